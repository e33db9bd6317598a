"""Planted kernel regressions (docs/numerics.md#planted-regressions): a pytest plugin
(loaded by the root conftest.py) that patches MLX and mlx-lm functions where
mlx-lm calls them, for one test (the ``plant`` fixture) or for a whole run
(``--plant NAME``: run any selection of the suite under one regression and
watch it turn red, e.g. on a new backend).

Each plant is one entry of :data:`PLANTS`: what it patches, when it fires,
and what the suite must do about it (``expect``: "FAIL" where the result is
wrong, "declined" where only a multi-token forward's last bits move and the
gate declining is the right answer). Size-conditional plants fire only at
sizes real models use (32+ matmul rows, head_dim 128, 1024+ keys): the zoo's
own sizes never reach them, the size matrix (suites/plants) does.

While a plant is active, the process's memoized envelopes and gate probes are
set aside (a planted measurement must neither use nor poison the real ones),
and the plant tests run the suite's checks :func:`suites.verdict.unrecorded`:
a FAIL they provoke on purpose is not the run's verdict.
"""

import copy
import importlib
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
import mlx_lm.models.base as mlx_base
import pytest

from treespec.evidence import gate, numerics
from treespec import rows, zoo
from treespec.mixers import set_slot

FAIL, DECLINED = "FAIL", "declined"

# A few ulp of the output's dtype (2 epsilons: 2-4 ulp, float32 2^-22;
# bfloat16/float16 their own, so the change is not rounded away).
ULPS = 2


BITS = {mx.bfloat16: mx.uint16, mx.float16: mx.uint16, mx.float32: mx.uint32}


def bit_steps(x: mx.array, index: tuple, k: int) -> mx.array:
    """A copy of ``x`` with the elements at ``index`` (an element or a slice)
    moved ``k`` steps of their dtype's bit pattern (k units in the last place
    within a binade, away from zero for k > 0): a difference exact in any
    float dtype, never rounded away."""
    out, part = mx.array(x), x[index]
    moved = mx.view(part.reshape(-1), BITS[x.dtype]) + k
    out[index] = mx.view(moved, x.dtype).reshape(part.shape)
    return out


@contextmanager
def stood_in(container, key, make: Callable):
    """``make(module)`` in place of ``container[key]`` for the block (a planted
    defect in one module of a model), the module back however the block ends."""
    inner = container[key]
    set_slot(container, key, make(inner))
    try:
        yield
    finally:
        set_slot(container, key, inner)


@dataclass(frozen=True)
class Plant:
    name: str
    where: str  # what is patched, as mlx-lm (or treespec's commit) calls it
    fires: str  # the condition under which it changes anything
    expect: str  # FAIL, or declined (the gate declining is the right answer)
    install: Callable  # (pytest.MonkeyPatch) -> None
    at_size: bool = False  # fires only at sizes real models use, never at the zoo's


def _nudged(y: mx.array) -> mx.array:
    """``y`` moved by ULPS units of its dtype's epsilon, relatively."""
    return y * (1 + ULPS * mx.finfo(y.dtype).eps) if mx.issubdtype(y.dtype, mx.floating) else y


# -- attention: mlx_lm.models.base.scaled_dot_product_attention, as each model
# module imported it (``from .base import scaled_dot_product_attention``) --


def _model_modules():
    """The mlx-lm model modules of the zoo's families (imported), and base."""
    mods = [importlib.import_module(f"mlx_lm.models.{zoo.config(f)['model_type']}") for f in zoo.FAMILIES]
    return [mlx_base] + [m for m in mods if getattr(m, "scaled_dot_product_attention", None)
                         is mlx_base.scaled_dot_product_attention]


def _keys(keys) -> int:
    return (keys[0] if isinstance(keys, (tuple, list)) else keys).shape[-2]


def _maskless_attention(when: Callable):
    """An attention that drops an array mask (a tree verify's; plain forwards
    pass "causal" or None) over several queries, where ``when(queries, keys)``."""
    def install(mp):
        real = mlx_base.scaled_dot_product_attention

        def maskless(queries, keys, values, cache, scale, mask, **kwargs):
            if isinstance(mask, mx.array) and queries.shape[2] > 1 and when(queries, keys):
                mask = None
            return real(queries, keys, values, cache=cache, scale=scale, mask=mask, **kwargs)

        for m in _model_modules():
            mp.setattr(m, "scaled_dot_product_attention", maskless)
    return install


# -- RoPE: mx.fast.rope, which nn.RoPE and mlx-lm's rope classes call --------


def _rope_plus_one(mp):
    real = mx.fast.rope

    def shifted(x, *args, offset, **kwargs):
        if isinstance(offset, mx.array) and offset.ndim == 1:  # per-batch-row offsets
            offset = offset + 1
        return real(x, *args, offset=offset, **kwargs)

    mp.setattr(mx.fast, "rope", shifted)


# -- the row gather of a commit (treespec.rows.gather_rows, as
# rows.gather_path calls it for every attention cache mode) --------------


def _stale_gather(mp):
    real = rows.gather_rows

    def stale(x, start, tail, **kwargs):
        out = real(x, start, tail, **kwargs)
        if not out:
            return out
        # The last moved row is read from its destination slot: what the
        # verify wrote there for an off-path node (a stale row).
        last = start + tail.first_moved + out[0].shape[2] - 1
        return [mx.concatenate([a[..., :-1, :], src[..., last:last + 1, :]], axis=2)
                for a, src in zip(out, rows._arrays(x))]

    mp.setattr(rows, "gather_rows", stale)


# -- the gated-delta recurrence and its conv (qwen3_next / qwen3_5's
# ``gated_delta_update`` and their mixers' nn.Conv1d) -------------------------


def _gated_delta_first_state(mp):
    """Several sequences in one call (a tree depth's nodes, each from its own
    parent) all start from the first one's state."""
    for name in ("qwen3_next", "qwen3_5"):
        mod = importlib.import_module(f"mlx_lm.models.{name}")
        real = mod.gated_delta_update

        def first_state(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, _real=real, **kw):
            if state is not None and q.shape[0] > 1:
                state = mx.broadcast_to(state[:1], state.shape)
            return _real(q, k, v, a, b, A_log, dt_bias, state, mask, **kw)

        mp.setattr(mod, "gated_delta_update", first_state)


def _conv_few_ulp(mp):
    """The mixer convolves its K-1 cached inputs and the new tokens (N, L, C):
    one token is L = K (the kernel), several are L > K."""
    real = nn.Conv1d.__call__

    def conv(self, x):
        y = real(self, x)
        return _nudged(y) if x.shape[1] > self.weight.shape[1] else y

    mp.setattr(nn.Conv1d, "__call__", conv)


# -- matmuls: nn.Linear and nn.QuantizedLinear (mx.quantized_matmul) ----------


def _matmul_few_ulp(min_rows: int):
    def install(mp):
        for cls in (nn.Linear, nn.QuantizedLinear):
            real = cls.__call__

            def call(self, x, _real=real):
                y = _real(self, x)
                return _nudged(y) if x.ndim >= 2 and x.shape[-2] >= min_rows else y

            mp.setattr(cls, "__call__", call)
    return install


PLANTS = {p.name: p for p in [
    Plant("attention-drops-array-mask", "mlx_lm.models.*.scaled_dot_product_attention",
          "array mask, T > 1", FAIL, _maskless_attention(lambda q, k: True)),
    Plant("rope-row-offsets-plus-one", "mx.fast.rope", "vector (per-row) offset", FAIL,
          _rope_plus_one),
    Plant("commit-gathers-a-stale-row", "treespec.rows.gather_rows (every attention cache's commit)",
          "a commit that moves rows", FAIL, _stale_gather),
    Plant("gated-delta-rows-share-first-state", "mlx_lm.models.qwen3_next/qwen3_5.gated_delta_update",
          "several sequences in one call (a tree depth)", FAIL, _gated_delta_first_state),
    Plant("conv-multi-token-few-ulp", "nn.Conv1d.__call__ (the GatedDeltaNet conv)",
          "2+ new tokens", DECLINED, _conv_few_ulp),
    Plant("matmul-multi-token-few-ulp", "nn.Linear / nn.QuantizedLinear __call__", "2+ rows",
          DECLINED, _matmul_few_ulp(2)),
    # Size-conditional: only at sizes real models use.
    Plant("matmul-32-rows-few-ulp", "nn.Linear / nn.QuantizedLinear __call__", "32+ rows",
          DECLINED, _matmul_few_ulp(32), at_size=True),
    Plant("attention-drops-mask-head-dim-128", "mlx_lm.models.*.scaled_dot_product_attention",
          "array mask, T > 1, head_dim 128", FAIL,
          _maskless_attention(lambda q, k: q.shape[-1] == 128), at_size=True),
    Plant("attention-drops-mask-1024-keys", "mlx_lm.models.*.scaled_dot_product_attention",
          "array mask, T > 1, 1024+ keys", FAIL,
          _maskless_attention(lambda q, k: _keys(k) >= 1024), at_size=True),
]}


def shape_dependent(model, eps: float, axis: int, name: str):
    """A copy of ``model`` whose logits move by ``eps`` per extra entry of its
    input's ``axis`` (0: the batch, 1: the tokens of the call): a backend whose
    products depend on that size, planted above the model (its class, layers
    and caches otherwise the model's)."""
    cls = type(model)

    def call(self, inputs, cache=None, **kw):
        return cls.__call__(self, inputs, cache=cache, **kw) + eps * (inputs.shape[axis] - 1)
    planted = copy.deepcopy(model)
    planted.__class__ = type(f"{name}{cls.__name__}", (cls,), {"__call__": call})
    return planted


PLANT_ENV = "TREESPEC_PLANT"


@contextmanager
def planted(name: str):
    """``PLANTS[name]`` installed, with fresh memos of the envelope and the
    gate's probe (restored after)."""
    if name not in PLANTS:
        raise pytest.UsageError(f"--plant: unknown plant {name!r}; known: {', '.join(PLANTS)}")
    mp = pytest.MonkeyPatch()
    # The probe's disk memo too (treespec.evidence.gate_memo): its key names the code
    # and the weights, not a planted kernel, so a planted probe must neither
    # read the real verdicts nor store its own.
    memo = tempfile.mkdtemp(prefix="treespec-plant-")
    try:
        mp.setattr(numerics, "_MEMO", {})
        mp.setattr(gate, "_MEMO", {})
        mp.setenv("TREESPEC_CACHE_DIR", memo)
        mp.setenv(PLANT_ENV, name)  # census children plant it too: suites/census_child.py
        PLANTS[name].install(mp)
        yield PLANTS[name]
    finally:
        mp.undo()
        shutil.rmtree(memo, ignore_errors=True)


@pytest.fixture
def plant():
    """``with plant(NAME): ...`` runs the block under one planted regression."""
    return planted


def pytest_addoption(parser):
    parser.addoption("--plant", default=None, metavar="NAME",
                     help="run the whole selection under one planted kernel regression "
                          f"(docs/numerics.md#planted-regressions): {', '.join(PLANTS)}")


_SESSION = []


def pytest_configure(config):
    name = config.getoption("--plant")
    if name:
        cm = planted(name)
        cm.__enter__()
        _SESSION.append(cm)


def pytest_unconfigure(config):
    while _SESSION:
        _SESSION.pop().__exit__(None, None, None)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--plant"):
        skip = pytest.mark.skip(reason="--plant: the plant tests install their own plants")
        for item in items:
            if "plant" in getattr(item, "fixturenames", ()):
                item.add_marker(skip)
