"""The target's hidden states, captured during forwards it runs anyway.

A hidden-state head (treespec.heads.base) reads the outputs of some decoder
layers of the target, or the hidden state after its final norm (the input
of its lm_head). mlx-lm models return logits only, so :func:`tapped` puts a
recording stand-in (treespec.standin) in place of each tapped layer, on the
model instance, for the duration of the ``with``: every forward inside it
(the prefill's chunks, a verify of a chain or of a tree, hybrids included)
records its ``(1, T, H)`` outputs, and the stand-ins are taken out again
when the block ends, whether it ends normally or by an exception. No
forward is added; the recorded arrays are the forward's own (lazy) values.

Where the layers are: ``model.layers`` (every mlx-lm family exposes its
decoder layer list so), held as the ``layers`` list of one inner module,
whose ``norm`` is the final norm. A model without that shape is refused
with the reason (ValueError).
"""

from contextlib import contextmanager
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn

from ..heads.base import FINAL, Tap, tap_indices
from ..mixers import set_slot
from ..standin import StandIn

__all__ = ["Recorder", "Tapped", "layer_home", "tapped"]


class Recorder(StandIn):
    """Stands in for one decoder layer (or the final norm) and keeps every
    output it returns, in call order."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "outputs", [])  # not a child: not in the parameter tree

    def __call__(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        # A layer that returns more than its hidden state returns it first.
        self.outputs.append(out[0] if isinstance(out, (tuple, list)) else out)
        return out


def layer_home(model: nn.Module) -> Tuple[nn.Module, list]:
    """The inner module holding the decoder layer list (the layers
    ``model.layers`` returns, all of them, in order) and that list.
    ValueError where there is none."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"{type(model).__name__} exposes no decoder layer list (model.layers): "
                         "its hidden states cannot be tapped")
    ids = [id(x) for x in layers]  # some families return a fresh list (a pipeline's slice)
    for _, module in model.named_modules():
        held = module.get("layers") if isinstance(module, nn.Module) else None
        if isinstance(held, list) and [id(x) for x in held] == ids:
            return module, held
    raise ValueError(f"{type(model).__name__}: no module holds model.layers as its 'layers'")


class Tapped:
    """What one ``with tapped(...)`` recorded. ``features()``: every
    forward's taps, concatenated on the last axis in ``taps`` order and on
    the time axis in call order, ``(1, T, F)``. It keeps the outputs when
    the block ends (the stand-ins, which a pool may keep, let go of them)."""

    def __init__(self, recorders: Sequence[Recorder]):
        self.outputs = [r.outputs for r in recorders]  # per tap, per call

    def _keep(self):
        self.outputs = [list(o) for o in self.outputs]

    def calls(self) -> int:
        return len(self.outputs[0]) if self.outputs else 0

    def features(self) -> mx.array:
        per_call = []
        for i in range(self.calls()):
            parts = [o[i] for o in self.outputs]
            per_call.append(parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1))
        if not per_call:
            raise ValueError("no forward ran while the taps were in place")
        return per_call[0] if len(per_call) == 1 else mx.concatenate(per_call, axis=1)


def _sites(model: nn.Module, taps: Sequence[Tap]) -> List[Tuple[object, object]]:
    """(container, key) of each tapped module, in ``taps`` order."""
    home, layers = layer_home(model)
    out = []
    for tap in tap_indices(tuple(taps), len(layers)):
        if tap == FINAL:
            if "norm" not in home or not isinstance(home["norm"], nn.Module):
                raise ValueError(f"{type(home).__name__} has no final norm ('norm') to tap")
            out.append((home, "norm"))
        else:
            out.append((layers, tap))
    return out


@contextmanager
def tapped(model: nn.Module, taps: Sequence[Tap], pool: Optional[dict] = None):
    """Record the ``taps`` (treespec.heads.base) of every forward of
    ``model`` inside the block; yields a :class:`Tapped`. The model's
    modules are back in place when the block ends, however it ends.
    ``pool``: a dict this call may keep its stand-ins in, for the next call
    to reuse (the same objects each time: the model's module tree inside
    the block is the same at every verify, so the tree adapter need not
    walk it again, treespec.module_tree)."""
    sites = _sites(model, taps)
    pool = {} if pool is None else pool
    put, fresh, order, record = [], {}, [], None
    try:
        for container, key in sites:
            module = container[key]
            if isinstance(module, Recorder) and id(module) in fresh:  # a tap named twice
                order.append(module)
                continue
            rec = pool.get(id(module))
            if rec is None or rec.inner is not module:
                rec = pool[id(module)] = Recorder(module)
            rec.outputs.clear()
            fresh[id(rec)] = rec
            set_slot(container, key, rec)
            put.append((container, key, module))
            order.append(rec)
        record = Tapped(order)
        yield record
    finally:
        for container, key, module in reversed(put):
            set_slot(container, key, module)
        if record is not None:
            record._keep()
        for rec in fresh.values():
            rec.outputs.clear()
