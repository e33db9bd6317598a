"""Contract 7 at the cache level: committing a path of a verified tree leaves
every cache mode exactly as a cache that was fed only that path.

Pure cache operations, no model: a history, then the n tree rows as one
update (what a verify forward does), then ``commit_path``; the reference gets
the same history and then only the path's rows as one update. Every state
array (valid rows) and field, every mask and every later update output must
be identical, bit for bit, also across the sliding window and chunk limits.
"""

import copy

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from suites.rollback.helpers_caches import (
    BUSH,
    MODES,
    assert_same,
    crosses_chunk,
    feed,
    fingerprint,
    observe,
    offset_of,
    rows,
    take,
    tree_and_path,
)
from mlx.utils import tree_map as mx_tree_map
from treespec import caches
from treespec.rollback import RollbackRefused, commit_path, snapshot
from treespec.tree import DraftTree

pytestmark = pytest.mark.exactness

modes = pytest.mark.parametrize("mode", list(MODES.values()), ids=list(MODES))


def align_to_chunk(mode, caches, n, rng):
    """Feed filler rows so a tree of n rows does not straddle a chunk boundary
    (a refused case, pinned by the refusal suite)."""
    c = caches[0]
    off = offset_of(c)
    if crosses_chunk(c, off, n):
        fill = rows(mode, mode.chunk - off % mode.chunk, rng)
        for x in caches:
            feed(x, fill)


def commit_round(mode, ours, ref, tree, path, rng):
    """Verify-like update of all nodes then commit on ``ours``; the path alone
    on ``ref``. Returns the tree rows."""
    align_to_chunk(mode, (ours, ref), len(tree), rng)
    kv = rows(mode, len(tree), rng)
    off, snap = offset_of(ours), snapshot([ours])
    feed(ours, kv)
    assert commit_path([ours], off, path, tree, snapshot=snap) == len(path)
    feed(ref, take(kv, path))
    assert_same(observe(ours), observe(ref), f"after committing {path} of {tree!r}")
    return kv


def continue_both(mode, ours, ref, sizes, rng):
    """Later single- and multi-token updates see the same keys and masks."""
    for size in sizes:
        kv = rows(mode, size, rng)
        assert_same(feed(ours, kv), feed(ref, kv), f"update of {size} after commit")
        assert_same(observe(ours), observe(ref), f"state after an update of {size}")


@modes
@settings(max_examples=25)
@given(
    history=st.lists(st.integers(1, 9), max_size=5),
    rounds=st.lists(tree_and_path(), min_size=1, max_size=4),
    later=st.lists(st.integers(1, 6), max_size=4),
    seed=st.integers(0, 2**16),
)
def test_commit_equals_a_cache_that_only_saw_the_path(mode, history, rounds, later, seed):
    rng = np.random.RandomState(seed)
    ours, ref = mode.make(), mode.make()
    for size in history:
        kv = rows(mode, size, rng)
        feed(ours, kv), feed(ref, kv)
    for tree, path in rounds:
        commit_round(mode, ours, ref, tree, path, rng)
    continue_both(mode, ours, ref, later, rng)


@modes
def test_every_root_path_at_every_offset_around_the_window(mode):
    rng = np.random.RandomState(0)
    for history in range(0, 2 * (mode.window or 8) + 3):
        for node in range(len(BUSH)):
            ours, ref = mode.make(), mode.make()
            if history:
                kv = rows(mode, history, rng)
                feed(ours, kv), feed(ref, kv)
            commit_round(mode, ours, ref, BUSH, BUSH.path_to(node), rng)
            continue_both(mode, ours, ref, [1, 1, 3, 1], rng)


@modes
def test_one_node_tree_is_left_as_the_plain_step_it_was(mode):
    """A 1-node tree took the single-token update path (in place for a
    rotating cache); committing its root changes nothing."""
    rng = np.random.RandomState(1)
    for history in (0, 3, 7, 8, 9, 20):
        ours, ref = mode.make(), mode.make()
        if history:
            kv = rows(mode, history, rng)
            feed(ours, kv), feed(ref, kv)
        commit_round(mode, ours, ref, DraftTree([3], [-1]), [0], rng)
        continue_both(mode, ours, ref, [1, 2, 1], rng)


@modes
@settings(max_examples=20)
@given(
    history=st.integers(0, 30),
    case=tree_and_path(),
    cuts=st.sets(st.integers(1, 9), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_tree_written_in_several_updates_is_committed_exactly_or_refused_untouched(
    mode, history, case, cuts, seed
):
    """A drafter grows its tree over several forwards. Step-allocated caches
    hold the rows in order regardless; a sliding window trims and rotates
    differently, a chunked cache trims its front per forward: those layouts
    must be refused with every cache untouched, never committed wrongly."""
    tree, path = case
    rng = np.random.RandomState(seed)
    ours, ref = mode.make(), mode.make()
    if history:
        kv = rows(mode, history, rng)
        feed(ours, kv), feed(ref, kv)
    align_to_chunk(mode, (ours, ref), len(tree), rng)
    off = offset_of(ours)
    kv, snap = rows(mode, len(tree), rng), snapshot([ours])
    bounds = [0] + sorted(c for c in cuts if c < len(tree)) + [len(tree)]
    for a, b in zip(bounds, bounds[1:]):
        feed(ours, take(kv, range(a, b)))
    before = fingerprint([ours])
    try:
        commit_path([ours], off, path, tree, snapshot=snap)
    except RollbackRefused:
        assert fingerprint([ours]) == before
        return
    feed(ref, take(kv, path))
    assert_same(observe(ours), observe(ref), f"{path} of {tree!r} fed in parts {bounds}")
    continue_both(mode, ours, ref, [1, 3, 1], rng)


trimmable = [name for name, m in MODES.items() if m.trim_agrees]


@pytest.mark.parametrize("name", trimmable)
@settings(max_examples=25)
@given(
    history=st.integers(0, 20),
    n=st.integers(1, 9),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_linear_prefix_commit_equals_mlx_lm_trim(name, history, n, data, seed):
    """On a linear tree, keeping a prefix is what mlx-lm's speculative
    decoding does with ``trim_prompt_cache``: where it can trim, both must
    leave the same visible cache."""
    mode = MODES[name]
    k = data.draw(st.integers(1, n))
    rng = np.random.RandomState(seed)
    ours, trimmed = mode.make(), mode.make()
    align_to_chunk(mode, (ours, trimmed), history + n, rng)
    if history:
        kv = rows(mode, history, rng)
        feed(ours, kv), feed(trimmed, kv)
    off = offset_of(ours)
    if crosses_chunk(ours, off, n):
        return
    tree = DraftTree.linear(list(range(n)))
    kv = rows(mode, n, rng)
    snap = snapshot([ours])
    feed(ours, kv), feed(trimmed, kv)
    if not can_trim_prompt_cache([trimmed]):
        return  # a wrapped rotating cache: mlx-lm cannot, the next tests can
    commit_path([ours], off, list(range(k)), tree, snapshot=snap)
    assert trim_prompt_cache([trimmed], n - k) == n - k
    for size in [0, 1, 2, 1]:
        later = rows(mode, size, rng)
        if size:
            assert_same(feed(ours, later), feed(trimmed, later), "update after trim")
        assert offset_of(ours) == offset_of(trimmed)


def test_concatenate_commit_drops_rows_mlx_lm_trim_leaves_visible():
    """ConcatenateKVCache.trim only moves offset (cache.py:233): the next
    update concatenates after the dropped rows. The commit shortens the
    arrays instead."""
    mode = MODES["concatenate"]
    rng = np.random.RandomState(2)
    ours, trimmed, ref = mode.make(), mode.make(), mode.make()
    hist, kv = rows(mode, 4, rng), rows(mode, 5, rng)
    for c in (ours, trimmed, ref):
        feed(c, hist)
    feed(ours, kv), feed(trimmed, kv), feed(ref, take(kv, [0, 1, 2]))
    commit_path([ours], 4, [0, 1, 2], DraftTree.linear([1] * 5))
    trim_prompt_cache([trimmed], 2)
    later = rows(mode, 1, rng)
    seen_ours, seen_ref, seen_trimmed = (feed(c, later)[0] for c in (ours, ref, trimmed))
    assert_same(seen_ours, seen_ref)
    assert seen_trimmed.shape[2] == 10 != seen_ref.shape[2] == 8


@pytest.mark.parametrize("name", [n for n in MODES if n.startswith("rotating")])
def test_multi_token_update_leaves_the_pre_verify_ring_untouched(name):
    """Why a rotating snapshot may hold references: _update_concat builds new
    arrays (cache.py:462-480), so the ring the 1-node path is rewritten into
    survives the verify of a tree of 2+ nodes."""
    mode = MODES[name]
    rng = np.random.RandomState(3)
    c = mode.make()
    for size in (5, 1, 1, 1, 1, 1, 1, 1):  # wrapped by single-token steps
        feed(c, rows(mode, size, rng))
    before = fingerprint([c.keys, c.values])
    held = (c.keys, c.values)
    feed(c, rows(mode, 4, rng))
    assert fingerprint(list(held)) == before
    assert c.keys is not held[0]


@modes
def test_a_forked_cache_is_each_row_what_its_source_row_would_see_and_the_source_is_untouched(mode):
    """``caches.fork`` (a drafter's branches as batch rows): row i of the
    fork, fed its own next row, gives attention what the source cache would
    give after that row alone, bit for bit; the source is left as it was;
    ``caches.adopt`` of row i makes a copy of the source that cache. Modes
    that do not fork or adopt say so and refuse, naming the class."""
    rng = np.random.RandomState(3)
    c = mode.make()
    feed(c, rows(mode, 11, rng))
    if not caches.forks([c]):
        with pytest.raises(TypeError, match=type(c).__name__):
            caches.fork([c], [0, 0])
        return
    before = fingerprint(c)
    nexts = [rows(mode, 1, rng) for _ in range(3)]
    (fork,) = caches.fork([c], [0, 0, 0])
    seen = feed(fork, tuple(mx.concatenate([kv[i] for kv in nexts]) for i in (0, 1)))
    assert fingerprint(c) == before
    alones = []
    for i, kv in enumerate(nexts):
        alone = copy.deepcopy(c)
        want = feed(alone, kv)
        alones.append(alone)
        assert_same(mx_tree_map(lambda a: a[i:i + 1], seen), want, f"row {i}")
        # Taking the row back: the source as if it had been fed that row.
        back = copy.deepcopy(c)
        if not caches.adopts([back]):
            with pytest.raises(TypeError, match=type(c).__name__):
                caches.adopt([back], [fork], i)
            continue
        caches.adopt([back], [fork], i)
        assert_same(observe(back), observe(alone), f"row {i} adopted")
    # Forks of the fork, rows out of order and repeated (evenly, unevenly):
    # row j continues source row rows2[j].
    for rows2 in ([1, 1, 0, 0, 2, 2], [2, 0, 0, 1]):
        nexts2 = [rows(mode, 1, rng) for _ in rows2]
        (fork2,) = caches.fork([fork], rows2)
        seen2 = feed(fork2, tuple(mx.concatenate([kv[i] for kv in nexts2]) for i in (0, 1)))
        for j, (i, kv) in enumerate(zip(rows2, nexts2)):
            want = feed(copy.deepcopy(alones[i]), kv)
            assert_same(mx_tree_map(lambda a: a[j:j + 1], seen2), want, f"{rows2}: row {j}")
