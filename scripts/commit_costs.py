"""Where a branch commit's time goes, piece by piece, against the verify.

    python scripts/commit_costs.py [--dims 4096x32] [--repeats 9]
    python scripts/commit_costs.py --pair default [--repeats 9]

A verify of the 9-node tree [2,1,1,1] writes its nodes at ``offset ..
offset + 8``; committing the branch [0, 5, 6, 7, 8] moves four rows of every
attention cache's keys and values (64 arrays on 32 layers). Each item is one
step ended by an evaluation (treespec.bench.timing.interleaved); ratios are taken
against the verify in the same pass:

- ``adapter.commit`` of the first-choice path (a trim: no row moves) and of
  the branch, each after an untimed verify;
- the same number of row moves done by hand on the caches' buffers, each
  right after an untimed verify as a commit is, from a separate source array
  per cache as the captured update input is:
  a gather (``mx.take``) and a slice write per array, a slice and a slice
  write per array, the slice writes alone (rows already evaluated), the
  gathers alone.

The hand-made items bound what any commit that moves rows one array at a
time can cost on this machine; the gap between them and ``adapter.commit``
is the commit's own host work.
"""

import argparse
import os
import statistics
from time import perf_counter as _now

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from treespec.bench import scaled
from treespec.draft import make_drafter
from treespec.bench.timing import interleaved, ratio
from treespec.tree import DraftTree
from treespec.verify.adapter import adapter_for

CONTEXT = 64
BRANCHING = [2, 1, 1, 1]


def main():
    ap = argparse.ArgumentParser()
    scaled.add_study_arguments(ap, repeats=9)
    args = ap.parse_args()
    target, _, what = scaled.study_pair(args)
    scaled.announce(what)
    adapter = adapter_for(target)
    cache = scaled.filled_cache(target, CONTEXT)
    fixed = DraftTree(list(range(9)), make_drafter("tree", branching=BRANCHING).shape)
    branch = [0, fixed.children(0)[1]]
    while fixed.children(branch[-1]):
        branch.append(fixed.children(branch[-1])[0])
    moved = len(branch) - 1  # rows 1.. move: node 1 is the first choice, not on the branch
    first = branch[1]
    items = {}

    def verify():
        mx.eval(adapter.verify(fixed, cache))
        trim_prompt_cache(cache, len(fixed))

    items["verify [2,1,1,1] (9)"] = verify

    def commit(path):
        def step():
            mx.eval(adapter.verify(fixed, cache))
            t0 = _now()
            adapter.commit(cache, fixed, path)
            mx.eval([c.state for c in cache])
            dt = _now() - t0
            trim_prompt_cache(cache, len(path))
            return dt
        return step

    items["adapter.commit, first-choice path (trim)"] = commit(list(range(5)))
    items[f"adapter.commit, branch {branch}"] = commit(branch)

    # One source per cache array, shaped as a verify's update input.
    sources = [(mx.random.normal(c.keys[..., :9, :].shape).astype(c.keys.dtype),
                mx.random.normal(c.values[..., :9, :].shape).astype(c.values.dtype))
               for c in cache]
    mx.eval(sources)
    idx = mx.array(list(range(first, first + moved)), dtype=mx.int32)
    dst = slice(CONTEXT + 1, CONTEXT + 1 + moved)

    def after_a_verify():
        # As the commit does: the verify's forward has just run (its host
        # objects out of the CPU's caches), and its adapter state is dropped.
        mx.eval(adapter.verify(fixed, cache))
        adapter.commit(cache, fixed, list(range(5)))  # the first-choice path: a trim
        trim_prompt_cache(cache, 5)

    def by_hand(read, write=True, source=sources):
        def step():
            after_a_verify()
            t0 = _now()
            out = []
            for c, (sk, sv) in zip(cache, source):
                rk, rv = read(sk), read(sv)
                if write:
                    c.keys[..., dst, :] = rk
                    c.values[..., dst, :] = rv
                    out += [c.keys, c.values]
                else:
                    out += [rk, rv]
            mx.eval(out)
            return _now() - t0
        return step

    items["by hand: take + slice write per array"] = by_hand(lambda s: mx.take(s, idx, axis=2))
    items["by hand: slice + slice write per array"] = by_hand(
        lambda s: s[..., first:first + moved, :])
    rows = [(sk[..., first:first + moved, :] + 0, sv[..., first:first + moved, :] + 0)
            for sk, sv in sources]
    mx.eval(rows)
    items["by hand: slice writes alone (rows evaluated)"] = by_hand(lambda r: r, source=rows)
    items["by hand: takes alone"] = by_hand(lambda s: mx.take(s, idx, axis=2), write=False)

    times = interleaved(items, args.repeats, args.calls)
    ref = "verify [2,1,1,1] (9)"
    print(f"\n{2 * len(cache)} cache arrays, {moved} rows moved per array; medians of "
          f"{args.repeats} interleaved repeats x {args.calls} calls "
          f"(load {os.getloadavg()[0]:.2f} at the end)")
    for n, v in times.items():
        extra = "" if n == ref else f"  x{ratio(times, n, ref):.3f} verify"
        print(f"{n:52} {statistics.median(v):8.3f} ms{extra}")


if __name__ == "__main__":
    main()
