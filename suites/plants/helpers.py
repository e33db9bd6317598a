"""The suite checks a planted regression must turn red (suites/planted.py),
each run exactly as its own suite runs it, returning what the check said:
a verdict word (``numerics.FAIL`` ...), ``RUNS`` / ``DECLINED`` for the gate.
And the size matrix's models: tiny seeded zoo models at real-model sizes
(head_dim 64/128/256, a 512-token window, 1-2 layers, hidden 128)."""

from functools import lru_cache
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np
import pytest

from suites.helpers_numerics import require_sound
from suites.rollback.helpers_caches import BUSH
from suites.rollback.helpers_models import rounds_then_decode
from suites.verify import helpers as verify_helpers
from suites.verify.helpers import clone, root_path_verdict
from treespec import audit, zoo
from treespec.evidence import numerics
from treespec.backend import soundness
from treespec.audit.states import CacheMode, History, replay
from treespec.evidence.gate import decide, shapes_for
from treespec.tree import DraftTree
from treespec.verify import adapter_for

RUNS, DECLINED = "runs", "declined"
OK = (numerics.BIT_EXACT, numerics.WITHIN)

# The size matrix's models: 1-2 layers, hidden 128 (every group size 32-128
# divides it), 2 query heads on one KV head, vocab the zoo's.
SIZED = {
    "llama": dict(num_hidden_layers=1, hidden_size=128, intermediate_size=128,
                  num_attention_heads=2, num_key_value_heads=1),
    # layer 0 slides over a realistic window, layer 1 is global
    "gemma3_text": dict(num_hidden_layers=2, hidden_size=128, intermediate_size=128,
                        num_attention_heads=2, num_key_value_heads=1, sliding_window=512,
                        sliding_window_pattern=2),
}


@lru_cache(maxsize=None)
def sized(family: str = "llama", head_dim: int = 64, bits: Optional[int] = None,
          group: int = 64, window: Optional[int] = None, widths: tuple = soundness.ROWS):
    """A size-matrix model; quantized (``bits``), its products probed sound
    at ``widths`` (the widths its test multiplies with) first."""
    over = {**SIZED[family], "head_dim": head_dim}
    if family == "gemma3_text":
        over["query_pre_attn_scalar"] = head_dim
        if window:
            over["sliding_window"] = window
    return require_sound(zoo.build(family, "float32", bits, group_size=group, overrides=over), widths)


def tree(n: int, seed: int) -> DraftTree:
    """A random tree of ``n`` nodes (each node's parent uniform among the
    earlier ones: branching and a few levels deep, as drafters' trees are)."""
    rng = np.random.RandomState(seed)
    parents = [-1] + [int(rng.randint(0, i)) for i in range(1, n)]
    return DraftTree(verify_helpers.tokens(n, seed), parents)


def history(context: int, kv: Optional[tuple] = None) -> tuple:
    """(History, CacheMode) for treespec.audit.states.replay: a prompt of
    ``context`` tokens and one more step; ``kv`` (bits, group): then
    converted to mlx-lm's QuantizedKVCache, as generate's kv_bits does."""
    mode = CacheMode(f"kv-q{kv[0]}-g{kv[1]}", kv[0], kv[1]) if kv else CacheMode()
    return History(verify_helpers.tokens(context, 3), verify_helpers.tokens(1, 4)), mode


def verify_word(model, context: int, t: DraftTree, kv: Optional[tuple] = None) -> numerics.Verdict:
    """suites/verify's contract 6 on ``model``: every node's verify row
    against a plain forward over its root path (root_path_verdict)."""
    hist, mode = history(context, kv)
    cache = replay(model, hist, mode)
    before = clone(cache)
    logits = adapter_for(model).verify(t, cache)
    mx.eval(logits)
    return root_path_verdict(model, before, t, logits, kv)


def zoo_verify(family: str = "llama", context: int = 12, kv: Optional[int] = None) -> str:
    """test_root_paths' case: the bushy tree on a zoo model (KV-quantized at
    ``kv`` bits with the verify suite's group)."""
    model = verify_helpers.model(family)
    t = verify_helpers.branching_trees(family)["bushy"]
    return verify_word(model, context, t, (kv, verify_helpers.KV_GROUP) if kv else None).word


def sized_verify(head_dim: int = 64, context: int = 40, nodes: int = 40, family: str = "llama") -> str:
    return verify_word(sized(family, head_dim), context, tree(nodes, nodes)).word


def kernels(family: str = "llama") -> str:
    """suites/verify/test_tree_path's check: a chain through the tree path
    against the plain forward (treespec.evidence.numerics.tree_path_verdict)."""
    env = numerics.envelope(verify_helpers.model(family), 12, range(1, 10))
    return numerics.tree_path_verdict(env).word


def rollback(family: str = "llama", setup: str = "native") -> str:
    """suites/rollback's round: verify the bushy tree, commit the path to its
    deepest node, check the kept rows bit for bit (data movement) and the
    decoding on; FAIL on the first assertion or FAIL verdict."""
    try:
        rounds_then_decode(family, setup, list(range(40, 60)), [(BUSH, BUSH.path_to(6))], [[3], [7, 8]])
    except (AssertionError, pytest.fail.Exception):
        return numerics.FAIL
    return numerics.BIT_EXACT


def gate(model, trees: Sequence[Sequence[int]] = (), block: int = 4) -> str:
    """treespec.evidence.gate's decision over chains up to ``block`` and ``trees``."""
    return RUNS if decide(model, shapes_for(block, trees), draws=1).run else DECLINED


def audit_row(row: str, family: str = "llama") -> str:
    """``treespec audit --only long-context`` on the zoo checkpoint: the
    verdict word of row ``row`` (long-context[tree-verify] / [probe])."""
    report = audit.audit(zoo.checkpoint(family), properties=["long-context"])
    return next(c.verdict for c in report.checks if c.name == row)
