"""Shared pieces of the verify suite: zoo models, cache histories, plain
root-path references, and cache snapshots that compare every array bit."""

import copy
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from treespec import zoo
from treespec.tree import DraftTree

# (family, dtype, bits): float32 on every family; every dtype and both
# quantizations on llama; the sliding-window families in half precision too.
CONFIGS = [(f, "float32", None) for f in zoo.FAMILIES] + [
    ("llama", "float16", None),
    ("llama", "bfloat16", None),
    ("llama", "float32", 4),
    ("llama", "float32", 8),
    ("llama", "bfloat16", 4),
    ("gemma3_text", "bfloat16", None),
    ("gemma4_text", "float16", None),
    ("qwen3_5", "bfloat16", None),
]
HYBRID = ("qwen3_5", "qwen3_next")
# Quantized KV cache mode (mlx-lm's QuantizedKVCache, as generate's
# kv_bits makes it) on the family whose head_dim a group fits.
KV_QUANT = [("qwen3", "float32", None, 4), ("qwen3", "float32", None, 8)]
KV_GROUP = 32


def config_id(cfg) -> str:
    family, dtype, bits = cfg[:3]
    kv = f"-kv{cfg[3]}" if len(cfg) > 3 else ""
    return f"{family}-{dtype}" + (f"-q{bits}" if bits else "") + kv


@lru_cache(maxsize=None)
def model(family: str, dtype: str = "float32", bits: Optional[int] = None):
    return zoo.build(family, dtype, bits)


def window(family: str) -> Optional[int]:
    """The sliding window of the zoo family (None when it has none)."""
    return zoo.config(family).get("sliding_window")


def tokens(n: int, seed: int) -> tuple:
    rng = np.random.RandomState(seed)
    return tuple(int(t) for t in rng.randint(0, zoo.VOCAB_SIZE, n))


@dataclass(frozen=True)
class History:
    """How a cache got its state: one prompt forward, then single steps,
    then (``kv_bits``) conversion to mlx-lm's QuantizedKVCache.

    Single steps are what drive a RotatingKVCache round its buffer (in-place
    updates); a long prompt wraps it through the concatenating update."""

    prompt: tuple
    steps: tuple = ()
    kv_bits: Optional[int] = None

    @property
    def offset(self) -> int:
        return len(self.prompt) + len(self.steps)

    def replay(self, model) -> list:
        cache = make_prompt_cache(model)
        if self.prompt:
            mx.eval(model(mx.array(self.prompt)[None], cache=cache))
        for t in self.steps:
            mx.eval(model(mx.array([[t]]), cache=cache))
        if self.kv_bits:
            # Groups run along head_dim; the zoo's qwen3 has head_dim 32.
            cache = [c.to_quantized(group_size=KV_GROUP, bits=self.kv_bits) for c in cache]
        return cache


def history(n_prompt: int, n_steps: int = 0, seed: int = 0, kv_bits=None) -> History:
    return History(tokens(n_prompt, seed), tokens(n_steps, seed + 1000), kv_bits)


def histories(family: str, kv_bits=None) -> list:
    """Cache states before and after the sliding window wraps (window 8 is
    used for families without one, so every family sees the same offsets)."""
    w = window(family) or 8
    return [
        history(0, kv_bits=kv_bits),  # empty cache: the tree is the whole context
        history(3, kv_bits=kv_bits),  # short history, nothing wrapped
        history(w - 2, 1, kv_bits=kv_bits),  # just below the window
        history(w + 3, kv_bits=kv_bits),  # wrapped by the prompt (concatenating update)
        history(2, w + 2, kv_bits=kv_bits),  # wrapped by single steps (buffer rotated)
        history(w, w // 2 + 1, seed=7, kv_bits=kv_bits),  # both
    ]


def plain_rows(model, cache, toks) -> mx.array:
    """Logits [T, vocab] of a plain mlx-lm forward over ``toks`` from ``cache``."""
    out = model(mx.array(list(toks))[None], cache=cache)[0]
    mx.eval(out)
    return out


def keys_rotated(cache) -> bool:
    """After a one-token step: does some RotatingKVCache hand the attention
    its keys out of time order? ``_update_in_place`` writes into a wrapped
    buffer at ``_idx``, so unless that write landed in the last slot the
    keys come oldest-in-the-middle (``keys_and_values`` returns the buffer
    as is), and the attention sums them in a rotated order."""
    return any(
        isinstance(c, RotatingKVCache)
        and c.offset > c.keys.shape[2]
        and c._idx != c.keys.shape[2]
        for c in cache
    )


def max_abs_diff(a: mx.array, b: mx.array) -> float:
    return float(mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max())


# ---------------------------------------------------------------------------
# Snapshots: every attribute of every cache, arrays as exact bytes.
# ---------------------------------------------------------------------------


def _freeze(v):
    if isinstance(v, mx.array):
        return ("array", str(v.dtype), tuple(v.shape), np.array(v.view(mx.uint8)).tobytes()
                if v.dtype.size else b"")
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_freeze(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted((k, _freeze(x)) for k, x in v.items())))
    if isinstance(v, (int, float, str, bool, type(None))):
        return v
    return ("object", id(v))  # functions (an instance make_mask!) by identity


def snapshot(cache) -> list:
    """Everything a cache list holds, including instance attributes such as
    a leftover ``make_mask`` override, in a form that compares with ==."""
    return [(type(c).__name__, _freeze(dict(vars(c)))) for c in cache]


def clone(cache) -> list:
    """An independent copy of a cache list (verified by test_support)."""
    return copy.deepcopy(cache)


# ---------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------


def branching_trees(family: str) -> dict:
    """Named branching trees; one is deeper than the sliding window so the
    window cuts inside the tree itself."""
    w = window(family) or 8
    deep = [-1] + list(range(0, w + 2)) + [3, w // 2]
    return {
        "fan": DraftTree(tokens(5, 1), [-1, 0, 0, 0, 0]),
        "two-chains": DraftTree(tokens(9, 2), [-1, 0, 1, 2, 3, 0, 5, 6, 7]),
        "bushy": DraftTree(tokens(12, 3), [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 6, 9]),
        "deeper-than-window": DraftTree(tokens(len(deep), 4), deep),
    }


def linear_trees(family: str) -> dict:
    w = window(family) or 8
    return {
        "pair": DraftTree.linear(tokens(2, 5)),
        "chain-5": DraftTree.linear(tokens(5, 6)),
        "longer-than-window": DraftTree.linear(tokens(w + 3, 7)),
    }
