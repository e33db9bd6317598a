"""The memory a tree verify through the tree-aware recurrence keeps alive.

Every node's recurrent state and conv windows are kept until the commit
(treespec.verify.tree_recurrence), so a branching tree of n nodes holds n states
per recurrent cache; a chain goes through the mixer's own multi-token path
and keeps none (``kept_nodes``). ``footprint_breakdown`` counts them for a
loaded model (any mixer: the slot shapes and dtypes a scratch forward leaves
in each ``ArraysCache``, treespec.mixers.discover) or, before loading, from
the config.json dict or ModelArgs of a gated-delta family; trees over the limit
(``TREESPEC_MAX_TREE_STATE_BYTES``, default 2 GiB) are refused before
anything runs.
"""

import os
from typing import List, Optional, Tuple

import mlx.nn as nn
import numpy as np

from ..errors import TreeRefused
from ..mixers import Discovery, discover


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

    ``config_or_args``: a loaded model or its ``Discovery`` (every recurrent
    cache's slots as a scratch forward leaves them, in their own dtypes),
    or a gated-delta family's config.json dict (``text_config`` is looked
    into) or ModelArgs: recurrent state float32 (4 Hv Dv Dk bytes per node
    per layer), conv windows in the activation dtype (``act_bytes``; from the
    config's dtype, else 4 to stay on the safe side). Transient per-depth
    buffers are not counted."""
    if isinstance(config_or_args, (nn.Module, Discovery)):
        found = config_or_args if isinstance(config_or_args, Discovery) else discover(config_or_args)
        rec = conv = 0
        for shapes in found.slot_shapes.values():
            for s in shapes:
                if s is None:
                    continue
                size = int(np.prod(s[0])) * s[1].size
                if len(s[0]) >= 3:
                    rec += size
                else:
                    conv += size
        layers = len(found.slot_shapes)
    else:
        cfg = _config_dict(config_or_args)
        if act_bytes is None:
            act_bytes = _dtype_bytes(cfg, 4)
        n, slots = _config_layers(cfg)
        rec = conv = 0
        for shape, recurrent in slots:
            size = int(np.prod(shape))
            if recurrent:
                rec += 4 * size
            else:
                conv += act_bytes * size
        rec, conv, layers = rec * n, conv * n, n
    return {
        "recurrent_layers": layers,
        "recurrent_bytes_per_node": rec,
        "conv_bytes_per_node": conv,
        "bytes_per_node": rec + conv,
        "n_nodes": n_nodes,
        "total_bytes": (rec + conv) * n_nodes,
    }


def state_footprint(config_or_args, n_nodes: int, act_bytes: Optional[int] = None) -> int:
    """Total bytes of per-node recurrent + conv state for an ``n_nodes`` tree."""
    return footprint_breakdown(config_or_args, n_nodes, act_bytes)["total_bytes"]


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
        f"recurrent caches, {info['bytes_per_node']} bytes per node), over the "
        f"limit of {limit} bytes ({_fmt(limit)}). Use a smaller tree, or raise "
        f"the limit with {MAX_BYTES_ENV}=<bytes> (or limit=...)"
    )


def check_tree_footprint(config_or_args, n_nodes: int, limit: Optional[int] = None) -> int:
    """Raise ``TreeRefused`` for a tree whose per-node states exceed the
    limit; else return the footprint in bytes."""
    why = footprint_refusal(config_or_args, n_nodes, limit)
    if why:
        if isinstance(config_or_args, nn.Module):
            fam = str(getattr(config_or_args, "model_type", type(config_or_args).__module__))
        elif isinstance(config_or_args, Discovery):
            fam = "model"
        else:
            fam = str(_config_dict(config_or_args).get("model_type"))
        raise TreeRefused(fam, why)
    return state_footprint(config_or_args, n_nodes)
