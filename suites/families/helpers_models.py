"""The family sweep's models and mlx-lm's reference forwards: every model
module of the installed mlx-lm, built tiny from its own ModelArgs
(helpers_configs) and seeded, and the forwards the sweep (helpers) compares
a tree verify with: mlx-lm's own, with a module handed an ``ArraysCache``
run one token at a time (``stepped``) as classic decoding runs it, and with
the whole model stepped where a one-token step is a code path of its own
(``latent``, a sliding-window ring).

    modules()          every module name (and "module@variant") to sweep
    build(name)        the tiny seeded model
    forward(model, cache, tokens, stepped=, whole=)  a reference forward's logits
    latent(model)      whether its attention is multi-head latent
"""

import importlib
import inspect
import os
import types
from typing import List

import mlx.core as mx
import mlx.nn as nn
import mlx_lm.models as mlx_lm_models
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import bitlinear_layers
from mlx_lm.models.mla import MultiLinear, QuantizedMultiLinear
from mlx_lm.models.cache import ArraysCache, RotatingKVCache

from suites.families.helpers_configs import VARIANTS, config
from treespec.caches import leaves
from treespec.standin import StandIn

# mlx-lm's shared layers, not model families.
SHARED = {"base", "cache", "rope_utils", "switch_layers", "__init__", "activations",
          "bitlinear_layers", "gated_delta", "mla", "pipeline", "ssm"}
SEED = 0


def modules() -> List[str]:
    folder = os.path.dirname(mlx_lm_models.__file__)
    names = sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f[:-3] not in SHARED)
    return names + sorted(VARIANTS)


# -- building -----------------------------------------------------------------


def _cpu_bitlinear(self, x, packed):
    """bitnet's BitLinear matmul in plain MLX ops (its own is a Metal kernel):
    the 2-bit ternary weights unpacked, x @ W.T, scaled."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    w = mx.concatenate([((packed >> (2 * k)) & 3).astype(x.dtype) - 1 for k in range(4)], axis=0)
    out = x @ w.T
    s = self.weight_scale[0]
    out = out / s if self.invert_weight_scales else out * s
    return out.reshape(*shape[:-1], self.out_features)


def build(name: str, seed: int = SEED):
    """The tiny model: default init plus seeded noise on every float
    parameter (matrices on the scale of their init, vectors +-0.05), so no
    zero-initialised gate or bias leaves a family's paths untested."""
    cfg = config(name)
    mod = importlib.import_module(f"mlx_lm.models.{name.split('@')[0]}")
    mx.random.seed(seed)
    model = mod.Model(mod.ModelArgs.from_dict(cfg))
    rng = np.random.RandomState(seed)
    new = []
    for k, v in tree_flatten(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            s = 1.0 / np.sqrt(v.shape[-1]) if v.ndim >= 2 else 0.05
            noise = rng.standard_normal(v.shape).astype(np.float32) * s
            v = (v.astype(mx.float32) + mx.array(noise)).astype(v.dtype)
        new.append((k, v))
    model.update(tree_unflatten(new))
    if name == "bitnet":
        for _, m in model.named_modules():
            if isinstance(m, bitlinear_layers.BitLinear):
                m.execute_matmul_kernel = types.MethodType(_cpu_bitlinear, m)
                m.weight = mx.array(rng.randint(0, 256, m.weight.shape).astype("uint8"))
                r = float(np.sqrt(m.in_features))
                m.weight_scale = mx.array([r if m.invert_weight_scales else 1.0 / r])
    mx.eval(model.parameters())
    model.eval()
    return model


# -- references ---------------------------------------------------------------


def maxdiff(a, b) -> float:
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    if a.shape == b.shape and mx.array_equal(a, b).item():
        return 0.0
    if a.shape != b.shape:
        return float("inf")
    d = mx.where(a == b, 0.0, mx.abs(a - b))
    return float(mx.where(mx.isnan(d), float("inf"), d).max())


class _Stepped(StandIn):
    """Runs a module handed an ArraysCache one token at a time (unless an
    outer one already does): what classic decoding does in that layer."""

    def __init__(self, inner, busy):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "_busy", busy)
        object.__setattr__(self, "_sig", inspect.signature(inner.__call__))


    def __call__(self, *args, **kwargs):
        try:
            bound = self._sig.bind(*args, **kwargs).arguments
        except TypeError:
            return self.inner(*args, **kwargs)
        names = list(bound)
        x = bound[names[0]]
        if self._busy[0] or type(bound.get("cache")) is not ArraysCache or x.shape[1] == 1:
            return self.inner(*args, **kwargs)
        L = x.shape[1]
        self._busy[0] = True
        try:
            outs = []
            for t in range(L):
                call = {}
                for k, v in bound.items():
                    if isinstance(v, mx.array) and v.ndim >= 2 and v.shape[:2] == (1, L):
                        v = v[:, t : t + 1]
                    elif k == "offset" and isinstance(v, int):
                        v = v + t
                    elif k == "mask":
                        v = None
                    call[k] = v
                outs.append(self.inner(**call))
        finally:
            self._busy[0] = False
        return _concat(outs)


def _concat(outs):
    if isinstance(outs[0], mx.array):
        return mx.concatenate(outs, axis=1)
    if outs[0] is None:
        return None
    return type(outs[0])(_concat([o[i] for o in outs]) for i in range(len(outs[0])))


def _cache_takers(model):
    """(container, key, module) of every submodule whose call takes ``cache``."""
    out = []

    def visit(module):
        for key, value in module.items():
            items = ([(module, key, value)] if isinstance(value, nn.Module) else
                     [(value, i, v) for i, v in enumerate(value)] if isinstance(value, list) else [])
            for container, k, child in items:
                if not isinstance(child, nn.Module):
                    continue
                try:
                    if "cache" in inspect.signature(child.__call__).parameters:
                        out.append((container, k, child))
                except (AttributeError, TypeError, ValueError):
                    pass
                visit(child)

    visit(model)
    return out


def _put(container, key, module):
    if isinstance(container, nn.Module):
        setattr(container, key, module)
    else:
        container[key] = module


def latent(model) -> bool:
    """Whether ``model`` has a multi-head latent attention (a module with a
    ``MultiLinear`` child), whose one-token step is a code path of its own."""
    return any(isinstance(v, (MultiLinear, QuantizedMultiLinear))
               for _, m in model.named_modules() for v in m.values())


def forward(model, cache, tokens, stepped=True, whole=False) -> mx.array:
    """Logits [T, vocab] of mlx-lm's forward over ``tokens``; ``stepped``:
    as classic decoding computes them, recurrent layers one token at a time,
    and where a cache is a sliding-window ring the whole model one token at a
    time (a one-token step sees the ring in slot order, a multi-token
    forward in time order: treespec verifies as the steps do). ``whole``:
    the whole model one token at a time anyway (classic decoding itself)."""
    ring = any(type(c) is RotatingKVCache for _, c in leaves(cache))
    if len(tokens) > 1 and (whole or (stepped and ring)):
        return mx.concatenate([forward(model, cache, [t], stepped) for t in tokens], axis=0)
    swapped = []
    if stepped:
        busy = [False]
        for container, key, module in _cache_takers(model):
            _put(container, key, _Stepped(module, busy))
            swapped.append((container, key, module))
    try:
        out = model(mx.array([list(tokens)]), cache=cache)
    finally:
        for container, key, module in reversed(swapped):
            _put(container, key, module)
    out = out[0] if isinstance(out, (tuple, list)) else out
    mx.eval(out)
    return out[0]
