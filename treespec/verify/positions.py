"""Per-position values a model computes from the flattened index, re-indexed by depth.

Some mlx-lm models compute a value per token from ``offset + arange(L)``
outside their ropes (treespec.verify.codescan finds them): gpt2 and
gpt_bigcode look up learned absolute position embeddings, ministral3,
mistral3 and mistral4 scale their queries by ``1 + beta * log(1 + floor(
position / original_max_position_embeddings))``. Over a flattened tree node
i would get the value of position ``offset + i``; its root path gives it
``offset + depth(i)``.

Both are a function of the position alone, computed for the flattened
positions ``offset .. offset + n - 1``, and ``depth(i) <= i < n``: so the
value node i needs is already there, at row ``depth(i)``. A stand-in for the
module that *receives* the values (the position embedding, the attention
taking ``attn_scale``) gathers those rows by depth and hands them on: the
model's own arithmetic, values bit for bit those of the root path. Only
trees fed whole (``start`` 0): a continued tree's earlier depths are not
among the fed positions.

    RECEIVERS            (module, class) -> (argument, token axis) of a receiving module
    EMBEDDINGS           (module, class) -> attribute of its position embedding
    HANDLED              the functions whose arange the stand-ins make exact
    position_inputs(model)   [(path, container, key, module, argument, axis)]
    ByDepth(module, depths, argument, axis)   the stand-in
"""

import inspect
from typing import List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from ..mixers import slots
from ..standin import StandIn

# Modules whose argument carries a value per flattened position: the token
# axis is where the queries' L is (attn_scale broadcasts as [..., L, 1]).
RECEIVERS = {
    ("mlx_lm.models.ministral3", "Attention"): ("attn_scale", -2),
    ("mlx_lm.models.mistral4", "Mistral4Attention"): ("attn_scale", -2),
}
# Models holding a learned position embedding, looked up at arange(L) + offset.
EMBEDDINGS = {
    ("mlx_lm.models.gpt2", "GPT2Model"): "wpe",
    ("mlx_lm.models.gpt_bigcode", "GPTBigCodeModel"): "wpe",
}
# The functions whose arange computes exactly the values the stand-ins
# re-index (mistral4 imports ministral3's; ministral3's Attention calls it
# itself only when not handed a scale, and the stand-in refuses that call).
HANDLED = {
    ("mlx_lm.models.ministral3", "_get_llama_4_attn_scale"),
    ("mlx_lm.models.gpt2", "GPT2Model.__call__"),
    ("mlx_lm.models.gpt_bigcode", "GPTBigCodeModel.__call__"),
}


def _key(obj) -> Tuple[str, str]:
    return type(obj).__module__, type(obj).__qualname__


def position_inputs(model: nn.Module, walked: Optional[list] = None) -> List[tuple]:
    """``(path, container, key, module, argument, axis)`` of every module
    that receives per-position values (``argument`` None: the first one).
    ``walked``: ``slots(model)`` if the caller has it (one walk, not one
    per reader)."""
    out = []
    for path, container, key, module in slots(model) if walked is None else walked:
        if container is None:
            continue
        if _key(module) in RECEIVERS:
            out.append((path, container, key, module, *RECEIVERS[_key(module)]))
        elif isinstance(container, nn.Module) and EMBEDDINGS.get(_key(container)) == key:
            out.append((path, container, key, module, None, -1))
    return out


class ByDepth(StandIn):
    """Stands in for a module receiving per-position values during one
    verify forward: its ``argument`` (the first one when None) re-indexed
    along ``axis`` by node depth, then the module runs unchanged."""

    def __init__(self, inner: nn.Module, depths: mx.array, argument, axis: int, signature=None):
        super().__init__()
        self.inner = inner
        # not a parameter; set past nn.Module (a stand-in it wraps has one too)
        object.__setattr__(self, "_depths", depths)
        object.__setattr__(self, "_argument", argument)
        object.__setattr__(self, "_axis", axis)
        # the receiving module's own signature when ``inner`` is another
        # stand-in for it (treespec.verify.per_node.NodeSteps)
        object.__setattr__(self, "_signature", signature or inspect.signature(inner.__call__))
        self._calls = 0


    def __call__(self, *args, **kwargs):
        bound = self._signature.bind(*args, **kwargs)
        name = self._argument or next(iter(bound.arguments))
        value = bound.arguments.get(name)
        n = self._depths.size
        if not isinstance(value, mx.array) or value.ndim == 0 or value.shape[self._axis] != n:
            raise RuntimeError(
                f"{type(self.inner).__name__} was not handed its per-position {name!r} "
                f"for the {n} tree nodes (got {getattr(value, 'shape', value)}): it would "
                "compute them from flattened indices")
        self._calls += 1
        bound.arguments[name] = mx.take(value, self._depths, axis=self._axis)
        return self.inner(*bound.args, **bound.kwargs)
