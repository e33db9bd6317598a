"""treespec.auto.costcurve: the verify cost curve and the T-forward-vs-T-steps measurement."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from suites.helpers_subprocess import project_env
from treespec.backend import blas
from treespec.auto.costcurve import build_llama, stepwise_exactness, verify_cost_curve

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny():
    return build_llama(64, 2, vocab=256, seed=0)


def test_cost_curve_rows_and_ratios(tiny):
    rows = verify_cost_curve(tiny, Ts=(1, 2, 8), context=16, repeats=2, warmup=1)
    assert [r["T"] for r in rows] == [1, 2, 8]
    assert rows[0]["ratio_to_T1"] == 1.0
    assert all(r["median_ms"] > 0 and r["min_ms"] <= r["median_ms"] for r in rows)


def test_the_curve_leaves_the_cache_state_it_measures_from(tiny):
    # Trimming between repeats means a second run sees the same state: same shapes, no growth.
    a = verify_cost_curve(tiny, Ts=(4,), context=8, repeats=1, warmup=0)
    b = verify_cost_curve(tiny, Ts=(4,), context=8, repeats=1, warmup=0)
    assert a[0]["T"] == b[0]["T"] == 4


def test_stepwise_exactness_reports_every_T(tiny):
    rows = stepwise_exactness(tiny, T_max=5, context=8)
    assert [r["T"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0]["identical"] and rows[0]["max_abs_diff"] == 0.0
    for r in rows:
        assert r["identical"] == (r["max_abs_diff"] == 0.0)
        assert 0 <= r["argmax_flips"] <= r["T"]


@pytest.mark.exactness
@pytest.mark.skipif(
    not sys.platform.startswith("linux") or blas.detect().device_type != "cpu",
    reason="the bundled reference BLAS is the Linux CPU wheel's",
)
def test_reference_blas_forward_over_T_equals_T_single_steps():
    # DESIGN contract 6's premise on this backend: with the bundled reference BLAS a T-token
    # forward is bit-identical to T single-token steps (float32, 4-bit). Run where the reference
    # BLAS is guaranteed, whatever this pytest process was started with.
    code = (
        "from treespec.backend import blas; from treespec.auto.costcurve import build_llama, stepwise_exactness\n"
        "assert blas.ensure_blas('reference').name == 'reference'\n"
        "for bits in (None, 4):\n"
        "    rows = stepwise_exactness(build_llama(64, 2, vocab=256, bits=bits), T_max=8, context=8)\n"
        "    bad = [r for r in rows if not r['identical']]\n"
        "    assert not bad, (bits, bad)\n"
        "print('OK')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=project_env(blas.REEXEC_ENV),
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr


def test_both_blas_cli_prints_one_table_naming_each_blas():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", blas.REEXEC_ENV)}
    proc = subprocess.run(
        [sys.executable, "-m", "treespec.auto.costcurve", "--dims", "64x2", "--Ts", "1,2",
         "--repeats", "1", "--context", "8", "--exactness", "4", "--both-blas"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "BLAS: reference" in out and "verify cost curve" in out and "reference" in out
    if blas.openblas_path():
        assert "BLAS: openblas" in out and "openblas (" in out
    else:
        assert "libopenblas0-pthread" in out
