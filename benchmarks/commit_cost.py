"""What committing an accepted path costs, against the verify that wrote the tree.

    python -m benchmarks.commit_cost --dims 4096x32 --repeats 9
    python -m benchmarks.commit_cost --pair default --by-hand
    python -m benchmarks.commit_cost --dims 512x8 --modes kv,q8,rotating --offsets 128,8192

A verify of the 9-node tree [2,1,1,1] writes its nodes at ``offset ..
offset + 8``; committing the branch that leaves the first choice at the root
(the root's second child, then down its chain) moves four rows of every
attention cache's keys and values; committing the first-choice path moves
none (a trim). Per cache mode and offset (the caches hold ``offset`` random
rows, written without a prefill: their values do not matter to the cost; a
mode replaces every layer's cache, so the model's must all be attention
caches): each item is one step ended by an evaluation, all interleaved
(``--repeats`` passes, ``--calls`` calls each), ratios against the verify
in the same pass:

- the verify of the tree (``TreeAdapter.verify``);
- ``TreeAdapter.commit`` of the first-choice path and of the branch, each
  right after an untimed verify;
- ``treespec.rollback.commit_path`` of the branch with nothing the verify
  recorded (rows read from the caches' buffers: one host evaluation before
  the writes);
- ``--by-hand`` (``kv`` mode): the same row moves done by hand on the caches'
  buffers, from a separate source array per cache as the captured update
  input is: a gather and a slice write per array, a slice and a slice write,
  the slice writes alone (rows evaluated), the gathers alone. They bound what
  any commit that moves rows one array at a time costs on this machine; the
  gap to ``TreeAdapter.commit`` is the commit's own host work.

The commit only reads and writes the tree's rows, so its cost must not grow
with the offset; the verify's attention does. Modes: ``kv`` (KVCache), ``q8``
(8-bit QuantizedKVCache, group 64: head_dim a multiple of 64), ``rotating``
(RotatingKVCache whose window is half the offset, so the ring has wrapped).
"""

import statistics
import time

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (KVCache, RotatingKVCache, can_trim_prompt_cache,
                                 make_prompt_cache, trim_prompt_cache)

from benchmarks import harness
from treespec.draft import make_drafter
from treespec.rollback import commit_path
from treespec.tree import DraftTree
from treespec.verify import adapter_for

BRANCHING = [2, 1, 1, 1]
MODES = ("kv", "q8", "rotating")


def fill(model, mode: str, offset: int, rng):
    """The model's caches in ``mode``, holding ``offset`` random rows; None
    where the mode cannot hold this model's heads."""
    probe = make_prompt_cache(model)
    if not all(type(c) in (KVCache, RotatingKVCache) for c in probe):
        raise SystemExit("commit_cost replaces every layer's cache: this model's are not all "
                         f"attention caches ({sorted({type(c).__name__ for c in probe})})")
    model(mx.array([[1]]), cache=probe)
    caches = []
    for p in probe:
        c = RotatingKVCache(max_size=max(offset // 2, 1)) if mode == "rotating" else KVCache()
        shape = p.keys.shape[:2] + (offset, p.keys.shape[3])
        kv = [mx.array(rng.standard_normal(shape).astype(np.float32)).astype(p.keys.dtype)
              for _ in "kv"]
        c.update_and_fetch(*kv)
        if mode == "q8":
            if shape[-1] % 64:
                return None  # mx.quantize needs head_dim to be a multiple of the group
            c = c.to_quantized(group_size=64, bits=8)
        caches.append(c)
    mx.eval([(c.keys, c.values) for c in caches])
    return caches


def items_for(model, adapter, cache, offset, by_hand, label):
    """name -> step, and the name of the verify the ratios are taken against."""
    tree = DraftTree(list(range(9)), make_drafter("tree", branching=BRANCHING).shape)
    branch = [0, tree.children(0)[1]]  # the root's second child, then down its chain
    while tree.children(branch[-1]):
        branch.append(tree.children(branch[-1])[0])
    first_choice = list(range(5))
    trims = can_trim_prompt_cache(cache)
    pristine = [c.state for c in cache]

    def restore(n):
        if trims:
            trim_prompt_cache(cache, n)
        else:  # a wrapped ring: a verify's update never writes into these arrays
            for c, s in zip(cache, pristine):
                c.state = s

    def settle():
        mx.eval([(c.keys, c.values) for c in cache])

    def verify():
        mx.eval(adapter.verify(tree, cache))
        settle()
        restore(len(tree))

    def commit(path, buffers=False):
        def step():
            mx.eval(adapter.verify(tree, cache))
            settle()
            t0 = time.perf_counter()
            if buffers:  # nothing the verify recorded: rows read from the buffers
                commit_path(cache, offset, path, tree)
            else:
                adapter.commit(cache, tree, path)
            settle()
            dt = time.perf_counter() - t0
            restore(len(path))
            return dt
        return step

    ref = f"{label}: verify {BRANCHING} (9 nodes)"
    items = {ref: verify,
             f"{label}: TreeAdapter.commit, first-choice path (a trim)": commit(first_choice),
             f"{label}: TreeAdapter.commit, branch {branch}": commit(branch),
             f"{label}: commit_path, branch, rows from the buffers": commit(branch, True)}
    if by_hand:
        items.update(by_hand_items(adapter, cache, tree, branch, offset, restore, label))
    return items, ref


def by_hand_items(adapter, cache, tree, branch, offset, restore, label):
    """The branch's row moves done by hand, each right after an untimed
    verify and first-choice commit, as a commit runs."""
    moved, first = len(branch) - 1, branch[1]
    sources = [(mx.random.normal(c.keys[..., :9, :].shape).astype(c.keys.dtype),
                mx.random.normal(c.values[..., :9, :].shape).astype(c.values.dtype))
               for c in cache]
    mx.eval(sources)
    idx = mx.array(list(range(first, first + moved)), dtype=mx.int32)
    dst = slice(offset + 1, offset + 1 + moved)
    rows = [(sk[..., first:first + moved, :] + 0, sv[..., first:first + moved, :] + 0)
            for sk, sv in sources]
    mx.eval(rows)

    def after_a_verify():
        mx.eval(adapter.verify(tree, cache))
        adapter.commit(cache, tree, list(range(5)))  # a trim: the caches hold offset + 5
        mx.eval([(c.keys, c.values) for c in cache])

    def step_of(read, write=True, source=sources):
        def step():
            after_a_verify()
            t0 = time.perf_counter()
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
            dt = time.perf_counter() - t0
            restore(5)
            return dt
        return step

    return {f"{label}: by hand, take + slice write per array":
            step_of(lambda s: mx.take(s, idx, axis=2)),
            f"{label}: by hand, slice + slice write per array":
            step_of(lambda s: s[..., first:first + moved, :]),
            f"{label}: by hand, slice writes alone (rows evaluated)":
            step_of(lambda r: r, source=rows),
            f"{label}: by hand, takes alone":
            step_of(lambda s: mx.take(s, idx, axis=2), write=False)}


def main(argv=None):
    ap = harness.parser("commit_cost", __doc__, repeats=9, calls=5)
    ap.add_argument("--modes", default="kv", help="comma separated: kv, q8, rotating")
    ap.add_argument("--offsets", default="64", help="rows in the caches, comma separated")
    ap.add_argument("--by-hand", action="store_true",
                    help="also the row moves done by hand (kv mode)")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    if set(modes) - set(MODES):
        ap.error(f"--modes: {', '.join(sorted(set(modes) - set(MODES)))} not in {MODES}")
    offsets = [int(x) for x in args.offsets.split(",")]
    pair = harness.load_pair(args)
    with harness.record(args, pair) as say:
        target = pair.target
        adapter = adapter_for(target)
        rng = np.random.RandomState(0)
        items, refs = {}, {}
        for mode in modes:
            for offset in offsets:
                label = f"{mode} at {offset}"
                cache = fill(target, mode, offset, rng)
                if cache is None:
                    say(f"{label}: n/a (head_dim is not a multiple of 64)")
                    continue
                got, ref = items_for(target, adapter, cache, offset,
                                     args.by_hand and mode == "kv", label)
                items.update(got)
                refs.update({n: ref for n in got if n != ref})
        times = harness.interleaved(items, args.repeats, args.calls)
        say(f"\nmedians of {args.repeats} interleaved passes x {args.calls} calls, ms; "
            "ratios: medians of per-pass ratios to the verify of the same caches")
        for n, v in times.items():
            extra = f"  x{harness.ratio(times, n, refs[n]):.4f} verify" if n in refs else ""
            say(f"{n:66} {statistics.median(v):9.3f} ms{extra}")


if __name__ == "__main__":
    main()
