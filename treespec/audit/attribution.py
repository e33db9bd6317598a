"""Whose fault a failure is: mlx-lm's own forwards in a cache mode, before
any treespec code runs in it.

A property audited per cache mode (tree-verify, rollback) first asks whether
mlx-lm alone runs in that mode: the mode's cache state replayed from a
history past the window (a prompt, then one-token steps), then a multi-token
forward and a one-token step on it, all plain mlx-lm calls. Where that
fails (gemma4_text with KV-shared layers on a quantized KV cache: mlx-lm's
attention hands ``mx.fast.scaled_dot_product_attention`` the quantized
tuple) the row says so, with mlx-lm's error, and is not a treespec failure;
the other modes are still audited, each its own row.
"""

from typing import Optional

from .states import CacheMode, History, clone, histories, plain, replay
from .subject import Subject


def mlx_lm_failure(s: Subject, mode: CacheMode) -> Optional[str]:
    """mlx-lm's own error in ``mode`` (``Type: message``), or None when its
    plain forwards run there. Measured once per audit and mode."""
    memo = s._memo.setdefault("mlx_lm_alone", {})
    if mode not in memo:
        memo[mode] = _plain_forwards(s, mode)
    return memo[mode]


def _plain_forwards(s: Subject, mode: CacheMode) -> Optional[str]:
    hist: History = histories(s)[-1]  # past the window, ring rotated by steps
    tokens = list(hist.prompt[:3]) or [0, 0, 0]
    try:
        cache = replay(s.model, hist, mode)
        plain(s.model, clone(cache), tokens)
        plain(s.model, cache, tokens[:1])
    except Exception as e:  # whatever mlx-lm raises is its own report
        return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
    return None


def attributed(prop: str, mode: CacheMode, why: str):
    """The row of a property in a mode where mlx-lm alone fails."""
    return dict(name=f"{prop}[{mode.name}]",
                detail=f"mlx-lm alone fails in this cache mode, before any treespec code "
                       f"(its own prompt, multi-token and one-token forwards): {why}",
                first_failure={"message": why, "mode": mode.name, "mlx_lm_alone": True})
