"""Tree verify of whole hybrid models (zoo qwen3_5 and qwen3_next): one
flattened forward, attention layers given the tree mask and depth positions
by the verify adapter, every gated-delta layer swapped for the tree-aware
recurrence. Compared bit for bit with plain forwards over root paths."""

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import ArraysCache

from suites.hybrid import helpers as H
from suites.helpers_strategies import branching_trees, trees
from treespec.verify import adapter_for
from treespec.verify.footprint import footprint_breakdown
from treespec.verify.recurrence import TreeRecurrence

pytestmark = pytest.mark.exactness

VARIANTS = [
    ("qwen3_5", "float32", None),
    ("qwen3_next", "float32", None),
    ("qwen3_5", "bfloat16", None),
    ("qwen3_5", "float32", 4),
    ("qwen3_next", "float32", 8),
]
IDS = [f"{f}-{d}" + (f"-q{b}" if b else "") for f, d, b in VARIANTS]

prompts = st.lists(st.integers(0, 383), min_size=0, max_size=12)  # 0: empty cache


def _path_tokens(tree, node):
    return [tree.tokens[j] for j in tree.path_to(node)]


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
@settings(max_examples=40)
@given(tree=trees(max_nodes=24), prompt=prompts)
def test_every_node_equals_a_plain_forward_over_its_root_path(variant, tree, prompt):
    model = H.build(*variant)
    cache = H.prefill(model, prompt)
    base = H.snapshot(cache)
    logits = H.verify(model, tree, cache, TreeRecurrence())
    refs = mx.stack([H.path_logits(model, base, _path_tokens(tree, i))[0] for i in range(len(tree))])
    assert H.mismatched(refs, logits) == []


@pytest.mark.parametrize("variant", VARIANTS[:2], ids=IDS[:2])
@settings(max_examples=50)
@given(
    # Kept per-node states exist for branching trees only: a chain goes
    # through the mixer's own multi-token path and commit replays it
    # (suites/rollback pins that path).
    tree=branching_trees(max_nodes=20),
    prompt=prompts,
    pick=st.integers(0, 10**6),
    k=st.integers(1, 4),
)
def test_commit_then_decode_equals_a_model_that_only_saw_the_path(variant, tree, prompt, pick, k):
    model = H.build(*variant)
    cache = H.prefill(model, prompt)
    base = H.snapshot(cache)
    adapter = adapter_for(model, recurrent=TreeRecurrence())
    logits = adapter.verify(tree, cache)
    node = pick % len(tree)
    path = tree.path_to(node)
    # Recurrent layers take the node's kept state (no replay), attention
    # layers gather the path's rows.
    adapter.commit(cache, tree, path)
    want_logits, ref = H.path_logits(model, base, _path_tokens(tree, node))
    assert mx.array_equal(logits[node], want_logits).item()
    for i, (a, b) in enumerate(zip(cache, ref)):
        same = H.same_arrays_cache(a, b) if isinstance(a, ArraysCache) else H.same_kv(a, b)
        assert same, f"layer {i} ({type(a).__name__}) differs from the path-only cache"

    tok = int(mx.argmax(want_logits).item())
    for step in range(k):
        a = model(mx.array([[tok]]), cache=cache)[0, -1]
        b = model(mx.array([[tok]]), cache=ref)[0, -1]
        assert mx.array_equal(a, b).item(), f"decode step {step} differs after commit"
        tok = int(mx.argmax(b).item())


@pytest.mark.parametrize("variant", VARIANTS[:2], ids=IDS[:2])
@settings(max_examples=20)
@given(tree=branching_trees(max_nodes=16), prompt=prompts)
def test_a_flattened_tree_through_the_recurrence_is_caught(variant, tree, prompt):
    """Tree mask and positions right, recurrence fed the flattened tree: the
    same check that passes the tree-aware verify flags it, from the first
    node whose flattened predecessor is not its parent."""
    model = H.build(*variant)
    cache = H.prefill(model, prompt)
    base = H.snapshot(cache)
    flat = H.verify(model, tree, cache, H.Flattened())
    refs = mx.stack([H.path_logits(model, base, _path_tokens(tree, i))[0] for i in range(len(tree))])
    bad = H.mismatched(refs, flat)
    first_jump = next(i for i, p in enumerate(tree.parents) if i > 0 and p != i - 1)
    assert bad and min(bad) == first_jump
    err = max(mx.abs(refs[i] - flat[i]).max().item() for i in bad)
    assert err > 1e-3  # gross, not rounding


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_footprint_is_the_memory_the_states_hold(variant):
    model = H.build(*variant)
    cache = H.prefill(model, [1, 2, 3])
    tree = H.DraftTree([4, 5, 6, 7, 8, 9, 10], [-1, 0, 0, 1, 2, 2, 5])
    adapter = adapter_for(model, recurrent=TreeRecurrence())
    mx.eval(adapter.verify(tree, cache))
    held = sum(a.nbytes for _, states in adapter._last.captures.kept for a in states.arrays())
    assert held == footprint_breakdown(model, len(tree))["total_bytes"]
