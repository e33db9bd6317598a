"""The gated-delta mixers of mlx-lm: which modules they are, where they sit on
a decoder layer, and the per-node shapes of their cache slots.

Families whose recurrent mixer calls ``gated_delta_update`` and keeps all its
state in an ``ArraysCache`` (all of them in mlx-lm 0.32), by decoder-layer
attribute and cache slots:

    qwen3_5, qwen3_5_moe  layer.linear_attn  GatedDeltaNet           [conv qkv, ssm]
    qwen3_next            layer.linear_attn  Qwen3NextGatedDeltaNet  [conv qkv, ssm]
    olmo_hybrid           layer.linear_attn  GatedDeltaNet           [conv q, conv k, conv v, ssm]
    kimi_linear           layer.self_attn    KimiDeltaAttention      [conv q, conv k, conv v, ssm]
    kimi_k3               layer.self_attn    KimiK3DeltaAttention    [conv qkv, ssm]
    bailing_moe_v3        layer.attention    BailingKDA              [conv q, conv k, conv v, ssm]

qwen3_5 and qwen3_next share the layout (attribute, conv1d/conv_dim, the two
cache slots, scalar gate); only their input projections differ. olmo_hybrid
keeps the attribute name but has three convs and four slots; the Kimi and
Bailing KDA mixers use per-channel (vector) gates. The tree-aware recurrence
(treespec.verify.gdn_tree) is slot-generic and calls the module itself; the
suite pins all six at the layer level.
"""

from typing import List, Tuple

import mlx.nn as nn


def _family(obj) -> str:
    """model_type of a model, or the mlx-lm module name of a mixer."""
    mt = getattr(obj, "model_type", None) or getattr(getattr(obj, "args", None), "model_type", None)
    if mt:
        return str(mt)
    return type(obj).__module__.rsplit(".", 1)[-1]


class StandIn(nn.Module):
    """Base of a module that stands in for a mixer during one verify
    (``self.mixer`` is the real one), so the mixer is still found there."""


# (module, class) -> the per-node shapes of its cache slots (no batch axis),
# in slot order. 3-D slots are the float32 recurrent state (Hv, Dv, Dk), 2-D
# ones conv windows (K-1, channels) in the activation dtype. The suite checks
# these against real caches for every family.
def _qwen_slots(m):
    k = m.conv_kernel_size - 1
    return [(k, m.conv_dim), (m.num_v_heads, m.head_v_dim, m.head_k_dim)]


def _olmo_slots(m):
    k = m.conv_kernel_size - 1
    return [
        (k, m.key_dim),
        (k, m.key_dim),
        (k, m.value_dim),
        (m.num_v_heads, m.head_v_dim, m.head_k_dim),
    ]


def _kimi_slots(m):
    k = m.conv_kernel - 1
    p = m.projection_dim
    return [(k, p), (k, p), (k, p), (m.num_heads, m.head_dim, m.head_dim)]


def _kimi_k3_slots(m):
    return [
        (m.conv_kernel - 1, 3 * m.projection_dim),
        (m.num_heads, m.head_dim, m.head_dim),
    ]


def _bailing_slots(m):
    k = m.conv_kernel_size - 1
    p = m.projection_size
    return [(k, p), (k, p), (k, p), (m.num_heads, m.head_dim, m.head_dim)]


_MIXERS = {
    ("mlx_lm.models.qwen3_5", "GatedDeltaNet"): _qwen_slots,
    ("mlx_lm.models.qwen3_next", "Qwen3NextGatedDeltaNet"): _qwen_slots,
    ("mlx_lm.models.olmo_hybrid", "GatedDeltaNet"): _olmo_slots,
    ("mlx_lm.models.kimi_linear", "KimiDeltaAttention"): _kimi_slots,
    ("mlx_lm.models.kimi_k3", "KimiK3DeltaAttention"): _kimi_k3_slots,
    ("mlx_lm.models.bailing_moe_v3", "BailingKDA"): _bailing_slots,
}

# Decoder-layer attribute that holds the mixer, tried in this order.
MIXER_ATTRS = ("linear_attn", "self_attn", "attention")


def _slots_fn(module):
    return _MIXERS.get((type(module).__module__, type(module).__name__))


def is_gated_delta_mixer(module) -> bool:
    return _slots_fn(module) is not None


def recurrent_mixers(model) -> List[Tuple[int, nn.Module, str]]:
    """``(layer index, decoder layer, attribute)`` of every gated-delta mixer.

    Layer indices match ``model.make_cache()``. A layer already holding a
    stand-in (a verify still in progress) is reported too."""
    found = []
    for i, layer in enumerate(model.layers):
        for attr in MIXER_ATTRS:
            mod = getattr(layer, attr, None) if attr in layer else None
            if isinstance(mod, StandIn) or (mod is not None and is_gated_delta_mixer(mod)):
                found.append((i, layer, attr))
                break
    return found
