"""Project-wide pytest setup: markers, hypothesis profiles, golden snapshots,
``--blas`` (the CPU regime), ``--device`` (MLX's device, set before mlx-lm is
imported), the verdict table (suites/verdict.py), the order tests reach
xdist's workers (suites/scheduling.py), and a private folder for the probe's
disk memo."""

import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

# Float32 products at float32 precision, before MLX is imported: MLX runs
# float32 matrix products as TF32 where the hardware has it (CUDA; Apple's
# M5), unless MLX_ENABLE_TF32=0. The suite's float32 checks need float32:
# on the H200 TF32 made the float32 envelope 1e-2 to 3.6, so the negative
# controls no longer separated from it and nearly every float32 verdict was
# inconclusive (docs/numerics.md#tf32-and-cudnn-attention-on-cuda). A caller's own setting is kept;
# the CPU backend has no TF32 and is unaffected. xdist workers and the
# suites' subprocesses inherit it.
os.environ.setdefault("MLX_ENABLE_TF32", "0")
# cuDNN attention off on CUDA, as every treespec command turns it off
# (treespec/backend/cuda.py), so that the suite measures what the commands
# run. It also changes the arithmetic: on the H100 in bfloat16 it made
# multi-token attention differ from one-token steps where MLX's own kernels
# do not (gemma3_text's tree rows on a wrapped ring: 6 of 39 bit-exact with
# it, 30 without; results/half-power/README.md#cudnn-attention-and-the-suite).
# A caller's own setting is kept, and keys the goldens (blas.regime).
os.environ.setdefault("MLX_CUDA_USE_CUDNN_SDPA", "0")

import pytest
from hypothesis import HealthCheck, settings
from syrupy.extensions.amber import AmberSnapshotExtension

from suites.goldens import GOLDEN_MISSING, RECORD_GOLDENS
from treespec.backend import blas
from treespec.cli import startup
from treespec.errors import UsageError as TreespecUsageError

GOLDEN = Path(__file__).parent / "golden"

pytest_plugins = ["suites.verdict", "suites.planted", "suites.backend", "suites.scheduling"]

# `ci` is deterministic (derandomized, no example database) so a red run is
# reproducible from the commit alone; `dev` searches much harder.
settings.register_profile(
    "ci",
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    max_examples=2000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def pytest_addoption(parser, pluginmanager):
    parser.addoption(
        "--hypothesis-profile-name",
        default=None,
        help="hypothesis profile: ci (default) or dev; env TREESPEC_HYPOTHESIS",
    )
    # Here, not in suites/: the root conftest is loaded before the command
    # line is parsed, so `--target-model PATH` (with a space) works too.
    group = parser.getgroup("treespec audit", "audit a user checkpoint (suites/audit/test_user_model.py)")
    group.addoption("--target-model", default=None, metavar="PATH",
                    help="mlx-lm checkpoint directory whose tree adapter the audit tests check")
    group.addoption("--draft-model", default=None, metavar="PATH",
                    help="drafter checkpoint for the end-to-end text diff (default: the target itself)")
    group.addoption("--adapter", default=None, metavar="MODULE:ATTR",
                    help="callable model -> adapter to audit instead of treespec.verify.adapter_for")
    parser.addoption(
        "--blas", default="auto", choices=("auto", "reference", "openblas"),
        help="the CPU BLAS MLX multiplies with: openblas re-executes pytest with Debian's "
             "OpenBLAS preloaded (the fast, inexact regime), reference without any preloaded "
             "BLAS; auto keeps this process's (default)")
    parser.addoption("--device", choices=startup.DEVICES, default=None,
                     help=f"{startup.DEVICE_HELP}; xdist workers and the suite's subprocesses "
                     "compute on the same device")
    _apply_device(parser, pluginmanager)


def _apply_device(parser, pluginmanager):
    """``--device``, applied now: this hook runs as this conftest registers,
    before its ``pytest_plugins`` are imported, and they import mlx-lm (by
    pytest_configure mlx_lm.generate is loaded, its stream made on the default
    device: treespec/cli/startup.py says why that is too late). The command line
    is not parsed yet, so it is read here as pytest reads it: the ini's addopts,
    then PYTEST_ADDOPTS, then the arguments (an xdist worker gets its
    controller's arguments, so it sets the same device)."""
    config = pluginmanager.get_plugin("pytestconfig")
    args = [*config.getini("addopts"), *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
            *config.invocation_params.args]
    try:
        name = startup.apply_device(parser.parse_known_and_unknown_args(args)[0].device)
    except TreespecUsageError as e:
        raise pytest.UsageError(str(e))
    if name is not None:  # the suite's subprocesses (treespec, child pytest runs) inherit it
        os.environ[startup.DEVICE_ENV] = name


def _choose_blas(config):
    """Re-execute this pytest under the requested BLAS before any test runs
    (LD_PRELOAD only takes effect in a new process). xdist workers inherit
    the controller's environment and must already have it."""
    choice = config.getoption("--blas")
    try:
        startup.refuse_blas_on_gpu(choice, config.getoption("--device"))
    except TreespecUsageError as e:
        raise pytest.UsageError(str(e))
    if choice == "auto":
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        if blas.detect().cpu_name != choice:
            raise pytest.UsageError(f"--blas {choice}: this worker runs on {blas.describe()}")
        return
    try:
        blas.ensure_blas(choice, [sys.executable, *sys.orig_argv[1:]])
    except blas.BlasUnavailable as e:
        raise pytest.UsageError(f"--blas {choice}: {e}")


def pytest_configure(config):
    _choose_blas(config)
    config.addinivalue_line(
        "markers", "exactness: checks one of the ten exactness contracts (the CI gate)"
    )
    config.addinivalue_line(
        "markers", f"goldens: checks this backend's goldens (texts, envelopes); `{RECORD_GOLDENS}` "
        "records them")
    profile = (
        config.getoption("--hypothesis-profile-name")
        or os.environ.get("TREESPEC_HYPOTHESIS")
        or "ci"
    )
    settings.load_profile(profile)
    # The gate's verdicts on disk (treespec/evidence/gate_memo.py) go to a folder of this
    # run, not the user's ~/.cache/treespec; subprocesses and xdist workers
    # inherit it. A caller's TREESPEC_CACHE_DIR is kept.
    if not os.environ.get("TREESPEC_CACHE_DIR"):
        os.environ["TREESPEC_CACHE_DIR"] = config._treespec_memo = tempfile.mkdtemp(
            prefix="treespec-test-cache-")


def pytest_unconfigure(config):
    memo = getattr(config, "_treespec_memo", None)
    if memo is not None:  # made by this run (not a worker's, not the caller's): removed
        shutil.rmtree(memo, ignore_errors=True)
        os.environ.pop("TREESPEC_CACHE_DIR", None)


def _regime() -> str:
    # Goldens are kept per numerics regime (reference, openblas, cuda, ...):
    # docs/numerics.md#goldens-per-regime says what each pins and how to record a
    # new backend's.
    return blas.regime()


class GoldenExtension(AmberSnapshotExtension):
    """Snapshots live under golden/<suite>/<regime>/, not in scattered
    __snapshots__ folders."""

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(_golden_dir(Path(test_location.filepath)))


def _golden_dir(test_file: Path) -> Path:
    """Where this regime's goldens of a test file live: golden/<suite>/<regime>/."""
    return GOLDEN / test_file.parent.name / _regime()


@pytest.fixture
def snapshot(snapshot):
    return snapshot.use_extension(GoldenExtension)




@pytest.fixture
def golden_missing(request):
    """None where this regime's goldens of the requesting test file exist (or
    are being recorded); else what to say: a regime nobody recorded yet (a
    new backend) has none, and its tests report that with the one command
    that records them, after checking what they check against an independent
    reference in the same run, instead of failing on a missing snapshot."""
    test_file = Path(str(request.node.fspath))
    golden = _golden_dir(test_file) / f"{test_file.stem}.ambr"
    if request.config.option.update_snapshots or golden.exists():
        return None
    return f"{GOLDEN_MISSING} for regime {_regime()}: run `{RECORD_GOLDENS}`"
