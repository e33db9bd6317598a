"""What the gate's weights digest costs the host: treespec's
(treespec.evidence.weights_digest, pieces on every core) against one
sha256 stream over a copy of each parameter's bytes (what it did before
0b48c8b), side by side on the same weights, medians of interleaved repeats.

    python results/gate-probe/digest_time.py --dims 2048x16 --repeats 5
"""

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import time

import mlx.core as mx
from mlx.utils import tree_flatten

from treespec.auto.costcurve import parse_dims
from treespec.bench.scaled import build_pair
from treespec.evidence.weights_digest import _hash_weights


def one_stream(params) -> str:
    h = hashlib.sha256()
    for name, w in params:
        h.update(f"{name}:{w.shape}:{w.dtype}".encode())
        h.update(bytes(memoryview(mx.contiguous(w).view(mx.uint8) if w.dtype == mx.bfloat16 else w)))
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="2048x16")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    target, _ = build_pair(*parse_dims(args.dims), draft_layers=2, alpha=0.02)
    params = tree_flatten(target.parameters())
    gb = sum(w.nbytes for _, w in params) / 1e9
    ways = {"one stream": one_stream, "pieces": _hash_weights}
    times = {k: [] for k in ways}
    for _ in range(args.repeats):
        for k, f in ways.items():
            t0 = time.perf_counter()
            f(params)
            times[k].append(time.perf_counter() - t0)
    git = subprocess.run(["git", "log", "-1", "--format=%h"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"device": str(mx.default_device()), "cpus": os.cpu_count(),
                      "machine": platform.machine(), "git": git, "dims": args.dims, "gb": round(gb, 3)}))
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, m in med.items():
        print(f"{k:<11} {m:7.3f} s  {m / gb:6.3f} s/GB")
    print(f"pieces / one stream: {med['pieces'] / med['one stream']:.2f}")


if __name__ == "__main__":
    main()
