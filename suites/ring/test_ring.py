"""treespec.ring, the index math of a sliding-window verify, against
mlx-lm's RotatingKVCache itself: keys tagged with their position (and tree
nodes with their index) go through the real cache's one-token steps, and
what each step hands its attention is compared with the ring layout.

A classic one-token step sees ``keys_and_values()`` after its in-place
write, in slot order; the layout must give every node exactly those keys,
in that order, and after a commit the ring must hold what the path's
classic steps left."""

import copy

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import RotatingKVCache

from suites.helpers_strategies import trees
from treespec.ring import committed, layout, ring_of

pytestmark = pytest.mark.exactness


def tagged(tags):
    """Keys/values [1, 1, n, 1] whose only element is the tag (exact in float32)."""
    a = mx.array(np.asarray(tags, dtype=np.float32).reshape(1, 1, -1, 1))
    return a, a


def tags_of(keys) -> list:
    return [int(x) for x in np.array(keys).reshape(-1)]


@st.composite
def histories(draw):
    """A ring and how it got its state: multi-token updates (prefill, or
    mlx-lm's own verify) and one-token steps in any order."""
    size = draw(st.integers(3, 12))
    # up to mlx-lm's own keep: make_prompt_cache's max_kv_size ring keeps 4
    keep = draw(st.integers(0, min(4, size - 2)))
    updates = draw(st.lists(st.integers(1, 2 * size + 2), max_size=6))
    return size, keep, updates


def replay(size, keep, updates):
    c = RotatingKVCache(max_size=size, keep=keep)
    pos = 0
    for n in updates:
        c.update_and_fetch(*tagged(range(pos, pos + n)))
        pos += n
    return c, pos


def ring_from(c):
    stored = 0 if c.keys is None else c.keys.shape[2]
    return ring_of(c.max_size, c.keep, c.offset, stored, c._idx)


def classic_steps(c, tags):
    """What each of len(tags) one-token steps on (a copy of) ``c`` hands its
    attention, and the cache after them."""
    c = copy.deepcopy(c)
    seen = []
    for t in tags:
        k, _ = c.update_and_fetch(*tagged([t]))
        seen.append(tags_of(k))
    return seen, c


@settings(max_examples=120)
@given(histories())
def test_the_ring_is_what_the_next_one_token_step_sees(case):
    size, keep, updates = case
    c, pos = replay(size, keep, updates)
    ring = ring_from(c)
    (seen,), after = classic_steps(c, [-1])
    stored = tags_of(c.keys) if c.keys is not None else []
    ring_tags = [stored[r] for r in ring.rows]
    # the step writes its key into slot idx of the ring it sees
    expect = list(ring_tags)
    expect[ring.idx:ring.idx + 1] = [-1]
    assert seen == expect
    assert list(ring.positions()) == ring_tags  # tags are positions
    assert ring.offset == pos


@settings(max_examples=60)
@given(histories(), trees(max_nodes=14), st.data())
def test_every_node_sees_its_classic_steps_keys_in_their_order(case, tree, data):
    size, keep, updates = case
    c, pos = replay(size, keep, updates)
    ring = ring_from(c)
    stored = tags_of(c.keys) if c.keys is not None else []
    lay = layout(ring, tree.depths(), tree.parents)
    # column -> tag: ring slots carry positions, node i carries -(i + 1)
    col_tag = [stored[r] for r in ring.rows] + [-(i + 1) for i in range(len(tree))]
    for i in range(len(tree)):
        path = tree.path_to(i)
        seen, _ = classic_steps(c, [-(a + 1) for a in path])
        got = [col_tag[col] for col, see in zip(lay.order, lay.mask[i]) if see]
        assert got == seen[-1], f"node {i} (path {path})"


@settings(max_examples=60)
@given(histories(), trees(max_nodes=14), st.data())
def test_a_commit_leaves_the_ring_its_paths_classic_steps_leave(case, tree, data):
    size, keep, updates = case
    c, _ = replay(size, keep, updates)
    ring = ring_from(c)
    stored = tags_of(c.keys) if c.keys is not None else []
    lay = layout(ring, tree.depths(), tree.parents)
    col_tag = [stored[r] for r in ring.rows] + [-(i + 1) for i in range(len(tree))]
    node = data.draw(st.integers(0, len(tree) - 1))
    path = tree.path_to(node)
    rows, idx = committed(lay, path)
    _, after = classic_steps(c, [-(a + 1) for a in path])
    visible, _ = after.keys_and_values() if after.keys is not None else (None, None)
    assert [col_tag[lay.order[r]] for r in rows] == tags_of(visible)
    assert idx == after._idx


@pytest.mark.parametrize("window", [2, 3, 5])
@settings(max_examples=40)
@given(updates=st.lists(st.integers(1, 14), max_size=5), tree=trees(max_nodes=10))
def test_a_narrower_window_hides_what_the_one_token_mask_hides(window, updates, tree):
    """RotatingKVCache.make_mask(1, window_size) for a window narrower than
    the ring: the visible slots of each node's classic step."""
    size = 8
    c, _ = replay(size, 0, updates)
    ring = ring_from(c)
    stored = tags_of(c.keys) if c.keys is not None else []
    lay = layout(ring, tree.depths(), tree.parents, window)
    col_tag = [stored[r] for r in ring.rows] + [-(i + 1) for i in range(len(tree))]
    for i in range(len(tree)):
        d = copy.deepcopy(c)
        for a in tree.path_to(i):
            mask = d.make_mask(1, window_size=window)
            keys, _ = d.update_and_fetch(*tagged([-(a + 1)]))
        tags = tags_of(keys)
        want = tags if mask is None else [t for t, m in zip(tags, np.array(mask).reshape(-1)) if m]
        got = [col_tag[col] for col, see in zip(lay.order, lay.mask[i]) if see]
        assert got == want, f"node {i}"
