"""The row-invariant verify (treespec.verify.row_invariant, ``--verify rows``):
every node's logits row equals, bit for bit, classic decoding's one-token
steps along its root path, wherever the census measures this backend's
batch rows and product rows invariant up to the tree's width; with its
linears in chunks of the products' width (``--verify chunks``), wherever the
rest of those rows is (suites/verify/test_row_chunks.py has the chunks
themselves). Nothing is
assumed about the backend: the width is the census's
(treespec.backend.census.row_width) of the model's own shapes, measured in
this run, and a tree past it is reported, not asserted.

Each check is shown to separate: two planted defects of the per-depth key
gather (a sibling's key instead of an ancestor's; the right keys in another
order, which only moves the summation order) must break the bit identity on
every backend, in the same run."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from suites.verify import helpers
from treespec.backend.census import Row, census, row_width
from treespec.backend.row_chunks import RowChunks
from treespec.cli.rows import chunks_plan, rows_cap
from treespec.errors import UsageError
from treespec.evidence.controls import clone
from treespec.tree import DraftTree
from treespec.zoo import cpu_limitation
from treespec.verify import ROW_ADAPTER, RowAdapter, adapter_for
from treespec.checkpoints import load_default_pair
from treespec.decoding import decode
from treespec.errors import TreeRefused
from treespec.verify.depth_steps import KeptRoPE, depth_groups

pytestmark = pytest.mark.exactness

FAMILIES = ("llama", "qwen3", "qwen3_5", "qwen3_next")
TREES = {
    "chain of 2": [-1, 0],
    "chain of 5": [-1, 0, 1, 2, 3],
    "branching 7": [-1, 0, 0, 1, 1, 2, 4],
    "branching 12": [-1, 0, 0, 0, 1, 1, 2, 3, 4, 4, 5, 8],
}


def _width(model) -> int:
    width, _ = row_width(census(model))
    return width or 0


def _step_along(model, cache, path) -> mx.array:
    for token in path:  # mlx-lm's generate_step: one token per forward
        logits = model(mx.array([[token]]), cache=cache)
    return logits[0, -1]


def _steps(model, before, tree) -> mx.array:
    """Classic decoding's logits at every node: one-token steps along its root
    path, each from its own copy of the cache state before the tree."""
    return mx.stack([_step_along(model, clone(before), [tree.tokens[j] for j in tree.path_to(i)])
                     for i in range(len(tree))])


def _bits_equal(a: mx.array, b: mx.array) -> bool:
    return a.shape == b.shape and mx.array_equal(a, b).item()


def _verify(model, mode: str, nodes: int):
    """(the row-invariant verify of ``mode``, the most nodes the census keeps
    it exact for): ``rows``, the census's whole width; ``chunks`` (every
    linear in calls of its products' width: treespec.backend.row_chunks),
    the width of the rest (treespec.cli.rows.chunks_plan)."""
    if mode == "rows":
        return adapter_for(model, rows=True), _width(model)
    plan = chunks_plan(model, nodes - 1, False)
    return (adapter_for(model, kernels=RowChunks(plan.width)),
            nodes if plan.cap is None else plan.cap[0])


@pytest.mark.parametrize("mode", ["rows", "chunks"])
@pytest.mark.parametrize("shape", TREES, ids=list(TREES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_node_row_is_classic_decodings_one_token_step(family, dtype, shape, mode):
    why = cpu_limitation(family, dtype, None) if mx.default_device() == mx.cpu else None
    if why:
        pytest.skip(why)
    model = helpers.model(family, dtype)
    tree = DraftTree(helpers.tokens(len(TREES[shape]), 3), TREES[shape])
    verify, width = _verify(model, mode, len(tree))
    if len(tree) > width:
        pytest.skip(f"the census keeps the rows --verify {mode} rests on for {family} {dtype} "
                    f"up to {width} nodes on this backend; a tree of {len(tree)} is past it")
    before = helpers.history(9).replay(model)
    got = verify.verify(tree, clone(before))
    want = _steps(model, before, tree)
    assert _bits_equal(got, want), helpers.max_abs_diff(got, want)


def test_a_chain_on_a_hybrid_takes_one_token_recurrence_steps(plant):
    # A backend whose multi-token conv1d gives other bits than its one-token
    # steps (the plant: a few ulp on every call of 2+ new tokens) cannot
    # reach a chain's rows: every node takes its own one-token recurrence
    # step, never mlx-lm's T-token call. Compared with the same verify
    # unplanted, so the claim holds on any backend, exact or not; the control:
    # the plant does reach mlx-lm's own chain forward (the flat verify).
    model = helpers.model("qwen3_5", "float32")
    tree = DraftTree(helpers.tokens(5, 3), TREES["chain of 5"])
    before = helpers.history(9).replay(model)
    rows, flat = adapter_for(model, rows=True), adapter_for(model)
    clean = [a.verify(tree, clone(before)) for a in (rows, flat)]
    with plant("conv-multi-token-few-ulp"):
        planted = [a.verify(tree, clone(before)) for a in (rows, flat)]
    assert _bits_equal(planted[0], clean[0]), helpers.max_abs_diff(planted[0], clean[0])
    assert not _bits_equal(planted[1], clean[1])


def _reused(adapter) -> list:
    """The stand-ins an adapter keeps between verifies: the attentions' and,
    with the row kernels, the linears' (treespec.verify.row_invariant)."""
    kept = [adapter._stand_ins.sites[0][3]]
    return kept + [adapter._linears.sites[0][3]] if hasattr(adapter, "_linears") else kept


@pytest.mark.parametrize("mode", ["rows", "kernels"])
def test_one_adapter_reuses_its_stand_ins_only_while_the_model_holds_what_they_wrap(mode):
    # Its stand-ins are made on the first verify and reused by the next
    # (treespec.verify.row_invariant.StandIns, KernelLinears): each tree
    # through one adapter gets the rows a fresh adapter gives it, and a
    # projection swapped into the model between two verifies is the one the
    # next verify computes with. "kernels" off CUDA: the kernels' seam
    # (helpers.kernel_seam). Tried: reusing them without checking the slots,
    # the swapped case fails (either kind of stand-in).
    model = helpers.model("llama", "float32")
    before = helpers.history(9).replay(model)
    options = {"rows": True} if mode == "rows" else {"kernels": helpers.kernel_seam()[0]}
    adapter = adapter_for(model, **options)
    trees = [DraftTree(helpers.tokens(len(p), 3), p)
             for p in (TREES["branching 7"], TREES["chain of 5"], TREES["branching 7"])]
    fresh = lambda tree: adapter_for(model, **options).verify(tree, clone(before))  # noqa: E731
    first = None
    for tree in trees:
        assert _bits_equal(adapter.verify(tree, clone(before)), fresh(tree))
        first = first or _reused(adapter)
        assert all(a is b for a, b in zip(_reused(adapter), first))  # reused, not remade
    attention = model.model.layers[0].self_attn
    original = attention.q_proj
    swapped = nn.Linear(original.weight.shape[1], original.weight.shape[0], bias="bias" in original)
    swapped.update(original.parameters())
    swapped.weight = original.weight * (1 + 2 ** -7)
    try:
        attention.q_proj = swapped
        got = adapter.verify(trees[0], clone(before))
        assert _bits_equal(got, fresh(trees[0]))  # the swapped projection's rows ...
    finally:
        attention.q_proj = original
    assert not _bits_equal(got, adapter.verify(trees[0], clone(before)))  # ... not the original's


class _Planted(RowAdapter):
    """A row-invariant verify with a defect in how each node's keys are laid out."""

    def __init__(self, model, defect):
        base = adapter_for(model, rows=True)
        super().__init__(model, base.family, base.recurrent, base.found)
        self.defect = defect

    def depth_groups(self, tree):
        return [(nodes, self.defect(tree, paths)) for nodes, paths in super().depth_groups(tree)]


def _sibling(tree, paths):
    # depth >= 2: the parent's key swapped for the parent's sibling's (node 2 is node 1's)
    out = paths.copy()
    if out.shape[1] >= 3:
        out[:, -2] = np.where(out[:, -2] == 1, 2, 1)
    return out


def _reordered(tree, paths):
    # the same keys, the root path reversed: only the summation order moves
    return paths[:, ::-1].copy()


@pytest.mark.parametrize("defect", [_sibling, _reordered], ids=["sibling key", "reordered keys"])
def test_a_planted_key_defect_breaks_the_identity(defect):
    model = helpers.model("llama", "float32")
    tree = DraftTree(helpers.tokens(7, 3), TREES["branching 7"])
    before = helpers.history(9).replay(model)
    got = _Planted(model, defect).verify(tree, clone(before))
    assert not _bits_equal(got, _steps(model, before, tree))


def test_a_depth_pass_that_ropes_otherwise_than_the_wide_pass_is_refused():
    """A depth's pass gets the wide pass's rotated rows for the same call
    (treespec.verify.depth_steps.KeptRoPE), so the n-th rope call of every
    pass must be the same call: one the wide pass never made, or of another
    shape, is refused by name, never answered with some other call's rows.
    (That the rows handed back are the right ones, the identity test above
    shows: handing each depth the first n kept rows instead fails it.)"""
    rope = nn.RoPE(8)
    kept = KeptRoPE(rope)
    x = mx.random.normal((3, 2, 1, 8))
    assert mx.array_equal(kept(x, offset=4), rope(x, offset=4)).item()  # off: the rope itself
    kept.set("keep")
    wide = kept(x, offset=mx.array([4, 5, 6]))
    kept.set("rows", slice(1, 3))
    assert mx.array_equal(kept(x[1:3], offset=mx.array([5, 6])), wide[1:3]).item()
    with pytest.raises(TreeRefused, match="rope called alike in every pass.*call 2 differs"):
        kept(x[1:3], offset=mx.array([5, 6]))  # a second call the wide pass did not make
    kept.set("rows", slice(1, 3))
    with pytest.raises(TreeRefused, match="call 1 differs"):
        kept(mx.random.normal((2, 2, 1, 4)), offset=mx.array([5, 6]))  # another shape


def test_depth_groups_hold_each_nodes_root_path_in_depth_order():
    tree = DraftTree(list(range(12)), TREES["branching 12"])
    groups = depth_groups(tree.depths(), tree.ancestry())
    assert [list(n) for n, _ in groups] == [[0], [1, 2, 3], [4, 5, 6, 7], [8, 9, 10], [11]]
    for nodes, paths in groups:
        for node, path in zip(nodes, paths):
            assert list(path) == tree.path_to(int(node))


@pytest.mark.parametrize("family,kv_bits,words", [
    ("gemma3_text", None, ["RotatingKVCache", "plain KVCache"]),  # its sliding-window layers
    ("qwen3", 8, ["QuantizedKVCache", "plain KVCache"]),          # --kv-bits
])
def test_caches_it_cannot_gather_from_are_refused_before_anything_is_written(family, kv_bits,
                                                                               words):
    model = helpers.model(family, "float32")
    cache = helpers.history(5, kv_bits=kv_bits).replay(model)
    tree = DraftTree(helpers.tokens(3, 1), [-1, 0, 0])
    helpers.assert_refused_untouched(adapter_for(model, rows=True), tree, cache, *words)


def test_decoding_through_it_is_gated_exact_and_classic_text():
    # the gate measures this verify itself (named apart: a memo of the flat verify
    # does not answer for it), and runs the tree where the census says rows hold
    target, draft, tok = load_default_pair()
    prompt = tok.encode("def add(a, b):\n    return")
    want = decode(target, prompt, max_tokens=24).tokens
    got = decode(target, prompt, mode="tree", draft_model=draft, max_tokens=24, budget=4,
                 adapter=adapter_for(target, rows=True), adapter_name=ROW_ADAPTER)
    assert got.tokens == want
    width = _width(target)
    if width < 5:
        pytest.skip(f"the census keeps the pair's rows only up to {width} nodes here")
    assert got.stats.gate["exact"] and got.stats.mode == "tree", got.stats.gate


def test_rounds_never_verify_more_nodes_than_max_nodes_and_stay_classic_text():
    # The cap is the round loop's, so the rounds run past the gate on every
    # backend (where it declines, as for the float16 pair on CUDA, none would);
    # the text is classic decoding's wherever the census keeps rows of 3 nodes.
    target, draft, tok = load_default_pair()
    prompt = tok.encode("for i in range(10):\n    ")
    want = decode(target, prompt, max_tokens=24).tokens
    sizes = []
    got = decode(target, prompt, mode="tree", draft_model=draft, max_tokens=24, budget=6,
                 adapter=adapter_for(target, rows=True), adapter_name=ROW_ADAPTER, max_nodes=3,
                 gate=False, on_round=lambda rnd, walk: sizes.append(len(rnd.tree)))
    assert sizes and max(sizes) == 3  # the budget of 6 would draft 7-node trees
    if _width(target) >= 3:
        assert got.tokens == want


@pytest.mark.parametrize("kwargs,error", [
    ({"mode": "classic"}, "max_nodes caps a greedy chain or tree round; it does not act in classic"),
    ({"mode": "chain", "temperature": 0.5}, "it does not act at temperature > 0"),
    ({"mode": "chain", "max_nodes": 1}, "max_nodes must be >= 2"),
])
def test_max_nodes_is_refused_where_it_would_not_act(kwargs, error):
    target, draft, _ = load_default_pair()
    kwargs = {"max_nodes": 3, **kwargs}
    with pytest.raises(ValueError, match=error):
        decode(target, [1, 2, 3], draft_model=None if kwargs["mode"] == "classic" else draft,
               max_tokens=4, **kwargs)


def _census_of(first_differs):
    return lambda model, widths: [Row("matmul", "float32", "64->64", tuple(widths), first_differs,
                                      0.0 if first_differs is None else 1e-6)]


def test_the_command_line_caps_rounds_at_the_census_width_and_names_the_row():
    # rows_cap reads the width off the census of the target's own shapes (here a
    # planted census row): a round of budget 6 needs 7 nodes
    assert rows_cap(None, 6, False, measure=_census_of(None)) is None
    width, why = rows_cap(None, 6, False, measure=_census_of(4))
    assert width == 3 and "matmul tokens float32 64->64: differs from 4" in why
    assert rows_cap(None, 6, True, measure=_census_of(4)) is None  # --allow-inexact runs it all
    with pytest.raises(UsageError, match="keeps a row's bits for one node only") as refused:
        rows_cap(None, 6, False, measure=_census_of(2))
    # a product sets it: the chunked linears are the way on (suites/verify/test_row_chunks.py)
    assert "give --verify chunks" in str(refused.value)
