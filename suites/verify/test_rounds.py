"""The adapter inside a speculative round: verify, commit the accepted path
(through treespec.rollback, with what verify recorded), decode on; a tree fed
in parts (a drafter growing it level by level); the recurrent hook."""

import mlx.core as mx
import pytest

from suites.helpers_numerics import check, exact
from suites.verdict import ROLLBACK_DECODE, ROLLBACK_ROWS
from suites.verify import helpers
from suites.verify.helpers import HYBRID, History, classic, clone, plain_rows, assert_rows_are_root_path_forwards, assert_refused_untouched
from treespec import caches, zoo
from treespec.evidence import numerics
from treespec.audit.movement import mismatches, moved, recorded
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify.tree_recurrence import TreeRecurrence

pytestmark = pytest.mark.exactness


def _trees(family):
    if family in HYBRID:
        return {"chain-5": helpers.linear_trees(family)["chain-5"]}
    return helpers.branching_trees(family)


def _cases():
    for family in zoo.FAMILIES:
        hists = helpers.histories(family)
        for hist in (hists[1], hists[3], hists[4]):
            for name, tree in _trees(family).items():
                for leaf in sorted({1, tree.leaves()[0], len(tree) - 1}):
                    yield pytest.param(
                        family, hist, tree, leaf,
                        id=f"{family}-h{hist.offset}{'s' if hist.steps else ''}-{name}-to{leaf}",
                    )


@pytest.mark.parametrize("family, hist, tree, node", list(_cases()))
def test_after_commit_decoding_continues_as_if_only_the_path_was_fed(family, hist, tree, node):
    """Commit the root path to ``node``: every cache then holds exactly the
    rows (and recurrent states) the verify wrote for the path, on every
    backend; and the next two steps give the logits of a cache that saw the
    history, then the path as one forward (on a sliding-window ring: one
    token at a time, as classic decoding feeds it), bit for bit where the
    backend is exact, within its envelope elsewhere."""
    model = helpers.model(family)
    adapter = adapter_for(model)
    cache = hist.replay(model)
    offset = caches.offset(cache)
    pre = clone(cache)
    with recorded(cache) as writes:
        adapter.verify(tree, cache)
    captures = adapter._last.captures
    path = tree.path_to(node)
    assert adapter.commit(cache, tree, path, offset) == len(path)
    bad = mismatches(cache, moved(pre, writes, path, len(tree), captures, cache))
    assert not bad, f"the commit of {path} left other rows than the verify wrote: {bad}"
    exact(ROLLBACK_ROWS, model, "native")
    path_tokens = [tree.tokens[j] for j in path]
    ref = hist.replay(model)
    classic(model, ref, path_tokens)
    widths = numerics.widths_of(tree, len(path))
    for t in helpers.tokens(2, 21):
        check(plain_rows(model, cache, [t]), plain_rows(model, ref, [t]), model, offset + len(path),
              widths, ROLLBACK_DECODE, what="next step after the commit", mode="native")


@pytest.mark.parametrize("shape", ["bushy", "linear"])
@pytest.mark.parametrize(
    "family, kv_bits", [("llama", None), ("qwen3", None), ("qwen3", 8)],
    ids=["llama", "qwen3", "qwen3-kv8"],
)
def test_a_tree_fed_in_parts_verifies_as_if_fed_whole(family, kv_bits, shape):
    """A drafter grows its tree level by level: verify(tree, start=s) feeds
    nodes s.. on top of nodes 0..s-1 already in the cache. Every row is still
    the node's root-path forward. A linear tree (a spine's fed nodes) goes
    through as a plain forward."""
    model = helpers.model(family)
    adapter = adapter_for(model)
    if shape == "bushy":
        tree, stops = helpers.branching_trees(family)["bushy"], (1, 3, 7)  # its level boundaries
    else:
        tree, stops = DraftTree.linear(helpers.tokens(6, 4)), (1, 2, 4)
    hist = History(helpers.tokens(6, 3), (), kv_bits)
    cache = hist.replay(model)
    before = clone(cache)
    rows, start = [], 0
    for stop in stops + (len(tree),):
        part = DraftTree(tree.tokens[:stop], tree.parents[:stop])
        rows.append(adapter.verify(part, cache, start=start))
        start = stop
    logits = mx.concatenate(rows, axis=0)
    assert_rows_are_root_path_forwards(model, before, tree, logits)


def test_feeding_a_tree_in_parts_is_refused_on_a_rotating_window():
    model = helpers.model("gemma3_text")
    adapter = adapter_for(model)
    tree = helpers.branching_trees("gemma3_text")["fan"]
    cache = helpers.history(3).replay(model)
    adapter.verify(DraftTree(tree.tokens[:1], tree.parents[:1]), cache)
    assert_refused_untouched(adapter, tree, cache, "fed in parts", start=1)


@pytest.mark.parametrize("family", HYBRID)
def test_a_registered_tree_recurrence_lifts_the_branching_refusal(family):
    """The hook: a strategy that can carry a tree through the recurrence
    (treespec.verify.tree_recurrence) replaces ChainOnly for one adapter."""

    model = helpers.model(family)
    adapter = adapter_for(model, recurrent=TreeRecurrence())
    tree = helpers.branching_trees(family)["two-chains"]
    cache = helpers.histories(family)[1].replay(model)
    before = clone(cache)
    assert_rows_are_root_path_forwards(model, before, tree, adapter.verify(tree, cache))
