"""What a tree round costs against a chain round, piece by piece, side by side.

    python scripts/tree_verify_costs.py [--dims 2048x16] [--alpha 0.02] [--repeats 9]
    python scripts/tree_verify_costs.py --pair default|weak [--repeats 9]

On the scaled pair (treespec.bench.scaled, bf16) or the built-in trained pair. Every
item is one step ended by an evaluation, timed ``--calls`` times (median)
within a repeat; the items run interleaved, in an order rotated every repeat,
and each ratio is the median over repeats of the item's time over its
reference's time in the same repeat (so a busy machine moves both alike):

- verify: ``TreeAdapter.verify`` of a spine of 9 nodes, of [2,1,1,1] (9) and
  of a chain of 5, each against a plain forward over as many tokens; host
  graph building alone (the verify's and a plain forward's, evaluated
  untimed after each call; again with each call made right after one of
  the other, evaluated: the order of a decode loop, where neither follows
  itself); and the verify's host work outside its forward
  alone, in a loop with no forward (the checks, snapshot, hold, injection put
  in and taken out, capture of the writes), against the plain forward's host
  graph building;
- the pieces of the injection on a 9-token forward: the per-node rope alone,
  the mask alone, both; sdpa with mlx-lm's "causal", a bool and an additive
  mask in the activation dtype;
- drafting one round alone, per drafter kind, against a chain of the same
  depth (4): chain b=5, the spine, [2,1,1,1] (its wide levels injected, and
  as batch rows: ``batch_levels``), the confidence tree of budget 4
  and of budget 8 (depth 8, against chain b=9); and the host graph building
  alone of the rounds drafted on the device (chain b=5, the spine,
  [2,1,1,1]), nothing started while it is built, against chain b=5's: what
  of a tree's drafting is host work where the device waits on the host;
- commit: the target's commit of the first-choice path (a trim) and of a
  branch (rows moved) of the 9-node tree, against the verify; the branch
  again with its rows read from the caches' buffers (``commit_path`` with no
  capture of what the verify wrote: one host evaluation before the writes).

Load-independent figures printed with them: draft forwards per round, host
evaluations (``mx.eval`` calls) per drafting round and per commit, and the
number of primitives in the verify graph against the plain forward's and in
one drafting round's graph per drafter (``mx.export_to_dot``; on a GPU about
one kernel each, so on a launch-bound draft model a count of its launches;
MLX's CPU backend spells some fused ops, rope, norms, attention, as several).
"""

import argparse
import os
from collections import Counter
from contextlib import contextmanager
from typing import Optional
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from treespec.bench import scaled
from treespec.draft import FixedTreeDrafter, make_drafter
from treespec.bench.graph_census import difference, primitives
from treespec.rollback import capture_written, commit_path, snapshot
from treespec.bench.timing import interleaved, ratio
from treespec.tree import DraftTree
from treespec.verify.adapter import adapter_for
from treespec.verify.attention import injected, rope_owners
from treespec.verify.guard import restored_on_error

SPINE = [-1, 0, 0, 1, 1, 3, 3, 5, 5]  # depth 4, two children per spine node
BRANCHING = [2, 1, 1, 1]
CONTEXT = 64

_evals = [0]
_eval = mx.eval


def counted_eval(*args, **kwargs):
    _evals[0] += 1
    return _eval(*args, **kwargs)


mx.eval = counted_eval  # this script's own counter of host evaluations


# Drafters whose rounds are built without a host evaluation (the device
# rounds): their graph building can be timed apart from the device's work.
DRAFTING_BUILT = ("chain b=5", "spine (depth 4)", "[2,1,1,1] (depth 4)",
                  "[2,1,1,1] (depth 4), batch levels")


@contextmanager
def nothing_started(asked: Optional[list] = None):
    """No ``mx.async_eval`` starts anything: a drafting round's levels stay
    one lazy graph until the caller evaluates it. ``asked`` collects the
    arrays the round asked to start (work it does even where nothing
    evaluated later reads them)."""
    started = mx.async_eval
    mx.async_eval = (lambda *arrays: None) if asked is None else (lambda *a: asked.extend(a))
    try:
        yield
    finally:
        mx.async_eval = started


def finish_round(drafter, rnd, before):
    """Evaluate a round's tokens and put the draft cache back."""
    _eval(rnd.device_tokens if rnd.device_tokens is not None else mx.array(0))
    trim_prompt_cache(drafter.cache, drafter.cache[0].offset - before)
    drafter.pending = []


def drafting_built(drafter):
    """Host time to build one drafting round's graph, nothing evaluated
    while it is built (evaluated, untimed, after)."""
    def step():
        before = drafter.cache[0].offset
        with nothing_started():
            t0 = time.perf_counter()
            rnd = drafter.draft(7)
            dt = time.perf_counter() - t0
        finish_round(drafter, rnd, before)
        return dt
    return step


def drafting_census(drafter) -> Counter:
    """Primitives in one drafting round's graph, by name: every level's,
    counted in what the round evaluates (a device round's tokens; the
    confidence tree's one evaluation at its end) and in what it starts on
    its own (``mx.async_eval``: a level's ranking, a frontier), each node
    once, with no level started before the count; after one round uncounted
    (what a drafter builds once, on its first round, is no round's work)."""
    before = drafter.cache[0].offset
    finish_round(drafter, drafter.draft(7), before)
    seen, asked = Counter(), []

    def counted(*arrays):
        seen.update(primitives(*arrays, *asked))
        asked.clear()
        return _eval(*arrays)

    with nothing_started(asked):
        mx.eval = counted
        try:
            rnd = drafter.draft(7)
        finally:
            mx.eval = counted_eval
        if rnd.device_tokens is not None or asked:
            ends = [rnd.device_tokens] if rnd.device_tokens is not None else []
            seen.update(primitives(*ends, *asked))
    _eval(asked)
    finish_round(drafter, rnd, before)
    return seen


def main():
    ap = argparse.ArgumentParser()
    scaled.add_study_arguments(ap, repeats=9)
    args = ap.parse_args()
    target, draft, what = scaled.study_pair(args)
    scaled.announce(what)
    adapter = adapter_for(target)
    cache = scaled.filled_cache(target, CONTEXT)
    spine = DraftTree(list(range(9)), make_drafter("tree", parents=SPINE).shape)
    fixed = DraftTree(list(range(9)), make_drafter("tree", branching=BRANCHING).shape)
    chain5 = DraftTree.linear(list(range(5)))
    items, refs = {}, {}

    def restore(n):
        trim_prompt_cache(cache, n)

    # -- verify against a plain forward ------------------------------------
    def forward(T):
        def step():
            mx.eval(target(mx.arange(T)[None], cache=cache))
            restore(T)
        return step

    def verify(tree):
        def step():
            mx.eval(adapter.verify(tree, cache))
            restore(len(tree))
        return step

    for T in (1, 5, 9):
        items[f"plain forward T={T}"] = forward(T)
    for name, tree in (("spine of 9", spine), ("[2,1,1,1] (9)", fixed), ("chain of 5", chain5)):
        items[f"verify {name}"] = verify(tree)
        refs[f"verify {name}"] = f"plain forward T={len(tree)}"

    def building(build, n):
        """Host time to build the graph alone; evaluated (untimed) after the
        call, so that no lazy graph piles up across calls."""
        def step():
            t0 = time.perf_counter()
            out = build()
            dt = time.perf_counter() - t0
            _eval(out)
            restore(n)
            return dt
        return step

    timed = {"host graph building, verify of the 9-node spine":
             building(lambda: adapter.verify(spine, cache), 9),
             "host graph building, plain forward of 9":
             building(lambda: target(mx.arange(9)[None], cache=cache), 9)}
    refs["host graph building, verify of the 9-node spine"] = \
        "host graph building, plain forward of 9"

    def after(other, build, n):
        """``building(build, n)``, each call right after the other build's
        call (evaluated, untimed): each is timed where the other ran last,
        as in a decode loop, where neither follows itself, so that the ratio
        can be compared with the back-to-back one (README: no difference
        measured)."""
        first, timed_part = building(other, n), building(build, n)

        def step():
            first()
            return timed_part()
        return step

    spine_build = lambda: adapter.verify(spine, cache)  # noqa: E731
    plain_build = lambda: target(mx.arange(9)[None], cache=cache)  # noqa: E731
    timed["host graph building, spine verify after a plain forward"] = \
        after(plain_build, spine_build, 9)
    timed["host graph building, plain forward after a spine verify"] = \
        after(spine_build, plain_build, 9)
    refs["host graph building, spine verify after a plain forward"] = \
        "host graph building, plain forward after a spine verify"

    def setup_alone():
        """What ``adapter.verify`` does around its forward, without one."""
        owners = adapter.check(spine, cache)
        snapshot(cache)
        with restored_on_error(cache), adapter.injection(cache, spine, owners, 0), \
                capture_written(cache):
            pass

    setup_name = "verify's host work outside its forward (no forward)"
    items[setup_name] = setup_alone
    refs[setup_name] = "host graph building, plain forward of 9"
    graphs = {}
    for name, build in (("verify", lambda: adapter.verify(spine, cache)),
                        ("plain", lambda: target(mx.arange(9)[None], cache=cache))):
        out = build()
        graphs[name] = sum(primitives(out).values())
        _eval(out)
        restore(9)
    g_verify, g_plain = graphs["verify"], graphs["plain"]

    owners = rope_owners(target)
    chain9 = DraftTree.linear(list(range(9)))

    def partly_injected(rope, mask):
        def step():
            fn = ((lambda c, N, w: chain9.mask(c.offset)) if mask == "bool"
                  else (lambda c, N, w: chain9.additive_mask(c.offset, dtype=dtype))
                  if mask == "additive" else (lambda c, N, w: "causal"))
            with injected(target, cache, chain9.depths(), fn, "rope", owners):
                if not rope:  # put the real ropes back: the mask alone
                    for _, owner in owners:
                        owner.rope = owner.rope.inner
                out = target(mx.arange(9)[None], cache=cache)
            mx.eval(out)
            restore(9)
        return step

    dtype = target.model.embed_tokens.weight.dtype
    if not mx.issubdtype(dtype, mx.floating):  # quantized embedding
        dtype = target.model.embed_tokens.scales.dtype
    for rope, mask in ((False, "bool"), (False, "additive"), (True, "causal"), (True, "additive")):
        key = f"9-token forward, per-node rope {'on' if rope else 'off'}, mask {mask}"
        items[key] = partly_injected(rope, mask)
        refs[key] = "plain forward T=9"

    H, D = 32, 64
    q = mx.random.normal((1, H, 9, D)).astype(dtype)
    k = mx.random.normal((1, H, 128, D)).astype(dtype)
    v = mx.random.normal((1, H, 128, D)).astype(dtype)
    bool_mask = chain9.mask(128 - 9)
    additive = chain9.additive_mask(128 - 9, dtype=dtype)
    _eval(q, k, v, bool_mask, additive)
    for name, m in (("causal", "causal"), ("bool", bool_mask), ("additive", additive)):
        key = f"sdpa 9x128, {name} mask"
        items[key] = (lambda m=m: mx.eval(mx.fast.scaled_dot_product_attention(
            q, k, v, scale=D ** -0.5, mask=m)))
        if name != "causal":
            refs[key] = "sdpa 9x128, causal mask"

    # -- drafting one round, per drafter kind --------------------------------
    drafters = {"chain b=5": make_drafter("chain", block=5),
                "chain b=9": make_drafter("chain", block=9),
                "spine (depth 4)": make_drafter("tree", parents=SPINE),
                "[2,1,1,1] (depth 4)": make_drafter("tree", branching=BRANCHING),
                "[2,1,1,1] (depth 4), batch levels": FixedTreeDrafter(branching=BRANCHING,
                                                                     batch_levels=True),
                "confidence n=4 (depth 4)": make_drafter("tree", budget=4),
                "confidence n=8 (depth 8)": make_drafter("tree", budget=8)}
    counts, census = {}, {}
    for name, drafter in drafters.items():
        drafter.start(draft, list(range(CONTEXT)))

        def round_alone(drafter=drafter, name=name):
            before = drafter.cache[0].offset
            e0 = _evals[0]
            rnd = drafter.draft(7)
            counts[name] = (rnd.forwards, _evals[0] - e0)
            finish_round(drafter, rnd, before)

        key = f"drafting round, {name}"
        items[key] = round_alone
        if name != "chain b=5" and name != "chain b=9":
            refs[key] = "drafting round, chain b=9" if "depth 8" in name else \
                "drafting round, chain b=5"
        census[name] = drafting_census(drafter)
        if name in DRAFTING_BUILT:
            key = f"drafting round, host graph building, {name}"
            timed[key] = drafting_built(drafter)
            if name != "chain b=5":
                refs[key] = "drafting round, host graph building, chain b=5"

    # -- commit -------------------------------------------------------------
    commit_evals = {}

    def commit(path, name, buffers=False):
        def step():
            mx.eval(adapter.verify(fixed, cache))
            t0 = time.perf_counter()
            e0 = _evals[0]
            if buffers:  # the rows read from the caches' buffers, as without a capture
                commit_path(cache, CONTEXT, path, fixed)
            else:
                adapter.commit(cache, fixed, path)
            commit_evals[name] = _evals[0] - e0
            _eval([c.state for c in cache])  # the writes it left lazy
            dt = time.perf_counter() - t0
            restore(len(path))
            return dt
        return step

    first_choice = list(range(5))  # the first-choice path: nodes 0..4
    branch = [0, fixed.children(0)[1]]  # the root's second child, then down its chain
    while fixed.children(branch[-1]):
        branch.append(fixed.children(branch[-1])[0])
    commits = {"commit, first-choice path (5 nodes)": commit(first_choice, "first-choice"),
               f"commit, branch {branch}": commit(branch, "branch"),
               f"commit, branch {branch}, rows from the buffers":
               commit(branch, "buffers", buffers=True)}
    timed.update(commits)

    # -- run, interleaved ----------------------------------------------------
    times = interleaved({**items, **timed}, args.repeats, args.calls)
    names = list(times)
    med = {n: statistics.median(v) for n, v in times.items()}
    refs.update({n: "verify [2,1,1,1] (9)" for n in commits})

    def shown(n):
        ref = refs.get(n)
        if ref is None:
            return ""
        return f"  x{ratio(times, n, ref):.3f} {ref}"

    print(f"\nmedians of {args.repeats} interleaved repeats x {args.calls} calls "
          f"(load {os.getloadavg()[0]:.2f} at the end)")
    for n in names:
        extra = ""
        for name, (fw, ev) in counts.items():
            if n == f"drafting round, {name}":
                extra = f"  [{fw} draft forwards, {ev} host evaluations]"
        if n in commits:
            ev = commit_evals["first-choice" if "first-choice" in n
                              else "buffers" if "buffers" in n else "branch"]
            extra = f"  [{ev} host evaluations]"
        print(f"{n:58} {med[n]:8.3f} ms{shown(n)}{extra}")
    print(f"\ngraph primitives, verify of the 9-node spine {g_verify} against a plain 9-token "
          f"forward {g_plain} (x{g_verify / g_plain:.2f})")
    total = {name: sum(c.values()) for name, c in census.items()}
    print("graph primitives, one drafting round (every level's graph, the draft "
          "forwards' included): " + ", ".join(
              f"{name} {n}" + (f" (+{n - total['chain b=5']} over chain b=5)"
                               if "depth 4" in name else "")
              for name, n in total.items()))
    base = census["chain b=5"]
    for name, c in census.items():
        if "depth 4" in name:  # which primitives a depth-4 tree adds, by name
            print(f"  {name} - chain b=5: " + ", ".join(
                f"{k} {v:+d}" for k, v in difference(c, base)))

if __name__ == "__main__":
    main()
