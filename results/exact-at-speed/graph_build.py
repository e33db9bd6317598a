"""What building a verify's graph costs on the host, apart from computing it.

The round loop times ``adapter.verify(...)`` (which only builds MLX's lazy
graph) inside its "draft" stage and the evaluation as "verify"
(treespec/rounds.py). On the H100 the row-invariant verify's "draft" stage
was 10-15 ms longer per round than the flat verify's with the same drafter
(h100-3f309e9/). This measures the two halves of one verify per mode on the
running device, medians of interleaved repeats: host time to build the
graph (no evaluation), then time to evaluate it.

    python results/exact-at-speed/graph_build.py --dims 1024x32 --bits 4 --context 128
"""

import argparse
import json
import platform
import statistics
import subprocess
import time

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from treespec.auto.costcurve import parse_dims
from treespec.bench.scaled import build_pair, filled_cache
from treespec.tree import DraftTree
from treespec.verify import adapter_for

TREES = {"chain 2": [-1, 0], "chain 3": [-1, 0, 1], "chain 5": [-1, 0, 1, 2, 3],
         "tree [2,1]": [-1, 0, 0, 1, 2], "tree p[-1,0,0,1]": [-1, 0, 0, 1]}


def one(adapter, cache, parents):
    tree = DraftTree([1 + i for i in range(len(parents))], parents)  # fresh: no memo reused
    t0 = time.perf_counter()
    logits = adapter.verify(tree, cache)
    t1 = time.perf_counter()
    mx.eval(logits)
    t2 = time.perf_counter()
    trim_prompt_cache(cache, len(parents))
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="1024x32")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    hidden, layers = parse_dims(args.dims)
    target, _ = build_pair(hidden, layers, draft_layers=2, alpha=0.02, bits=args.bits)
    modes = {"flat": adapter_for(target), "rows": adapter_for(target, rows=True)}
    cache = filled_cache(target, args.context)
    times = {(m, t): ([], []) for m in modes for t in TREES}
    for r in range(args.repeats + 1):  # the first pass warms up, uncounted
        for t, parents in TREES.items():
            for m, adapter in modes.items():
                build, run = one(adapter, cache, parents)
                if r:
                    times[m, t][0].append(build)
                    times[m, t][1].append(run)
    git = subprocess.run(["git", "log", "-1", "--format=%h"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"device": str(mx.default_device()), "machine": platform.machine(),
                      "mlx": mx.__version__, "git": git, "dims": args.dims, "bits": args.bits,
                      "context": args.context, "repeats": args.repeats}))
    print(f"{'tree':<18} {'mode':<5} {'build ms':>9} {'eval ms':>9}")
    for t in TREES:
        for m in modes:
            b, e = times[m, t]
            print(f"{t:<18} {m:<5} {statistics.median(b):9.2f} {statistics.median(e):9.2f}")


if __name__ == "__main__":
    main()
