"""A fixed-shape tree drafted on the device (no host round trip per level)
is the tree the host path drafts: same tokens every round, including rounds
that accept a leaf the draft never fed and rounds cut short by max_tokens.
With ``batch_levels`` the device round feeds a wide level as batch rows of
forked caches (its cache takes one row back) where the host feeds it
through the tree injection into its one; after each commit both hold the
same committed text (each cache a prefix of it, the rest queued), judged by
decoding on from both: byte-identical rows where the backend is exact,
within its envelope elsewhere. Also the ranking every tree drafter's
children come from (``top_ids``, ``top_children``). The confidence tree:
test_confidence_drafting.py."""

from contextlib import nullcontext

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings

from suites.e2e.helpers import deepest_path
from suites.helpers_numerics import check
from suites.helpers_strategies import parent_lists
from suites.verdict import DRAFTING
from suites.verify import helpers
from treespec import caches
from treespec.evidence import numerics
from treespec.draft import DeviceRound, FixedTreeDrafter, top_children, top_ids
from treespec.decoding import decode
from treespec.draft.base import ARGMAX_PASSES
from treespec.errors import OptionError
from treespec.options import DecodeOptions, wide_depth

pytestmark = pytest.mark.exactness

SHAPES = {
    "2x2x1": dict(branching=[2, 2, 1]),
    "3x1": dict(branching=[3, 1]),
    # not in level order: node 3 (depth 2) comes before node 4 (depth 1)
    "parents": dict(parents=[-1, 0, 1, 2, 0, 4, 1]),
}


@pytest.mark.parametrize("on_device", [True, False], ids=["device", "host"])
def test_a_parent_list_is_kept_in_first_choice_order_so_the_probed_shapes_are_the_verified_trees(
        on_device):
    model = helpers.model("llama")
    prompt = list(helpers.tokens(8, seed=2))
    drafter = FixedTreeDrafter(**SHAPES["parents"])
    drafter.on_device = on_device
    drafter.start(model, prompt[:-1])
    # [-1, 0, 1, 2, 0, 4, 1] renumbered in preorder, a node's children in
    # their given order (by hand: old nodes 0, 1, 2, 3, 6, 4, 5)
    assert drafter.shape == [-1, 0, 1, 2, 1, 0, 5]
    probed = set(drafter.probe_shapes())
    for limit in (None, 3):
        rnd = drafter.draft(prompt[-1], limit)
        assert tuple(rnd.tree.parents) in probed
        drafter.commit(rnd, [0])


def fed_as_batch_rows(rnd) -> list:
    """What a device round's draft cache holds, from a host round of the
    same tree (``fed``: node -> its row past the round's offset, -1 for none):
    the host's rows up to the first depth that feeds two or more nodes; from
    there each fed node was a batch row of forked caches, and the caches took
    back the rows of the first row of the last fed depth (its fed ancestors,
    in depth order), numbered on."""
    depths = [int(x) for x in rnd.tree.depths()]
    fed_at = {}
    for i, f in enumerate(rnd.fed):
        if f >= 0:
            fed_at.setdefault(depths[i], []).append(i)
    wide = min((d for d, nodes in fed_at.items() if len(nodes) > 1), default=None)
    if wide is None:
        return list(rnd.fed)
    out = [f if depths[i] < wide else -1 for i, f in enumerate(rnd.fed)]
    node, lineage = fed_at[max(fed_at)][0], []
    while depths[node] >= wide:
        lineage.append(node)
        node = rnd.tree.parents[node]
    kept = sum(f >= 0 for f in out)
    for j, node in enumerate(reversed(lineage)):
        out[node] = kept + j
    return out


@pytest.mark.parametrize("batch_levels", [False, True], ids=["injected", "batch-rows"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_a_tree_drafted_on_the_device_is_the_tree_the_host_drafts(family, shape, batch_levels):
    """The same tree every round and the same fed rows, or with
    ``batch_levels`` (a wide level's nodes as batch rows of forked caches, of
    which the cache takes one row back, where the host feeds them all
    through the tree injection) the host's rows before the first wide level
    and that row's: after each commit both drafters hold the same committed
    text, each cache a prefix of it, the rest of the accepted path queued for
    the next root."""
    model = helpers.model(family)
    prompt = list(helpers.tokens(12, seed=3))
    device, host = FixedTreeDrafter(**shape, batch_levels=batch_levels), FixedTreeDrafter(**shape)
    host.on_device = False
    for d in (device, host):
        d.start(model, prompt[:-1])
    root = prompt[-1]
    widths = set()  # of every forward that wrote the caches so far, in either drafter
    for rnd_no, limit in enumerate([None, None, 2, None, 1, None]):
        a, b = device.draft(root, limit), host.draft(root, limit)
        assert isinstance(a, DeviceRound) and not isinstance(b, DeviceRound)
        assert a.tree == b.tree and a.offset == b.offset
        assert a.fed == (fed_as_batch_rows(b) if batch_levels else b.fed)
        # Alternate between paths to fed nodes and to unfed leaves.
        path = deepest_path(a.tree, last_child=rnd_no % 2 == 1)
        for d, r in ((device, a), (host, b)):
            d.commit(r, path)
        # Each cache holds a prefix of the committed text and queues the
        # rest of the accepted path.
        text = [a.tree.tokens[n] for n in path]
        assert (caches.offset(device.cache) + len(device.pending)
                == caches.offset(host.cache) + len(host.pending))
        for d in (device, host):
            assert d.pending == text[len(text) - len(d.pending):]
        root = text[-1]
        # Decoding on from both (each feeds what it queued with the next
        # root): the same rows for the positions both feed.
        got = helpers.plain_rows(model, helpers.clone(device.cache), device.pending + [root])
        want = helpers.plain_rows(model, helpers.clone(host.cache), host.pending + [root])
        n = min(len(got), len(want))
        widths.update(numerics.widths_of(a.tree, len(device.pending) + 1, len(host.pending) + 1))
        check(got[-n:], want[-n:], model, caches.offset(device.cache) + len(device.pending),
              sorted(widths), DRAFTING, what="the draft caches decoding on",
              mode="device vs host drafting")


class Shapes:
    """The draft model, recording the shape of every input it is fed."""

    def __init__(self, model):
        self.model, self.seen = model, []

    def __call__(self, x, cache=None):
        self.seen.append(tuple(x.shape))
        return self.model(x, cache=cache)


@pytest.mark.parametrize("shape, injected, batch_rows", [
    # (batch rows, tokens) of each draft forward of a round
    (dict(branching=[2, 1, 1, 1]), [(1, 1), (1, 2), (1, 2), (1, 2)],
     [(1, 1), (2, 1), (2, 1), (2, 1)]),
    (dict(branching=[2, 2, 1]), [(1, 1), (1, 2), (1, 4)], [(1, 1), (2, 1), (4, 1)]),
    # a spine: its fed nodes are one chain, in the draft cache itself
    (dict(parents=[-1, 0, 0, 1, 1, 3, 3]), [(1, 1), (1, 1), (1, 1)], [(1, 1), (1, 1), (1, 1)]),
], ids=["2x1x1x1", "2x2x1", "spine"])
def test_a_wide_level_is_one_forward_of_its_nodes_or_with_batch_levels_of_batch_rows(
        shape, injected, batch_rows):
    model = helpers.model("llama")
    prompt = list(helpers.tokens(10, seed=4))
    for batch_levels, fed in ((False, injected), (True, batch_rows)):
        drafter = FixedTreeDrafter(**shape, batch_levels=batch_levels)
        drafter.start(model, prompt[:-1])
        drafter.model = recorder = Shapes(model)
        drafter.draft(prompt[-1])
        assert recorder.seen == fed, batch_levels


def test_batch_levels_is_a_flag_refused_where_the_draft_caches_cannot_fork():
    with pytest.raises(TypeError, match="batch_levels"):
        FixedTreeDrafter(branching=[2, 1], batch_levels="yes")
    # gemma3's sliding-window caches take a tree whole: no level is fed in parts
    drafter = FixedTreeDrafter(branching=[2, 1], batch_levels=True)
    with pytest.raises(ValueError, match="batch_levels: .*RotatingKVCache"):
        drafter.start(helpers.model("gemma3_text"), list(helpers.tokens(6, seed=2)))


@settings(max_examples=30, deadline=None)
@given(parents=parent_lists(min_nodes=2, max_nodes=12))
def test_the_options_refuse_batch_levels_exactly_where_the_drafter_would_fork_no_cache(
        parents, monkeypatch_forks):
    """``batch_levels`` is refused as doing nothing (treespec.options
    ``wide_depth``) for the shapes whose device round forks no cache, and
    only for those: counted at ``caches.fork`` in a real round."""
    forks, model, prompt = monkeypatch_forks
    drafter = FixedTreeDrafter(parents=parents, batch_levels=True)
    drafter.start(model, prompt[:-1])
    del forks[:]
    drafter.draft(prompt[-1])
    assert (len(forks) > 0) == (wide_depth(parents) is not None), (parents, forks)
    with pytest.raises(OptionError, match="nothing to batch") if not forks else nullcontext():
        DecodeOptions(mode="tree", parents=parents, draft_model=True, batch_levels=True).check()


@pytest.fixture(scope="module")
def monkeypatch_forks():
    """(the rows of every caches.fork call, the zoo llama, a prompt), the
    count module-wide (hypothesis runs one test function many times)."""
    with pytest.MonkeyPatch.context() as mp:
        forks, real = [], caches.fork
        mp.setattr(caches, "fork", lambda c, rows: forks.append(tuple(rows)) or real(c, rows))
        yield forks, helpers.model("llama"), list(helpers.tokens(8, seed=3))


def test_batch_levels_over_draft_caches_that_cannot_fork_is_refused_before_decoding():
    """``decode(..., batch_levels=True)`` asks the draft model's caches
    before anything runs (the drafter's start would find it at the first
    round): gemma3's sliding-window caches take a tree whole."""
    model = helpers.model("gemma3_text")
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(model), "__call__",
                   lambda self, *a, _real=type(model).__call__, **k: calls.append(1) or
                   _real(self, *a, **k))
        with pytest.raises(OptionError, match=r"batch_levels: the draft model's caches "
                           r"\(RotatingKVCache\) take a tree whole"):
            decode(model, list(helpers.tokens(6, seed=2)), mode="tree", draft_model=model,
                   branching=[2, 1], batch_levels=True, max_tokens=4)
    assert not calls  # refused before the gate's probe or any forward


@pytest.mark.parametrize("shape, limit, ranked", [
    # (k, rows) per ranking: the root's two fed children, then each level's
    # first choice, then the last level's leaves at the end
    (dict(branching=[2, 1, 1, 1]), None, [(2, 1), (1, 2), (1, 2), (1, 2)]),
    (dict(branching=[1, 3]), None, [(1, 1), (3, 1)]),
    # a spine: an argmax per level, as a chain's; every second choice at once
    (dict(parents=[-1, 0, 0, 1, 1, 3, 3, 5, 5]), None, [(1, 1), (1, 1), (1, 1), (2, 4)]),
    # the first 4 nodes of [2,1,1,1] in first-choice order: a chain of 4
    (dict(branching=[2, 1, 1, 1]), 3, [(1, 1), (1, 1), (1, 1)]),
], ids=["2x1x1x1", "1x3", "spine", "2x1x1x1-cut-to-3"])
def test_a_level_ranks_only_what_the_next_level_feeds_and_every_leaf_is_ranked_once_at_the_end(
        shape, limit, ranked):
    """A device round ranks, per level, only as many children as the next
    level's forward feeds (an argmax where each row feeds its first choice),
    not the shape's widest branching at every level; the children past those
    (leaves) come from one ranking of every row that has them, at the
    round's end. The tree is the host path's all the same (the test above)."""
    model = helpers.model("llama")
    prompt = list(helpers.tokens(8, seed=4))
    device, host = FixedTreeDrafter(**shape), FixedTreeDrafter(**shape)
    host.on_device = False
    for d in (device, host):
        d.start(model, prompt[:-1])
    asked, rank = [], device._device_top

    def counted(logits, k):
        asked.append((k, logits.shape[0]))
        return rank(logits, k)

    device._device_top = counted
    assert device.draft(prompt[-1], limit).tree == host.draft(prompt[-1], limit).tree
    assert asked == ranked


def test_a_round_without_drafts_feeds_what_was_pending_and_the_root():
    """limit 0 (max_tokens reached) takes the host path: the accepted leaf
    the device round never fed must still reach the draft cache."""
    model = helpers.model("llama")
    prompt = list(helpers.tokens(8, seed=1))
    drafter = FixedTreeDrafter(branching=[2, 1])
    drafter.start(model, prompt[:-1])
    rnd = drafter.draft(prompt[-1])
    assert rnd.tree.parents == (-1, 0, 1, 0, 3)  # first-choice order
    drafter.commit(rnd, [0, 1, 2])  # node 2: a leaf the draft never fed
    assert drafter.pending == [rnd.tree.tokens[2]]
    assert caches.offset(drafter.cache) == len(prompt) + 1  # + root and node 1
    tiny = drafter.draft(rnd.tree.tokens[2], limit=0)
    drafter.commit(tiny, [0])
    assert len(tiny.tree) == 1 and drafter.pending == []
    assert caches.offset(drafter.cache) == len(prompt) + 3  # + the leaf and the new root


# Ties and masked rows only where the argmax passes run: the partition above
# ARGMAX_PASSES orders equal values as it finds them.
TOP_IDS_CASES = [(k, row) for k in (1, 2, 3, 4, 5, 40) for row in ("normal", "ties", "masked")
                 if row == "normal" or k <= ARGMAX_PASSES]


@pytest.mark.parametrize("k, row", TOP_IDS_CASES, ids=[f"k{k}-{row}" for k, row in TOP_IDS_CASES])
def test_top_ids_are_the_largest_values_largest_first(k, row):
    """The ranking every tree drafter uses (argmax passes up to
    ARGMAX_PASSES, a partition above), against numpy's stable full sort:
    equal values by lower id, and a row with fewer finite values than k
    (a masked-out vocabulary) still names k distinct ids, its -inf entries
    by lower id; k larger than the row falls back to the whole row."""
    rng = np.random.default_rng(k)
    x = rng.standard_normal((5, 33)).astype(np.float32)
    if row == "ties":
        x = np.round(x).astype(np.float32)  # a handful of values, each many times
    if row == "masked":
        x[:, 2:] = -np.inf  # two finite entries a row
    want = np.argsort(-x, axis=-1, kind="stable")[:, :k]
    assert np.array(top_ids(mx.array(x), k)).tolist() == want.tolist()


def test_children_follow_the_logits_where_the_log_softmax_rounds_them_together():
    """A node's children are its largest float32 logits: two logits a few
    ulps apart far below the log-sum-exp become one log-probability, and a
    ranking by log-probability would put the lower id (the smaller logit)
    first. Their log-probabilities are the full log-softmax's, read at the
    chosen ids, and k = 1 is the argmax of the logits in their own dtype
    (a chain's draft)."""
    # 1e-9 and 2e-9 are distinct float32 logits, both far below half an ulp of the
    # log-sum-exp (about 20): subtracting it rounds them to one value on any backend
    x = np.array([[1e-9, 2e-9, 20.0, -3.0]], dtype=np.float32)
    full = np.array(mx.array(x) - mx.logsumexp(mx.array(x), axis=-1, keepdims=True))
    assert full[0, 0] == full[0, 1]  # the premise: rounded together
    ids, lp = top_children(mx.array(x), 3)
    assert np.array(ids).tolist() == [[2, 1, 0]]
    assert np.array_equal(np.array(lp), np.take_along_axis(full, np.array(ids), axis=-1))
    rng = np.random.default_rng(3)
    for dtype in (mx.bfloat16, mx.float16, mx.float32):
        logits = mx.array(np.round(rng.standard_normal((4, 300)), 1)).astype(dtype)  # ties
        assert np.array(top_children(logits, 1)[0]).ravel().tolist() == \
            np.array(mx.argmax(logits, axis=-1)).tolist()


@pytest.mark.parametrize("shape", [dict(branching=[3, 2, 1]), dict(parents=[-1, 0, 0, 1, 1, 3, 3])],
                         ids=["3x2x1", "spine"])
@pytest.mark.parametrize("on_device", [True, False], ids=["device", "host"])
def test_each_nodes_children_are_the_drafts_best_tokens_best_first(on_device, shape):
    """Against the draft model itself: a plain forward over the prompt and
    the node's path, ranked by numpy. (A spine feeds one node per level: its
    levels continue the draft cache as plain forwards.)"""
    model = helpers.model("llama")
    prompt = list(helpers.tokens(8, seed=4))
    drafter = FixedTreeDrafter(**shape)
    drafter.on_device = on_device
    drafter.start(model, prompt[:-1])
    rnd = drafter.draft(prompt[-1])
    tree = rnd.tree
    for node in range(len(tree)):
        kids = [i for i, p in enumerate(tree.parents) if p == node]
        if not kids:
            continue
        path = [tree.tokens[i] for i in tree.path_to(node)]
        logits = np.array(model(mx.array(prompt[:-1] + path)[None])[0, -1].astype(mx.float32))
        best = np.argsort(-logits, kind="stable")[: len(kids)].tolist()
        assert [tree.tokens[i] for i in kids] == best, f"node {node}"


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3_5"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_on_a_cache_fed_whole_the_device_round_is_the_host_round(family, shape):
    """A sliding-window or recurrent draft cache is put back to the round's
    start before every level and fed the fed tree so far whole, still with
    no host round trip: the same trees and caches as the host path."""
    model = helpers.model(family)
    prompt = list(helpers.tokens(20, seed=3))  # past gemma3's window of 8
    device, host = FixedTreeDrafter(**shape), FixedTreeDrafter(**shape)
    host.on_device = False
    for d in (device, host):
        d.start(model, prompt[:-1])
        assert not d.compacting
    root = prompt[-1]
    for rnd_no, limit in enumerate([None, None, 2, None]):
        a, b = device.draft(root, limit), host.draft(root, limit)
        assert isinstance(a, DeviceRound)
        assert a.tree == b.tree and a.fed == b.fed and a.fed_tree == b.fed_tree
        path = deepest_path(a.tree, last_child=rnd_no % 2 == 1)
        for d, r in ((device, a), (host, b)):
            d.commit(r, path)
        assert device.pending == host.pending
        assert helpers.fingerprint(device.cache) == helpers.fingerprint(host.cache)
        root = a.tree.tokens[path[-1]]
