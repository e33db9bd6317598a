"""The verdict table (suites/verdict.py): per contract x family x dtype, at
the end of every run, under pytest-xdist too (records travel from the
workers with the reports), and as JSON with --verdict-json."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import suites.verdict as verdict_plugin
from suites.helpers_subprocess import project_env
from treespec.backend import census, census_child
from treespec.evidence.numerics import UNSOUND

ROOT = Path(__file__).resolve().parents[2]

PLANTED = '''
import pytest
from suites.verdict import expect, record
from treespec.evidence import numerics

pytestmark = pytest.mark.exactness
E = numerics.Envelope("planted", (1, 2), (0,), 1e-6, 1e-6, 0.0, {"control": 1.0})


@pytest.mark.parametrize("i", range(4))
def test_within(i):
    expect(numerics.Verdict(numerics.WITHIN, 2e-6 * (i + 1), 1e-6, 4e-6, 1.0, "fine"), "c1", "fam", "f32")


def test_fail():
    expect(numerics.Verdict(numerics.FAIL, 0.5, 1e-6, 4e-6, detail="planted failure"), "c1", "fam", "bf16")


def test_inconclusive():
    expect(numerics.Verdict(numerics.INCONCLUSIVE, 1e-3, 1e-3, 4e-3, 1e-2, "controls 0.01"), "c2", "fam", "f32")


def test_assertion_after_an_exact_record():
    record(numerics.Verdict(numerics.BIT_EXACT), "c3", "fam", "f32")
    assert False, "a plain assertion later in the test"


def test_nothing_recorded():
    pass
'''


def run(tmp_path, *args):
    (tmp_path / "test_planted.py").write_text(PLANTED)
    out = tmp_path / "verdict.json"
    env = project_env()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suites.verdict",
           "--rootdir", str(tmp_path), "-rs", "-W", "ignore::pytest.PytestUnknownMarkWarning",
           str(tmp_path / "test_planted.py"), "--verdict-json", str(out), *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    return proc, json.loads(out.read_text())


def test_every_test_s_verdict_reaches_the_table_and_the_json_from_xdist_workers(tmp_path):
    proc, data = run(tmp_path, "-n", "2")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "treespec verdict (per contract x family x dtype)" in proc.stdout
    rows = {(r["contract"], r["family"], r["dtype"]): r for r in data["rows"]}
    within = rows[("c1", "fam", "f32")]
    assert within["verdict"] == "within envelope" and within["tests"] == 4
    assert within["max_diff"] == pytest.approx(8e-6)
    assert rows[("c1", "fam", "bf16")]["verdict"] == "FAIL"
    assert rows[("c2", "fam", "f32")]["verdict"] == "inconclusive"
    assert "controls 0.01" in rows[("c2", "fam", "f32")]["detail"]
    # a test that recorded bit-exact and then failed is a FAIL of that contract
    assert rows[("c3", "fam", "f32")]["verdict"] == "FAIL"
    assert "a plain assertion" in rows[("c3", "fam", "f32")]["detail"]
    # an exactness test that records nothing counts by its outcome
    assert any(r["tests"] == 1 and r["verdict"] == "bit-exact" for k, r in rows.items() if k[1] == "-")
    assert "1 skipped" in proc.stdout and "2 failed" in proc.stdout
    assert "inconclusive, c2 [fam f32]" in proc.stdout  # the skip carries the figures


STRICT = '''
import pytest
from suites.verdict import expect, record
from treespec.evidence import numerics

pytestmark = pytest.mark.exactness


def test_proven():
    expect(numerics.Verdict(numerics.BIT_EXACT), "proven", "fam", "f32")


def test_within():
    expect(numerics.Verdict(numerics.WITHIN, 2e-6, 1e-6, 8e-6, 1.0, "fine"), "proven", "fam", "bf16")


@pytest.mark.parametrize("case", {CASES})
def test_unproven(case):
    if case == "inconclusive":
        expect(numerics.Verdict(numerics.INCONCLUSIVE, 1e-3, 1e-3, 4e-3, 1e-2, "controls 0.01"),
               "weak", "fam", "f32")
    if case == "unsound":  # recorded as a backend not measured exact records it (expect: a skip)
        record(numerics.Verdict(numerics.INCONCLUSIVE, float("nan"),
                                detail=f"{numerics.UNSOUND}: q8 differs"), "sound", "fam", "q8")
        pytest.skip("inconclusive: unsound")
    if case == "golden":
        pytest.skip("golden not recorded for regime planted: run `python -m pytest x --snapshot-update`")
'''


def run_strict(tmp_path, cases, *args):
    (tmp_path / "test_planted.py").write_text(STRICT.replace("{CASES}", repr(list(cases))))
    out = tmp_path / "verdict.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suites.verdict",
           "--rootdir", str(tmp_path), "-W", "ignore::pytest.PytestUnknownMarkWarning",
           str(tmp_path / "test_planted.py"), "--verdict-json", str(out), *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=project_env(), capture_output=True, text=True,
                          timeout=600)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.parametrize("case, reason", [
    ("inconclusive", "inconclusive: weak [fam f32]"),
    ("unsound", f"unsound kernel: sound [fam q8]: {UNSOUND}: q8 differs"),
    ("golden", "1 test(s): golden not recorded for regime planted: run `python -m pytest x "
               "--snapshot-update`"),
])
def test_strict_verdicts_fail_a_run_that_left_a_contract_unproven(tmp_path, case, reason):
    """Without --strict-verdicts an inconclusive contract (one on a kernel
    the backend computes unsoundly among them) and a golden this backend
    never recorded are skips (reported, the run green); with it, the run
    fails and says why, an unsound kernel named as such: green means every
    contract concluded."""
    proc, data = run_strict(tmp_path, [case])
    assert proc.returncode == 0, proc.stdout[-3000:]
    if case == "golden":
        assert "not recorded (1 tests): golden not recorded for regime planted" in proc.stdout
    proc, data = run_strict(tmp_path, [case], "--strict-verdicts")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert f"--strict-verdicts: this run fails (1 reasons):\n  {reason}" in proc.stdout
    assert data["strict_failures"] == [reason]


def test_strict_verdicts_hold_a_floor_of_proven_rows(tmp_path):
    proc, data = run_strict(tmp_path, [], "--strict-verdicts", "--min-proven", "2")
    assert proc.returncode == 0 and data["proven"] == 2, proc.stdout[-3000:]
    proc, data = run_strict(tmp_path, [], "--strict-verdicts", "--min-proven", "3")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert data["strict_failures"] == [
        "2 rows proven (bit-exact or within envelope), fewer than --min-proven 3"]


def test_a_floor_without_strict_verdicts_is_a_usage_error(tmp_path):
    proc, _ = run_strict(tmp_path, [], "--min-proven", "2")
    assert proc.returncode == 4, proc.stdout[-3000:]
    assert "--min-proven: it is a floor of --strict-verdicts, which is off" in proc.stderr


def _row(op="matmul", first=None, how="tokens", error=None):
    from_m = 0.0 if first is None else 1e-6
    return census.Row(op, "float32", "64->128", tuple(range(1, 17)), first, from_m, how, error)


@pytest.mark.parametrize("extra, exact", [
    ((), True),
    ((_row(first=2),), False),  # one op, one dtype, one shape differing from M=2 is enough
    ((_row("sdpa+mask", first=9),), False),
    ((_row(error="[quantized_matmul] No implementation"),), False),  # unmeasured is unproven
    ((_row("ssm_update", first=2, how="steps"),), True),  # another algorithm, on every backend
], ids=["all-identical", "matmul-differs", "attention-differs", "op-raised", "scan-vs-step"])
def test_an_exact_backend_is_what_the_census_measures_never_a_name(extra, exact, monkeypatch):
    rows = [_row(), _row("rms_norm"), _row("gated_delta", how="batch")] + list(extra)
    monkeypatch.setattr(census_child, "isolated", lambda **_: rows)
    verdict_plugin.exact_backend.cache_clear()
    verdict_plugin._differing.cache_clear()
    try:
        assert verdict_plugin.exact_backend() is exact
        line = verdict_plugin.census_line()
        assert ("every op row-invariant" in line) is exact, line
    finally:
        verdict_plugin.exact_backend.cache_clear()
        verdict_plugin._differing.cache_clear()
