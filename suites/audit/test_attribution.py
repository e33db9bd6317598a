"""`treespec audit` says whose fault a failure is: a cache mode in which mlx-lm
alone fails is reported as that (with mlx-lm's error), not as a treespec
failure, and every other mode is still audited, each a row of its own; a
treespec crash in one mode fails that mode's row only.

The audited mode's rows pass where the regime is exact; elsewhere they may be
inconclusive, with their figures (CUDA: the negative controls do not separate
from the envelope), and their verdict is recorded for the table; the
attribution itself is checked the same on every backend."""

import pytest
from mlx_lm.models.cache import QuantizedKVCache

from suites.audit.helpers import assert_numeric_row, rows_verdict
from suites.families.helpers_models import build
from suites.helpers_numerics import exact_backend, model_label
from suites.verdict import AUDIT, record
from treespec.backend.blas import regime
from treespec.audit import runner
from treespec.audit.records import FAIL, SKIP
from treespec.audit.states import cache_modes, histories, plain, replay
from treespec.audit.subject import Subject
from treespec.verify import TreeAdapter, adapter_for

pytestmark = pytest.mark.exactness

PROPS = ("tree-verify", "rollback")


def rows(report) -> dict:
    return {c.name: c for c in report.checks}


def test_a_mode_mlx_lm_alone_cannot_run_is_said_and_the_others_are_still_audited():
    """gemma4_text with KV-shared layers on a quantized KV cache: mlx-lm's
    own attention hands mx.fast.scaled_dot_product_attention the quantized
    tuple (a TypeError, no treespec code involved)."""
    model = build("gemma4_text@kvshare")
    s = Subject(model)
    modes, _ = cache_modes(model)
    quantized = [m for m in modes if m.kv_bits]
    assert quantized, "the model must have a quantized KV mode"
    # mlx-lm alone, straight: the same failure
    with pytest.raises(TypeError, match="scaled_dot_product_attention"):
        cache = replay(model, histories(s)[-1], quantized[0])
        plain(model, cache, [1, 2, 3])
    report = runner.run(s, PROPS)
    got = rows(report)
    for prop in PROPS:
        assert_numeric_row(got[f"{prop}[native]"])  # exact regimes: PASS
        for m in quantized:
            row = got[f"{prop}[{m.name}]"]
            assert row.status == SKIP and "mlx-lm alone fails" in row.detail, row.line()
            assert "TypeError" in row.detail and row.first_failure["mlx_lm_alone"]
    assert report.ok, report.failed()
    record(rows_verdict([got[f"{p}[native]"] for p in PROPS]), AUDIT, *model_label(model))


class CrashesOnQuantizedKV(TreeAdapter):
    """Planted: treespec's own fault, in one cache mode only."""

    def verify(self, tree, cache, start=0, tokens=None, **kw):
        if any(isinstance(c, QuantizedKVCache) for c in cache):
            raise TypeError("planted: treespec breaks on a quantized KV cache")
        return super().verify(tree, cache, start, tokens, **kw)


def test_a_treespec_crash_in_one_mode_fails_that_row_only():
    model = build("gemma4_text")  # mlx-lm runs every mode of this one
    real = adapter_for(model)
    s = Subject(model, factory=lambda m: CrashesOnQuantizedKV(m, real.family),
                adapter_source="planted")
    report = runner.run(s, ("tree-verify",))
    got = rows(report)
    assert_numeric_row(got["tree-verify[native]"])  # exact regimes: PASS
    others = [r for name, r in got.items() if name != "tree-verify[native]"]
    # Where mlx-lm alone cannot run a quantized KV mode on this backend (the
    # H200: no quantized_matmul kernel for it), that row says so; never on an
    # exact regime, where mlx-lm runs every mode of this model.
    alone = [r for r in others if r.status == SKIP and (r.first_failure or {}).get("mlx_lm_alone")]
    if exact_backend():
        assert not alone, [r.line() for r in alone]
    crashed = [r for r in others if r not in alone]
    assert all(r.status == FAIL and "planted" in r.detail for r in crashed), [r.line() for r in crashed]
    assert not any("mlx-lm alone" in r.detail for r in crashed)
    if not crashed:
        pytest.skip(f"mlx-lm alone fails in every quantized KV mode on {regime()}: "
                    f"{alone[0].detail[:200]}")
    record(rows_verdict([got["tree-verify[native]"]]), AUDIT, *model_label(model))
