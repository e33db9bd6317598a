"""Cache modes and the observations the rollback suite compares.

One table (``MODES``) of every cache mode the rollback supports; one feed,
one observation of everything a later update or mask can see, and one
fingerprint of every array and field for the refusal checks. Tests never
branch on the mode beyond what this module exposes.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx
import numpy as np
from hypothesis import strategies as st
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)

from suites.helpers_strategies import trees
from treespec.tree import DraftTree

HEADS = 2

# A small branching tree whose root paths move rows: node 5 sits at index 5,
# its slot on the path [0, 2, 5] is 2.
BUSH = DraftTree([5, 6, 7, 8, 9, 10, 11], [-1, 0, 0, 1, 1, 2, 5])


@st.composite
def tree_and_path(draw, max_nodes=10):
    """A tree and an accepted root path: root only, the deepest branch in
    full, or the path to any node."""
    tree = draw(trees(max_nodes=max_nodes))
    deepest = int(np.argmax(tree.depths()))
    node = draw(st.one_of(st.just(0), st.just(deepest), st.integers(0, len(tree) - 1)))
    return tree, tree.path_to(node)


@dataclass(frozen=True)
class Mode:
    make: Callable[[], object]
    dtype: mx.Dtype = mx.float32
    head_dim: int = 16
    # mlx-lm's trim equals a commit of a linear prefix (ConcatenateKVCache's
    # trim only moves offset and leaves the dropped rows visible).
    trim_agrees: bool = True
    window: Optional[int] = None  # a sliding window tests should cross
    chunk: Optional[int] = None


MODES = {
    **{
        f"kv-{d}": Mode(KVCache, getattr(mx, d))
        for d in ("float32", "float16", "bfloat16")
    },
    **{
        f"quantized-{b}bit-g{g}": Mode(
            lambda g=g, b=b: QuantizedKVCache(group_size=g, bits=b), head_dim=128
        )
        for b in (4, 8)
        for g in (32, 64, 128)
    },
    "quantized-4bit-g64-float16": Mode(
        lambda: QuantizedKVCache(group_size=64, bits=4), mx.float16, head_dim=64
    ),
    "rotating-w8-keep0": Mode(lambda: RotatingKVCache(max_size=8), window=8),
    "rotating-w12-keep4": Mode(lambda: RotatingKVCache(max_size=12, keep=4), window=12),
    "rotating-w8-keep2-bfloat16": Mode(
        lambda: RotatingKVCache(max_size=8, keep=2), mx.bfloat16, window=8
    ),
    "chunked-c16": Mode(lambda: ChunkedKVCache(16), chunk=16),
    "concatenate": Mode(ConcatenateKVCache, trim_agrees=False),
    "cachelist-kv-rotating": Mode(
        lambda: CacheList(KVCache(), RotatingKVCache(max_size=8, keep=1)), window=8
    ),
}


def rows(mode: Mode, n: int, rng: np.random.RandomState):
    """n distinct (keys, values) rows [1, HEADS, n, head_dim] for ``mode``."""
    shape = (1, HEADS, n, mode.head_dim)
    k, v = (mx.array(rng.standard_normal(shape).astype(np.float32)) for _ in "kv")
    return k.astype(mode.dtype), v.astype(mode.dtype)


def take(kv, idx):
    """The rows ``idx`` (time axis) of a (keys, values) pair."""
    idx = mx.array(np.asarray(idx, dtype=np.int32))
    return tuple(mx.take(a, idx, axis=2) for a in kv)


def feed(c, kv):
    """One update of len(kv rows) tokens, as an attention layer makes it;
    returns what attention would see. llama4 trims chunked caches before
    every forward."""
    if isinstance(c, CacheList):
        return [feed(s, kv) for s in c.caches]
    if isinstance(c, ChunkedKVCache):
        c.maybe_trim_front()
    return c.update_and_fetch(*kv)


def offset_of(c) -> int:
    return offset_of(c.caches[0]) if isinstance(c, CacheList) else c.offset


def crosses_chunk(c, offset: int, n: int) -> bool:
    if isinstance(c, CacheList):
        return any(crosses_chunk(s, offset, n) for s in c.caches)
    if isinstance(c, ChunkedKVCache):
        return offset // c.chunk_size != (offset + n - 1) // c.chunk_size
    return False


# -- observing ---------------------------------------------------------------


def _masks(c):
    """Every mask a model could ask this cache for next."""
    if not hasattr(c, "make_mask"):
        return {}
    out = {}
    windows = [None] + ([c.max_size // 2, c.max_size] if isinstance(c, RotatingKVCache) else [3])
    for n in (1, 3):
        for w in windows:
            if isinstance(c, ArraysCache):
                m = c.make_mask(n)
            else:
                m = c.make_mask(n, window_size=w, return_array=True)
            out[f"mask{n}w{w}"] = m
    return out


def observe(c, prefix="") -> dict:
    """Everything later updates and masks can depend on: the valid rows of
    every state array and every meta field. Rows past ``offset`` of a
    step-allocated buffer are never read, so they are left out; a rotating
    cache is observed as its attention reads it (``keys_and_values``: the
    whole ring once it holds ``offset`` rows or more, rows in slot order)
    with the slot its next step writes."""
    if isinstance(c, CacheList):
        out = {}
        for j, s in enumerate(c.caches):
            out.update(observe(s, f"{prefix}{j}."))
        return out
    obs = {"class": type(c).__name__, "size": c.size(), **_masks(c)}
    if isinstance(c, ArraysCache):
        obs.update({f"slot{i}": a for i, a in enumerate(c.cache)})
        obs.update(left_padding=c.left_padding, lengths=c.lengths)
    elif isinstance(c, RotatingKVCache):
        keys, values = c.keys_and_values() if c.keys is not None else (None, None)
        obs.update(keys=keys, values=values, offset=c.offset, _idx=c._idx)
        obs.update(keep=c.keep, max_size=c.max_size)
    else:
        start = getattr(c, "start_position", 0)
        valid = lambda a: a[..., : c.offset - start, :]
        for name in ("keys", "values"):
            x = getattr(c, name)
            if isinstance(x, (list, tuple)):  # quantized: packed, scales, biases
                obs.update({f"{name}{i}": valid(a) for i, a in enumerate(x)})
            else:
                obs[name] = valid(x)
        obs.update(offset=c.offset)
        for meta in ("group_size", "bits", "chunk_size", "start_position"):
            if hasattr(c, meta):
                obs[meta] = getattr(c, meta)
    return {prefix + k: v for k, v in obs.items()}


def assert_same(a, b, what="", values=True):
    """Same fields, same dtypes and shapes, and (``values``) same array
    values, bit for bit."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{what}: fields differ {set(a) ^ set(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{what}.{k}", values)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{what}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{what}[{i}]", values)
    elif isinstance(a, mx.array):
        assert isinstance(b, mx.array), f"{what}: array vs {type(b).__name__}"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (
            f"{what}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        )
        assert not values or mx.array_equal(a, b).item(), f"{what}: values differ"
    else:
        assert a == b or (a is None and b is None), f"{what}: {a!r} != {b!r}"


# -- fingerprints for refusals -------------------------------------------------


def _bits(a: mx.array) -> np.ndarray:
    if a.dtype in (mx.bfloat16, mx.float16):
        a = a.view(mx.uint16)
    return np.array(a, copy=True)


def fingerprint(x):
    """A deep copy, as numpy, of every array and field reachable from a cache
    (all of ``vars``, whole buffers included): arrays are mutated in place,
    so holding references would prove nothing."""
    if isinstance(x, mx.array):
        return ("array", str(x.dtype), x.shape, _bits(x).tobytes())
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [fingerprint(y) for y in x])
    if isinstance(x, dict):
        return ("dict", {k: fingerprint(v) for k, v in x.items()})
    if hasattr(x, "__dict__") and type(x).__module__.startswith("mlx_lm"):
        return (type(x).__name__, id(x), fingerprint(vars(x)))
    return x
