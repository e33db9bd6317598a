"""Where a tree's drafting costs more than a chain's, level by level, on the
scaled pair's drafter (or the trained pair's).

    python scripts/draft_level_costs.py [--dims 4096x32] [--repeats 7] [--calls 5]
    python scripts/draft_level_costs.py --pair default

A chain level is one plain forward over one token and an argmax; a level of
[2,1,1,1] is a forward over two tokens through the tree injection (mask
array, per-node RoPE), through ``TreeAdapter.verify`` with ``start`` or the
injection alone (what a fixed tree's device round ran before it drafted wide
levels as batch rows), or two batch rows of one token (what it runs now),
and the top-k of each row. Every item is one step ended by an evaluation, timed
``--calls`` times (median) within a repeat; items interleaved, the order
rotated every repeat; ratios are medians of per-repeat ratios:

- ranking a level's rows, logits in the drafter's dtype: argmax (a chain's
  draft), ``top_children`` at k=2 and 4 (the ids alone, a fixed tree's: argmax
  passes over the float32 logits, each masking the ids taken; and with their
  log-probabilities, a confidence tree's), the same k by a partition of the
  float32 logits then a sort of the k (``top_ids`` before a215c45), and
  ``top_ids`` after ``logprobs_of`` (the ranking before a53a1d8);
- the draft forward of a level: one token (a chain's), two tokens as a
  plain causal forward, two tokens as a tree level (verify, injection alone), and
  two batch rows of one token each over a cache forked into two rows (how
  the branches of [2,1,1,1] could be drafted: no mask, one position per
  row, the backend's one-token attention), with the fork alone (every
  layer's keys and values copied into two rows, once per round: it grows
  with ``--context``, the tokens in the draft cache, 64 by default);
- host graph building alone of the tree levels and the plain forward
  (evaluated untimed after).
"""

import argparse
import os
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from treespec import caches
from treespec.bench import scaled
from treespec.draft.base import logprobs_of, top_children, top_ids
from treespec.bench.timing import interleaved, ratio
from treespec.tree import DraftTree
from treespec.verify.adapter import adapter_for

CONTEXT = 64


def partition_top(logprobs, k):
    """The k best ids by a partition of the row, then a sort of the k
    (``top_ids`` for every k before the argmax passes)."""
    ids = mx.argpartition(-logprobs, k - 1, axis=-1)[:, :k]
    values = mx.take_along_axis(logprobs, ids, axis=-1)
    return mx.take_along_axis(ids, mx.argsort(-values, axis=-1), axis=-1)


def main():
    ap = argparse.ArgumentParser()
    scaled.add_study_arguments(ap, repeats=7)
    ap.add_argument("--context", type=int, default=CONTEXT,
                    help="tokens in the draft cache before the level (the fork copies them)")
    args = ap.parse_args()
    _, draft, what = scaled.study_pair(args)
    scaled.announce(what + "; its drafter measured")
    adapter = adapter_for(draft)
    cache = scaled.filled_cache(draft, args.context)
    # Level 2 of [2,1,1,1]: the root and its two children are in the cache
    # (fed by levels 0 and 1), the two grandchildren are fed now.
    level_tree = DraftTree([0, 1, 2, 3, 4], [-1, 0, 0, 1, 2])
    logits = draft(mx.array([[0]]), cache=cache)
    vocab, dtype = logits.shape[-1], logits.dtype
    trim_prompt_cache(cache, 1)
    rows = {r: mx.random.normal((r, vocab)).astype(dtype) for r in (1, 2)}
    mx.eval(list(rows.values()))

    items, refs = {}, {}
    for r, x in rows.items():
        base = f"rank {r} row(s): argmax"
        items[base] = lambda x=x: mx.eval(mx.argmax(x, axis=-1))
        for k in (2, 4):
            ways = {f"top_children k={k}": lambda x=x, k=k: top_children(x, k)[0],
                    f"top_children k={k}, log-probabilities too":
                        lambda x=x, k=k: top_children(x, k),
                    f"partition k={k}": lambda x=x, k=k: partition_top(x.astype(mx.float32), k),
                    f"top_ids k={k} after logprobs_of": lambda x=x, k=k: top_ids(
                        logprobs_of(x), k)}
            for name, way in ways.items():
                items[f"rank {r} row(s): {name}"] = lambda way=way: mx.eval(way())
                refs[f"rank {r} row(s): {name}"] = base

    def plain(T):
        def step():
            mx.eval(draft(mx.arange(T)[None], cache=cache))
            trim_prompt_cache(cache, T)
        return step

    # Such a level through the injection alone, the caches checked once per
    # round (untimed here): what FixedTreeDrafter's device rounds ran before
    # they drafted wide levels as batch rows.
    level_tokens = mx.arange(2)

    def inject_level(part, start, tokens, owners):
        with adapter.injection(cache, part, owners, start) as probe:
            logits = draft(tokens[None], cache=cache).squeeze(0)
            probe()
        return logits

    def level(injected, build_only=False):
        """Level 2 fed on top of the root and level 1 (fed untimed): two
        tokens through ``TreeAdapter.verify`` ("verify"), the injection alone
        ("injection"), or as a plain causal forward (False);
        the forward evaluated, or its host graph building alone."""
        def step():
            draft(mx.arange(3)[None], cache=cache)
            mx.eval([c.state for c in cache])
            owners = adapter.check(level_tree, cache, 3) if injected == "injection" else None
            t0 = time.perf_counter()
            out = (adapter.verify(level_tree, cache, start=3) if injected == "verify"
                   else inject_level(level_tree, 3, level_tokens, owners)
                   if injected == "injection"
                   else draft(level_tokens[None], cache=cache))
            if not build_only:
                mx.eval(out)
            dt = time.perf_counter() - t0
            mx.eval(out)
            trim_prompt_cache(cache, 5)
            return dt
        return step

    branches = caches.fork(cache, [0, 0])  # two rows, each the context alone
    mx.eval([c.state for c in branches])

    def fork():
        mx.eval([f.state for f in caches.fork(cache, [0, 0])])

    def batch():
        # As a level past the fork: each row holds the context and its own
        # branch so far (two rows fed, one each, untimed), then the level.
        draft(mx.arange(2)[:, None], cache=branches)
        mx.eval([c.state for c in branches])
        t0 = time.perf_counter()
        mx.eval(draft(level_tokens[:, None], cache=branches))
        dt = time.perf_counter() - t0
        trim_prompt_cache(branches, 2)
        return dt

    if caches.forks(cache):
        items["draft forward, 2 batch rows of 1 token (branches)"] = batch
        items["fork of the draft cache into 2 batch rows"] = fork
        refs["draft forward, 2 batch rows of 1 token (branches)"] = \
            "draft forward, 1 token (a chain level)"
        refs["fork of the draft cache into 2 batch rows"] = \
            "draft forward, 1 token (a chain level)"
    items["draft forward, 1 token (a chain level)"] = plain(1)
    items["draft forward, 2 tokens, plain causal"] = plain(2)
    items["draft forward, 2 tokens as a tree level (verify)"] = level("verify")
    items["draft forward, 2 tokens as a tree level (injection)"] = level("injection")
    items["host graph building, 2 tokens, plain causal"] = level(False, build_only=True)
    items["host graph building, 2 tokens as a tree level (verify)"] = level("verify", True)
    items["host graph building, 2 tokens as a tree level (injection)"] = level("injection", True)
    for n in ("draft forward, 2 tokens, plain causal",
              "draft forward, 2 tokens as a tree level (verify)",
              "draft forward, 2 tokens as a tree level (injection)"):
        refs[n] = "draft forward, 1 token (a chain level)"
    for n in ("host graph building, 2 tokens as a tree level (verify)",
              "host graph building, 2 tokens as a tree level (injection)"):
        refs[n] = "host graph building, 2 tokens, plain causal"

    times = interleaved(items, args.repeats, args.calls)
    names = list(times)
    print(f"\nmedians of {args.repeats} interleaved repeats x {args.calls} calls (vocab {vocab}; "
          f"load {os.getloadavg()[0]:.2f} at the end)")
    for n in names:
        ref = refs.get(n)
        shown = "" if ref is None else f"  x{ratio(times, n, ref):.3f} {ref}"
        print(f"{n:56} {statistics.median(times[n]):8.3f} ms{shown}")


if __name__ == "__main__":
    main()
