"""The audit's rollback row takes the proof at the attentions for decoding on
(treespec.evidence.attention_rows.decode_proof) where the envelope cannot
decide: a commit that leaves the path's newest ring row one bit step away
(a value projection of the verify rounding by the call's width, in the last
layer) passes the attentions' check (proven where the wrong-branch control
lands 10x beyond; a short path's control may not, and the row says so); the
same step in the first layer, which the verify carries into every later
layer's rows, does not, and the row says why. Tried: with the audit's
rollback row passing no ``attention=``, both fail. Planted on the width-dependent
gemma3_text bfloat16 model of suites/verify/test_same_width.py, whose
envelope leaves its controls short of 10x the bound."""

import pytest
from suites.planted import bit_steps, shape_dependent, stood_in
from suites.verify import helpers
from treespec.audit import runner
from treespec.audit.subject import Subject
from treespec.evidence import numerics
from treespec.evidence.attention_rows import STALE
from treespec.standin import StandIn
from treespec.verify import TreeAdapter, adapter_for

pytestmark = pytest.mark.exactness


class Rounded(StandIn):
    """A key or value projection whose multi-token calls come out ``k`` bit
    steps off in their first element, every row: a backend whose product
    rounds by the call's width, in the rows a verify writes."""

    def __init__(self, inner, k):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "k", k)

    def __call__(self, x):
        out = self.inner(x)
        return bit_steps(out, (0, slice(None), 0), self.k) if out.shape[1] > 1 else out


def rounding_verify(layer: int, k: int):
    """An adapter whose verify runs with ``layer``'s value projection
    :class:`Rounded`."""

    class Planted(TreeAdapter):
        def verify_handle(self, tree, cache, *args, **kw):
            with stood_in(self.model.layers[layer].self_attn, "v_proj",
                          lambda inner: Rounded(inner, k)):
                return super().verify_handle(tree, cache, *args, **kw)
    return Planted


@pytest.fixture(scope="module")
def model():
    return shape_dependent(helpers.model("gemma3_text", "bfloat16"), 2 ** -4, 1, "WidthDependent")


@pytest.mark.parametrize("layer, within", [(-1, True), (0, False)], ids=["last-layer", "first-layer"])
def test_the_rollback_row_asks_the_attentions_where_the_envelope_cannot_decide(model, layer, within):
    # One bit step in the last layer's cached values leaves every attention
    # within one unit: the row is proven, or, where the wrong branch (a short
    # path's one or two rows) moves an attention less than 10x, says that. In
    # the first layer's, the verify carries the step into every later layer's
    # rows and a later attention moves by more: no proof, and the row says so.
    real = adapter_for(model)
    kind = rounding_verify(layer, 1)
    s = Subject(model, factory=lambda m: kind(m, real.family), adapter_source="planted")
    row = next(c for c in runner.run(s, ("rollback",)).checks if c.name == "rollback[native]")
    assert row.verdict in (numerics.WITHIN, numerics.INCONCLUSIVE), row.line()
    if within:
        assert (row.verdict == numerics.WITHIN and STALE in row.detail) or (
            f"no proof at the attentions: the {STALE} control moves" in row.detail), row.line()
    else:
        assert "no proof at the attentions: an attention output differs" in row.detail, row.line()
