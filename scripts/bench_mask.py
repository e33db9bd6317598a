"""Mask construction cost per round: a 64-node tree at offset 4096.

The mask changes with the topology every round, so it cannot be cached;
this is what each round pays. Run: python scripts/bench_mask.py
"""

import random
import statistics
import time

import mlx.core as mx

from treespec.tree import DraftTree


def random_tree(n, seed=0):
    rng = random.Random(seed)
    return DraftTree([rng.randrange(256) for _ in range(n)],
                     [-1] + [rng.randrange(i) for i in range(1, n)])


def bench(n=64, offset=4096, window=None, repeats=200):
    times = {"mask": [], "mask+eval": [], "additive bf16": [], "positions": []}
    for r in range(repeats):
        tree = random_tree(n, seed=r)  # fresh tree: nothing cached between rounds
        t0 = time.perf_counter()
        m = tree.mask(offset, window)
        t1 = time.perf_counter()
        mx.eval(m)
        t2 = time.perf_counter()
        times["mask"].append(t1 - t0)
        times["mask+eval"].append(t2 - t0)
        tree = random_tree(n, seed=r)
        t0 = time.perf_counter()
        mx.eval(tree.additive_mask(offset, window, dtype=mx.bfloat16))
        times["additive bf16"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        mx.eval(tree.positions(offset))
        times["positions"].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


if __name__ == "__main__":
    for window in (None, 512):
        res = bench(window=window)
        print(f"n=64 offset=4096 window={window}: "
              + ", ".join(f"{k} {v:.3f} ms" for k, v in res.items()))
