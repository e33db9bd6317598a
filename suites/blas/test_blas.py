"""treespec.backend.blas: detection of the BLAS MLX really calls, and switching it by re-exec.

Detection is checked in fresh subprocesses: LD_PRELOAD only acts at process start, and this
pytest process may itself run under either BLAS.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suites.helpers_subprocess import project_env
from treespec.backend import blas

ROOT = Path(__file__).resolve().parents[2]
LINUX_CPU_WHEEL = sys.platform.startswith("linux")
OPENBLAS = blas.openblas_path()
needs_openblas = pytest.mark.skipif(
    OPENBLAS is None,
    reason=f"OpenBLAS not installed; CI installs it with: {blas.APT_COMMAND}",
)
linux_only = pytest.mark.skipif(not LINUX_CPU_WHEEL, reason="LD_PRELOAD/BLAS choice is a Linux CPU-backend matter")

REPORT = (
    "import json, numpy, sys\n"  # numpy maps its own (prefixed) OpenBLAS: must not fool detect()
    "from treespec.backend import blas\n"
    "print('START', flush=True)\n"
    "i = blas.{call}\n"
    "d = dict(name=i.name, cpu=i.cpu_name, library=i.library, threads=i.threads, key=i.key(),\n"
    "         regime=blas.regime(i),\n"
    "         mapped=list(i.mapped), describe=blas.describe(i), preload=__import__('os').environ.get('LD_PRELOAD'),\n"
    "         guard=__import__('os').environ.get(blas.REEXEC_ENV))\n"
    "print('INFO ' + json.dumps(d), flush=True)\n"
)


def _env(**extra):
    return project_env("LD_PRELOAD", blas.REEXEC_ENV, blas.OPENBLAS_ENV, **extra)


def _run(call="detect()", **extra):
    proc = subprocess.run(
        [sys.executable, "-c", REPORT.format(call=call)],
        cwd=ROOT, env=_env(**extra), capture_output=True, text=True,
    )
    infos = [json.loads(ln[5:]) for ln in proc.stdout.splitlines() if ln.startswith("INFO ")]
    return proc, proc.stdout.count("START"), (infos[-1] if infos else None)


@pytest.fixture(scope="module")
def plain():
    proc, _, info = _run()
    assert proc.returncode == 0, proc.stderr
    return info


@pytest.fixture(scope="module")
def preloaded():
    if OPENBLAS is None:
        pytest.skip(f"OpenBLAS not installed; CI installs it with: {blas.APT_COMMAND}")
    proc, _, info = _run(LD_PRELOAD=OPENBLAS)
    assert proc.returncode == 0, proc.stderr
    return info


# Measured, not named: the gate's probe of a branching tree under the preloaded library.
GATE = (
    "from treespec import zoo\n"
    "from treespec.evidence.gate import decide\n"
    "d = decide(zoo.build('llama'), [(-1, 0, 0, 1), (-1, 0, 1, 2)])\n"
    "print('GATE', d.run, d.exact)\n"
)


@linux_only
def test_a_blas_nobody_identified_is_never_taken_for_the_reference_blas(plain, tmp_path):
    """Every BLAS ships a libblas.so.3 (Debian's BLIS and ATLAS too, exporting
    nothing of their own); one was once taken for the reference BLAS by that
    file name and held to its bit-exactness (238 failures under BLIS). Here
    the wheel's own reference library, copied to a folder no known BLAS lives
    in under that shared name: detection cannot identify it, so it is
    "unknown", keyed and recorded by where it lives; and the gate measures it
    exact all the same (the name decides nothing)."""
    folder = tmp_path / "someblas"
    folder.mkdir()
    copy = folder / "libblas.so.3"
    shutil.copy(plain["library"], copy)
    proc, _, info = _run(LD_PRELOAD=str(copy))
    assert proc.returncode == 0, proc.stderr
    assert info["library"] == os.path.realpath(copy), info  # the copy is what MLX calls
    assert (info["name"], info["regime"]) == ("unknown", "unknown-someblas-libblas-so-3"), info
    assert info["key"] == "cpu/unknown/someblas/libblas.so.3"
    assert info["describe"].startswith("BLAS: unknown (")
    gate = subprocess.run([sys.executable, "-c", GATE], cwd=ROOT, capture_output=True, text=True,
                          env=_env(LD_PRELOAD=str(copy)))
    assert "GATE True True" in gate.stdout, gate.stdout + gate.stderr[-2000:]


@linux_only
def test_a_plain_process_reports_the_wheels_reference_blas(plain):
    assert plain["name"] == "reference", plain
    assert plain["threads"] == 1
    assert plain["describe"].startswith("BLAS: reference")
    assert plain["key"].startswith("cpu/reference")


@needs_openblas
@linux_only
def test_an_openblas_preload_is_detected_although_the_bundled_blas_stays_mapped(preloaded):
    assert preloaded["name"] == "openblas", preloaded
    assert preloaded["library"] == os.path.realpath(OPENBLAS)
    assert isinstance(preloaded["threads"], int) and preloaded["threads"] >= 1
    assert f"{preloaded['threads']} thread" in preloaded["describe"]
    # libmlx.so still maps the wheel's reference BLAS: the mapped list alone cannot tell.
    assert any("blas" in Path(m).name for m in preloaded["mapped"] if m != preloaded["library"])


@needs_openblas
@linux_only
def test_the_verdict_key_differs_between_the_two_blas(plain, preloaded):
    assert plain["key"] != preloaded["key"]


@needs_openblas
@linux_only
def test_openblas_keys_carry_the_thread_count():
    # OpenBLAS's float32 results depend on its thread count (measured): verdicts must not mix.
    _, _, one = _run(LD_PRELOAD=OPENBLAS, OPENBLAS_NUM_THREADS="1")
    assert one["threads"] == 1 and one["key"].endswith("/t1"), one


@needs_openblas
@linux_only
def test_ensure_openblas_reexecs_the_command_with_the_preload():
    proc, starts, info = _run("ensure_blas('openblas')")
    assert proc.returncode == 0, proc.stderr
    assert starts == 2, "the command should have run once, then again after the re-exec"
    assert info["name"] == "openblas"
    assert info["preload"].split(":")[0] == OPENBLAS
    assert info["guard"] is None, "a satisfied ensure_blas clears the loop guard for children"


@needs_openblas
@linux_only
def test_ensure_reference_reexecs_without_the_preload():
    proc, starts, info = _run("ensure_blas('reference')", LD_PRELOAD=OPENBLAS)
    assert proc.returncode == 0, proc.stderr
    assert starts == 2
    assert info["name"] == "reference"
    assert not info["preload"]


@linux_only
def test_ensure_does_not_reexec_when_already_satisfied(plain):
    proc, starts, info = _run(f"ensure_blas({plain['name']!r})")
    assert proc.returncode == 0, proc.stderr
    assert starts == 1 and info["key"] == plain["key"]
    proc, starts, info = _run("ensure_blas('auto')")
    assert starts == 1 and info["key"] == plain["key"]


@linux_only
def test_a_missing_openblas_names_the_debian_package(tmp_path):
    missing = str(tmp_path / "nowhere" / "libblas.so.3")
    proc, starts, info = _run("ensure_blas('openblas')", **{blas.OPENBLAS_ENV: missing})
    assert proc.returncode != 0 and info is None and starts == 1
    assert "BlasUnavailable" in proc.stderr
    assert "libopenblas0-pthread" in proc.stderr and "apt-get install" in proc.stderr
    assert missing in proc.stderr


def test_the_missing_message_names_package_command_and_paths():
    assert blas.openblas_path(["/nonexistent/libblas.so.3"]) is None
    with pytest.raises(blas.BlasUnavailable, match="libopenblas0-pthread") as err:
        blas.reexec_with_openblas(candidates=["/nonexistent/libblas.so.3"])
    assert blas.APT_COMMAND in str(err.value) and "/nonexistent/libblas.so.3" in str(err.value)


@linux_only
def test_the_loop_guard_refuses_a_second_reexec():
    # As if we had already re-exec'd for OpenBLAS and it still was not in use.
    target = OPENBLAS or "/bin/true"
    proc, starts, info = _run(
        "ensure_blas('openblas')", **{blas.REEXEC_ENV: "openblas", blas.OPENBLAS_ENV: target}
    )
    assert proc.returncode != 0 and starts == 1 and info is None
    assert "refusing to loop" in proc.stderr


def test_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="auto, reference, openblas"):
        blas.ensure_blas("fast")


def test_detect_in_this_process_is_consistent():
    info = blas.detect()
    assert info.device.startswith("Device(")
    assert blas.describe(info).startswith(f"BLAS: {info.name}")
    assert info.key().startswith(f"{info.device_type}/{info.name}")
    assert info == blas.detect()  # frozen, comparable, stable


@linux_only
def test_a_reexec_is_refused_inside_pytest():
    # Re-exec'ing here would restart the test session under another BLAS.
    other = "reference" if blas.detect().cpu_name == "openblas" else "openblas"
    if other == "openblas" and OPENBLAS is None:
        pytest.skip(f"OpenBLAS not installed; CI installs it with: {blas.APT_COMMAND}")
    with pytest.raises(blas.BlasUnavailable, match="inside pytest"):
        blas.ensure_blas(other)


THREADS_AT_RUN_TIME = (
    "import ctypes, json\n"
    "from treespec.backend import blas\n"
    "before = blas.detect(mapped=False)\n"
    "ctypes.CDLL(before.library).openblas_set_num_threads(1)\n"
    "after = blas.detect(mapped=False)\n"
    "print('KEYS ' + json.dumps([before.threads, before.key(), after.threads, after.key()]))\n"
)


@needs_openblas
@linux_only
def test_the_key_follows_an_openblas_thread_count_changed_at_run_time():
    """The library is classified once per process, its thread count read on
    every detection: one and two OpenBLAS threads give different float32
    logits, so a verdict measured with two must not be reused with one."""
    proc = subprocess.run([sys.executable, "-c", THREADS_AT_RUN_TIME], cwd=ROOT,
                          env=_env(LD_PRELOAD=OPENBLAS, OPENBLAS_NUM_THREADS="2"),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("KEYS "))
    threads_before, key_before, threads_after, key_after = json.loads(line[5:])
    assert (threads_before, threads_after) == (2, 1)
    assert key_before.endswith("/t2") and key_after.endswith("/t1"), (key_before, key_after)


@pytest.mark.parametrize("setting", ["0", "1", None])
def test_every_report_naming_the_backend_names_the_float32_precision(setting, monkeypatch):
    """generate's, bench's, audit's and the verdict table's backend line is
    describe()'s: with TF32 (MLX's default where the hardware has it) float32
    products round to 10 bits, so a record must say which it was made at."""
    if setting is None:
        monkeypatch.delenv("MLX_ENABLE_TF32", raising=False)
    else:
        monkeypatch.setenv("MLX_ENABLE_TF32", setting)
    assert blas.describe().endswith(f", MLX_ENABLE_TF32={setting or 'unset'}"), blas.describe()


@pytest.mark.parametrize("backend, device, cudnn, regime", [
    ("metal", "Apple M2 Max", False, "metal-apple-m2-max"),
    ("metal", "Apple Paravirtual device", False, "metal-apple-paravirtual-device"),
    ("cuda", "NVIDIA H100 80GB HBM3", False, "cuda"),
    ("cuda", "NVIDIA H100 80GB HBM3", True, "cuda-cudnn-attention"),
    ("metal", "", False, "metal"),
])
def test_a_metal_chip_githubs_paravirtual_gpu_and_cudnn_attention_keep_goldens_of_their_own(
        backend, device, cudnn, regime):
    """cuDNN attention rounds a multi-token attention otherwise than MLX's own
    kernels (12 CUDA golden texts moved on the H100): its records are its own."""
    assert blas.gpu_regime(backend, device, cudnn) == regime
