"""The row-invariant verify against the flat one on one target: bit identity
of every node's row to single-token steps (trees of 2..9 nodes), and the cost
of one verify (flat, rows) against one step at several context lengths,
medians of interleaved repeats.

    python results/exact-at-speed/probe.py --dims 4096x32 --bits 4 --contexts 128,1024,4096

Prints one JSON object per line (see results/exact-at-speed/README.md)."""

import argparse
import json
import platform
import statistics
import subprocess
import time

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from treespec.bench.scaled import build_pair
from treespec.cli.flags import parse_dims
from treespec.tree import DraftTree
from treespec.verify import adapter_for

TREES = {
    "chain2": [-1, 0], "chain3": [-1, 0, 1], "chain5": [-1, 0, 1, 2, 3],
    "tree5": [-1, 0, 0, 1, 2], "tree7": [-1, 0, 0, 1, 2, 3, 4], "chain9": list(range(-1, 8)),
}


def prefilled(model, prompt):
    cache = make_prompt_cache(model)
    model(mx.array(prompt)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def steps(model, prompt, tree):
    rows = []
    for i in range(len(tree)):
        cache = prefilled(model, prompt)
        for j in tree.path_to(i):
            out = model(mx.array([[tree.tokens[j]]]), cache=cache)
        rows.append(out[0, -1])
    return mx.stack(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", type=parse_dims, default=(4096, 32))
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--contexts", default="128,1024,4096")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    hidden, layers = args.dims
    target, _ = build_pair(hidden, layers, 2, 0.3, bits=args.bits)
    flat, rows = adapter_for(target), adapter_for(target, rows=True)
    rng = np.random.default_rng(0)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    print(json.dumps({"machine": platform.node(), "device": str(mx.default_device()),
                      "mlx": mx.__version__, "git": git, "dims": [hidden, layers],
                      "bits": args.bits}), flush=True)
    prompt = rng.integers(0, 32000, 64).tolist()
    for name, parents in TREES.items():
        tree = DraftTree(rng.integers(0, 32000, len(parents)).tolist(), parents)
        want = steps(target, prompt, tree)
        got = {k: a.verify(tree, prefilled(target, prompt)) for k, a in (("flat", flat), ("rows", rows))}
        mx.eval(want, *got.values())
        print(json.dumps({"identity": name, "nodes": len(tree), **{
            k: {"identical_rows": int(sum(bool(mx.array_equal(g[i], want[i])) for i in range(len(tree)))),
                "max_diff": float(mx.max(mx.abs(g.astype(mx.float32) - want.astype(mx.float32))))}
            for k, g in got.items()}}), flush=True)
    for context in (int(c) for c in args.contexts.split(",")):
        prompt = rng.integers(0, 32000, context).tolist()
        base = prefilled(target, prompt)
        times = {"step": [], "flat chain5": [], "rows chain5": [], "flat tree5": [], "rows tree5": []}

        def once(kind):
            cache = [type(c)() for c in base]
            for c, b in zip(cache, base):
                c.keys, c.values, c.offset = b.keys, b.values, b.offset
            name, _, shape = kind.partition(" ")
            t0 = time.perf_counter()
            if name == "step":
                mx.eval(target(mx.array([[1]]), cache=cache))
            else:
                tree = DraftTree(list(range(1, 6)), TREES[shape])
                mx.eval((flat if name == "flat" else rows).verify(tree, cache))
            return time.perf_counter() - t0

        for kind in times:  # warm-up: kernels compile on first use
            once(kind)
        for r in range(args.repeats):
            order = list(times)[r % len(times):] + list(times)[:r % len(times)]
            for kind in order:
                times[kind].append(once(kind))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(json.dumps({"context": context, "ms": med,
                          "x_step": {k: v / med["step"] for k, v in med.items()}}), flush=True)


if __name__ == "__main__":
    main()
