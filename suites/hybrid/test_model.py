"""Tree verify of whole hybrid models (zoo qwen3_5 and qwen3_next): one
flattened forward, attention layers given the tree mask and depth positions
by the verify adapter, every gated-delta layer swapped for the tree-aware
recurrence. Compared with plain forwards over root paths: bit for bit where
the backend is exact, within its measured envelope elsewhere (the tree's own
negative controls separating); what a commit keeps, bit for bit everywhere."""

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import ArraysCache

from suites.helpers_numerics import check, exact
from suites.hybrid import helpers as H
from suites.verify.helpers import assert_rows_are_root_path_forwards
from suites.helpers_strategies import branching_trees, trees
from suites.verdict import ROLLBACK_DECODE, ROLLBACK_ROWS, VERIFY
from treespec.evidence import numerics
from treespec.audit.movement import mismatches, moved, recorded
from treespec.audit.states import clone
from treespec.verify import adapter_for
from treespec.verify.footprint import footprint_breakdown
from treespec.verify.tree_recurrence import TreeRecurrence

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


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
@settings(max_examples=40)
@given(tree=trees(max_nodes=24), prompt=prompts)
def test_every_node_equals_a_plain_forward_over_its_root_path(variant, tree, prompt):
    model = H.build(*variant)
    cache = H.prefill(model, prompt)
    base = H.snapshot(cache)
    logits = H.verify(model, tree, cache, TreeRecurrence())
    # The tree-node contract's one judgement for every family (the same-width
    # reference, isolation, the leak proof: suites/verify/helpers.py).
    assert_rows_are_root_path_forwards(model, base, tree, logits)


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
    base, pre = H.snapshot(cache), clone(cache)
    adapter = adapter_for(model, recurrent=TreeRecurrence())
    with recorded(cache) as writes:
        logits = adapter.verify(tree, cache)
    captures = adapter._last.captures
    node = pick % len(tree)
    path = tree.path_to(node)
    # Recurrent layers take the node's kept state (no replay), attention
    # layers gather the path's rows: exactly what the verify wrote.
    adapter.commit(cache, tree, path)
    bad = mismatches(cache, moved(pre, writes, path, len(tree), captures, cache))
    assert not bad, f"the commit of {path} left other rows/states than the verify's: {bad}"
    exact(ROLLBACK_ROWS, model, "native")
    want_logits, ref = H.path_logits(model, base, _path_tokens(tree, node))
    widths, offset = numerics.widths_of(tree, 1), len(prompt) + len(path)
    env = lambda: numerics.envelope(model, offset, widths)
    check(logits[node], want_logits, model, len(prompt), widths, VERIFY, what=f"node {node}")
    for i, (a, b) in enumerate(zip(cache, ref)):
        same = H.same_arrays_cache(a, b) if isinstance(a, ArraysCache) else H.same_kv(a, b)
        # Written by forwards of other widths: identical where the backend is exact.
        assert same or not env().exact, f"layer {i} ({type(a).__name__}) differs from the path-only cache"

    tok = int(mx.argmax(want_logits).item())
    for step in range(k):
        a = model(mx.array([[tok]]), cache=cache)[0, -1]
        b = model(mx.array([[tok]]), cache=ref)[0, -1]
        check(a, b, model, offset + step, widths, ROLLBACK_DECODE, what=f"decode step {step}",
              mode="native")
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
    env = numerics.envelope(model, len(prompt), numerics.widths_of(tree))
    bad = [i for i in range(len(tree)) if not numerics.judge(flat[i], refs[i], env).ok]
    first_jump = next(i for i, p in enumerate(tree.parents) if i > 0 and p != i - 1)
    assert bad and min(bad) == first_jump, (bad, first_jump, env.line())
    err = max(mx.abs(refs[i] - flat[i]).max().item() for i in bad)
    assert err > 1e-3  # gross, not rounding


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_footprint_is_the_memory_the_states_hold(variant):
    model = H.build(*variant)
    cache = H.prefill(model, [1, 2, 3])
    tree = H.DraftTree([4, 5, 6, 7, 8, 9, 10], [-1, 0, 0, 1, 2, 2, 5])
    adapter = adapter_for(model, recurrent=TreeRecurrence())
    mx.eval(adapter.verify(tree, cache))
    held = sum(a.nbytes for _, states in adapter._last.captures.kept for a in states.arrays())
    assert held == footprint_breakdown(model, len(tree))["total_bytes"]
