"""What the backend census measures: the default shapes, and the shapes read
off an mlx-lm model. Reading only: nothing here computes on the device.

A :class:`Spec` is one op at one shape. Its ``dims`` say everything the
measurement needs (the census draws its own seeded inputs and weights), so a
model's shapes and the default ones go through the same measuring code
(treespec.backend.census). Two ops are bound to a module instead, where mlx-lm
has no free function to call with the dims: a RoPE module (``nn.RoPE``,
``Llama3RoPE``, ``YarnRoPE``, ... each computes its own frequencies) and
Mamba's ``ssm_step`` method (its own projections inside).
"""

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

__all__ = ["DEFAULT_SPECS", "HISTORY", "Spec", "model_dtype", "model_specs"]

# Keys before the first query of an attention row: a short history, as a
# verify after a few rounds sees (the label says "keys 24+M").
HISTORY = 24


@dataclass(frozen=True)
class Spec:
    """One op at one shape. ``dims``: (name, value) pairs; ``module``: the
    module a module-bound op calls (None otherwise)."""

    op: str
    shape: str
    dims: Tuple[Tuple[str, Any], ...] = ()
    module: Any = field(default=None, compare=False, hash=False)

    def __getitem__(self, name: str):
        return dict(self.dims)[name]


def linear(n_in: int, n_out: int, bias: bool = False) -> Spec:
    return Spec("addmm" if bias else "matmul", f"{n_in}->{n_out}",
                (("n_in", n_in), ("n_out", n_out)))


def quantized(n_in: int, n_out: int, bits: int, group: int, mode: str = "affine",
              bias: bool = False) -> Spec:
    kind = f"q{bits}" if mode == "affine" else mode
    return Spec("quantized_matmul", f"{kind} g{group} {n_in}->{n_out}",
                (("n_in", n_in), ("n_out", n_out), ("bits", bits), ("group", group),
                 ("mode", mode)))


def attention(heads: int, kv_heads: int, head_dim: int) -> Spec:
    return Spec("sdpa", f"heads {heads}/{kv_heads} dim {head_dim} keys {HISTORY}+M",
                (("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim)))


def rms_norm(dim: int, eps: float = 1e-6) -> Spec:
    return Spec("rms_norm", f"dim {dim}", (("dim", dim), ("eps", eps)))


def rope(dims: int, head_dim: int, base: Optional[float], module=None) -> Spec:
    """``dims`` of ``head_dim`` rotated; ``base`` None where the module keeps
    its own frequencies (Llama3RoPE, YarnRoPE, ...)."""
    name = type(module).__name__ if module is not None else "fast.rope"
    at = f" base {base:g}" if base else ""
    return Spec("rope", f"{name} {dims}/{head_dim}{at} offset {HISTORY}",
                (("dims", dims), ("head_dim", head_dim), ("base", base)), module)


def conv1d(channels: int, kernel: int, groups: int, channels_out: Optional[int] = None) -> Spec:
    out = channels if channels_out is None else channels_out
    size = f"{channels}" if out == channels else f"{channels}->{out}"
    return Spec("conv1d", f"channels {size} kernel {kernel} groups {groups}",
                (("channels", channels), ("channels_out", out), ("kernel", kernel),
                 ("groups", groups)))


def gated_delta(k_heads: int, v_heads: int, k_dim: int, v_dim: int) -> Spec:
    return Spec("gated_delta", f"heads k{k_heads}/v{v_heads} dims k{k_dim}/v{v_dim}",
                (("k_heads", k_heads), ("v_heads", v_heads), ("k_dim", k_dim), ("v_dim", v_dim)))


def ssm_update(heads: int, head_dim: int, state: int, groups: int) -> Spec:
    return Spec("ssm_update", f"heads {heads} dim {head_dim} state {state} groups {groups}",
                (("heads", heads), ("head_dim", head_dim), ("state", state), ("groups", groups)))


def ssm_step(module) -> Spec:
    return Spec("ssm_step", f"inner {module.intermediate_size} state {module.ssm_state_size}",
                (("inner", module.intermediate_size), ("state", module.ssm_state_size)), module)


# The order of a census's rows.
ORDER = ("matmul", "addmm", "quantized_matmul", "sdpa", "rms_norm", "rope", "conv1d",
         "gated_delta", "ssm_update", "ssm_step")

# The default census: the zoo's sizes (hidden 64, head dims 16-32, the
# qwen3_next mixer) and one step up (512-wide products, head dim 128), small
# enough that the whole census takes about a second on the CPU's reference
# BLAS (results/census/README.md).
DEFAULT_SPECS = (
    linear(64, 128), linear(512, 512),
    quantized(64, 128, 4, 64), quantized(128, 256, 8, 64),
    attention(4, 2, 32), attention(8, 2, 128),
    rms_norm(64), rms_norm(512),
    rope(32, 32, 10000.0), rope(8, 32, 10000000.0),
    conv1d(128, 4, 128),
    gated_delta(2, 4, 32, 16),
    ssm_update(4, 16, 8, 1),
)


# ---------------------------------------------------------------------------
# A model's shapes.


def _is_quantized(m) -> bool:
    return hasattr(m, "bits") and hasattr(m, "group_size") and "scales" in m


def _namespace(m) -> dict:
    """The globals of the mlx-lm module that defines ``m``'s class: which
    recurrent kernel its forward calls is what that module imported."""
    return vars(sys.modules.get(type(m).__module__, object()))


def _tied(model) -> bool:
    """Whether the output head is the embedding's ``as_linear`` (no lm_head)."""
    return not any(name.split(".")[-1] == "lm_head" for name, _ in model.named_modules())


def _attention_args(model) -> Optional[Tuple[int, int, int]]:
    """(heads, kv heads, head dim) from the first ``args`` that names
    attention heads (a text model's, or a wrapper's inner model's)."""
    for _, m in [("", model)] + list(model.named_modules()):
        a = getattr(m, "args", None)
        heads = getattr(a, "num_attention_heads", None)
        if isinstance(heads, int) and heads > 0:
            kv = getattr(a, "num_key_value_heads", None) or heads
            head_dim = getattr(a, "head_dim", None) or a.hidden_size // heads
            return heads, kv, head_dim
    return None


def _product(m, tied: bool) -> Optional[Spec]:
    """The product a linear-like module computes, if any (an embedding only
    where it is the output head)."""
    embedding = "Embedding" in type(m).__name__
    if embedding and not tied:
        return None
    w = m.get("weight") if isinstance(m, nn.Module) else None
    if w is None or w.ndim != 2:  # stacked experts (gather_mm) are not measured
        return None
    if _is_quantized(m):
        n_out, n_in = w.shape[0], w.shape[1] * 32 // m.bits
        return quantized(n_in, n_out, m.bits, m.group_size, getattr(m, "mode", "affine"))
    if isinstance(m, (nn.Linear, nn.Embedding)):
        n_out, n_in = w.shape
        return linear(n_in, n_out, bias=not embedding and "bias" in m)
    return None


def _mixer(m) -> Optional[Spec]:
    """The recurrent kernel a mixer module calls, if it is one the census knows."""
    ns = _namespace(m)
    if callable(getattr(m, "ssm_step", None)) and hasattr(m, "intermediate_size"):
        return ssm_step(m)  # mamba: the step is a method of the module
    keys = ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")
    if "gated_delta_update" in ns and all(hasattr(m, k) for k in keys):
        return gated_delta(*(getattr(m, k) for k in keys))
    keys = ("num_heads", "head_dim", "ssm_state_size", "n_groups")
    if "ssm_update" in ns and all(hasattr(m, k) for k in keys):
        return ssm_update(*(getattr(m, k) for k in keys))
    return None


def _norm(m) -> Optional[Spec]:
    w = m.get("weight") if isinstance(m, nn.Module) else None
    if "RMSNorm" in type(m).__name__ and w is not None and w.ndim == 1:
        return rms_norm(w.shape[0], float(getattr(m, "eps", 1e-6)))
    return None


def _rope(name: str, m, head_dim: Optional[int]) -> Optional[Spec]:
    if not (isinstance(m, nn.RoPE) or type(m).__name__.endswith("RoPE")
            or name.split(".")[-1] == "rope"):
        return None
    dims = getattr(m, "dims", None) or getattr(m, "dim", None) or head_dim
    if not isinstance(dims, int):
        return None
    base = getattr(m, "base", None)
    return rope(dims, head_dim or dims, float(base) if isinstance(base, (int, float)) else None, m)


def _owner_head_dim(modules: dict, name: str) -> Optional[int]:
    """The ``head_dim`` of the module holding ``name`` (a rope's attention),
    where it states one: families mix head sizes (gemma4_text's global layers
    32, its sliding ones 16), so one attention's is not every rope's."""
    head_dim = getattr(modules.get(name.rpartition(".")[0]), "head_dim", None)
    return head_dim if isinstance(head_dim, int) else None


def model_specs(model: nn.Module) -> List[Spec]:
    """Every distinct shape of the ops the census knows, read off ``model``:
    its linear and quantized products (the output head where it is the
    embedding's), attention from its args, RMS norms, RoPE modules, conv1d
    and the recurrent kernels of its mixers. Experts' stacked products and
    other ops are not listed."""
    tied = _tied(model)
    att = _attention_args(model)
    found: Dict[tuple, Spec] = {}
    modules = dict(model.named_modules())
    if att is not None:
        spec = attention(*att)
        found[(spec.op, spec.shape)] = spec
    for name, m in modules.items():
        spec = (_product(m, tied) or _mixer(m) or _norm(m)
                or _rope(name, m, _owner_head_dim(modules, name) or (att[2] if att else None)))
        if spec is None and isinstance(m, nn.Conv1d):
            w = m.weight  # (out, kernel, in / groups)
            groups = getattr(m, "groups", 1)
            spec = conv1d(w.shape[2] * groups, w.shape[1], groups, w.shape[0])
        if spec is not None:
            found.setdefault((spec.op, spec.shape), spec)
    return sorted(found.values(), key=lambda s: ORDER.index(s.op))


def model_dtype(model: nn.Module) -> str:
    """The floating dtype holding most of the model's parameters (scales
    count for quantized weights), e.g. "bfloat16"."""
    count: Counter = Counter()
    for _, v in tree_flatten(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            count[str(v.dtype).removeprefix("mlx.core.")] += v.size
    return count.most_common(1)[0][0] if count else "float32"
