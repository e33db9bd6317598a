# Archived one-question probe (issue 41): scripts/chain_round_host.py as it stood at 7dc635f,
# beside the record(s) it produced; not run or tested since (its imports may have moved).
# Record(s):
#   results/cpu-bench/5b618e4/chain-round-host.txt (recorded in 03f6d65)
#   results/cpu-bench/16f4b76/chain-round-host.txt (9792143 against 16f4b76, recorded in 33669c8)
#   results/h200-scaled/7962c0e/chain-round-host.txt (the H200's host, recorded in 03f6d65)
# Its second half times the verify's pieces in place by wrapping private methods
# (TreeAdapter._checked, _plans) and patching treespec.rollback.snapshot and
# treespec.caches.hold at run time: kept here as the record's provenance, not to be rerun. Its
# first half, the round's graph building and commit against mlx-lm's, is
# `python -m benchmarks.host_cost --sections round`.
# The version that produced a record: git show <recording commit>:scripts/chain_round_host.py

"""The host work of a chain round beyond mlx-lm's, on a thin target.

    python scripts/chain_round_host.py [--layers 32] [--repeats 300]

A seeded random llama (``treespec.auto.costcurve.build_llama``, hidden 64,
vocabulary 256: a forward's host work dominates) with a 64-token cache. Each
repeat times, interleaved (the order alternating), treespec's chain verify
of 3 nodes (``TreeAdapter.verify``, graph building only) and its commit of 2
(``TreeAdapter.commit``), against what mlx-lm's round does for the same: a
plain forward over the 3 tokens and ``trim_prompt_cache``. Both are
evaluated untimed between. Medians, and their differences: the per-round
host work treespec adds on the round's critical path where the host builds
the graph slower than the device runs the drafts (the H200 at 4096x32).
Then the pieces of treespec's verify, each timed where it runs (right after
the previous round's forward, as in a decode): the cache check, the ring
plans, the snapshot, the hold that puts the caches back if the forward
raises.
"""

import argparse
import functools
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from treespec import caches, rollback
from treespec.auto.costcurve import build_llama
from treespec.tree import DraftTree
from treespec.verify import adapter as adapter_module
from treespec.verify.adapter import adapter_for

PIECES = {}  # name -> seconds of each call, while timed_pieces() is on


def timed(name, f):
    @functools.wraps(f)
    def wrapped(*args, **kwargs):
        t0 = time.perf_counter()
        out = f(*args, **kwargs)
        PIECES.setdefault(name, []).append(time.perf_counter() - t0)
        return out
    return wrapped


def timed_pieces():
    """Wrap the verify's pieces with timers (this script's own process only)."""
    cls = adapter_module.TreeAdapter
    cls._checked = timed("cache check (_checked)", cls._checked)
    cls._plans = timed("ring plans (_plans)", cls._plans)
    rollback.snapshot = timed("snapshot", rollback.snapshot)
    caches.hold = timed("hold (caches.hold)", caches.hold)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    target = build_llama(64, args.layers, vocab=256, dtype="bfloat16")
    adapter = adapter_for(target)
    cache = make_prompt_cache(target)
    mx.eval(target(mx.arange(64)[None], cache=cache), [c.state for c in cache])
    chain = DraftTree([0, 1, 2], [-1, 0, 1])
    tokens = mx.array([1, 2, 3], dtype=mx.uint32)

    def treespec_round():
        t0 = time.perf_counter()
        out = adapter.verify(chain, cache, tokens=tokens)
        t1 = time.perf_counter()
        mx.eval(out)
        t2 = time.perf_counter()
        adapter.commit(cache, chain, [0, 1])
        t3 = time.perf_counter()
        trim_prompt_cache(cache, 1)  # back to 64
        return t1 - t0, t3 - t2

    def mlx_lm_round():
        t0 = time.perf_counter()
        out = target(tokens[None], cache=cache)
        t1 = time.perf_counter()
        mx.eval(out)
        t2 = time.perf_counter()
        trim_prompt_cache(cache, 1)
        t3 = time.perf_counter()
        trim_prompt_cache(cache, 2)
        return t1 - t0, t3 - t2

    times = {"treespec": [], "mlx-lm": []}
    for r in range(args.repeats):
        pair = (("treespec", treespec_round), ("mlx-lm", mlx_lm_round))
        for name, f in pair[::-1] if r % 2 else pair:
            times[name].append(f())
    med = {k: [statistics.median(x[i] for x in v) * 1e3 for i in (0, 1)]
           for k, v in times.items()}
    print(f"llama 64x{args.layers}, chain of 3, {args.repeats} interleaved repeats (medians)")
    for k, (build, commit) in med.items():
        print(f"{k:9} verify graph building {build:.3f} ms  commit {commit:.3f} ms")
    print(f"treespec adds {med['treespec'][0] - med['mlx-lm'][0]:.3f} ms of graph building and "
          f"{med['treespec'][1] - med['mlx-lm'][1]:.3f} ms of commit a round")
    timed_pieces()
    for _ in range(args.repeats):
        treespec_round()
        mlx_lm_round()  # a plain forward in between, as the rounds above
    print("pieces of treespec's verify, timed in place (medians): " + ", ".join(
        f"{name} {statistics.median(v) * 1e6:.1f} us" for name, v in PIECES.items()))


if __name__ == "__main__":
    main()
