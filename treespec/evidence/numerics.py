"""The backend's numerics envelope, measured in the same run (the suites and
``treespec audit`` alike); treespec.evidence.verdicts holds the words and the rule it
is judged with (re-exported here: ``numerics.judge``, ``numerics.Verdict``).

One forward over M tokens gives logits bit-identical to M single-token steps
on MLX's CPU reference BLAS only; under OpenBLAS (float32) and on CUDA the
kernels sum in an order that depends on M (docs/gate.md#where-it-declines).
There a tree node and a plain forward over its root path, two forwards of
different widths, cannot be compared bit for bit; this module measures how
far apart forwards of different widths are on this backend.

**The envelope** E of (model, cache mode, context bucket, widths): over
``SAMPLES`` random contexts spread over the bucket (more where the rounding
is heavy-tailed), the largest |logit difference| from M single-token steps
(what classic decoding computes) of

- a plain mlx-lm forward over the same M tokens (mlx-lm's own kernels), and
- the same M tokens as a linear tree verified through the tree path (array
  mask, per-node RoPE positions, the tree-aware recurrence), which is
  correct by construction: this covers the tree path's own kernels;
- on a KV-quantized cache of an inexact backend, also one quantization
  level's effect (:meth:`Measurement.kv_level`);
- for a model with recurrent mixers, one-token steps of M independent
  sequences run as one batch of M rows (mlx-lm's own forward, correct by
  construction) against each sequence alone: the tree-aware recurrence runs
  each depth of a tree as one batch of its nodes, kernels a chain never
  reaches at batch > 1 (:meth:`Measurement.batch`). Without it a backend
  whose products depend on the batch size, but whose mamba forward steps a
  chain one row at a time, measured a zero envelope on twelve contexts and
  then failed a branching tree by 1.2e-6 (BLIS, results/verdicts/).

The tree path is admitted into E only as far as it agrees with the plain
forward of the same tokens within the plain envelope's bound: an attention
that drops an array mask, or a RoPE whose per-row offsets are off, would
otherwise widen the very bound meant to catch it (``Envelope.tree_ok``; the
"tree path kernels" contract FAILs instead). Caches are measured
time-ordered (a sliding window as a KVCache, the window in its mask), so E
is the backend's rounding only: the order in which a wrapped ring hands its
keys to a one-token step is a cache layout, which a tree verify reproduces
by construction (treespec.ring) and suites/ring pins bit for bit. Measured
on the ring itself, E would take in the ring-order difference of mlx-lm's
multi-token forward: exactly what a verify that saw the ring in time order
would get wrong.

Where the model's quantized products are unsound on this backend at the
widths asked (treespec.backend.soundness: the same call giving different or
infinite values), there is no envelope to measure: :func:`envelope` returns
one carrying the faults, and every verdict judged with it is inconclusive.

Entry points: :func:`envelope` (memoized per process), :func:`measure` (not
memoized: for a test that changes kernels for its own duration),
:func:`controls` (a tree's negative controls, treespec.evidence.controls'), and the
rule's ``judge``.
"""

import random
from typing import Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (
    ArraysCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from .controls import (
    CONTROLS,
    RECURRENCE,
    SUBSTITUTED,
    FlatRecurrence,
    adapter_or_none,
    clone,
    control_rows,
    controls,
    max_abs_diff,
)
from ..caches import leaves
from ..errors import TreeRefused
from ..models import vocab_size
from ..backend.soundness import faults as kernel_faults
from ..tree import DraftTree
from .verdicts import (
    BIT_EXACT,
    DECLINED,
    FAIL,
    INCONCLUSIVE,
    SAFETY,
    SEPARATION,
    TRIANGLE,
    UNSOUND,
    WITHIN,
    WORDS,
    Envelope,
    Verdict,
    bucket,
    declined,
    judge,
    tree_path_verdict,
    unsound,
    widths_of,
    worst,
)
from ..verify import TreeAdapter
from ..verify.tree_recurrence import TreeRecurrence

__all__ = ["BIT_EXACT", "CONTROLS", "DECLINED", "Envelope", "FAIL", "FlatRecurrence",
           "INCONCLUSIVE", "RECURRENCE", "SAFETY", "SEPARATION", "TRIANGLE", "UNSOUND", "Verdict",
           "WITHIN", "WORDS", "control_rows", "controls", "declined", "envelope", "judge",
           "measure", "tree_path_verdict", "unsound", "widths_of", "worst"]

SAMPLES = 4  # contexts measured per bucket, and per extension
MAX_SAMPLES = 12
TAIL = 2.0  # a sample this far above the median: the rounding is heavy-tailed, measure more


def _time_ordered(model, kv_bits, kv_group, prompt) -> list:
    """The model's caches with every RotatingKVCache a KVCache (keys in time
    order; the model passes its window to make_mask, which a KVCache honours
    for one-token steps too), after ``prompt``; then the model's own KVCache
    layers KV-quantized (a window's layers stay unquantized, as mlx-lm's
    ``kv_bits`` leaves them)."""
    own = make_prompt_cache(model)
    cache = [KVCache() if type(c) is RotatingKVCache else c for c in own]
    if prompt:
        mx.eval(model(mx.array(prompt)[None], cache=cache))
    if kv_bits:
        cache = [c.to_quantized(group_size=kv_group, bits=kv_bits) if type(o) is KVCache else c
                 for c, o in zip(cache, own)]
    mx.eval([c.state for c in cache])
    return cache


class _PrefillUnsound(Exception):
    """A sample's context is a width at which the model's quantized products
    are unsound (treespec.backend.soundness.faults, carried in ``faults``)."""

    def __init__(self, faults):
        super().__init__("; ".join(map(str, faults)))
        self.faults = tuple(faults)


class _Sample:
    """One random context, and single-token steps over one random chain from
    it, extended as wider widths are asked for."""

    def __init__(self, model, kv, context: int, seed):
        # The prefill multiplies at ``context`` rows, a width the comparison's
        # own probe (_unsound) need not cover: probed first, so that an
        # unsound kernel there makes the envelope unsound instead of raising
        # from MLX (on the H200 a quantized product raised at 9 rows).
        found = kernel_faults(model, (context,)) if context > 0 else ()
        if found:
            raise _PrefillUnsound(found)
        self.model, self.context, self.rng = model, context, random.Random(repr(seed))
        v = vocab_size(model)
        self.base = _time_ordered(model, *kv, [self.rng.randrange(v) for _ in range(context)])
        self.tokens: List[int] = []
        self.steps: List[mx.array] = []
        self._cache = clone(self.base)
        self._v = v
        self.firsts: List[int] = []  # independent next tokens after the context
        self.alone: List[mx.array] = []  # the one-token step of each, alone

    def siblings(self, m: int) -> Tuple[List[int], mx.array]:
        """``m`` independent next tokens after the context, and each one's
        one-token step from the context alone (batch 1)."""
        while len(self.firsts) < m:
            t = self.rng.randrange(self._v)
            row = self.model(mx.array([[t]]), cache=clone(self.base))[0, -1]
            mx.eval(row)
            self.firsts.append(t)
            self.alone.append(row)
        return self.firsts[:m], mx.stack(self.alone[:m])

    def chain(self, m: int) -> Tuple[List[int], mx.array]:
        while len(self.steps) < m:
            t = self.rng.randrange(self._v)
            self.tokens.append(t)
            row = self.model(mx.array([[t]]), cache=self._cache)[0, -1]
            mx.eval(row)
            self.steps.append(row)
        return self.tokens[:m], mx.stack(self.steps[:m])


class Measurement:
    """The per-width measurements of one (model, cache mode, context bucket,
    tree adapter), made lazily: a width is measured the first time asked,
    on every sample. Samples start at ``SAMPLES`` contexts spread over the
    bucket; where one sample's difference stands out from the median by more
    than ``TAIL`` (heavy-tailed rounding: a recurrence amplifying it, a KV
    quantization level flipping), ``SAMPLES`` more are measured, up to
    ``MAX_SAMPLES``, so the maximum reaches the tail."""

    def __init__(self, model, adapter=None, context: int = 0, kv_bits=None, kv_group=None,
                 key: str = "", seed: int = 0):
        self.model = model
        self.adapter = adapter if adapter is not None else adapter_or_none(model)
        self.kv = (kv_bits, kv_group)
        self.lo, self.hi = bucket(context)
        self.key = key or f"context {self.lo}-{self.hi}" + (f", kv {kv_bits}-bit g{kv_group}" if kv_bits else "")
        self._seed = seed
        self._rng = random.Random(f"{seed}:{self.key}:contexts")
        self.samples: List[_Sample] = []
        self._more(SAMPLES)
        self.by_width: Dict[int, list] = {}
        self._levels: Dict[int, float] = {}
        self._controls: Optional[Dict[str, float]] = None
        self._chains: Optional[TreeAdapter] = None

    @property
    def contexts(self) -> Tuple[int, ...]:
        return tuple(s.context for s in self.samples)

    def _more(self, k: int):
        for _ in range(k):
            i = len(self.samples)
            spread = (self.lo, self.hi, (self.lo + self.hi) // 2)
            c = spread[i] if i < len(spread) else self._rng.randint(self.lo, self.hi)
            self.samples.append(_Sample(self.model, self.kv, c, f"{self._seed}:{self.key}:{i}:{c}"))

    def _measure(self, s: "_Sample", m: int, tree_path: bool):
        toks, steps = s.chain(m)
        p = self.model(mx.array(toks)[None], cache=clone(s.base))[0]
        plain = max(max_abs_diff(p, steps), self.batch(s, m))
        t = self._tree_path(toks, s.base) if tree_path else None
        if t is None:
            return plain, None, None
        return plain, max_abs_diff(t, steps), max_abs_diff(t, p)

    @property
    def batched(self) -> bool:
        """Whether the tree path runs a depth's nodes as batch rows: a
        treespec adapter with recurrent mixers (the tree-aware recurrence)."""
        found = getattr(self.adapter, "found", None)
        return isinstance(self.adapter, TreeAdapter) and bool(getattr(found, "mixers", None))

    def batch(self, s: "_Sample", m: int) -> float:
        """Max |diff| of ``m`` independent one-token steps after ``s``'s
        context run as one batch of ``m`` rows against each run alone; 0
        where the tree path runs no batch (:attr:`batched`)."""
        if not self.batched or m <= 1:
            return 0.0
        toks, alone = s.siblings(m)
        rows = self.model(mx.array(toks)[:, None], cache=_batch_of(s.base, m))[:, -1]
        return max_abs_diff(rows, alone)

    def width(self, m: int):
        """(plain, tree path, tree path vs plain) max |diff| at width m, over
        every sample (None: the tree path refused)."""
        if m <= 1:
            return 0.0, 0.0, 0.0
        rows = self.by_width.setdefault(m, [])
        while True:
            # The tree path on the first SAMPLES samples: it is the plain
            # forward's kernels plus its own (admitted only within the plain
            # bound), and the tail is the plain forward's.
            rows += [self._measure(s, m, i < SAMPLES) for i, s in enumerate(self.samples)
                     if i >= len(rows)]
            plains = sorted(r[0] for r in rows)
            # A zero (any difference FAILs) is believed on MAX_SAMPLES contexts
            # only: OpenBLAS's Cooperlake kernels gave 0 on four, 1e-6 on others.
            if len(self.samples) < MAX_SAMPLES and (
                    plains[-1] == 0 or plains[-1] > TAIL * plains[len(plains) // 2]):
                self._more(SAMPLES)
                continue
            break
        trees = [r[1] for r in rows[:SAMPLES]]
        if any(t is None for t in trees):
            return plains[-1], None, None
        return plains[-1], max(trees), max(r[2] for r in rows[:SAMPLES])

    def _tree_path(self, toks, base) -> Optional[mx.array]:
        if self.adapter is None:
            return None
        tree, cache = DraftTree.linear(toks), clone(base)
        try:
            if isinstance(self.adapter, TreeAdapter):
                out = self._chain_adapter().verify(tree, cache, inject=True)
            else:  # a user's adapter: whatever it does with a chain
                out = self.adapter.verify(tree, cache)
        except TreeRefused:
            return None
        mx.eval(out)
        return out

    def _chain_adapter(self) -> TreeAdapter:
        """The adapter under measurement, its tree-aware recurrence (if any)
        made to take chains through its per-depth path too, as it takes
        branching trees (a chain is otherwise the mixer's own forward)."""
        if self._chains is None:
            a = self.adapter
            rec = a.recurrent
            if isinstance(rec, TreeRecurrence):
                rec = TreeRecurrence(rec.limit, chains=True)
            self._chains = type(a)(a.model, a.family, rec, a.found)
        return self._chains

    def controls(self) -> Optional[Dict[str, float]]:
        """The negative controls for comparisons that have no branching tree
        of their own (a chain's, a commit's decoding on), from the first
        sample's context: the tree defects on a branching tree of 8 nodes
        (when treespec has an adapter for the model), and a plain forward
        over 8 tokens with its third replaced (what a rollback that kept a
        stale row would feed the next step)."""
        if self._controls is None:
            s = self.samples[0]
            v = vocab_size(self.model)
            rng = random.Random(f"{self.key}:controls")
            tree = DraftTree([rng.randrange(v) for _ in range(8)], [-1, 0, 0, 2, 3, 4, 5, 6])
            refs = [self.model(mx.array([tree.tokens[j] for j in tree.path_to(i)])[None],
                               cache=clone(s.base))[0, -1] for i in range(len(tree))]
            out = controls(self.model, s.base, tree, mx.stack(refs)) or {}
            toks, _ = s.chain(8)
            wrong = list(toks)
            wrong[2] = (wrong[2] + 1 + rng.randrange(v - 1)) % v
            p, q = (self.model(mx.array(t)[None], cache=clone(s.base))[0] for t in (toks, wrong))
            out[SUBSTITUTED] = max_abs_diff(p, q)
            self._controls = out
        return self._controls

    def envelope(self, widths: Sequence[int], with_controls: bool = True) -> Envelope:
        widths = _with_one(widths)
        n = -1
        while n != len(self.samples):  # a width that asks for more samples re-measures the others
            n = len(self.samples)
            rows = [self.width(m) for m in widths]
        plain = max(r[0] for r in rows)
        trees = [r[1] for r in rows]
        tree = None if any(t is None for t in trees) else max(trees)
        tvp = None if tree is None else max(r[2] for r in rows)
        level = self.kv_level(max(widths)) if self.kv[0] and plain > 0 else None
        env = Envelope(self.key, widths, self.contexts, plain, tree, tvp, None, level)
        if with_controls and not env.exact:
            env = Envelope(self.key, widths, self.contexts, plain, tree, tvp, self.controls(), level)
        return env

    def kv_level(self, width: int) -> float:
        """On an inexact backend a multi-token forward's keys and values differ
        from single steps' by a few ulp, and where one sits at a quantization
        boundary it lands a whole level away: rare (a few percent of
        forwards), large, and so missed by a sample maximum. Measured instead
        by planting it: the largest next-step logit change one level in one
        freshly written key or value element makes, over ``LEVELS`` random
        elements of each sample."""
        if width not in self._levels:
            worst = 0.0
            for i, s in enumerate(self.samples[:SAMPLES]):
                toks, _ = s.chain(width)
                cache = clone(s.base)
                self.model(mx.array(toks)[None], cache=cache)
                nxt = mx.array([[s.chain(width + 1)[0][-1]]])
                want = self.model(nxt, cache=clone(cache))[0, -1]
                rng = random.Random(f"{self.key}:level:{width}:{i}")
                for _ in range(LEVELS):
                    planted = clone(cache)
                    if _flip_one_level(planted, width, rng):
                        got = self.model(nxt, cache=planted)[0, -1]
                        worst = max(worst, max_abs_diff(got, want))
            self._levels[width] = worst
        return self._levels[width]


LEVELS = 4  # planted level changes per sample


def _batch_of(cache, k: int) -> list:
    """A copy of a batch-1 cache list holding the same history ``k`` times
    (every array repeated along the batch axis)."""
    out = clone(cache)

    def rep(a):
        return tuple(rep(x) for x in a) if isinstance(a, (tuple, list)) else (
            None if a is None else mx.repeat(a, k, axis=0))
    for _, c in leaves(out):
        if isinstance(c, ArraysCache):
            c.cache = [rep(a) for a in c.cache]
        elif getattr(c, "keys", None) is not None:
            c.keys, c.values = rep(c.keys), rep(c.values)
    return out


def _flip_one_level(cache, width: int, rng) -> bool:
    """Move one quantized element of the last ``width`` rows of one
    QuantizedKVCache's keys or values by one level (in place); False when
    the model has no quantized KV layer."""
    layers = [c for c in cache if isinstance(c, QuantizedKVCache) and c.keys is not None]
    if not layers:
        return False
    c = rng.choice(layers)
    which = rng.choice(("keys", "values"))
    packed, scales, biases = getattr(c, which)
    words = np.array(packed)
    per_word = 32 // c.bits
    h = rng.randrange(words.shape[1])
    row = c.offset - 1 - rng.randrange(min(width, c.offset))
    e = rng.randrange(words.shape[-1] * per_word)
    w, shift = e // per_word, (e % per_word) * c.bits
    mask = (1 << c.bits) - 1
    field = (int(words[0, h, row, w]) >> shift) & mask
    new = field + 1 if field < mask else field - 1
    words[0, h, row, w] = np.uint32((int(words[0, h, row, w]) & ~(mask << shift)) | (new << shift))
    setattr(c, which, (mx.array(words), scales, biases))
    return True


_MEMO: Dict[tuple, Measurement] = {}


def envelope(model, context: int, widths: Sequence[int], kv_bits: Optional[int] = None,
             kv_group: Optional[int] = None, adapter=None, adapter_name: str = "treespec",
             label: str = "") -> Envelope:
    """The envelope of ``model`` (its own caches, KV-quantized by
    ``kv_bits``/``kv_group``) at ``context`` tokens of history over
    ``widths``, measured on first use and remembered for the process (the
    measurement holds the model, so its identity stays its key). ``adapter``:
    the tree path measured (default ``adapter_for(model)``), named in the key
    by ``adapter_name``."""
    lo, hi = bucket(context)
    name = label or getattr(model, "model_type", type(model).__name__)
    tag = f"{name}, context {lo}-{hi}" + (f", kv {kv_bits}-bit g{kv_group}" if kv_bits else "")
    key = (id(model), kv_bits, kv_group, lo, adapter_name)

    def memoized():
        if key not in _MEMO:
            _MEMO[key] = Measurement(model, adapter, context, kv_bits, kv_group, tag)
        return _MEMO[key]
    return _measured(model, widths, tag, memoized)


def _measured(model, widths: Sequence[int], key: str, measurement) -> Envelope:
    """``measurement()``'s envelope over ``widths``, or the unsound one where
    the model's quantized products are unsound at these widths or at a
    sample's prefill width."""
    unsound = _unsound(model, widths, key)
    if unsound is not None:
        return unsound
    try:
        return measurement().envelope(widths)
    except _PrefillUnsound as e:
        return _unsound_envelope(key, widths, e.faults)


def _unsound(model, widths: Sequence[int], key: str) -> Optional[Envelope]:
    """The envelope that is none: where the model's quantized products are
    unsound at these widths (treespec.backend.soundness), nothing is measured and
    every comparison judged with it is inconclusive, naming the fault."""
    found = kernel_faults(model, _with_one(widths))
    return _unsound_envelope(key, widths, found) if found else None


def _with_one(widths: Sequence[int]) -> Tuple[int, ...]:
    return tuple(sorted({int(w) for w in widths} | {1}))


def _unsound_envelope(key: str, widths: Sequence[int], found) -> Envelope:
    return Envelope(key, _with_one(widths), (), float("nan"), None, None,
                    faults=tuple(map(str, found)))


def measure(model, context: int, widths: Sequence[int], kv_bits=None, kv_group=None,
            adapter=None, seed: int = 0) -> Envelope:
    """:func:`envelope` measured afresh, remembered nowhere: for code that
    changes kernels for its own duration (a planted regression)."""
    key = f"fresh, context {context}"
    return _measured(model, widths, key,
                     lambda: Measurement(model, adapter, context, kv_bits, kv_group, key, seed))
