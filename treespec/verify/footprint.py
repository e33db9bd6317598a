"""The memory a tree verify through the tree-aware recurrence keeps alive.

Every node's recurrent state and conv windows are kept until the commit
(treespec.verify.gdn_tree), so a branching tree of n nodes holds n states
per recurrent layer; a chain goes through the mixer's own multi-token path
and keeps none (``kept_nodes``). ``footprint_breakdown`` counts them from a
config.json dict, a ModelArgs or a loaded model; trees over the limit
(``TREESPEC_MAX_TREE_STATE_BYTES``, default 2 GiB) are refused before
anything runs.
"""

import os
from typing import List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import TreeRefused
from .mixers import StandIn, _family, _slots_fn, recurrent_mixers


DEFAULT_MAX_TREE_STATE_BYTES = 2 * 1024**3
MAX_BYTES_ENV = "TREESPEC_MAX_TREE_STATE_BYTES"
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _parse_bytes(text: str) -> int:
    s = text.strip().lower().replace("_", "")
    for suffix in ("ib", "b"):
        if s.endswith(suffix):
            s = s[: -len(suffix)]
            break
    unit = s[-1] if s and s[-1] in _UNITS else ""
    if unit:
        s = s[:-1]
    return int(float(s) * _UNITS[unit])


def max_tree_state_bytes() -> int:
    """The per-node state limit: env ``TREESPEC_MAX_TREE_STATE_BYTES`` (bytes,
    or with a suffix: ``4GiB``, ``512M``), else 2 GiB."""
    raw = os.environ.get(MAX_BYTES_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_MAX_TREE_STATE_BYTES
    try:
        return _parse_bytes(raw)
    except (ValueError, IndexError):
        raise ValueError(
            f"{MAX_BYTES_ENV}={raw!r} is not a byte count (e.g. 2147483648 or 2GiB)"
        ) from None


def _config_dict(obj) -> dict:
    if isinstance(obj, dict):
        cfg = dict(obj)
    elif hasattr(obj, "__dataclass_fields__"):
        cfg = dict(vars(obj))
    else:
        raise TypeError(f"expected a config dict or ModelArgs, got {type(obj).__name__}")
    text = cfg.get("text_config")
    if isinstance(text, dict):
        merged = dict(text)
        merged.setdefault("model_type", cfg.get("model_type"))
        return merged
    return cfg


def _dtype_bytes(cfg: dict, default: int) -> int:
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "")
    for key, size in (("float32", 4), ("bfloat16", 2), ("float16", 2)):
        if key in name:
            return size
    return default


def _config_layers(cfg: dict) -> Tuple[int, List[Tuple[tuple, bool]]]:
    """Recurrent layer count and per-layer slots ``(shape, is_recurrent)``."""
    mt = str(cfg.get("model_type") or "")
    L = cfg["num_hidden_layers"]
    if "linear_attn_config" in cfg:  # kimi_linear, kimi_k3
        la = cfg["linear_attn_config"]
        H, Dh, K = la["num_heads"], la["head_dim"], la.get("short_conv_kernel_size", 4)
        n = len(la["kda_layers"])
        if "k3" in mt:
            conv = [((K - 1, 3 * H * Dh), False)]
        else:
            conv = [((K - 1, H * Dh), False)] * 3
        return n, conv + [((H, Dh, Dh), True)]
    if mt.startswith("bailing"):
        H, Dh, K = cfg["num_attention_heads"], cfg["head_dim"], cfg.get("short_conv_kernel_size", 4)
        g = cfg.get("layer_group_size", 4)
        n = sum(1 for i in range(L) if not ((i + 1) % g == 0 or i >= L // g * g))
        return n, [((K - 1, H * Dh), False)] * 3 + [((H, Dh, Dh), True)]
    Hv, Hk = cfg["linear_num_value_heads"], cfg["linear_num_key_heads"]
    Dv, Dk = cfg["linear_value_head_dim"], cfg["linear_key_head_dim"]
    K = cfg.get("linear_conv_kernel_dim", 4)
    if cfg.get("layer_types"):
        n = sum(1 for t in cfg["layer_types"] if t == "linear_attention")
    else:
        every = cfg.get("full_attention_interval", 4)
        n = sum(1 for i in range(L) if (i + 1) % every != 0)
    if mt.startswith("olmo"):
        conv = [((K - 1, Hk * Dk), False)] * 2 + [((K - 1, Hv * Dv), False)]
    else:
        conv = [((K - 1, 2 * Hk * Dk + Hv * Dv), False)]
    return n, conv + [((Hv, Dv, Dk), True)]


def footprint_breakdown(config_or_args, n_nodes: int, act_bytes: Optional[int] = None) -> dict:
    """Bytes of per-node state a tree verify of ``n_nodes`` nodes keeps alive.

    ``config_or_args``: a config.json dict (``text_config`` is looked into), a
    ModelArgs, or a loaded model. Recurrent state is float32 (4 Hv Dv Dk
    bytes per node per layer); conv windows are in the activation dtype
    (``act_bytes``; from the config's dtype, else 4 to stay on the safe
    side). Transient per-depth buffers are not counted."""
    if isinstance(config_or_args, nn.Module):
        mixers = [getattr(l, a) for _, l, a in recurrent_mixers(config_or_args)]
        mixers = [m.mixer if isinstance(m, StandIn) else m for m in mixers]
        if act_bytes is None:
            act_bytes = _model_act_bytes(config_or_args)
        per_layer = [[(s, len(s) == 3) for s in _slots_fn(m)(m)] for m in mixers]
    else:
        cfg = _config_dict(config_or_args)
        if act_bytes is None:
            act_bytes = _dtype_bytes(cfg, 4)
        n, slots = _config_layers(cfg)
        per_layer = [slots] * n
    rec = conv = 0
    for slots in per_layer:
        for shape, recurrent in slots:
            size = int(np.prod(shape))
            if recurrent:
                rec += 4 * size
            else:
                conv += act_bytes * size
    return {
        "recurrent_layers": len(per_layer),
        "recurrent_bytes_per_node": rec,
        "conv_bytes_per_node": conv,
        "bytes_per_node": rec + conv,
        "n_nodes": n_nodes,
        "total_bytes": (rec + conv) * n_nodes,
    }


def state_footprint(config_or_args, n_nodes: int, act_bytes: Optional[int] = None) -> int:
    """Total bytes of per-node recurrent + conv state for an ``n_nodes`` tree."""
    return footprint_breakdown(config_or_args, n_nodes, act_bytes)["total_bytes"]


def _model_act_bytes(model) -> int:
    """Activation dtype size, read off the token embedding (its scales when
    quantized); 4 when unknown."""
    emb = getattr(getattr(model, "model", model), "embed_tokens", None)
    for name in ("weight", "scales"):
        w = getattr(emb, name, None) if emb is not None else None
        if isinstance(w, mx.array) and mx.issubdtype(w.dtype, mx.floating):
            return w.dtype.size
    return 4


def _fmt(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def kept_nodes(tree) -> int:
    """How many per-node states a verify of ``tree`` keeps alive: every node
    of a branching tree (the tree-aware recurrence keeps each one for the
    commit), none of a chain (the mixer's own multi-token path writes one
    state, and commit replays the accepted prefix from the snapshot)."""
    return 0 if tree.is_linear() else len(tree)


def footprint_refusal(config_or_args, n_nodes: int, limit: Optional[int] = None) -> Optional[str]:
    """Why a tree's per-node states are too big, or None. Reads only shapes."""
    limit = max_tree_state_bytes() if limit is None else int(limit)
    info = footprint_breakdown(config_or_args, n_nodes)
    total = info["total_bytes"]
    if total <= limit:
        return None
    return (
        f"a {n_nodes}-node tree through the tree-aware recurrence keeps per-node "
        f"states of {total} bytes ({_fmt(total)}: {info['recurrent_layers']} "
        f"recurrent layers x {info['bytes_per_node']} bytes per node), over the "
        f"limit of {limit} bytes ({_fmt(limit)}). Use a smaller tree, or raise "
        f"the limit with {MAX_BYTES_ENV}=<bytes> (or limit=...)"
    )


def check_tree_footprint(config_or_args, n_nodes: int, limit: Optional[int] = None) -> int:
    """Raise ``TreeRefused`` for a tree whose per-node states exceed the
    limit; else return the footprint in bytes."""
    why = footprint_refusal(config_or_args, n_nodes, limit)
    if why:
        fam = config_or_args if isinstance(config_or_args, nn.Module) else None
        fam = _family(fam) if fam is not None else str(_config_dict(config_or_args).get("model_type"))
        raise TreeRefused(fam, why)
    return state_footprint(config_or_args, n_nodes)
