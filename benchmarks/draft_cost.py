"""What drafting a tree costs against drafting a chain: one level, and one whole round.

    python -m benchmarks.draft_cost --dims 4096x32 --repeats 7
    python -m benchmarks.draft_cost --pair default --repeats 7 --context 2048
    python -m benchmarks.draft_cost --pair default --sections rounds

The pair's drafter, its cache holding ``--context`` tokens. Every item is one
step ended by an evaluation, timed ``--calls`` times (median) within a pass;
the items run interleaved, in an order rotated every pass, and each ratio is
the median over passes of the item's time over its reference's in the same
pass. ``--sections`` (default both):

``levels``: one level of [2,1,1,1] (two tokens fed below the root and its
two children) against a chain's level (one token):

- ranking a level's rows, logits in the drafter's dtype: argmax (a chain's
  draft), ``top_children`` at k=2 and 4 (the ids alone, a fixed tree's: argmax
  passes over the float32 logits, each masking the ids taken; and with their
  log-probabilities, a confidence tree's), and two rankings it replaced: a
  partition of the float32 logits then a sort of the k, and ``top_ids`` after
  ``logprobs_of``;
- the draft forward of a level: one token (a chain's), two tokens as a
  plain causal forward, two tokens as a tree level (through
  ``TreeAdapter.verify`` with ``start``, and through the injection alone, the
  caches checked once, untimed), and two batch rows of one token each over
  the cache forked into two rows (how ``FixedTreeDrafter(batch_levels=True)``
  drafts the wide levels), with the fork alone (every layer's keys and values
  copied into two rows: it grows with ``--context``);
- host graph building alone of the tree levels and the plain forward
  (evaluated untimed after).

``rounds``: one drafting round (``Drafter.draft``, its tokens evaluated) per
drafter kind against a chain of the same depth: chain b=5, the spine of
depth 4, [2,1,1,1] (its wide levels injected, and as batch rows), the
confidence tree of budget 4 and of budget 8 (depth 8, against chain b=9);
with the draft forwards each round ran. Not measured (scripts/tree_verify_costs.py did,
at 7dc635f and before, by replacing ``mx.eval`` and ``mx.async_eval`` at run time): a
round's host graph building with nothing started, its primitives, its host evaluations.
"""

import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from benchmarks import harness
from treespec import caches
from treespec.bench.scaled import filled_cache
from treespec.draft import FixedTreeDrafter, make_drafter
from treespec.draft.base import logprobs_of, top_children, top_ids
from treespec.tree import DraftTree
from treespec.verify import adapter_for

SPINE = [-1, 0, 0, 1, 1, 3, 3, 5, 5]
BRANCHING = [2, 1, 1, 1]
SECTIONS = ("levels", "rounds")


def partition_top(logprobs, k):
    """The k best ids by a partition of the row, then a sort of the k
    (``top_ids`` for every k before the argmax passes)."""
    ids = mx.argpartition(-logprobs, k - 1, axis=-1)[:, :k]
    values = mx.take_along_axis(logprobs, ids, axis=-1)
    return mx.take_along_axis(ids, mx.argsort(-values, axis=-1), axis=-1)


def level_items(draft, context):
    """(items, refs) of the ``levels`` section."""
    adapter = adapter_for(draft)
    cache = filled_cache(draft, context)
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

    level_tokens = mx.arange(2)

    def inject_level(start, owners):
        with adapter.injection(cache, level_tree, owners, start) as probe:
            out = draft(level_tokens[None], cache=cache).squeeze(0)
            probe()
        return out

    def level(how, build_only=False):
        """Level 2 fed on top of the root and level 1 (fed untimed): through
        ``verify``, the ``injection`` alone, or a plain causal forward
        (None); evaluated, or its host graph building alone."""
        def step():
            draft(mx.arange(3)[None], cache=cache)
            mx.eval([c.state for c in cache])
            owners = adapter.check(level_tree, cache, 3) if how == "injection" else None
            t0 = time.perf_counter()
            out = (adapter.verify(level_tree, cache, start=3) if how == "verify"
                   else inject_level(3, owners) if how == "injection"
                   else draft(level_tokens[None], cache=cache))
            if not build_only:
                mx.eval(out)
            dt = time.perf_counter() - t0
            mx.eval(out)
            trim_prompt_cache(cache, 5)
            return dt
        return step

    one = "draft forward, 1 token (a chain level)"
    if caches.forks(cache):
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

        items["draft forward, 2 batch rows of 1 token (branches)"] = batch
        items["fork of the draft cache into 2 batch rows"] = fork
        refs["draft forward, 2 batch rows of 1 token (branches)"] = one
        refs["fork of the draft cache into 2 batch rows"] = one
    items[one] = plain(1)
    items["draft forward, 2 tokens, plain causal"] = plain(2)
    items["draft forward, 2 tokens as a tree level (verify)"] = level("verify")
    items["draft forward, 2 tokens as a tree level (injection)"] = level("injection")
    build_plain = "host graph building, 2 tokens, plain causal"
    items[build_plain] = level(None, build_only=True)
    items["host graph building, 2 tokens as a tree level (verify)"] = level("verify", True)
    items["host graph building, 2 tokens as a tree level (injection)"] = level("injection", True)
    for n in ("draft forward, 2 tokens, plain causal",
              "draft forward, 2 tokens as a tree level (verify)",
              "draft forward, 2 tokens as a tree level (injection)"):
        refs[n] = one
    for n in ("host graph building, 2 tokens as a tree level (verify)",
              "host graph building, 2 tokens as a tree level (injection)"):
        refs[n] = build_plain
    return items, refs, f"vocab {vocab}"


def round_items(draft, context):
    """(items, refs, forwards per round) of the ``rounds`` section."""
    drafters = {"chain b=5": make_drafter("chain", block=5),
                "chain b=9": make_drafter("chain", block=9),
                "spine (depth 4)": make_drafter("tree", parents=SPINE),
                "[2,1,1,1] (depth 4)": make_drafter("tree", branching=BRANCHING),
                "[2,1,1,1] (depth 4), batch levels": FixedTreeDrafter(branching=BRANCHING,
                                                                     batch_levels=True),
                "confidence n=4 (depth 4)": make_drafter("tree", budget=4),
                "confidence n=8 (depth 8)": make_drafter("tree", budget=8)}
    items, refs, forwards = {}, {}, {}
    for name, drafter in drafters.items():
        drafter.start(draft, list(range(context)))

        def round_alone(drafter=drafter, name=name):
            before = drafter.cache[0].offset
            rnd = drafter.draft(7)
            forwards[name] = rnd.forwards
            mx.eval(rnd.device_tokens if rnd.device_tokens is not None else mx.array(0))
            # the round's rows out of the draft cache: the next round starts as this one
            trim_prompt_cache(drafter.cache, drafter.cache[0].offset - before)

        key = f"drafting round, {name}"
        items[key] = round_alone
        if not name.startswith("chain"):
            refs[key] = f"drafting round, chain b={9 if 'depth 8' in name else 5}"
    return items, refs, forwards


def main(argv=None):
    ap = harness.parser("draft_cost", __doc__, repeats=7, calls=5)
    ap.add_argument("--context", type=int, default=64,
                    help="tokens in the draft cache (the fork copies them; default 64)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="levels, rounds or both")
    args = ap.parse_args(argv)
    sections = args.sections.split(",")
    if set(sections) - set(SECTIONS):
        ap.error(f"--sections: {', '.join(sorted(set(sections) - set(SECTIONS)))} unknown")
    pair = harness.load_pair(args)
    with harness.record(args, pair) as say:
        items, refs, forwards, note = {}, {}, {}, ""
        if "levels" in sections:
            got, got_refs, note = level_items(pair.draft, args.context)
            items.update(got)
            refs.update(got_refs)
        if "rounds" in sections:
            got, got_refs, forwards = round_items(pair.draft, args.context)
            items.update(got)
            refs.update(got_refs)
        times = harness.interleaved(items, args.repeats, args.calls)
        say(f"\nthe drafter, {args.context} tokens in its cache{'; ' + note if note else ''}; "
            f"medians of {args.repeats} interleaved passes x {args.calls} calls, ms; ratios: "
            "medians of per-pass ratios")
        for n, v in times.items():
            shown = f"  x{harness.ratio(times, n, refs[n]):.3f} {refs[n]}" if n in refs else ""
            fw = next((f"  [{f} draft forwards]" for k, f in forwards.items()
                       if n == f"drafting round, {k}"), "")
            say(f"{n:58} {statistics.median(v):8.3f} ms{shown}{fw}")


if __name__ == "__main__":
    main()
