"""What committing a path costs next to the verify forward that wrote the tree.

For each cache mode and each context offset: fill the caches with `offset`
random rows (no prefill: the rows' values do not matter to the cost), then
repeat {restore the caches to `offset`, verify a 16-node branching tree with
treespec.verify, commit its deepest branch (every accepted draft row moves)}
and report the medians. The commit only reads and writes the tree's rows, so
its cost must not grow with the offset; the verify's attention does.

    python scripts/bench_rollback.py                       # 512-wide 8-layer llama
    python scripts/bench_rollback.py --family llama        # a zoo model instead
    python scripts/bench_rollback.py --offsets 128,8192 --repeats 9 --modes kv,q8,rotating

Run it with the BLAS the numbers are for (treespec.backend.blas describes the one loaded).
"""

import argparse
import statistics
import sys
import time

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache


from treespec.backend import blas
from treespec.rollback import commit_path, snapshot
from treespec.tree import DraftTree
from treespec.verify import adapter_for

# Root, then three chains of five: the deepest leaf ends the last chain, so
# committing its branch moves all five accepted rows.
TREE = DraftTree(list(range(1, 17)), [-1, 0, 1, 2, 3, 4, 0, 6, 7, 8, 9, 0, 11, 12, 13, 14])
PATH = TREE.path_to(len(TREE) - 1)


def build(args):
    if args.family:
        from treespec import zoo

        return zoo.build(args.family)
    from treespec.auto.costcurve import build_llama

    hidden, layers = (int(x) for x in args.dims.split("x"))
    return build_llama(hidden, layers)


def fill(model, mode, offset, rng):
    """The model's caches in ``mode``, holding ``offset`` random rows."""
    probe = make_prompt_cache(model)
    model(mx.array([[1]]), cache=probe)
    caches = []
    for p in probe:
        c = RotatingKVCache(max_size=offset // 2) if mode == "rotating" else KVCache()
        shape = p.keys.shape[:2] + (offset, p.keys.shape[3])
        kv = [mx.array(rng.standard_normal(shape).astype(np.float32)) for _ in "kv"]
        c.update_and_fetch(*(a.astype(p.keys.dtype) for a in kv))
        if mode == "q8":
            if shape[-1] % 64:
                return None  # mx.quantize needs head_dim to be a multiple of the group
            c = c.to_quantized(group_size=64, bits=8)
        caches.append(c)
    mx.eval([c.keys for c in caches], [c.values for c in caches])
    return caches


def bench(model, mode, offset, repeats, rng):
    caches = fill(model, mode, offset, rng)
    if caches is None:
        return None
    # Multi-token updates never write into these arrays (rotating) or only
    # past `offset` (step-allocated), so setting the state back restores.
    pristine = [c.state for c in caches]
    adapter = adapter_for(model)
    verify_s, commit_s = [], []
    for _ in range(repeats + 1):
        for c, s in zip(caches, pristine):
            c.state = s
        snap = snapshot(caches)
        t0 = time.perf_counter()
        logits = adapter.verify(TREE, caches)
        mx.eval(logits, [c.keys for c in caches], [c.values for c in caches])
        t1 = time.perf_counter()
        commit_path(caches, offset, PATH, TREE, snapshot=snap)
        t2 = time.perf_counter()
        verify_s.append(t1 - t0)
        commit_s.append(t2 - t1)
    # The first round warms up (allocations, graph caches).
    return statistics.median(verify_s[1:]), statistics.median(commit_s[1:])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", help="a zoo family instead of the --dims llama")
    p.add_argument("--dims", default="512x8", help="llama hidden x layers (default 512x8)")
    p.add_argument("--offsets", default="128,8192")
    p.add_argument(
        "--modes", default="kv,q8,rotating", help="kv, q8 (8-bit KV), rotating (window offset/2)"
    )
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)

    model = build(args)
    rng = np.random.RandomState(0)
    name = args.family or f"llama {args.dims}"
    moved = len(PATH) - 1
    print(f"model: {name}; tree: {len(TREE)} nodes, path of {len(PATH)} ({moved} rows move)")
    print(f"backend: {blas.describe()}")
    print(f"medians of {args.repeats} runs (after one warm-up)\n")
    print(f"{'mode':<10}{'offset':>8}{'verify ms':>12}{'commit ms':>12}{'commit/verify':>15}")
    for mode in args.modes.split(","):
        for offset in (int(x) for x in args.offsets.split(",")):
            got = bench(model, mode, offset, args.repeats, rng)
            if got is None:
                print(f"{mode:<10}{offset:>8}   n/a: head_dim is not a multiple of 64")
                continue
            v, c = got
            print(f"{mode:<10}{offset:>8}{v * 1e3:>12.2f}{c * 1e3:>12.3f}{c / v:>15.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
