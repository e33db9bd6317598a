"""Tree-aware recurrence at the layer level, for every mlx-lm gated-delta
mixer (the model level, every other mixer: suites/families).

Reference: the unmodified mixer run over one node's root path, as a plain
forward, from the same cache state. Outputs and states are compared bit for
bit where the backend is exact, within the mixer's measured envelope
elsewhere (suites/hybrid/helpers.py: treespec.evidence.numerics' rule at the layer
level), with the flattened tree as the negative control; what a commit keeps
(a node's kept state) is compared bit for bit everywhere."""

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import ArraysCache

from suites.hybrid import helpers as H
from suites.helpers_strategies import branching_trees, trees
from suites.verdict import HYBRID_LAYER, ROLLBACK_ROWS, expect
from treespec.evidence import numerics
from treespec.tree import DraftTree
from treespec.errors import TreeRefused
from treespec.verify.tree_recurrence import TreeMixer, tree_mixer_forward

pytestmark = pytest.mark.exactness


def _copy(cache):
    c = ArraysCache(len(cache.cache))
    c.cache = list(cache.cache)
    c.left_padding = None if cache.left_padding is None else mx.array(cache.left_padding)
    c.lengths = None if cache.lengths is None else mx.array(cache.lengths)
    return c


def _plain(m, x, cache):
    """A plain forward as the model makes it: mask from the cache."""
    return m(x, cache.make_mask(x.shape[1]), cache)


def _judge(family, got, want, env, controls=None, what=""):
    return expect(numerics.judge(got, want, env, controls, what), HYBRID_LAYER, family, "float32")


def _flat_control(m, x, cache, refs):
    """The negative control of a branching tree: the unmodified mixer over
    the flattened tree, against the same root-path references."""
    return lambda: {"flattened tree": H._maxdiff(_plain(m, x, _copy(cache))[0], refs)}


def _stack_states(slots_list):
    return [mx.concatenate([s[k] for s in slots_list]) for k in range(len(slots_list[0]))]


@pytest.mark.parametrize("family", H.LAYER_FAMILIES)
@settings(max_examples=80)
@given(tree=trees(max_nodes=24), prefix=st.integers(0, 6), seed=st.integers(0, 2**16))
def test_every_node_equals_a_plain_forward_over_its_root_path(family, tree, prefix, seed):
    m, slots = H.mixer(family)
    cache = H.mixer_cache(m, slots, prefix, seed)
    before = list(cache.cache)
    x = mx.random.normal((1, len(tree), H.D_MODEL), key=mx.random.key(seed + 1))
    out, states = tree_mixer_forward(m, x, tree, cache)
    mx.eval(out, states.arrays())
    assert all(a is b for a, b in zip(cache.cache, before)), "the tree forward wrote the cache"
    refs, ref_states = [], []
    for i in range(len(tree)):
        c = _copy(cache)
        refs.append(_plain(m, x[:, tree.path_to(i)], c)[0, -1])
        ref_states.append(c.cache)
    refs = mx.stack(refs)
    widths = numerics.widths_of(tree)
    env = lambda j: lambda: H.layer_envelopes(family, prefix, widths)[j]
    controls = None if tree.is_linear() else _flat_control(m, x, cache, refs)
    _judge(family, out[0], refs, env(0), controls, "node outputs vs their root paths")
    got = _stack_states([states.node(i) for i in range(len(tree))])
    for k, want in enumerate(_stack_states(ref_states)):
        _judge(family, got[k], want, env(1), None, f"per-node state slot {k} vs its root path")


@pytest.mark.parametrize("family", H.LAYER_FAMILIES)
@settings(max_examples=50)
@given(
    tree=trees(max_nodes=16),
    prefix=st.integers(0, 5),
    seed=st.integers(0, 2**16),
    pick=st.integers(0, 10**6),
    padded=st.booleans(),
    k=st.integers(1, 4),
)
def test_commit_equals_a_cache_that_only_saw_the_path(family, tree, prefix, seed, pick, padded, k):
    m, slots = H.mixer(family)
    cache = H.mixer_cache(m, slots, prefix, seed)
    if padded:  # left padding already consumed: advance must still move it
        cache.left_padding = mx.array([-prefix])
    node = pick % len(tree)
    x = mx.random.normal((1, len(tree), H.D_MODEL), key=mx.random.key(seed + 1))

    ref = _copy(cache)
    _plain(m, x[:, tree.path_to(node)], ref)

    wrapper = TreeMixer(m, tree)
    wrapper(x, cache.make_mask(len(tree)), cache)
    (entry, states), = wrapper.records
    assert entry is cache
    states.write(cache, node)
    # Data movement, every backend: the cache is the node's kept state.
    kept = states.node(node)
    assert all(mx.array_equal(a, b).item() for a, b in zip(cache.cache, kept))
    expect(numerics.Verdict(numerics.BIT_EXACT), ROLLBACK_ROWS, family, "float32 mixer")

    widths = numerics.widths_of(tree, k)
    env = lambda j: lambda: H.layer_envelopes(family, prefix, widths)[j]
    steps = mx.random.normal((k, 1, 1, H.D_MODEL), key=mx.random.key(seed + 2))
    for t in range(k):
        a = _plain(m, steps[t], cache)
        b = _plain(m, steps[t], ref)
        _judge(family, a, b, env(0), None, f"decode step {t} after the commit")
    for j, (a, b) in enumerate(zip(cache.cache, ref.cache)):
        _judge(family, a, b, env(1), None, f"state slot {j} after the commit and {k} steps")


@pytest.mark.parametrize("family", H.LAYER_FAMILIES)
@settings(max_examples=20)
@given(tree=branching_trees(max_nodes=16), prefix=st.integers(0, 5), seed=st.integers(0, 2**16))
def test_a_flattened_tree_through_the_recurrence_is_caught(family, tree, prefix, seed):
    """The unmodified mixer over the flattened tree: every node whose
    flattened predecessor is not its parent starts from the wrong state and
    the wrong conv window. The same comparison that passes the tree-aware
    forward must flag it."""
    m, slots = H.mixer(family)
    cache = H.mixer_cache(m, slots, prefix, seed)
    x = mx.random.normal((1, len(tree), H.D_MODEL), key=mx.random.key(seed + 1))
    flat = _plain(m, x, _copy(cache))[0]
    refs = mx.stack([_plain(m, x[:, tree.path_to(i)], _copy(cache))[0, -1] for i in range(len(tree))])
    env = H.layer_envelopes(family, prefix, numerics.widths_of(tree))[0]
    bad = [i for i in range(len(tree)) if not numerics.judge(flat[i], refs[i], env).ok]
    # Nodes up to the first branch point are a prefix chain and agree.
    first_jump = next(i for i, p in enumerate(tree.parents) if i > 0 and p != i - 1)
    assert bad, "a flattened tree went undetected"
    assert min(bad) == first_jump
    tree_out, _ = tree_mixer_forward(m, x, tree, cache)
    _judge(family, tree_out[0], refs, env, _flat_control(m, x, cache, refs), "the tree-aware forward")


def test_single_node_and_chain_are_plain_forwards():
    m, slots = H.mixer("qwen3_5")
    cache = H.mixer_cache(m, slots, 4, 7)
    x = mx.random.normal((1, 9, H.D_MODEL), key=mx.random.key(8))
    for n in (1, 9):
        tree = DraftTree.linear(list(range(n)))
        ref = _copy(cache)
        want = _plain(m, x[:, :n], ref)
        got, states = tree_mixer_forward(m, x[:, :n], tree, cache)
        env = lambda j: lambda: H.layer_envelopes("qwen3_5", 4, (n,))[j]
        _judge("qwen3_5", got, want, env(0), None, f"a chain of {n} vs the plain forward")
        c = _copy(cache)
        states.write(c, n - 1)
        for j, (a, b) in enumerate(zip(c.cache, ref.cache)):
            _judge("qwen3_5", a, b, env(1), None, f"state slot {j} after a chain of {n}")


def test_commit_validates_before_writing():
    m, slots = H.mixer("qwen3_5")
    cache = H.mixer_cache(m, slots, 3, 1)
    tree = DraftTree([1, 2, 3], [-1, 0, 0])
    x = mx.random.normal((1, 3, H.D_MODEL), key=mx.random.key(2))
    _, states = tree_mixer_forward(m, x, tree, cache)
    before = list(cache.cache)
    with pytest.raises(IndexError):
        states.write(cache, 3)
    assert all(a is b for a, b in zip(cache.cache, before))


@pytest.mark.parametrize(
    "mode", ["lengths", "left_padding", "batch"], ids=["right-padded", "left-padded", "batch2"]
)
def test_padded_or_batched_caches_are_refused_untouched(mode):
    m, slots = H.mixer("qwen3_5")
    cache = H.mixer_cache(m, slots, 3, 1)
    if mode == "lengths":
        cache.lengths = mx.array([5])
    elif mode == "left_padding":
        cache.left_padding = mx.array([2])
    else:
        cache.cache = [mx.concatenate([a, a]) for a in cache.cache]
    snap = _copy(cache)
    tree = DraftTree([1, 2, 3], [-1, 0, 0])
    x = mx.random.normal((1, 3, H.D_MODEL), key=mx.random.key(2))
    with pytest.raises(TreeRefused) as err:
        TreeMixer(m, tree)(x, None, cache)
    assert "refused" in str(err.value) or "batch size" in str(err.value)
    assert H.same_arrays_cache(cache, snap)
