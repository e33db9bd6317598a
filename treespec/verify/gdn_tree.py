"""Tree-aware gated-delta recurrence for hybrid mlx-lm models.

A GatedDeltaNet-style mixer carries two kinds of state in its ``ArraysCache``:
causal-conv windows (the last ``K-1`` conv inputs) and a recurrent matrix
state. Running the mixer over a flattened tree is wrong: a node would inherit
its flattened predecessor's state (a sibling, or a cousin's leaf) instead of
its parent's, and its conv window would mix in those neighbours' inputs.

Here every node starts from its PARENT's state. The root starts from the
cached state. Nodes of one depth are independent of each other, so they run
as one batch: the unmodified mixer is called once per depth with inputs
``[n_d, 1, D]`` and a scratch ``ArraysCache`` whose slots hold the parents'
states gathered along the batch axis. Its own projections, conv, q/k
normalisation, ``gated_delta_update``, norm and output projection do all the
math. A tree of depth ``d`` costs ``d + 1`` mixer calls whatever its width.
Calling the real module, rather than a copy of its math, is also what keeps
this bit-identical to a plain forward over each node's root path on the CPU
backend: every op sees the same values in the same per-row order.

Every node's state after its step is kept, per depth level, stacked over the
nodes of that level. Committing the accepted node is then a gather: its conv
windows and recurrent state become the cache entries, with no replay. The
price is memory (``state_footprint``), so trees whose per-node states exceed a
limit are refused before anything runs.

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
cache slots, scalar gate); only their input projections differ (in_proj_qkv/
z/b/a vs the fused in_proj_qkvz/ba). olmo_hybrid keeps the attribute name but
has three convs and four slots; the Kimi and Bailing KDA mixers use per-channel
(vector) gates. None of that matters here: the wrapper is slot-generic and
calls the module itself, and the suite pins all six at the layer level.

API (the verify adapter's hook is ``TreeGatedDelta``):

    tree_mixer_forward(mixer, x, tree, cache) -> (out [1, n, D], TreeStates)
    TreeGatedDeltaNet(mixer, tree)            same call as the mixer; .states
    commit(cache_entry, states, node)         cache := node's states, advance(depth+1)
    tree_recurrence(model, tree, cache, limit) context manager -> TreeRecurrence
    TreeGatedDelta(limit)                     RecurrentStrategy: refusal / inject /
                                              commit(caches, path) / states_for(entry)
    register(limit)                           register_recurrent("gated_delta", ...)
    state_footprint(config_or_model, n_nodes) bytes; refusal over
                                              TREESPEC_MAX_TREE_STATE_BYTES (2 GiB)
"""

import os
from contextlib import contextmanager
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import ArraysCache

try:  # the verify package's refusal: TreeRefused(family, reason)
    from .adapter import TreeRefused
except ImportError:  # pragma: no cover - only while the adapter is absent

    class TreeRefused(ValueError):
        """A tree, cache mode or backend the verify forward cannot handle.
        Raised before anything is written: caches and modules are unchanged."""

        def __init__(self, family: str, reason: str):
            super().__init__(f"tree verify refused for model_type {family!r}: {reason}")
            self.family = family
            self.reason = reason


def _family(obj) -> str:
    """model_type of a model, or the mlx-lm module name of a mixer."""
    mt = getattr(obj, "model_type", None) or getattr(getattr(obj, "args", None), "model_type", None)
    if mt:
        return str(mt)
    return type(obj).__module__.rsplit(".", 1)[-1]


# --------------------------------------------------------------------------
# Which modules are gated-delta mixers, and where they live on a layer.

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
    ``TreeGatedDeltaNet`` (a verify still in progress) is reported too."""
    found = []
    for i, layer in enumerate(model.layers):
        for attr in MIXER_ATTRS:
            mod = getattr(layer, attr, None) if attr in layer else None
            if isinstance(mod, TreeGatedDeltaNet) or (
                mod is not None and is_gated_delta_mixer(mod)
            ):
                found.append((i, layer, attr))
                break
    return found


# --------------------------------------------------------------------------
# Memory bound.

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
        mixers = [m.mixer if isinstance(m, TreeGatedDeltaNet) else m for m in mixers]
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


# --------------------------------------------------------------------------
# Modes that are refused, by name.

KERNEL_ENV = "TREESPEC_GDN_KERNEL"


def _kernel_path(module) -> bool:
    """Whether ``gated_delta_update`` (or kimi_k3's compiled decode step)
    would take the Metal kernel for this module. CUDA has no gated-delta
    kernel in mlx-lm 0.32: it runs the same ops loop as the CPU."""
    return (
        not module.training
        and mx.default_device() == mx.gpu
        and mx.metal.is_available()
    )


def backend_refusal(module) -> Optional[str]:
    """The Metal kernel path is refused unless ``TREESPEC_GDN_KERNEL=allow``.

    Each kernel call here would see T=1 per batch row, started from the
    parent's state (never a flattened tree), and the kernel's per-step
    arithmetic does not depend on T, so the recurrence should match; but it
    has not been measured on Apple GPUs, so by default it is refused."""
    if _kernel_path(module) and os.environ.get(KERNEL_ENV, "refuse") != "allow":
        return (
            f"{type(module).__name__}: gated_delta_update would run its Metal "
            "kernel, whose per-depth batched use is not verified for exactness. "
            f"Set {KERNEL_ENV}=allow to run it anyway (one T=1 kernel call per "
            "depth, never a flattened tree; measure it with the gate), or run on "
            "the CPU stream"
        )
    return None


def cache_refusal(cache) -> Optional[str]:
    """The tree verify is single-sequence. A right-padded batch (``lengths``)
    or left padding not yet consumed would mask tree nodes away."""
    if cache is None:
        return None
    if not isinstance(cache, ArraysCache):
        return f"the tree-aware recurrence needs an ArraysCache, got {type(cache).__name__}"
    if cache.lengths is not None:
        return (
            "ArraysCache.lengths is set (a right-padded batch being prefilled); "
            "call cache.finalize() first"
        )
    bs = cache.batch_size
    if bs != 1:
        return f"the tree-aware recurrence needs batch size 1, the ArraysCache holds {bs}"
    lp = cache.left_padding
    if lp is not None and int(mx.max(lp).item()) > 0:
        return (
            f"ArraysCache.left_padding still masks {int(mx.max(lp).item())} "
            "positions of the next forward"
        )
    return None


def _check(module, cache) -> None:
    why = cache_refusal(cache) or backend_refusal(module)
    if why:
        raise TreeRefused(_family(module), why)


# --------------------------------------------------------------------------
# The per-depth forward.


class TreeStates:
    """Per-node cache slots of one mixer after a tree forward.

    ``levels[d]`` holds the slots of depth ``d``'s nodes, stacked along axis 0
    in node order; ``row[i]`` is node i's row in its level."""

    def __init__(self, depths: np.ndarray, levels: List[List[mx.array]], rows: np.ndarray):
        self.depths = depths
        self.levels = levels
        self.rows = rows

    def __len__(self) -> int:
        return len(self.depths)

    def node(self, i: int) -> List[mx.array]:
        """Node i's cache slots, each with a batch axis of 1."""
        if not 0 <= i < len(self.depths):
            raise IndexError(f"node {i} is not in a tree of {len(self.depths)} nodes")
        r = int(self.rows[i])
        return [s[r : r + 1] for s in self.levels[int(self.depths[i])]]

    def arrays(self) -> List[mx.array]:
        return [s for level in self.levels for s in level]


def _levels(tree) -> Tuple[np.ndarray, List[np.ndarray], np.ndarray]:
    depths = np.asarray(tree.depths())
    levels = [np.flatnonzero(depths == d) for d in range(int(depths.max()) + 1)]
    rows = np.empty(len(depths), dtype=np.int64)
    for nodes in levels:
        rows[nodes] = np.arange(len(nodes))
    return depths, levels, rows


def tree_mixer_forward(mixer, x: mx.array, tree, cache=None) -> Tuple[mx.array, TreeStates]:
    """Run ``mixer`` over the flattened tree ``x`` ([1, n, D]), each node from
    its parent's state, the root from ``cache``'s. Writes nothing to ``cache``.

    Returns the outputs [1, n, D] in flattened node order and the per-node
    states. Each depth is one call of the unmodified mixer on a batch of that
    depth's nodes."""
    n = len(tree)
    if x.ndim != 3 or x.shape[0] != 1 or x.shape[1] != n:
        raise ValueError(f"expected inputs [1, {n}, D] for a {n}-node tree, got {x.shape}")
    _check(mixer, cache)
    depths, levels, rows = _levels(tree)
    parents = np.asarray(tree.parents)
    n_slots = len(cache.cache) if cache is not None else len(_slots_fn(mixer)(mixer))
    # The root's parent state is the cached one (None slots: the mixer makes
    # its own zeros, exactly as a plain forward on an empty cache does).
    prev = list(cache.cache) if cache is not None else [None] * n_slots
    outs, states = [], []
    for d, nodes in enumerate(levels):
        if d > 0:
            # Parents of depth-d nodes all sit at depth d-1: gather their rows.
            idx = mx.array(rows[parents[nodes]])
            prev = [mx.take(s, idx, axis=0) for s in prev]
        step = ArraysCache(n_slots)
        step.cache = list(prev)
        xd = mx.take(x[0], mx.array(nodes), axis=0)[:, None, :]
        y = mixer(xd, None, step)
        prev = list(step.cache)
        outs.append(y[:, 0])
        states.append(prev)
    order = np.concatenate(levels)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    out = mx.take(mx.concatenate(outs, axis=0), mx.array(inverse), axis=0)[None]
    return out, TreeStates(depths, states, rows)


class TreeGatedDeltaNet(nn.Module):
    """Stand-in for a gated-delta mixer during one tree verify forward.

    Same call signature as the mixer. Writes nothing to the cache; after the
    call ``states`` holds every node's state for ``commit``."""

    def __init__(self, mixer: nn.Module, tree):
        super().__init__()
        if not is_gated_delta_mixer(mixer):
            raise TypeError(f"{type(mixer).__name__} is not a known gated-delta mixer")
        self.mixer = mixer
        self.tree = tree
        self.states = None

    def __call__(self, inputs: mx.array, mask: Optional[mx.array] = None, cache=None):
        # The model passes cache.make_mask(n): None, or all True once left
        # padding is consumed (cache_refusal refuses the rest). All-True masks
        # leave every value unchanged, so the mask can be dropped.
        if mask is not None and not bool(mx.all(mask).item()):
            raise TreeRefused(_family(self.mixer), "a padding mask hides tree nodes")
        out, self.states = tree_mixer_forward(self.mixer, inputs, self.tree, cache)
        return out


def commit(cache_entry: ArraysCache, states, node: int) -> None:
    """Make ``cache_entry`` what a plain forward over ``node``'s root path
    would have left: that node's conv windows and recurrent state, and the
    bookkeeping advanced by the path length. No replay."""
    if isinstance(states, TreeGatedDeltaNet):
        states = states.states
    if states is None:
        raise ValueError("no tree forward has run through this mixer yet")
    slots = states.node(node)  # validates node before anything is written
    if len(slots) != len(cache_entry.cache):
        raise ValueError(
            f"states have {len(slots)} slots, the cache entry {len(cache_entry.cache)}"
        )
    cache_entry.cache = [mx.contiguous(s) for s in slots]
    cache_entry.advance(int(states.depths[node]) + 1)


# --------------------------------------------------------------------------
# Model level: swap every mixer for the duration of one verify forward.


class TreeRecurrence:
    """The wrappers installed by ``tree_recurrence``, by cache index."""

    def __init__(self, wrappers: Dict[int, TreeGatedDeltaNet]):
        self.wrappers = wrappers

    def commit(self, cache: Sequence[Any], node: int) -> None:
        """Commit ``node`` into every recurrent cache entry of ``cache``."""
        for i, w in self.wrappers.items():
            if w.states is None:
                raise ValueError(f"layer {i}: no tree forward ran through this mixer")
            w.states.node(node)  # validate everything before writing anything
        for i, w in self.wrappers.items():
            commit(cache[i], w.states, node)


def tree_refusal(model, tree, cache: Optional[Sequence[Any]] = None, limit: Optional[int] = None) -> Optional[str]:
    """Why ``tree_recurrence`` would refuse, or None. Writes nothing."""
    mixers = recurrent_mixers(model)
    if not mixers:
        return None
    for i, layer, attr in mixers:
        m = getattr(layer, attr)
        if isinstance(m, TreeGatedDeltaNet):
            return f"layer {i}: a tree verify is already in progress"
        why = backend_refusal(m) or (cache_refusal(cache[i]) if cache is not None else None)
        if why:
            return f"layer {i}: {why}"
    return footprint_refusal(model, len(tree), limit)


@contextmanager
def tree_recurrence(model, tree, cache: Optional[Sequence[Any]] = None, limit: Optional[int] = None):
    """Swap every gated-delta mixer of ``model`` for a ``TreeGatedDeltaNet``
    (instance level) for the duration of the block; yields a
    ``TreeRecurrence``. Refusals happen on entry, before anything is
    swapped or written. Attention layers are the caller's business (tree
    mask and per-node positions)."""
    why = tree_refusal(model, tree, cache, limit)
    if why:
        raise TreeRefused(_family(model), why)
    mixers = recurrent_mixers(model)
    wrappers = {}
    try:
        for i, layer, attr in mixers:
            w = TreeGatedDeltaNet(getattr(layer, attr), tree)
            setattr(layer, attr, w)
            wrappers[i] = w
        yield TreeRecurrence(wrappers)
    finally:
        for i, layer, attr in mixers:
            if i in wrappers:
                setattr(layer, attr, wrappers[i].mixer)


class TreeGatedDelta:
    """``treespec.verify.recurrent.RecurrentStrategy`` for gated-delta layers.

    ``register()`` makes adapters created afterwards use it. After
    ``adapter.verify`` the per-node states of the last verify of each cache
    list are held here until ``commit`` (or the next verify) drops them."""

    name = "tree GatedDeltaNet"

    def __init__(self, limit: Optional[int] = None):
        self.limit = limit
        self._last = None  # (cache list, tree, TreeRecurrence)

    def refusal(self, model, caches, tree) -> Optional[str]:
        return tree_refusal(model, tree, caches, self.limit)

    @contextmanager
    def inject(self, model, caches, tree):
        self._last = None
        if tree.is_linear():
            # A chain through the recurrence is the sequence itself: exact
            # through the mixer's own multi-token path, which beats one call
            # per depth (a 16-chain measured 5x slower through the tree path).
            # Commit then replays the path from the snapshot.
            yield None
            return
        with tree_recurrence(model, tree, caches, self.limit) as handle:
            yield handle
        self._last = (caches, tree, handle)

    def states_for(self, cache_entry) -> TreeStates:
        """Per-node states the last verify recorded for this ArraysCache
        (identity), for a rollback that plans before it writes:
        ``states.node(i)`` validates, ``commit(cache_entry, states, i)``
        writes."""
        if self._last is not None:
            caches, _, handle = self._last
            for i, w in handle.wrappers.items():
                if caches[i] is cache_entry and w.states is not None:
                    return w.states
        raise ValueError("this ArraysCache was not in the last tree verify")

    def commit(self, caches, path: Sequence[int]) -> None:
        """Set every recurrent cache entry to the last node of the accepted
        root ``path`` of the tree this very cache list last verified."""
        if self._last is None or self._last[0] is not caches:
            raise ValueError("no tree verify of this cache list to commit from")
        _, tree, handle = self._last
        path = [int(p) for p in path]
        if not path or tree.path_to(path[-1]) != path:
            raise ValueError(f"{path} is not a root path of {tree!r}")
        handle.commit(caches, path[-1])
        self._last = None  # frees the per-node states


def register(limit: Optional[int] = None) -> TreeGatedDelta:
    """Register the tree-aware recurrence for kind ``gated_delta`` with the
    verify adapters (``treespec.verify.register_recurrent``)."""
    from .recurrent import register_recurrent

    strategy = TreeGatedDelta(limit)
    register_recurrent("gated_delta", strategy)
    return strategy
