"""A fixed-shape tree drafted on the device (no host round trip per level)
is the tree the host path drafts: same tokens, same fed nodes, same draft
cache after every commit, round after round, including rounds that accept
a leaf the draft never fed and rounds cut short by max_tokens. The two paths
feed the draft model forwards of different widths, so the draft caches are
byte-identical where the backend is exact and equal within its envelope
(their next logits judged) elsewhere; the trees are identical everywhere."""

import mlx.core as mx
import pytest

from suites.helpers_numerics import check
from suites.verdict import DRAFTING
from suites.verify import helpers
from treespec import caches, numerics
from treespec.draft import DeviceRound, FixedTreeDrafter

pytestmark = pytest.mark.exactness

SHAPES = {
    "2x2x1": dict(branching=[2, 2, 1]),
    "3x1": dict(branching=[3, 1]),
    # not in level order: node 3 (depth 2) comes before node 4 (depth 1)
    "parents": dict(parents=[-1, 0, 1, 2, 0, 4, 1]),
}


@pytest.mark.parametrize("on_device", [True, False], ids=["device", "host"])
def test_a_parent_list_is_kept_in_level_order_so_the_probed_shapes_are_the_verified_trees(
        on_device):
    model = helpers.model("llama")
    prompt = list(helpers.tokens(8, seed=2))
    drafter = FixedTreeDrafter(**SHAPES["parents"])
    drafter.on_device = on_device
    drafter.start(model, prompt[:-1])
    assert drafter.shape == [-1, 0, 0, 1, 2, 1, 3]  # [-1, 0, 1, 2, 0, 4, 1] renumbered
    probed = set(drafter.probe_shapes())
    for limit in (None, 3):
        rnd = drafter.draft(prompt[-1], limit)
        assert tuple(rnd.tree.parents) in probed
        drafter.commit(rnd, [0])


def deepest_path(tree, last_child: bool):
    """A root path to a leaf: always the first (or last) child."""
    path = [0]
    while True:
        kids = [i for i, p in enumerate(tree.parents) if p == path[-1]]
        if not kids:
            return path
        path.append(kids[-1] if last_child else kids[0])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_a_tree_drafted_on_the_device_is_the_tree_the_host_drafts(family, shape):
    model = helpers.model(family)
    prompt = list(helpers.tokens(12, seed=3))
    device, host = FixedTreeDrafter(**shape), FixedTreeDrafter(**shape)
    host.on_device = False
    for d in (device, host):
        d.start(model, prompt[:-1])
    root = prompt[-1]
    for rnd_no, limit in enumerate([None, None, 2, None, 1, None]):
        a, b = device.draft(root, limit), host.draft(root, limit)
        assert isinstance(a, DeviceRound) and not isinstance(b, DeviceRound)
        assert a.tree == b.tree
        assert a.fed == b.fed and a.offset == b.offset
        assert a.fed_tree == b.fed_tree
        # Alternate between paths to fed nodes and to unfed leaves.
        path = deepest_path(a.tree, last_child=rnd_no % 2 == 1)
        for d, r in ((device, a), (host, b)):
            d.commit(r, path)
        assert device.pending == host.pending
        root = a.tree.tokens[path[-1]]
        if helpers.fingerprint(device.cache) != helpers.fingerprint(host.cache):
            # Same layout, always; the bytes are the forwards' numerics.
            assert [c.state[0].shape for c in device.cache] == [c.state[0].shape for c in host.cache]
            offset = caches.offset(device.cache)
            assert offset == caches.offset(host.cache)
            nxt = [root] + list(device.pending)
            got, want = (helpers.plain_rows(model, helpers.clone(d.cache), nxt) for d in (device, host))
            check(got, want, model, offset, numerics.widths_of(a.tree, len(nxt)), DRAFTING,
                  what="the draft caches decoding on", mode="device vs host drafting")


def test_a_round_without_drafts_feeds_what_was_pending_and_the_root():
    """limit 0 (max_tokens reached) takes the host path: the accepted leaf
    the device round never fed must still reach the draft cache."""

    model = helpers.model("llama")
    prompt = list(helpers.tokens(8, seed=1))
    drafter = FixedTreeDrafter(branching=[2, 1])
    drafter.start(model, prompt[:-1])
    rnd = drafter.draft(prompt[-1])
    drafter.commit(rnd, [0, 1, 3])  # node 3: a leaf the draft never fed
    assert drafter.pending == [rnd.tree.tokens[3]]
    assert caches.offset(drafter.cache) == len(prompt) + 1  # + root and node 1
    tiny = drafter.draft(rnd.tree.tokens[3], limit=0)
    drafter.commit(tiny, [0])
    assert len(tiny.tree) == 1 and drafter.pending == []
    assert caches.offset(drafter.cache) == len(prompt) + 3  # + the leaf and the new root


@pytest.mark.parametrize("k", [1, 2, 3, 40])
def test_top_ids_are_the_largest_values_largest_first(k):
    """The ranking every tree drafter uses, against numpy's full sort
    (k larger than the row falls back to the whole row)."""
    import mlx.core as mx
    import numpy as np

    from treespec.draft import top_ids

    x = np.random.default_rng(k).standard_normal((5, 33)).astype(np.float32)
    want = np.argsort(-x, axis=-1, kind="stable")[:, :k]
    assert np.array(top_ids(mx.array(x), k)).tolist() == want.tolist()


@pytest.mark.parametrize("shape", [dict(branching=[3, 2, 1]), dict(parents=[-1, 0, 0, 1, 1, 3, 3])],
                         ids=["3x2x1", "spine"])
@pytest.mark.parametrize("on_device", [True, False], ids=["device", "host"])
def test_each_nodes_children_are_the_drafts_best_tokens_best_first(on_device, shape):
    """Against the draft model itself: a plain forward over the prompt and
    the node's path, ranked by numpy. (A spine feeds one node per level: its
    levels continue the draft cache as plain forwards.)"""
    import mlx.core as mx
    import numpy as np

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
