"""`treespec audit` itself: it passes on the zoo's checkpoints, and it fails,
naming the right property, on adapters with one planted defect each
(suites/audit/defects.py). An audit that could not fail would prove nothing.

Where the regime is exact every numeric row of the zoo's audits passes. Elsewhere a row may be
inconclusive with its figures (CUDA: the negative controls do not separate from the envelope),
never silently: the audit's verdict is the test's (suites/audit/helpers.py), an inconclusive
one a skip carrying the figures, after everything that holds on every backend was checked."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suites.audit.helpers import assert_numeric_row, line, rows_verdict
from suites.audit.helpers_defects import DEFECTS
from suites.helpers_numerics import exact_backend
from suites.helpers_subprocess import project_env
from suites.verdict import AUDIT, expect, record
from treespec import audit, zoo
from treespec.cli import main as cli
from treespec.evidence import numerics

pytestmark = pytest.mark.exactness

ROOT = Path(__file__).resolve().parents[2]
CHILD_ENV = project_env()  # this checkout first, then the parent's PYTHONPATH


def run_json(capsys, *args):
    rc = cli.main(["audit", *map(str, args), "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def failed_props(report) -> set:
    return {name.split("[", 1)[0] for name in report["failed"]}


# (family, with the zoo drafter or drafting for itself)
PASSING = [("llama", True), ("gemma3_text", True), ("qwen3", False), ("qwen3_next", False)]


@pytest.mark.slow
@pytest.mark.parametrize("family,drafter", PASSING, ids=[f for f, _ in PASSING])
def test_audit_passes_on_zoo_checkpoints(family, drafter, capsys):
    args = ["--model", zoo.checkpoint(family)]
    if drafter:
        args += ["--draft-model", zoo.drafter_checkpoint(family)]
    rc, report = run_json(capsys, *args)
    lines = [line(c) for c in report["checks"]]
    assert rc == 0 and report["ok"] and report["unverified"] == [], "\n".join(lines)
    # every property ran and reported, in every cache mode the model has
    props = {c["name"].split("[", 1)[0] for c in report["checks"]}
    assert props == set(audit.PROPERTIES)
    names = {c["name"] for c in report["checks"]}
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    rows = {c["name"]: c for c in report["checks"]}
    for prop in ("adapter", "walk-linear", "walk-siblings"):  # no forward compared
        assert statuses[prop] == "pass", lines
    for prop in ("linear-verify", "tree-verify[native]", "rollback[native]", "e2e[chain-b4]",
                 "e2e[tree-2x2x1]"):  # exact regimes: pass; elsewhere inconclusive too
        assert_numeric_row(rows[prop], lines)
    if family in ("qwen3", "qwen3_next"):  # head_dim 32: quantized KV is a cache mode
        assert {"rollback[kv-q4-g32]", "rollback[kv-q8-g32]"} <= names
        # 4-bit KV on an inexact backend: one quantization level moves logits
        # as far as a defect does, so the verdict may be inconclusive there.
        kv4 = rows["rollback[kv-q4-g32]"]
        # A backend without mlx-lm's kernel for it (CUDA: quantized_matmul at
        # group 32) is said, and is not treespec's failure.
        unrun = (not exact_backend() and kv4["status"] == "skip"
                 and "mlx-lm alone fails" in kv4["detail"])
        if not unrun:
            assert_numeric_row(kv4)
    else:  # head_dim 16: said, not silently dropped
        assert statuses["rollback[kv-quant]"] == "skip"
    header = report["header"]
    assert header["blas"] and header["device"] and header["drafter"]
    assert ("itself" in header["drafter"]) != drafter
    assert report["probe"]["shapes"]
    # The audit's own verdict: an inconclusive row makes this a skip with its figures.
    verdict = rows_verdict(report["checks"])
    assert (verdict.word == numerics.INCONCLUSIVE) == (report["verdict"] == numerics.INCONCLUSIVE)
    expect(verdict, AUDIT, family, header["dtypes"][0].removeprefix("mlx.core."))


def test_gemma_probe_on_a_wrapped_window_is_exact_where_the_backend_is(capsys):
    """The gate's probe runs past gemma's sliding window, where a one-token
    step sees the ring's keys in slot order; the verify lays them out the
    same way, so on an exact backend the probe is bit-identical (the gate
    lets speculation run); elsewhere the difference is the backend's,
    within its envelope, and the gate declines."""
    rc, report = run_json(capsys, "--model", zoo.checkpoint("gemma3_text"), "--only", "probe")
    (probe,) = report["checks"]
    assert rc == 0, probe
    if exact_backend():
        assert probe["status"] == "pass" and probe["verdict"] == "bit-exact", probe
        assert report["probe"]["identical"], report["probe"]
    else:
        assert probe["verdict"] == "declined by gate", probe
        assert "within the backend's envelope" in probe["detail"], probe


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_audit_fails_on_a_planted_defect_and_names_it(defect, capsys):
    family, must_fail, must_pass = DEFECTS[defect]
    # --context 0: each defect is named by the short rows (the long-context
    # rows are the size matrix's, suites/plants)
    rc, report = run_json(capsys, "--model", zoo.checkpoint(family),
                          "--adapter", f"suites.audit.helpers_defects:{defect}", "--context", "0")
    lines = "\n".join(f"{c['name']}: {c['status']}: {c['detail']}" for c in report["checks"])
    failed = failed_props(report)
    assert rc == 1 and not report["ok"], lines
    assert must_fail <= failed, lines
    assert not (must_pass & failed), lines
    for c in report["checks"]:
        if c["status"] == "FAIL" and c["name"].split("[")[0] in must_fail:
            # where it failed and by how much
            assert c["first_failure"], c
            assert "first:" in c["detail"], c


def test_allow_inexact_reports_differences_within_tolerance_as_inexact(capsys):
    """--allow-inexact does not hide a difference: it is measured and shown."""
    args = ["--model", zoo.checkpoint("llama"), "--adapter", "suites.audit.helpers_defects:causal_mask",
            "--only", "tree-verify,probe"]
    rc, strict = run_json(capsys, *args)
    rc_loose, loose = run_json(capsys, *args, "--allow-inexact", "--tolerance", "1e9")
    assert rc == 1 and rc_loose == 0
    row = {c["name"]: c for c in loose["checks"]}
    assert row["tree-verify[native]"]["status"] == row["probe"]["status"] == "inexact"
    assert row["tree-verify[native]"]["max_diff"] > 1
    assert "max |diff|" in row["tree-verify[native]"]["detail"]


def test_the_real_adapter_through_the_adapter_option_passes(capsys):
    """The control for the defects: --adapter itself changes nothing."""
    rc, report = run_json(capsys, "--model", zoo.checkpoint("llama"),
                          "--adapter", "suites.audit.helpers_defects:real", "--context", "0")
    assert rc == 0, report["failed"]
    assert report["header"]["adapter_source"] == "suites.audit.helpers_defects:real"


def test_a_refused_family_fails_the_adapter_property(tmp_path, capsys):
    """A llama whose rope is DynamicNTKScalingRoPE: adapter_for refuses by
    name; the audit fails on 'adapter', skips what needs one, still walks."""
    model = tmp_path / "llama-dynamic"
    shutil.copytree(zoo.checkpoint("llama"), model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["rope_scaling"] = {"type": "dynamic", "factor": 2.0}
    (model / "config.json").write_text(json.dumps(cfg))
    rc, report = run_json(capsys, "--model", model)
    status = {c["name"]: c for c in report["checks"]}
    assert rc == 1 and report["failed"] == ["adapter"]
    assert "DynamicNTKScalingRoPE" in status["adapter"]["detail"]
    assert status["tree-verify"]["status"] == "skip"
    assert status["walk-linear"]["status"] == "pass"


def test_an_audit_that_compared_nothing_of_the_model_is_not_verified(capsys):
    """An adapter refusing every verify (as a backend without the tree path's
    kernels would): every row of linear-verify, tree-verify and rollback is
    skipped, nothing fails, and the audit still must not pass: it says NOT
    VERIFIED, naming them, and exits 1 (it said PASSED and exited 0)."""
    llama = zoo.checkpoint("llama")
    defect = "suites.audit.helpers_defects:refuses_every_verify"
    rc, report = run_json(capsys, "--model", llama, "--adapter", defect, "--context", "0")
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert report["failed"] == [] and rc == 1, [line(c) for c in report["checks"]]
    assert report["unverified"] == ["linear-verify", "tree-verify", "rollback"]
    assert report["verdict"] == audit.NOT_VERIFIED
    assert status["probe"] == audit.SKIP and status["walk-linear"] == audit.PASS
    assert cli.main(["audit", "--model", str(llama), "--adapter", defect, "--context", "0"]) == 1
    text = capsys.readouterr().out
    assert "PASSED" not in text
    assert text.rstrip().splitlines()[-1].startswith(
        "NOT VERIFIED (every row of linear-verify, tree-verify, rollback skipped")
    # --only leaves the verifying properties out on purpose: what ran passed.
    rc, report = run_json(capsys, "--model", llama, "--adapter", defect, "--only", "walk-linear")
    assert rc == 0 and report["unverified"] == [] and report["verdict"] == audit.PASS


def test_a_skipped_row_of_a_user_checkpoint_is_never_recorded_as_bit_exact(tmp_path):
    """`pytest --target-model`: rows the adapter refused compared nothing, so
    the verdict table holds no row of them (they were recorded bit-exact)."""
    table = tmp_path / "verdicts.json"
    cmd = [sys.executable, "-m", "pytest", "suites/audit/test_user_model.py", "-q",
           "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "exactness",
           "-k", "linear-verify or tree-verify or rollback or walk-linear",
           "--target-model", str(zoo.checkpoint("llama")),
           "--adapter", "suites.audit.helpers_defects:refuses_every_verify",
           "--verdict-json", str(table)]
    proc = subprocess.run(cmd, cwd=ROOT, env=CHILD_ENV, capture_output=True, text=True)
    assert proc.returncode == 0 and "1 passed, 3 skipped" in proc.stdout, proc.stdout[-3000:]
    rows = json.loads(table.read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    contracts = {r["contract"]: r["verdict"] for r in rows}
    assert contracts.get("audit: walk-linear") == numerics.BIT_EXACT, contracts  # read at all
    assert [c for c in contracts if c.startswith(("audit: linear-verify", "audit: tree-verify",
                                                  "audit: rollback"))] == [], contracts


def test_usage_errors_exit_2(capsys):
    llama = str(zoo.checkpoint("llama"))
    assert cli.main(["audit", "--model", llama, "--adapter", "no_colon"]) == 2
    assert "module:attr" in capsys.readouterr().err
    assert cli.main(["audit", "--model", llama, "--adapter", "suites.audit.helpers_defects:nope"]) == 2
    assert "AttributeError" in capsys.readouterr().err
    assert cli.main(["audit", "--model", llama, "--only", "speed"]) == 2
    assert "unknown properties" in capsys.readouterr().err
    assert cli.main(["audit", "--model", llama, "--context", "-1"]) == 2
    assert "--context" in capsys.readouterr().err
    for bad in ("32,x", "0"):
        assert cli.main(["audit", "--model", llama, "--tree-nodes", bad]) == 2
        assert "--tree-nodes" in capsys.readouterr().err


def test_the_cli_as_a_subprocess_prints_the_table_and_exits_1():
    proc = subprocess.run(
        [sys.executable, "-m", "treespec", "audit", "--model", str(zoo.checkpoint("llama")),
         "--adapter", "suites.audit.helpers_defects:tail_trim", "--context", "0"],
        cwd=ROOT, env=CHILD_ENV, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "BLAS" in out and "device" in out
    row = next(line for line in out.splitlines() if line.startswith("rollback[native]"))
    assert " FAIL " in row and "max |diff|" in row and "after committing" in row
    # The defect is in the rollback only: tree-verify is not failed (off the
    # exact regimes it may be inconclusive, with its figures, and recorded).
    tree_row = next(l for l in out.splitlines() if l.startswith("tree-verify[native]"))
    word = tree_row.split()[1]  # the verdict column
    assert word in ("bit-exact", "within") + (
        () if exact_backend() else (numerics.INCONCLUSIVE,)), tree_row
    if word == numerics.INCONCLUSIVE:
        assert "max |diff|" in tree_row and "bound" in tree_row, tree_row
    record(numerics.Verdict(next(w for w in numerics.WORDS if w.startswith(word)),
                            detail=tree_row), AUDIT, "llama", "float32")
    assert out.rstrip().splitlines()[-1].startswith("FAILED (rollback[native]")


def test_pytest_options_audit_a_user_checkpoint():
    """The --target-model/--adapter pytest options drive test_user_model.py:
    one test per property, and a planted defect fails exactly its own."""
    cmd = [sys.executable, "-m", "pytest", "suites/audit/test_user_model.py", "-q",
           "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "exactness",
           "--target-model", str(zoo.checkpoint("llama")),
           "--adapter", "suites.audit.helpers_defects:last_sibling"]
    proc = subprocess.run(cmd, cwd=ROOT, env=CHILD_ENV, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "FAILED suites/audit/test_user_model.py::test_user_model[walk-siblings]" in proc.stdout
    assert "first child wins" in proc.stdout
    if exact_backend():
        assert f"1 failed, {len(audit.PROPERTIES) - 1} passed" in proc.stdout, proc.stdout[-3000:]
        return
    # Elsewhere a property whose rows are inconclusive is a skip, saying so
    # with its figures (test_user_model.py); every other one passed.
    tally = re.search(r"\b1 failed, (\d+) passed(?:, (\d+) skipped)?", proc.stdout)
    assert tally, proc.stdout[-3000:]
    passed, skipped = int(tally[1]), int(tally[2] or 0)
    assert passed + skipped == len(audit.PROPERTIES) - 1, proc.stdout[-3000:]
    skips = re.findall(r"^SKIPPED \[(\d+)\] \S+: (.*)$", proc.stdout, re.M)
    assert sum(int(n) for n, _ in skips) == skipped, proc.stdout[-3000:]
    assert all(r.startswith("inconclusive: ") and "max |diff|" in r for _, r in skips), skips
