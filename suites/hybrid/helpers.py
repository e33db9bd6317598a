"""Test-side plumbing for the hybrid suite: models and mixers of every
gated-delta family, cache snapshots and comparisons, the verify call, and the
attention-side commit (a row gather) the recurrent commit is checked with."""

from types import SimpleNamespace as NS

import mlx.core as mx
from mlx_lm.models import bailing_moe_v3, kimi_k3, kimi_linear, olmo_hybrid
from mlx_lm.models.cache import ArraysCache, KVCache

from suites.helpers_numerics import require_sound
from treespec.evidence import numerics
from treespec import zoo
from treespec.tree import DraftTree  # noqa: F401  (re-exported for the tests)
from treespec.verify import adapter_for
from treespec.mixers import discover
from treespec.verify.tree_recurrence import tree_mixer_forward

FAMILIES = ("qwen3_5", "qwen3_next")


_MODELS = {}


def build(family, dtype="float32", bits=None, seed=0):
    """The zoo model (built once per process)."""
    key = (family, dtype, bits, seed)
    if key not in _MODELS:
        _MODELS[key] = zoo.build(family, dtype=dtype, bits=bits, seed=seed)
    return require_sound(_MODELS[key])


# -- caches -------------------------------------------------------------------


def snapshot(cache):
    """An independent copy of a prompt cache: later writes to either side
    (KVCache writes its buffer in place) do not reach the other."""
    out = []
    for c in cache:
        if isinstance(c, ArraysCache):
            n = ArraysCache(len(c.cache))
            n.cache = list(c.cache)  # the layer replaces these, never mutates
            n.left_padding = None if c.left_padding is None else mx.array(c.left_padding)
            n.lengths = None if c.lengths is None else mx.array(c.lengths)
        elif isinstance(c, KVCache):
            n = KVCache()
            if c.keys is not None:
                n.keys = mx.contiguous(c.keys[..., : c.offset, :])
                n.values = mx.contiguous(c.values[..., : c.offset, :])
                n.offset = c.offset
        else:
            raise TypeError(f"no snapshot for {type(c).__name__}")
        out.append(n)
    mx.eval([a for c in out for a in _arrays(c)])
    return out


def _arrays(c):
    if isinstance(c, ArraysCache):
        arrs = [a for a in c.cache if a is not None]
        arrs += [a for a in (c.left_padding, c.lengths) if a is not None]
        return arrs
    return [a for a in (c.keys, c.values) if a is not None]


def same_arrays_cache(a, b):
    """Every field of two ArraysCaches, bit for bit."""
    if len(a.cache) != len(b.cache):
        return False
    for x, y in zip(a.cache, b.cache):
        if (x is None) != (y is None):
            return False
        if x is not None and (x.shape != y.shape or x.dtype != y.dtype or not mx.array_equal(x, y).item()):
            return False
    for x, y in ((a.left_padding, b.left_padding), (a.lengths, b.lengths)):
        if (x is None) != (y is None):
            return False
        if x is not None and not mx.array_equal(x, y).item():
            return False
    return True


def same_kv(a, b):
    if a.offset != b.offset:
        return False
    if a.keys is None or b.keys is None:
        return a.keys is None and b.keys is None
    ka, va = a.keys[..., : a.offset, :], a.values[..., : a.offset, :]
    kb, vb = b.keys[..., : b.offset, :], b.values[..., : b.offset, :]
    return mx.array_equal(ka, kb).item() and mx.array_equal(va, vb).item()


def prefill(model, tokens):
    """The model's cache after ``tokens`` (fresh and empty when there are none)."""
    cache = model.make_cache()
    if not tokens:
        return cache
    model(mx.array(tokens)[None], cache=cache)
    mx.eval([a for c in cache for a in _arrays(c)])
    return cache


# -- verify -------------------------------------------------------------------


# The silent corruption the suite must catch: a branching tree let through
# the unmodified recurrence (numerics' recurrence control, planted here).
Flattened = numerics.FlatRecurrence


def verify(model, tree, cache, strategy):
    """Logits [n, V] of one verify forward over the tree through the verify
    adapter (tree mask and depth positions into attention), with ``strategy``
    for the recurrent layers."""
    logits = adapter_for(model, recurrent=strategy).verify(tree, cache)
    mx.eval(logits)
    return logits


def path_logits(model, cache, tokens):
    """Plain forward over ``tokens`` on a snapshot of ``cache``: the last
    position's logits and the cache that saw only those tokens."""
    c = snapshot(cache)
    logits = model(mx.array(tokens)[None], cache=c)
    mx.eval(logits)
    return logits[0, -1], c


# -- mixers of every gated-delta family, for the layer-level tests ---------------

LAYER_FAMILIES = ("qwen3_5", "qwen3_next", "olmo_hybrid", "kimi_linear", "kimi_k3", "bailing_moe_v3")
D_MODEL = 64


def _built_mixer(family, seed=0):
    mx.random.seed(seed)
    if family == "olmo_hybrid":
        m = olmo_hybrid.GatedDeltaNet(
            NS(hidden_size=D_MODEL, linear_num_value_heads=4, linear_num_key_heads=2,
               linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
               linear_allow_neg_eigval=True, layer_norm_epsilon=1e-5)
        )
    elif family == "kimi_linear":
        m = kimi_linear.KimiDeltaAttention(
            NS(hidden_size=D_MODEL, rms_norm_eps=1e-5,
               linear_attn_config=dict(num_heads=4, head_dim=16, short_conv_kernel_size=4)), 0
        )
    elif family == "kimi_k3":
        m = kimi_k3.KimiK3DeltaAttention(
            NS(hidden_size=D_MODEL, rms_norm_eps=1e-5,
               linear_attn_config=dict(num_heads=4, head_dim=16, short_conv_kernel_size=4,
                                       gate_lower_bound=-5.0)), 0
        )
    elif family == "bailing_moe_v3":
        m = bailing_moe_v3.BailingKDA(
            NS(hidden_size=D_MODEL, rms_norm_eps=1e-5, no_kda_lora=True, kda_safe_gate=True,
               num_attention_heads=4, head_dim=16, short_conv_kernel_size=4, kda_lower_bound=-5.0)
        )
    else:
        raise ValueError(family)
    # Their A_log / dt_bias init to constants; spread them so the gates vary.
    m.A_log = 0.5 * mx.random.normal(m.A_log.shape)
    m.dt_bias = 0.5 * mx.random.normal(m.dt_bias.shape)
    m.eval()
    mx.eval(m.parameters())
    return m


_MIXER_CACHE = {}


def mixer(family):
    """A gated-delta mixer of ``family`` (the zoo model's first one for the
    Qwen families) and its number of ArraysCache slots."""
    if family not in _MIXER_CACHE:
        if family in FAMILIES:
            model = build(family)
            first = discover(model).mixers[0]
            m = first.module
            slots = len(model.make_cache()[first.where[0]].cache)
        else:
            m = _built_mixer(family)
            slots = 2 if family == "kimi_k3" else 4
        _MIXER_CACHE[family] = (m, slots)
    return _MIXER_CACHE[family]


def mixer_cache(m, slots, prefix_len, seed):
    """An ArraysCache after ``prefix_len`` inputs (empty when 0)."""
    cache = ArraysCache(slots)
    if prefix_len:
        x = mx.random.normal((1, prefix_len, D_MODEL), key=mx.random.key(seed))
        m(x, None, cache)
        mx.eval(cache.cache)
    return cache


def mismatched(a, b):
    """Indices along axis 0 where two stacks differ (any bit)."""
    return [i for i in range(a.shape[0]) if not mx.array_equal(a[i], b[i]).item()]


# -- the mixer's numerics envelope ---------------------------------------------
# treespec.evidence.numerics' rule one level down: how far a mixer's plain forward over
# M inputs, and the tree-aware recurrence over a chain of M (correct by
# construction), are from M single-input steps, for the outputs and for the
# state they leave, over contexts spread across the prefix's bucket. The
# negative control without a tree of its own: the plain forward with one
# input replaced (what a commit that kept a stale row would leave).
#
# A chain's state holds only its last inputs (the conv window), so the chain
# alone samples the rounding of the last rows of a width-M projection; a
# tree node's state holds its own row, anywhere in the verify's M. Where a
# BLAS rounds a row by its place in the product (OpenBLAS on Zen cores does;
# docs/numerics.md#the-envelope), the plain envelope also
# takes M one-input sequences as one batch (the same M-row products, every
# row's state kept) against each input alone from the same cache.

_STEP = 48  # widest input sequence measured


class _LayerMeasurement:
    def __init__(self, family, prefix):
        self.m, self.slots = mixer(family)
        lo, hi = numerics.bucket(prefix)
        ctxs = sorted({lo, (lo + hi) // 2, hi})
        self.contexts = tuple(ctxs + [hi] * (numerics.SAMPLES - len(ctxs)))
        self.key = f"{family} mixer, prefix {lo}-{hi}"
        self.samples = []
        for i, p in enumerate(self.contexts):
            cache = mixer_cache(self.m, self.slots, p, seed=7000 + i)
            x = mx.random.normal((1, _STEP, D_MODEL), key=mx.random.key(8000 + i))
            self.samples.append({"cache": cache, "x": x, "out": [], "state": [], "c": copy_cache(cache),
                                 "alone": []})
        self.by_width = {}
        self.controls = None

    def _steps(self, s, n):
        while len(s["out"]) < n:
            t = len(s["out"])
            y = self.m(s["x"][:, t : t + 1], s["c"].make_mask(1), s["c"])
            mx.eval(y, s["c"].cache)
            s["out"].append(y[0, -1])
            s["state"].append(list(s["c"].cache))
        return mx.stack(s["out"][:n]), s["state"][n - 1]

    def _alone(self, s, n):
        """Each of the first ``n`` inputs as a one-input step from the cache."""
        while len(s["alone"]) < n:
            r, c = len(s["alone"]), copy_cache(s["cache"])
            y = self.m(s["x"][:, r : r + 1], c.make_mask(1), c)
            mx.eval(y, c.cache)
            s["alone"].append((y[0, -1], list(c.cache)))
        return s["alone"][:n]

    def _rows(self, s, n):
        """(outputs, state) max |diff| of the first ``n`` inputs as one batch
        of one-input sequences against each alone: every row of a width-n
        product, and the state it leaves."""
        c = batch_cache(s["cache"], n)
        y = self.m(s["x"][0, :n][:, None], c.make_mask(1), c)
        mx.eval(y, c.cache)
        out = state = 0.0
        for r, (a, st) in enumerate(self._alone(s, n)):
            out = max(out, _maxdiff(y[r, -1], a))
            state = max(state, max(_maxdiff(b[r : r + 1], x) for b, x in zip(c.cache, st)))
        return out, state

    def width(self, n):
        if n not in self.by_width:
            out, state = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
            for s in self.samples:
                rows = self._rows(s, n)
                out[0], state[0] = max(out[0], rows[0]), max(state[0], rows[1])
                steps, st = self._steps(s, n)
                c = copy_cache(s["cache"])
                p = self.m(s["x"][:, :n], c.make_mask(n), c)[0]
                t, states = tree_mixer_forward(self.m, s["x"][:, :n], DraftTree.linear(list(range(n))),
                                               s["cache"])
                t, tst = t[0], states.node(n - 1)
                for k, (a, b) in enumerate(((p, steps), (t, steps), (t, p))):
                    out[k] = max(out[k], _maxdiff(a, b))
                for k, (a, b) in enumerate(((c.cache, st), (tst, st), (tst, c.cache))):
                    state[k] = max(state[k], max(_maxdiff(x, y) for x, y in zip(a, b)))
            self.by_width[n] = (out, state)
        return self.by_width[n]

    def control(self):
        if self.controls is None:
            s = self.samples[0]
            x = s["x"][:, :8]
            wrong = mx.concatenate([x[:, :2], s["x"][:, 20:21], x[:, 3:]], axis=1)
            a, b = copy_cache(s["cache"]), copy_cache(s["cache"])
            ya, yb = self.m(x, a.make_mask(8), a)[0], self.m(wrong, b.make_mask(8), b)[0]
            self.controls = ({"substituted input": _maxdiff(ya, yb)},
                             {"substituted input": max(_maxdiff(u, v) for u, v in zip(a.cache, b.cache))})
        return self.controls

    def envelopes(self, widths):
        widths = tuple(sorted(set(widths) | {1}))
        rows = [self.width(n) for n in widths if n > 1] or [([0.0] * 3, [0.0] * 3)]
        made = []
        for j in (0, 1):
            vals = [max(r[j][k] for r in rows) for k in range(3)]
            env = numerics.Envelope(self.key + (" outputs", " state")[j], widths, self.contexts, *vals)
            if not env.exact:
                env = numerics.Envelope(env.key, widths, self.contexts, *vals, self.control()[j])
            made.append(env)
        return made


def _maxdiff(a, b) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float(mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item())


def batch_cache(cache, n):
    """``n`` copies of a batch-1 ArraysCache as one batch of ``n``."""
    c = ArraysCache(len(cache.cache))
    c.cache = [None if a is None else mx.repeat(a, n, axis=0) for a in cache.cache]
    return c


def copy_cache(cache):
    """An ArraysCache sharing the (never mutated) slot arrays."""
    c = ArraysCache(len(cache.cache))
    c.cache = list(cache.cache)
    c.left_padding = None if cache.left_padding is None else mx.array(cache.left_padding)
    c.lengths = None if cache.lengths is None else mx.array(cache.lengths)
    return c


_LAYER_MEMO = {}


def layer_envelopes(family, prefix, widths):
    """(outputs envelope, state envelope) of ``family``'s mixer (a
    treespec.evidence.numerics.Envelope each) at ``prefix`` inputs of history."""
    key = (family, numerics.bucket(prefix))
    if key not in _LAYER_MEMO:
        _LAYER_MEMO[key] = _LayerMeasurement(family, prefix)
    return _LAYER_MEMO[key].envelopes(widths)
