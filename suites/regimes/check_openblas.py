"""Contract 10's other regime: run with Debian's OpenBLAS preloaded (by
suites/regimes/test_regimes.py, in a subprocess; its name keeps it out of
the plain run). There float32 forwards over 4+ tokens stop matching single
steps by a few 1e-6, and the gate has to see it and act on it."""

import pytest

from treespec import zoo
from treespec.blas import detect
from treespec.generate_cli import format_diagnostics
from treespec.decode import decode
from treespec.gate import probe, shapes_for

pytestmark = pytest.mark.exactness

PROMPT = zoo.tokenizer().encode("The target model verifies a whole tree")


def test_this_process_runs_on_openblas():
    assert detect().name == "openblas", detect()


@pytest.mark.parametrize("variant", [dict(dtype="float32"), dict(bits=4)], ids=["float32", "4bit"])
def test_the_probe_finds_the_shapes_that_differ_and_says_how_much(variant):
    p = probe(zoo.build("llama", **variant), shapes_for(8))
    differs = [s for s in p.shapes if not s.identical]
    assert differs, p.table()
    assert p.shapes[0].identical, "one token is one token: M=1 must match"
    # Measured 3-6e-6 with no argmax flip: a last-bit difference, and the
    # probe must report it as such rather than as a text-changing one.
    assert all(0 < s.max_abs_diff < 1e-3 for s in differs), p.table()
    assert p.argmax_flips == 0, p.table()


def test_bfloat16_passes_the_probe():
    p = probe(zoo.build("llama", dtype="bfloat16"), shapes_for(8, [(-1, 0, 0, 1, 1, 2, 2)]))
    assert p.identical, p.table()


@pytest.mark.parametrize("mode", [dict(mode="chain", block=5), dict(mode="tree", budget=6)],
                         ids=["chain", "tree"])
def test_float32_speculation_declines_to_classic_and_says_why(mode):
    target, draft = zoo.build("llama"), zoo.drafter("llama")
    classic = decode(target, PROMPT, "classic", max_tokens=32)
    result = decode(target, PROMPT, draft_model=draft, max_tokens=32, **mode)
    assert result.stats.mode == f"classic (declined {mode['mode']})"
    assert result.stats.gate["run"] is False and "declined" in result.stats.notes[0]
    assert result.tokens == classic.tokens


def test_allow_inexact_runs_and_warns_on_the_report():
    target, draft = zoo.build("llama"), zoo.drafter("llama")
    result = decode(target, PROMPT, mode="tree", draft_model=draft, budget=6,
                    max_tokens=32, allow_inexact=True)
    summary = result.stats.summary()
    assert summary["mode"] == "tree" and summary["rounds"] > 0
    assert summary["gate"]["exact"] is False
    assert summary["gate"]["reason"].startswith("INEXACT")
    assert format_diagnostics(summary).startswith("WARNING: INEXACT")


def test_bfloat16_speculation_runs_and_matches_classic():
    target, draft = zoo.build("llama", dtype="bfloat16"), zoo.drafter("llama", dtype="bfloat16")
    classic = decode(target, PROMPT, "classic", max_tokens=32)
    for mode in (dict(mode="chain", block=5), dict(mode="tree", branching=[2, 2, 1])):
        result = decode(target, PROMPT, draft_model=draft, max_tokens=32, **mode)
        assert result.stats.mode == mode["mode"] and result.stats.gate["exact"]
        assert result.tokens == classic.tokens
