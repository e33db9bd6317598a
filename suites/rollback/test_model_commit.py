"""Contract 7 with real models: after a tree verify and a commit, every cache
holds exactly the rows and recurrent states the verify wrote for the accepted
path (data movement: bit for bit on every backend), and the next decode steps
(single- and multi-token) give the logits of a cache that only ever saw the
accepted path (bit for bit on the CPU reference BLAS, within the measured
envelope elsewhere).

Every zoo family in every cache mode it runs in: its own caches (KVCache,
gemma's sliding windows, qwen3.5/next's GatedDeltaNet states), a sliding
window in place of each full KVCache (keep 0, and mlx-lm's max_kv_size keep
4), ConcatenateKVCache, and a QuantizedKVCache of 4 and 8 bits.
"""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from suites.helpers_numerics import check, exact
from suites.rollback.helpers_caches import BUSH, fingerprint, observe, tree_and_path
from suites.rollback.helpers_models import (
    OTHER_RECURRENT,
    RECURRENT,
    SETUPS,
    applicable,
    assert_same_where_exact,
    make_caches,
    model,
    prefill,
    rounds_then_decode,
    tiny,
)
from suites.verdict import ROLLBACK_DECODE, ROLLBACK_ROWS
from treespec.evidence import numerics
from treespec import zoo
from treespec.audit.movement import mismatches, moved, recorded
from treespec.audit.states import clone
from treespec.bench.graph_census import primitives
from treespec.rollback import capture_recurrent_inputs, commit_path, snapshot
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

CASES = [(f, s) for f in zoo.FAMILIES for s in SETUPS if applicable(f, s)]
cases = pytest.mark.parametrize("family,setup", CASES, ids=[f"{f}-{s}" for f, s in CASES])

HISTORY = list(range(40, 60))  # 20 tokens: past every window of the zoo (8, 12, 16)
LATER = [[3], [7], [11, 12, 13], [5], [9, 2]]
TOKENS = st.integers(0, zoo.VOCAB_SIZE - 1)


CHAIN = DraftTree.linear([21, 22, 23, 24, 25])


@cases
@pytest.mark.parametrize("history", [3, 20], ids=["short", "wrapped"])
def test_next_steps_match_a_model_that_only_saw_the_path(family, setup, history):
    # A chain goes through the recurrent layers as a plain sequence (they
    # write their states); a branching tree through the tree-aware
    # recurrence (it writes none): the replay must be right after both.
    for tree in (CHAIN, BUSH):
        for node in sorted({0, int(np.argmax(tree.depths())), 2}):
            rounds = [(tree, tree.path_to(node))]
            rounds_then_decode(family, setup, HISTORY[:history], rounds, LATER)


@pytest.mark.parametrize(
    "family",
    [f"{f}/{d}" for f in ("llama", "gemma3_text", "qwen3_5") for d in ("float16", "bfloat16")],
)
def test_half_precision_caches_commit_exactly(family):
    """KVCache, sliding windows and recurrent states holding float16 and
    bfloat16 activations."""
    for history in (3, 20):
        for node in (0, 2, 6):
            rounds = [(BUSH, BUSH.path_to(node))]
            rounds_then_decode(family, "native", HISTORY[:history], rounds, LATER)


@cases
@settings(max_examples=5)
@given(
    history=st.integers(1, 20),
    rounds=st.lists(tree_and_path(max_nodes=7), min_size=1, max_size=3),
    later=st.lists(st.lists(TOKENS, min_size=1, max_size=3), max_size=3),
)
def test_rounds_of_random_trees_then_decode(family, setup, history, rounds, later):
    rounds_then_decode(family, setup, HISTORY[:history], rounds, later or [[1]])


@pytest.mark.parametrize("family", RECURRENT)
def test_recurrent_snapshot_holds_references_the_forward_never_writes(family):
    """The GatedDeltaNet replaces its cache slots (cache[0] = ..., cache[1] =
    ...) and never writes into the old arrays: references are a snapshot."""
    m, caches = model(family), make_caches(family, "native")
    prefill(family, "native", caches, HISTORY[:5])
    recurrent_caches = [c for c in caches if hasattr(c, "cache")]
    held = [list(c.cache) for c in recurrent_caches]
    snap = snapshot(caches)
    before = fingerprint(held)
    m(mx.array([[1, 2, 3]]), cache=caches)
    assert fingerprint(held) == before
    assert fingerprint([e.state[0] for e in snap.entries if e.cls is ArraysCache]) == before
    for c, slots in zip(recurrent_caches, held):
        assert all(new is not old for new, old in zip(c.cache, slots))


@pytest.mark.parametrize("family", RECURRENT)
def test_capture_puts_every_mixer_back_even_on_error(family):
    m = model(family)
    before = [dict(layer.children()) for layer in m.layers]
    with pytest.raises(RuntimeError):
        with capture_recurrent_inputs(m) as captures:
            m(mx.array([[1, 2]]), cache=make_caches(family, "native"))
            recurrent_layers = sum(hasattr(c, "cache") for c in make_caches(family, "native"))
            assert len(captures.calls) == recurrent_layers
            raise RuntimeError("boom")
    after = [dict(layer.children()) for layer in m.layers]
    assert all(a[k] is b[k] for a, b in zip(before, after) for k in a)


@pytest.mark.parametrize("family", list(OTHER_RECURRENT))
@pytest.mark.parametrize("k", [1, 3, 5])
def test_other_recurrent_families_commit_a_prefix_of_a_chain(family, k):
    """The capture finds any mixer that takes the recurrent cache (mamba's
    and mamba2's ``mixer``, lfm2's ``conv``) and the replay rebuilds its
    state: exactly an independent replay of the captured inputs (every
    backend), and the cache and logits of a model fed only the prefix (bit
    for bit where the backend is exact, within its envelope elsewhere)."""
    m, chain = tiny(family), [20, 21, 22, 23, 24]
    ours, ref = make_prompt_cache(m), make_prompt_cache(m)
    for c in (ours, ref):
        m(mx.array([list(range(3, 12))]), cache=c)
    pre, snap = clone(ours), snapshot(ours)
    with recorded(ours) as writes, capture_recurrent_inputs(m) as captures:
        m(mx.array([chain]), cache=ours)
    path = list(range(k))
    commit_path(ours, 9, path, DraftTree.linear(chain), snapshot=snap, recurrent=captures)
    bad = mismatches(ours, moved(pre, writes, path, len(chain), captures, ours))
    assert not bad, f"not the verify's own rows and an independent replay: {bad}"
    exact(ROLLBACK_ROWS, m, "native")
    m(mx.array([chain[:k]]), cache=ref)
    widths, offset = {len(chain), k}, 9 + k
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert_same_where_exact(observe(a), observe(b), lambda: numerics.envelope(m, offset, widths),
                                f"layer {i}")
    for step in ([5], [6, 7], [8]):
        x = mx.array([step])
        widths.add(len(step))
        check(m(x, cache=ours), m(x, cache=ref), m, offset, widths, ROLLBACK_DECODE,
              what=f"logits on {step}", mode="native")
        offset += len(step)


@pytest.mark.parametrize("rows_from", ["written", "buffer"])
def test_a_branch_commit_copies_no_cache_buffer(rows_from, monkeypatch):
    """Moving a branch's rows costs its rows, not the context: the writes
    take every layer's buffer in place when the next forward evaluates them
    (a read of the buffer still pending then makes each write copy the whole
    buffer first: with the reads left lazy, all four buffers here). Rows
    read from what the verify wrote (``TreeAdapter.commit``) need no
    evaluation at all; rows read from the buffers (``commit_path`` alone, or
    a cache mode without a capture) need one, before any write."""
    m = model("llama")
    adapter = adapter_for(m)
    cache = make_prompt_cache(m)
    context = 3000
    m(mx.array([i % zoo.VOCAB_SIZE for i in range(context)])[None], cache=cache)
    mx.eval([c.state for c in cache])
    mx.eval(adapter.verify(BUSH, cache))
    path = BUSH.path_to(6)  # [0, 2, 5, 6]: every row past the root moves
    evaluations, real = [0], mx.eval

    def counting(*args, **kwargs):
        evaluations[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(mx, "eval", counting)
    if rows_from == "written":
        adapter.commit(cache, BUSH, path)
    else:
        commit_path(cache, context, path, BUSH)
    monkeypatch.setattr(mx, "eval", real)
    assert evaluations[0] == (0 if rows_from == "written" else 1)
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    mx.eval([c.state for c in cache])
    extra = max(mx.get_peak_memory() - before, 0)
    assert extra < cache[0].keys.nbytes // 4, (extra, cache[0].keys.nbytes)
    assert all(c.offset == context + len(path) for c in cache)


# BUSH in node order: [0, 1, 4] moves node 4 alone (one slice per array);
# [0, 2, 5, 6] moves 2, 5, 6, which are not consecutive rows (a gather each).
@pytest.mark.parametrize("path, gathers", [([0, 1, 4], 0), ([0, 2, 5, 6], 1)])
def test_a_branch_of_consecutive_nodes_moves_its_rows_without_a_gather(path, gathers):
    """The rows a branch commit moves are read as one slice of what the
    verify wrote when its moved nodes are consecutive in the verified block
    (in first-choice order, every branch that leaves the first choices once),
    else gathered: counted in the commit's lazy graph, and the committed
    rows checked against the verify's own rows read off the buffer first."""
    m = model("llama")
    adapter = adapter_for(m)
    cache = make_prompt_cache(m)
    context = 20
    m(mx.array([list(range(1, context + 1))]), cache=cache)
    mx.eval([c.state for c in cache])
    mx.eval(adapter.verify(BUSH, cache))
    verified = [(np.array(c.keys[..., context:context + len(BUSH), :]),
                 np.array(c.values[..., context:context + len(BUSH), :])) for c in cache]
    adapter.commit(cache, BUSH, path)
    written = [a for c in cache for a in (c.keys, c.values)]
    assert primitives(*written)["Gather"] == gathers * len(written)
    mx.eval(written)
    for c, (keys, values) in zip(cache, verified):
        assert c.offset == context + len(path)
        np.testing.assert_array_equal(np.array(c.keys[..., context:context + len(path), :]),
                                      keys[..., path, :])
        np.testing.assert_array_equal(np.array(c.values[..., context:context + len(path), :]),
                                      values[..., path, :])
