"""Rollback through an explicit verify handle, and the plain mode's trim.

``TreeAdapter.verify_handle`` returns the verify's :class:`Verified`, which
``commit(..., verified=)`` takes; the old call order (``verify`` then
``commit(cache, tree, path)``) commits the same handle, kept by the adapter.
Pinned here: both orders leave the same caches, bit for bit, in every cache
mode a model verifies in; a handle that is stale (committed, overtaken by a
later verify, of caches written since, of another adapter) is refused naming
the argument, every cache untouched; and the plain modes' commit of a prefix
of the node order is their trim (nothing gathered), leaving what the path
alone leaves, as the gather of a branch does.
"""

import mlx.core as mx
import numpy as np
import pytest

from suites.rollback.helpers_caches import (
    BUSH,
    MODES,
    assert_same,
    feed,
    fingerprint,
    observe,
    offset_of,
    rows,
    take,
)
from suites.rollback.helpers_models import make_caches, model, prefill
from treespec import caches
from treespec.rollback import RollbackRefused, commit_path, snapshot
from treespec.rows import Tail
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

HISTORY = list(range(40, 60))  # 20 tokens: past every window of the zoo (8, 12, 16)
CHAIN = DraftTree.linear([21, 22, 23, 24, 25])
# Rounds in sequence on one cache list: a branch whose rows move, a prefix
# of a chain (a trim on plain caches), a root-only path (a ring's rewrite).
ROUNDS = [(BUSH, BUSH.path_to(6)), (CHAIN, [0, 1, 2]), (BUSH, [0]), (BUSH, BUSH.path_to(4))]

# Every cache mode a model verifies in (ChunkedKVCache is refused by the
# verify itself; it and CacheList are committed at the cache level below
# and in test_cache_commit.py): (family, setup) -> what it covers.
SETUPS = {
    ("llama", "native"): "KVCache",
    ("qwen3", "quantized-4bit-g32"): "QuantizedKVCache 4-bit",
    ("qwen3", "quantized-8bit-g32"): "QuantizedKVCache 8-bit",
    ("llama", "concatenate"): "ConcatenateKVCache",
    ("llama", "rotating-w12"): "RotatingKVCache",
    ("llama", "rotating-w12-keep4"): "RotatingKVCache keep 4",
    ("gemma3_text", "native"): "KVCache + RotatingKVCache",
    ("qwen3_5", "native"): "KVCache + ArraysCache",
}


def _state(cache) -> list:
    """Every array (whole buffers) and field of every cache, as bytes: two
    cache lists in the same state have equal states (unlike
    ``fingerprint``, no object identity enters)."""
    return [(type(c).__name__, fingerprint(vars(c))) for _, c in caches.leaves(cache)]


def _caches(family, setup):
    cache = make_caches(family, setup)
    prefill(family, setup, cache, HISTORY)
    return cache


@pytest.mark.parametrize("family, setup", list(SETUPS), ids=list(SETUPS.values()))
def test_the_handle_and_the_old_call_order_leave_the_same_caches(family, setup):
    """Round after round, ``commit(cache, tree, path, verified=handle)``
    after ``verify_handle`` and ``commit(cache, tree, path)`` after
    ``verify`` leave every array and field the same, bit for bit, and the
    verifies return the same logits."""
    m = model(family)
    adapter = adapter_for(m)
    old, new = _caches(family, setup), _caches(family, setup)
    for tree, path in ROUNDS:
        logits = adapter.verify(tree, old)
        assert adapter.commit(old, tree, path) == len(path)
        verified = adapter.verify_handle(tree, new)
        assert adapter.commit(new, tree, path, verified=verified) == len(path)
        assert mx.array_equal(verified.logits, logits).item(), f"logits of {tree!r}"
        assert _state(new) == _state(old), f"after committing {path} of {tree!r}"
        assert adapter.last_verified is None


def _stale_committed(adapter, cache, other):
    verified = adapter.verify_handle(BUSH, cache)
    adapter.commit(cache, BUSH, [0, 2], verified=verified)
    return verified, "verified: a stale handle: it was committed already"


def _stale_overtaken(adapter, cache, other):
    verified = adapter.verify_handle(BUSH, cache)
    adapter.verify(CHAIN, other)  # another cache list, through the same adapter
    return verified, "verified: a stale handle: a later verify of this adapter came since"


def _stale_written(adapter, cache, other):
    verified = adapter.verify_handle(BUSH, cache)
    adapter.model(mx.array([[3]]), cache=cache)  # a plain step on the verified caches
    return verified, "cache: the caches were written since the verify"


def _stale_other_adapter(adapter, cache, other):
    verified = adapter_for(adapter.model).verify_handle(BUSH, other)
    adapter.verify(BUSH, cache)
    return verified, "verified: the handle of another adapter's verify"


STALE = {
    "committed already": _stale_committed,
    "a later verify": _stale_overtaken,
    "caches written since": _stale_written,
    "another adapter's handle": _stale_other_adapter,
}


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@pytest.mark.parametrize("case", list(STALE))
def test_a_stale_handle_is_refused_naming_it_and_every_cache_is_untouched(family, case):
    m = model(family)
    adapter = adapter_for(m)
    cache, other = _caches(family, "native"), _caches(family, "native")
    verified, reason = STALE[case](adapter, cache, other)
    mx.eval([c.state for c in cache + other])
    before = fingerprint([cache, other])
    with pytest.raises(RollbackRefused) as info:
        adapter.commit(cache, BUSH, BUSH.path_to(6), verified=verified)
    assert fingerprint([cache, other]) == before
    assert reason in str(info.value)


def test_a_handle_of_another_cache_list_or_tree_is_refused_naming_the_argument():
    adapter = adapter_for(model("llama"))
    cache, other = _caches("llama", "native"), _caches("llama", "native")
    verified = adapter.verify_handle(BUSH, cache)
    mx.eval([c.state for c in cache])
    before = fingerprint([cache, other])
    for args, named in (((other, BUSH), "cache:"), ((cache, CHAIN), "tree:")):
        with pytest.raises(RollbackRefused, match=named):
            adapter.commit(*args, [0, 1], verified=verified)
    with pytest.raises(TypeError, match="verified must be a Verified"):
        adapter.commit(cache, BUSH, [0, 1], verified=adapter.last_verified.snapshot)
    assert fingerprint([cache, other]) == before
    # Still the latest verify: it commits.
    assert adapter.commit(cache, BUSH, [0, 2, 5], verified=verified) == 3


PLAIN = [name for name in MODES if name.startswith(("kv-", "quantized-", "chunked-"))]


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("tree", [BUSH, CHAIN], ids=["bush", "chain"])
def test_a_prefix_of_the_node_order_is_the_plain_modes_trim_and_leaves_what_the_path_alone_does(
        name, tree):
    """On the appending modes a path that is a prefix of the node order
    plans mlx-lm's trim (no row gathered, nothing to read), any other path
    a gather of its moved rows; either way the cache is, field for field and
    row for row, a cache that took the path's rows as one-token steps
    (mlx-lm's own update, one row at a time)."""
    mode = MODES[name]
    rng = np.random.RandomState(5)
    for node in range(len(tree)):
        path = tree.path_to(node)
        ours, ref = mode.make(), mode.make()
        history = rows(mode, 6, rng)
        feed(ours, history), feed(ref, history)
        off, snap = offset_of(ours), snapshot([ours])
        kv = rows(mode, len(tree), rng)
        feed(ours, kv)
        plan = caches.plan_commit(ours, (0,), Tail(off, tree.parents, np.array(path)),
                                  snap.entries[0], None)
        prefix = path == list(range(len(path)))
        assert (plan.rows is None and not plan.reads) == prefix, (path, plan)
        commit_path([ours], off, path, tree, snapshot=snap)
        for p in path:
            feed(ref, take(kv, [p]))
        assert_same(observe(ours), observe(ref), f"{name}: {path} of {tree!r}")
