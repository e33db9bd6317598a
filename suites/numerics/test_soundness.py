"""Unsound kernels get no verdict (treespec.backend.soundness, suites/backend.py):
a quantized product that is not repeatable, not finite, far off its own
dequantized product, or missing on this backend makes every comparison on
it inconclusive and the gate decline, never a pass; on an exact regime it is
a FAIL. Faults are planted by replacing ``mx.quantized_matmul`` for one
test; on this CPU the unplanted kernels are sound."""

import subprocess
import sys

import mlx.core as mx
import pytest

import suites.verdict as verdict_plugin
from suites import backend
from suites.helpers_numerics import exact_backend, require_sound
from suites.helpers_subprocess import project_env
from suites.verdict import unrecorded
from treespec.evidence import numerics
from treespec.backend import soundness
from treespec import zoo
from treespec.backend.blas import regime
from treespec.evidence.gate import decide, shapes_for
from treespec.kv_options import ProbeCache

pytestmark = pytest.mark.exactness

REAL = mx.quantized_matmul
WIDTHS = (1, 2, 5, 9)


def SOUND(x, w, scales=None, biases=None, transpose=True, group_size=None, bits=None,
          mode="affine"):
    """A quantized product every backend computes soundly (a plain matmul of
    the dequantized weights): the base the faults are planted on, so that a
    backend whose own kernel is unsound (the H200's) still shows each plant
    alone."""
    w = mx.dequantize(w, scales, biases, group_size=group_size, bits=bits, mode=mode)
    return x @ (w.swapaxes(-1, -2) if transpose else w)


def _rows(x) -> int:
    return x.shape[-2] if x.ndim > 1 else 1


PLANTS = {
    # identical calls at more than one row differ (what the H200 showed at 5 rows)
    "not repeatable": lambda x, *a, **k: SOUND(x, *a, **k) + (
        1e-3 * mx.random.normal(SOUND(x, *a, **k).shape) if _rows(x) > 1 else 0),
    "not finite": lambda x, *a, **k: SOUND(x, *a, **k) / (0.0 if _rows(x) == 5 else 1.0),
    "off its own dequantized product": lambda x, *a, **k: SOUND(x, *a, **k) + (
        3.0 if _rows(x) == 9 else 0.0),
    "raises": lambda x, *a, **k: SOUND(x, *a, **k) if _rows(x) == 1 else (_ for _ in ()).throw(
        RuntimeError("[quantized_matmul] No implementation for problem shape: planted")),
}


@pytest.fixture
def planted(monkeypatch):
    monkeypatch.setattr(soundness, "_MEMO", {})

    def plant(fault):  # a name of PLANTS, or the replacement itself
        monkeypatch.setattr(mx, "quantized_matmul", PLANTS.get(fault, fault))
    return plant


@pytest.fixture(scope="module")
def q4():
    return zoo.build("llama", "float32", 4)


def test_this_backends_quantized_products_are_sound_where_it_is_exact(q4):
    if not exact_backend():
        pytest.skip(f"{regime()}: soundness is measured, not expected, off the exact regimes")
    for bits in (4, 8):
        assert soundness.faults(zoo.build("llama", "bfloat16", bits)) == ()
    assert soundness.faults(q4) == ()


@pytest.mark.parametrize("fault", list(PLANTS))
def test_each_planted_fault_is_found_at_the_rows_it_fires_and_named(fault, planted, q4):
    planted(fault)
    found = soundness.faults(q4, WIDTHS, every=True)
    rows = {int(str(f).split(" at ")[1].split(" rows")[0]) for f in found}
    assert rows == {2, 5, 9} if fault in ("not repeatable", "raises") else rows == (
        {5} if fault == "not finite" else {9}), found
    assert all(fault in f.what for f in found), found
    assert all("4-bit group 64" in str(f) for f in found)


def test_a_model_without_quantized_products_has_nothing_to_probe(planted):
    planted("not repeatable")
    assert soundness.faults(zoo.build("llama"), WIDTHS) == ()


def test_comparisons_on_unsound_kernels_are_inconclusive_never_a_pass(planted, q4):
    planted("not repeatable")
    env = numerics.envelope(q4, 3, WIDTHS)
    assert env.faults and "not repeatable" in env.line()
    a = mx.zeros((2, 8))
    v = numerics.judge(a + 1e-9, a, env)
    assert v.word == numerics.INCONCLUSIVE and numerics.UNSOUND in v.detail
    assert numerics.judge(a + 1.0, a, env).word == numerics.INCONCLUSIVE  # not FAIL: no bound
    assert numerics.judge(a, a, env).word == numerics.BIT_EXACT  # equal bytes are equal anywhere
    # a leak shown by a verify that repeats its bits needs no bound (isolation.leak)
    v = numerics.judge(a + 1.0, a, env, leak="a leak: node 1's row changes")
    assert v.word == numerics.FAIL and numerics.UNSOUND in v.detail and "a leak" in v.detail


@pytest.mark.parametrize("measured", ["envelope", "measure"])
def test_a_kernel_unsound_only_at_a_samples_prefill_width_makes_the_envelope_unsound(
        measured, planted):
    """The envelope's samples prefill contexts spread over the bucket (9-32
    for a context of 20, its first at 9 rows), widths the comparison's own
    probe (1-3 here) does not cover: a kernel that raises only there gives an
    unsound envelope naming it, not MLX's error out of the measurement."""
    model = zoo.build("llama", "float32", 4)  # fresh: no envelope of it memoized
    planted(lambda x, *a, **k: (PLANTS["raises"] if _rows(x) == 9 else SOUND)(x, *a, **k))
    env = getattr(numerics, measured)(model, 20, (1, 2, 3))
    assert env.faults, env.line()
    assert "at 9 rows" in env.faults[0] and "raises" in env.faults[0], env.faults


def test_unsound_kernels_fail_an_exact_regime_and_skip_elsewhere(planted, q4, monkeypatch):
    planted("not finite")
    with unrecorded():
        monkeypatch.setattr(verdict_plugin, "exact_backend", lambda: True)
        with pytest.raises(pytest.fail.Exception, match="measured exact by the census"):
            require_sound(q4, WIDTHS)
        monkeypatch.setattr(verdict_plugin, "exact_backend", lambda: False)
        with pytest.raises(pytest.skip.Exception, match="not finite"):
            require_sound(q4, WIDTHS)


@pytest.mark.parametrize("fault", ["not repeatable", "raises"])
def test_the_gate_declines_unsound_weight_products_without_probing(fault, planted, q4):
    planted(fault)
    d = decide(q4, shapes_for(3), allow_inexact=True)
    assert not d.run and not d.exact and d.probe is None
    assert "declined to classic decode" in d.reason and fault in d.reason, d.reason


def test_the_gate_declines_a_cache_mode_whose_kernel_is_missing_and_quotes_mlx(monkeypatch):
    """A KV-quantized cache's attention products (heads x rows x dim, 4-D and up)
    are not the weights' the soundness probe multiplies: there the probe's
    own forward raises, and the gate declines with MLX's error."""
    model = zoo.build("qwen3")

    def missing(x, *a, **k):
        if x.ndim >= 4 and x.shape[-2] > 1:
            raise RuntimeError("[quantized_matmul] No implementation for problem shape: planted")
        return REAL(x, *a, **k)
    monkeypatch.setattr(mx, "quantized_matmul", missing)
    d = decide(model, shapes_for(3), cache=ProbeCache(kv_bits=4, kv_group_size=32))
    assert not d.run and "cannot run the probe's multi-token forwards" in d.reason, d.reason
    assert "kv_quant 4bit/g32" in d.reason and "No implementation" in d.reason


def test_a_missing_kernel_is_reproduced_on_mlx_alone_before_it_is_blamed_on_the_backend(
        monkeypatch):
    msg = ("[quantized_matmul] No implementation for problem shape: 5x8x32x4, transpose: true, "
           'activation: float32, bits: 4, group size: 32, mode: "affine".')
    if exact_backend():  # MLX's CPU has the kernel: such a failure stays a failure
        assert backend.reproduce(msg) is None
    assert backend.reproduce("some other RuntimeError") is None

    def missing(x, *a, **k):  # only mlx-lm's grouped-query layout: 2 kv heads x 2 repeats
        if x.shape == (1, 2, 2, 5, 32):
            raise RuntimeError(msg)
        return SOUND(x, *a, **k)
    monkeypatch.setattr(mx, "quantized_matmul", missing)
    assert backend.reproduce(msg) == msg
    assert backend.reproduce(msg.replace("5x8x32x4", "6x8x32x4")) is None


INNER = '''
import mlx.core as mx
import pytest
import suites.backend

pytestmark = pytest.mark.exactness
suites.backend.exact_backend = lambda: EXACT
REAL = mx.quantized_matmul
MSG = ("[quantized_matmul] No implementation for problem shape: 5x8x32x4, transpose: true, "
       'activation: float32, bits: 4, group size: 32, mode: "affine".')


def missing(x, *a, **k):
    if x.shape[-2] == 5:
        raise RuntimeError(MSG)
    return REAL(x, *a, **k)


mx.quantized_matmul = missing


def test_needs_the_missing_kernel():
    q = mx.quantize(mx.ones((4, 8, 32)), group_size=32, bits=4)
    mx.eval(mx.quantized_matmul(mx.ones((4, 5, 32)), *q, group_size=32, bits=4))


def test_fails_on_its_own():
    raise RuntimeError("[quantized_matmul] No implementation for problem shape: 1x2x3x4 (garbled)")
'''


@pytest.mark.parametrize("exact", [False, True], ids=["inexact", "exact"])
def test_only_a_reproduced_missing_kernel_turns_a_failure_into_not_run(tmp_path, exact):
    (tmp_path / "test_inner.py").write_text(INNER.replace("EXACT", repr(exact)))
    # The parent's path after the project's (on the H200 MLX lives in a private site dir).
    env = project_env()
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
           "-p", "suites.verdict", "-p", "suites.backend", "--rootdir", str(tmp_path),
           "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path / "test_inner.py")]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    out = proc.stdout
    if not exact:
        assert "1 failed, 1 skipped" in out and "not run on this backend" in out, out[-2000:]
        assert "backend: kernel exists" in out  # its row in the verdict table
    else:  # a backend measured exact: a missing kernel is a regression
        assert "2 failed" in out, out[-2000:]
