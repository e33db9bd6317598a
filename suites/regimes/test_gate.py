"""Contract 10 in whatever regime this run is in (README's test command runs
the exactness suite on the reference BLAS, then again with OpenBLAS
preloaded; on the H200 it runs on CUDA): the gate's decision is its own
probe's measurement, and the probe sees what the backend's measured envelope
(treespec.evidence.numerics) sees. Where the backend is exact, speculation runs and
matches classic decoding; where a shape's forward differs from single steps,
speculation declines to classic decoding, says why, and runs only when
forced, with a warning on every report."""

import pytest

from suites.helpers_numerics import model_label, require_sound
from suites.verdict import GATE, expect
from treespec.evidence import numerics
from treespec import zoo
from treespec.cli.generate import format_diagnostics
from treespec.decoding import decode
from treespec.evidence.gate import CONTEXT, probe, shapes_for

pytestmark = pytest.mark.exactness

PROMPT = zoo.tokenizer().encode("The target model verifies a whole tree")
VARIANTS = {"float32": dict(dtype="float32"), "4bit": dict(bits=4), "bfloat16": dict(dtype="bfloat16")}
SHAPES = shapes_for(8, [(-1, 0, 0, 1, 1, 2, 2)])


def _record(model, verdict):
    family, dtype = model_label(model)
    return expect(verdict, GATE, family, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_probe_sees_what_the_envelope_measures(variant):
    # unsound kernels: neither the probe nor the envelope would measure anything
    model = require_sound(zoo.build("llama", **variant))
    p = probe(model, SHAPES)
    env = numerics.envelope(model, CONTEXT, range(1, 9))
    assert p.shapes[0].identical, "one token is one token: M=1 must match"
    if env.exact:
        assert p.identical, p.table()
        _record(model, numerics.Verdict(numerics.BIT_EXACT, detail="probe identical, envelope 0"))
        return
    differs = [s for s in p.shapes if not s.identical]
    assert differs, f"{env.line()} but the probe found every shape identical:\n{p.table()}"
    # A tree verify is one forward: within the backend's own bound of the
    # single steps, never a defect-sized difference.
    assert p.max_abs_diff <= env.bound, (p.table(), env.line())
    _record(model, numerics.declined(f"{len(differs)}/{len(p.shapes)} shapes differ, max |diff| "
                                     f"{p.max_abs_diff:.3g} (bound {env.bound:.3g})", p.max_abs_diff))


@pytest.mark.parametrize("mode", [dict(mode="chain", block=5), dict(mode="tree", budget=6),
                                  dict(mode="tree", branching=[2, 2, 1])],
                         ids=["chain", "confidence-tree", "fixed-tree"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_speculation_runs_exactly_where_the_probe_passed_else_declines_and_says_why(mode, dtype):
    target, draft = zoo.build("llama", dtype=dtype), zoo.drafter("llama", dtype=dtype)
    classic = decode(target, PROMPT, "classic", max_tokens=32)
    result = decode(target, PROMPT, draft_model=draft, max_tokens=32, **mode)
    gate = result.stats.gate
    assert result.tokens == classic.tokens
    if gate["run"]:
        assert gate["exact"] and gate["max_abs_diff"] == 0, gate
        assert result.stats.mode == mode["mode"] and result.stats.rounds > 0
        _record(target, numerics.Verdict(numerics.BIT_EXACT, detail="probe passed, speculation ran"))
    else:
        assert not gate["exact"] and gate["max_abs_diff"] > 0, gate
        assert result.stats.mode == f"classic (declined {mode['mode']})"
        assert "declined" in result.stats.notes[0] and "max |diff|" in gate["reason"]
        _record(target, numerics.declined(gate["reason"], gate["max_abs_diff"]))


def test_allow_inexact_runs_and_warns_on_the_report_exactly_where_the_probe_failed():
    target, draft = zoo.build("llama"), zoo.drafter("llama")
    result = decode(target, PROMPT, mode="tree", draft_model=draft, budget=6,
                    max_tokens=32, allow_inexact=True)
    summary = result.stats.summary()
    assert summary["mode"] == "tree" and summary["rounds"] > 0
    exact = summary["gate"]["exact"]
    assert summary["gate"]["reason"].startswith("INEXACT") != exact
    assert format_diagnostics(summary).startswith("WARNING: INEXACT") != exact
