"""Cache states and trees the audit properties (and the suites) run on:
histories before and after a sliding window wraps, cache modes (native and
quantized KV), copies and fingerprints of caches, plain forwards."""

import hashlib
import random
from dataclasses import dataclass
from typing import List, Optional, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from ..evidence import numerics
from ..caches import leaves
from ..evidence.controls import clone
from ..tree import DraftTree
from .subject import Subject, the_adapter, vocab, window


@dataclass(frozen=True)
class CacheMode:
    """``native``: the model's make_prompt_cache; ``kv-q{bits}-g{group}``: its
    KVCache layers converted to QuantizedKVCache after the history, as
    mlx-lm's ``kv_bits`` does."""

    name: str = "native"
    kv_bits: Optional[int] = None
    kv_group: Optional[int] = None


def cache_modes(model) -> Tuple[List[CacheMode], Optional[str]]:
    """The modes this model runs in, and why quantized KV is n/a (or None)."""
    cache = make_prompt_cache(model)
    model(mx.array([[1]]), cache=cache)
    dims = sorted({c.keys.shape[-1] for c in cache if type(c) is KVCache})
    modes = [CacheMode()]
    if not dims:
        return modes, "no KVCache layer to quantize"
    group = next((g for g in (64, 32) if all(d % g == 0 for d in dims)), None)
    if group is None:
        return modes, f"KV head_dim {dims} is not a multiple of a quantization group (32, 64)"
    modes += [CacheMode(f"kv-q{b}-g{group}", b, group) for b in (4, 8)]
    return modes, None


@dataclass(frozen=True)
class History:
    """One prompt forward, then single steps (they rotate a window's ring)."""

    prompt: tuple
    steps: tuple = ()

    @property
    def offset(self) -> int:
        return len(self.prompt) + len(self.steps)

    def label(self, w: Optional[int]) -> str:
        how = f"{len(self.prompt)} prompt + {len(self.steps)} steps" if self.steps else "prompt"
        wrapped = ", window wrapped" if w and self.offset >= w else ""
        return f"offset {self.offset} ({how}{wrapped})"


def histories(s: Subject) -> List[History]:
    """Cache states before and after the sliding window wraps (8 stands in
    for the window of a model without one), as suites/verify uses: empty,
    short, just below the window, wrapped by the prompt (concatenating
    update), wrapped by single steps (ring rotated in place), and both."""
    if "histories" not in s._memo:
        w = window(s.model) or 8
        rng = random.Random(f"{s.options.seed}:histories")
        v = vocab(s)
        toks = lambda n: tuple(rng.randrange(v) for _ in range(n))
        # A long window is wrapped by single steps with a long prompt first:
        # thousands of one-token steps would cost minutes on a real model.
        by_steps = History(toks(2), toks(w + 2)) if w <= 64 else History(toks(w - 2), toks(4))
        both = History(toks(w), toks(w // 2 + 1)) if w <= 64 else History(toks(w), toks(3))
        s._memo["histories"] = [
            History(()),
            History(toks(3)),
            History(toks(max(w - 2, 1)), toks(1)),
            History(toks(w + 3)),
            by_steps,
            both,
        ]
    return s._memo["histories"]


def envelope(s: Subject, context: int, widths, mode: CacheMode = CacheMode()):
    """The audited model's envelope (treespec.evidence.numerics) at ``context`` over
    ``widths`` in ``mode``, its tree path through the adapter under audit: a
    callable, measured when a comparison first needs it."""
    return lambda: numerics.envelope(s.model, context, widths, mode.kv_bits, mode.kv_group,
                                     adapter=the_adapter(s), adapter_name=s.adapter_source)


def base_cache(s: Subject, hist: History, mode: CacheMode) -> list:
    """The cache after ``hist`` in ``mode``, replayed once per audit: callers
    get a copy (``clone``), never the memoized one."""
    memo = s._memo.setdefault("caches", {})
    key = (hist, mode)
    if key not in memo:
        memo[key] = replay(s.model, hist, mode)
    return clone(memo[key])


def replay(model, hist: History, mode: CacheMode) -> list:
    cache = make_prompt_cache(model)
    if hist.prompt:
        mx.eval(model(mx.array(hist.prompt)[None], cache=cache))
    for t in hist.steps:
        mx.eval(model(mx.array([[t]]), cache=cache))
    if mode.kv_bits:
        cache = [c.to_quantized(group_size=mode.kv_group, bits=mode.kv_bits)
                 if type(c) is KVCache else c for c in cache]
    mx.eval([c.state for c in cache])
    return cache


def fingerprint(cache) -> str:
    """Every attribute of every cache, arrays as bytes, hashed."""
    h = hashlib.sha256()

    def feed(v):
        if isinstance(v, mx.array):
            h.update(f"{v.dtype}{v.shape}".encode())
            if v.size:
                h.update(np.array(v.view(mx.uint8) if v.dtype.size else v).tobytes())
        elif isinstance(v, (list, tuple)):
            h.update(f"{type(v).__name__}{len(v)}".encode())
            for x in v:
                feed(x)
        elif isinstance(v, dict):
            for k in sorted(v):
                h.update(str(k).encode())
                feed(v[k])
        elif isinstance(v, (int, float, str, bool, type(None))):
            h.update(repr(v).encode())
        else:
            h.update(f"obj{id(v)}".encode())

    for c in cache:
        h.update(type(c).__name__.encode())
        feed(dict(vars(c)))
    return h.hexdigest()


def plain(model, cache, tokens) -> mx.array:
    """Logits [T, vocab] of a plain mlx-lm forward over ``tokens``."""
    out = model(mx.array(list(tokens))[None], cache=cache)[0]
    mx.eval(out)
    return out


def keys_rotated(cache) -> bool:
    """After a one-token step: does a wrapped RotatingKVCache hand the
    attention its keys out of time order (``_update_in_place``)?"""
    return any(
        isinstance(c, RotatingKVCache) and c.offset > c.keys.shape[2] and c._idx != c.keys.shape[2]
        for c in cache
    )


def classic(model, cache, tokens) -> mx.array:
    """Logits [T, vocab] of the reference forward over a root path: where a
    cache is a sliding-window ring (RotatingKVCache), one-token steps, as
    classic decoding computes them (a multi-token forward would put a wrapped
    ring in time order first, which neither classic decoding nor a tree
    verify does: docs/verify.md#sliding-window-rings); elsewhere one plain forward."""
    if not any(isinstance(c, RotatingKVCache) for _, c in leaves(cache)):
        return plain(model, cache, tokens)
    out = mx.concatenate([model(mx.array([[t]]), cache=cache)[0] for t in tokens])
    mx.eval(out)
    return out


def root_path_forwards(model, before, tree) -> mx.array:
    """Row i: the last row of :func:`classic` over node i's root path of
    ``tree``, each from its own copy of ``before``: the reference every node
    of a tree verify is compared with."""
    return mx.stack([classic(model, clone(before), [tree.tokens[j] for j in tree.path_to(i)])[-1]
                     for i in range(len(tree))])


def wrapped(cache) -> bool:
    return any(isinstance(c, RotatingKVCache) and c.offset >= c.max_size for c in cache)


# ---------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------


def random_tree(rng: random.Random, vocab: int, n: int, style: str = "random") -> DraftTree:
    """A tree of ``n`` nodes: ``random`` (uniform parents), ``fan``, ``chain``
    or ``mixed``; any style but chain is made branching when n >= 3."""
    parents = [-1]
    for i in range(1, n):
        if style == "chain":
            parents.append(i - 1)
        elif style == "fan":
            parents.append(0)
        elif style == "mixed":
            parents.append(rng.choice([0, i - 1, rng.randrange(i)]))
        else:
            parents.append(rng.randrange(i))
    if style != "chain" and n >= 3 and parents == list(range(-1, n - 1)):
        parents[-1] = 0
    return DraftTree([rng.randrange(vocab) for _ in range(n)], parents)


def branching_trees(s: Subject, rng: random.Random) -> List[DraftTree]:
    """``draws`` random branching trees, plus one deeper than a small window
    (the window then cuts inside the tree itself)."""
    v = vocab(s)
    styles, sizes = ("random", "mixed", "fan"), (6, 10, 13)
    trees = [random_tree(rng, v, sizes[d % 3], styles[d % 3]) for d in range(s.options.draws)]
    w = window(s.model)
    if w and w <= 32:
        deep = [-1] + list(range(0, w + 2)) + [3, w // 2]
        trees.append(DraftTree([rng.randrange(v) for _ in deep], deep))
    return trees
