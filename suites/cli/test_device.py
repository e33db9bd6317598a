"""``--device cpu|gpu`` (treespec generate, bench, audit and pytest) and the
TF32 switch every command sets (treespec/cli/startup.py).

The device must be set before mlx_lm.generate is imported: that module makes
its ``generation_stream`` on the default device at import, and the rounds run
on it while the gate probes the default device. On a machine with one device
both orders give the same stream, so the order itself is what these tests
pin: a spy on ``mx.set_default_device``, installed in a subprocess before
anything else, records whether mlx_lm.generate was loaded when the device
was set. Fails with the device set after the command's module is imported
(``startup.apply_device`` moved below ``command(...)`` in main), tried; and
for pytest with the device applied in pytest_configure, tried."""

import json
import subprocess
import sys
import types
from pathlib import Path

import mlx.core as mx
import pytest

from suites.helpers_subprocess import project_env, without_startup_notes
from treespec.cli import startup
from treespec.cli.main import main
from treespec.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
CPU = str(mx.Device(mx.cpu))
HAS_GPU = mx.is_available(mx.Device(mx.gpu))

# mx.set_default_device spied on before anything imports mlx-lm: each call with
# whether mlx_lm.generate was loaded then.
SPY = """
import sys
import mlx.core as mx

CALLS = []
_set = mx.set_default_device


def _spy(device):
    CALLS.append([str(device), "mlx_lm.generate" in sys.modules])
    _set(device)


mx.set_default_device = _spy
"""

CLI = SPY + """
import json
from treespec.cli.main import main

rc = main(sys.argv[2:])
stream = sys.modules["mlx_lm.generate"].generation_stream
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "calls": CALLS, "stream": str(stream.device),
               "default": str(mx.default_device())}, f)
"""


def test_device_cpu_is_set_before_mlx_lm_makes_its_stream_and_the_stream_is_on_the_cpu(tmp_path):
    record = tmp_path / "record.json"
    run = subprocess.run([sys.executable, "-c", CLI, str(record), "generate", "--device", "cpu",
                          "--json", "-m", "4"], cwd=ROOT, env=project_env(), capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    seen = json.loads(record.read_text())
    assert seen["rc"] == 0
    assert seen["calls"][0] == [CPU, False], seen  # set while mlx_lm.generate was not loaded
    assert seen["stream"] == seen["default"] == CPU
    assert json.loads(run.stdout)["diagnostics"]["device"] == CPU  # the record names it


def test_without_device_the_default_device_is_left_alone(tmp_path):
    record = tmp_path / "record.json"
    run = subprocess.run([sys.executable, "-c", CLI, str(record), "generate", "--json", "-m", "2"],
                         cwd=ROOT, env=project_env(startup.DEVICE_ENV), capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(record.read_text())["calls"] == []


@pytest.mark.skipif(HAS_GPU, reason="this MLX has a GPU: --device gpu is accepted here")
@pytest.mark.parametrize("command", [["generate"], ["bench"], ["audit", "--model", "x"]],
                         ids=["generate", "bench", "audit"])
def test_device_gpu_where_mlx_has_none_is_a_one_line_error_naming_the_flag(capsys, command):
    assert main([*command, "--device", "gpu"]) == 2
    err = without_startup_notes(capsys.readouterr().err)
    assert err.count("\n") == 1, err
    assert err.startswith(f"treespec {command[0]}: error: --device gpu: MLX has no GPU here "
                          "(mx.is_available(mx.gpu) is False"), err
    assert mx.default_device() == mx.cpu


def test_the_variable_is_the_flags_default_and_a_bad_value_names_it(capsys, monkeypatch):
    monkeypatch.setenv(startup.DEVICE_ENV, "tpu")
    assert main(["generate"]) == 2
    assert without_startup_notes(capsys.readouterr().err) == (
        "treespec generate: error: TREESPEC_DEVICE=tpu: not a device; give one of cpu, gpu\n")
    with pytest.raises(UsageError, match="--device tpu: not a device"):
        startup.apply_device("tpu")  # the library's callers get the same check


def test_a_device_other_than_mlx_lms_stream_is_refused_not_switched(capsys, monkeypatch):
    """An in-process caller whose mlx_lm.generate already made its stream on
    another device: switching now would probe one device and decode on the
    other, so it is an error, and the default device is left as it was."""
    fake = types.SimpleNamespace(generation_stream=types.SimpleNamespace(
        device=mx.Device(mx.gpu)))
    monkeypatch.setitem(sys.modules, "mlx_lm.generate", fake)
    before = mx.default_device()
    assert main(["generate", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--device cpu: mlx_lm.generate is already imported, its stream on Device(gpu, 0)" in err
    assert mx.default_device() == before


def test_blas_beside_the_gpu_would_choose_nothing_and_is_refused(capsys):
    assert main(["generate", "--device", "gpu", "--blas", "openblas"]) == 2
    assert "--blas openblas chooses the CPU BLAS, and --device gpu multiplies on the GPU" in \
        capsys.readouterr().err
    startup.refuse_blas_on_gpu("auto", "gpu")  # no BLAS chosen: nothing to refuse
    startup.refuse_blas_on_gpu("openblas", "cpu")


# --- TF32: off in every command, a caller's own setting kept, the record names it


@pytest.mark.parametrize("caller,expected", [(None, "0"), ("1", "1")], ids=["unset", "set to 1"])
def test_generate_runs_with_tf32_off_unless_the_caller_set_it_and_says_so(caller, expected):
    env = project_env("MLX_ENABLE_TF32", MLX_ENABLE_TF32=caller)
    run = subprocess.run([sys.executable, "-m", "treespec", "generate", "--json", "-m", "2"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["diagnostics"]["tf32"] == expected


def test_float32_products_keeps_a_callers_setting():
    env = {}
    assert startup.float32_products(env) == "0" and env == {"MLX_ENABLE_TF32": "0"}
    env = {"MLX_ENABLE_TF32": "1"}
    assert startup.float32_products(env) == "1" and env == {"MLX_ENABLE_TF32": "1"}
    assert startup.settings({})["tf32"] == "unset"


# --- pytest --device: applied by the root conftest before its plugins import mlx-lm

# A plugin given with -p (loaded before any conftest): the spy, and at
# pytest_configure (after the conftests and their plugins loaded) a record
# of this process, the controller's or an xdist worker's.
PLUGIN = SPY + """
import json
import os


def pytest_configure(config):
    who = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    stream = sys.modules["mlx_lm.generate"].generation_stream
    with open(os.path.join(os.environ["DEVICE_SPY_DIR"], who + ".json"), "w") as f:
        json.dump({"calls": CALLS, "loaded_by_configure": "mlx_lm.generate" in sys.modules,
                   "stream": str(stream.device), "env": os.environ.get("TREESPEC_DEVICE")}, f)
"""

ONE_TEST = "suites/cli/test_device.py::test_float32_products_keeps_a_callers_setting"


def test_pytest_device_cpu_is_set_before_the_plugins_import_mlx_lm_in_every_worker(tmp_path):
    (tmp_path / "device_spy.py").write_text(PLUGIN)
    env = project_env(startup.DEVICE_ENV, DEVICE_SPY_DIR=str(tmp_path))
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "device_spy", "-p",
                          "no:cacheprovider", "--device", "cpu", "-n", "1", "-q", ONE_TEST],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    for who in ("controller", "gw0"):
        seen = json.loads((tmp_path / f"{who}.json").read_text())
        assert seen["calls"][0] == [CPU, False], (who, seen)
        # pytest_configure would have been too late: the plugins loaded it by then
        assert seen["loaded_by_configure"] and seen["stream"] == CPU, (who, seen)
        assert seen["env"] == "cpu", (who, seen)  # the suite's subprocesses get it too


@pytest.mark.skipif(HAS_GPU, reason="this MLX has a GPU: --device gpu is accepted here")
def test_pytest_device_gpu_where_mlx_has_none_is_a_usage_error():
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--device",
                          "gpu", "--collect-only", "-q", ONE_TEST], cwd=ROOT,
                         env=project_env(startup.DEVICE_ENV), capture_output=True, text=True)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert run.stderr.strip() == (
        "ERROR: --device gpu: MLX has no GPU here (mx.is_available(mx.gpu) is False: a CPU-only "
        "MLX build, or no Metal or CUDA device); give --device cpu or leave --device out"), \
        run.stderr
    assert "Traceback" not in run.stdout + run.stderr
