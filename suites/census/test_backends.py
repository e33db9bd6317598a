"""What the census reports on real backends, each verdict checked against a
direct computation: the matmul rows of ``x[:M] @ w.T`` against
``x[i:i+1] @ w.T``, bit for bit, written without the census's code
(suites/census/helpers.py).

- On MLX's bundled reference BLAS the census finds matmul row-invariant at
  every M, and so does the direct check.
- Under a preloaded BLAS (Debian's OpenBLAS; BLIS, a library the project was
  never told about), in a subprocess since LD_PRELOAD acts at process start:
  the census finds float32 matmul differing from some M, the direct check
  finds it too, and rms_norm and rope (which no BLAS computes) stay identical.

Tried: with the census's comparison answering "same" for every pair, both
preloaded tests fail (the census finds no matmul row differing where the
direct check finds one).
"""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import mlx.core as mx
import pytest

from suites.census.helpers import direct_first
from suites.helpers_subprocess import project_env
from treespec.backend import blas
from treespec.backend import census as c

pytestmark = pytest.mark.exactness

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = tuple(range(1, 17))
SHAPES = ((64, 128), (512, 512))  # the default census's matmuls (in, out)
_TRIPLET = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
LIBRARIES = {
    "openblas": blas.openblas_path(),
    "blis": f"/usr/lib/{_TRIPLET}/blis-pthread/libblas.so.3",
}

SCRIPT = """
import json
import mlx.core as mx
from suites.census.helpers import direct_first
from treespec.backend import blas
from treespec.backend import census as c
rows = c.census(dtypes=("float32",))
direct = {f"{i}->{o}": direct_first(i, o, mx.float32, tuple(range(1, 17))) for i, o in %r}
print("CENSUS " + json.dumps({"blas": blas.describe(), "rows": c.to_json(rows), "direct": direct}))
""" % (SHAPES,)


def cpu_reference() -> bool:
    return mx.default_device() == mx.cpu and blas.detect(mapped=False).cpu_name == "reference"


@pytest.mark.skipif(not cpu_reference(), reason="this process does not multiply with MLX's "
                    "bundled reference BLAS on the CPU")
def test_on_the_reference_blas_matmul_is_row_invariant_in_the_census_and_directly():
    got = [r for r in c.census(widths=WIDTHS) if r.op == "matmul"]
    assert {(r.shape, r.dtype) for r in got} == {
        (f"{i}->{o}", d) for i, o in SHAPES for d in c.DTYPES}
    for r in got:
        direct = direct_first(*map(int, r.shape.split("->")), getattr(mx, r.dtype), WIDTHS)
        assert direct is None, (r, direct)
        assert (r.first_differs, r.max_diff) == (None, 0.0), r


def _preloaded(library: str) -> dict:
    env = project_env("LD_PRELOAD", blas.REEXEC_ENV, blas.OPENBLAS_ENV, LD_PRELOAD=library)
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("CENSUS ")][-1]
    return json.loads(line[len("CENSUS "):])


@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_under_a_preloaded_blas_float32_matmul_differs_where_the_direct_check_says(name):
    library = LIBRARIES[name]
    if not library or not os.path.isfile(library):
        pytest.skip(f"{name} is not installed here ({library or blas.missing_openblas_message()})")
    out = _preloaded(library)
    assert library in out["blas"]  # the subprocess really multiplied with it
    rows = [c.Row(**{**r, "widths": tuple(r["widths"])}) for r in out["rows"]]
    matmul = {r.shape: r for r in rows if r.op == "matmul" and r.how == "tokens"}
    # Each shape: the census differs exactly where the direct check does.
    assert {s: r.first_differs is not None for s, r in matmul.items()} == {
        s: d is not None for s, d in out["direct"].items()}, (out["direct"], matmul)
    assert any(d is not None for d in out["direct"].values()), out["direct"]
    assert all(r.max_diff > 0 for r in matmul.values() if r.first_differs is not None)
    # What no BLAS computes stays row-invariant.
    for r in rows:
        if r.op in ("rms_norm", "rope"):
            assert r.first_differs is None and r.error is None, r
