"""Shared pieces of the verify suite: zoo models, cache histories, plain
root-path references (one-token steps on a sliding-window ring), and the assertions the verify tests share. Copies,
fingerprints, plain forwards and the rotated-keys test are the audit's own
(treespec.audit.states), so the suite and ``treespec audit`` measure alike."""

from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from suites.helpers_numerics import model_label, require_sound
from suites.verdict import VERIFY, expect
from treespec import caches, zoo
from treespec.evidence import node_rows, numerics
from treespec.backend import row_kernels
from treespec.backend.census import Row, census
from treespec.backend.census_position import position_census
from treespec.evidence.isolation import isolation, leak
from treespec.evidence import node_rows
from treespec.evidence.same_width import width_reason
from treespec.audit.states import (
    CacheMode,
    History as Replayed,
    classic,
    clone,
    fingerprint,
    keys_rotated,
)
from treespec.audit.states import plain as plain_rows
from treespec.audit.states import root_path_forwards
from treespec.audit.states import replay
from treespec.errors import TreeRefused
from treespec.tree import DraftTree

__all__ = ["CONFIGS", "HYBRID", "KV_GROUP", "KV_QUANT", "History",
           "assert_refused_untouched", "assert_rows_are_root_path_forwards", "branching_trees", "classic",
           "root_path_verdict",
           "clone", "config_id", "fingerprint", "histories", "history", "keys_rotated",
           "linear_trees", "max_abs_diff", "model", "plain_rows", "tokens", "window"]

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


def model(family: str, dtype: str = "float32", bits: Optional[int] = None):
    """The zoo model, built once per process; a quantized one only where this
    backend computes its products soundly (else the test is skipped,
    inconclusive: suites.helpers_numerics.require_sound)."""
    return require_sound(_built(family, dtype, bits))


@lru_cache(maxsize=None)
def _built(family: str, dtype: str, bits: Optional[int]):
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
        # Groups run along head_dim; the zoo's qwen3 has head_dim 32.
        mode = CacheMode(f"kv-q{self.kv_bits}", self.kv_bits, KV_GROUP) if self.kv_bits else CacheMode()
        return replay(model, Replayed(self.prompt, self.steps), mode)


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


def max_abs_diff(a: mx.array, b: mx.array) -> float:
    return float(mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max())


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


# ---------------------------------------------------------------------------
# Assertions shared by the verify tests
# ---------------------------------------------------------------------------

def widened_rows(model, widths):
    """A planted census (``width_measure`` of :func:`root_path_verdict`): a
    float32 product's row of an M-row call differs from M=2."""
    return [Row("matmul", "float32", "planted", tuple(widths), 2, 1e-7, "tokens")]


def root_path_verdict(model, before, tree, logits, kv=None,
                      measure=position_census, width_measure=census, verify=None) -> numerics.Verdict:
    """The verdict on every node's verify row against the last row of a plain
    forward over its root path (on a sliding-window ring: classic decoding's
    one-token steps over it, ``treespec.audit.states.classic``), each on its
    own copy of ``before`` (an untouched copy of the cache state the tree was
    verified from): bit-exact,
    within this backend's envelope (the tree's own negative controls
    separating), inconclusive, or FAIL (treespec.evidence.numerics). ``kv``:
    (bits, group) of a quantized KV cache mode; ``measure``: the census's
    position rows the same-width reference consults, ``width_measure`` its
    rows that may contradict an envelope of 0 (tests plant them); ``verify``:
    what gave ``logits`` (tree, cache -> rows; treespec's adapter if None),
    run again for the proof at the attentions (treespec.evidence.attention_rows)."""
    refs = root_path_forwards(model, before, tree)
    context = caches.offset(before) or 0
    kv_bits, kv_group = kv or (None, None)
    env = lambda: numerics.envelope(model, context, numerics.widths_of(tree, 2), kv_bits, kv_group)
    # The same root-path forwards at the verify's width may still match bit for
    # bit: proven on any backend, no envelope needed; a difference is judged,
    # with what those references found (treespec.evidence.node_rows).
    controls = lambda: numerics.controls(model, before, tree, refs)
    return node_rows.verdict(model, before, tree, logits, refs, env,
                             "node rows vs root-path forwards", measure, verify, controls=controls,
                             isolation=lambda: isolation(model, before, tree),
                             census=lambda: width_reason(model, len(tree), width_measure),
                             leak=lambda: leak(model, before, tree))


def assert_rows_are_root_path_forwards(model, before, tree, logits, kv=None, mode=""):
    """:func:`root_path_verdict`, expected: FAIL fails the test, inconclusive
    skips it with the figures; recorded for the verdict table."""
    family, dtype = model_label(model)
    kv_name = f"kv{kv[0]}" if kv else ""
    return expect(root_path_verdict(model, before, tree, logits, kv), VERIFY, family,
                  " ".join(x for x in (dtype, kv_name, mode) if x))


def assert_refused_untouched(adapter, tree, cache, *words, start=0):
    """The verify refuses with a TreeRefused naming the family and ``words``,
    and every cache is as it was."""
    before = fingerprint(cache)
    with pytest.raises(TreeRefused) as err:
        adapter.verify(tree, cache, start=start)
    assert fingerprint(cache) == before
    for w in (adapter.model_type, *words):
        assert w in str(err.value), (w, str(err.value))
    return err.value


def _alone(layer, rows: mx.array) -> mx.array:
    call = layer.as_linear if isinstance(layer, (nn.Embedding, nn.QuantizedEmbedding)) else layer
    return mx.concatenate([call(rows[i:i + 1]) for i in range(rows.shape[0])])


def kernel_seam(moved_row=None):
    """A stand-in for treespec.backend.row_kernels (``adapter_for(model,
    kernels=...)``) off CUDA, and the linears it was called with: kernels
    that compute every row alone through the layer itself; with
    ``moved_row``, that row of every product is scaled by 1 + 2**-7 (a
    factor every float dtype holds exactly, so the change is never rounded away)."""
    called = set()

    def linear_rows(layer, x):
        called.add(id(layer))
        flat = x.reshape(-1, x.shape[-1])
        y = _alone(layer, flat)
        if moved_row is not None and moved_row < y.shape[0]:
            y[moved_row] = y[moved_row] * mx.array(1 + 2 ** -7, dtype=y.dtype)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    return SimpleNamespace(available=lambda: True, coverage=row_kernels.coverage,
                           linear_rows=linear_rows), called
