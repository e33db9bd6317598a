"""The contract between a target model and a hidden-state drafting head.

A hidden-state head (a multi-token-prediction module, an EAGLE-3 head) drafts
from the target's own hidden states instead of running a separate draft model
over the tokens. The target's verify forward hands them over at no extra
forward: while it runs, the outputs of the decoder layers a head names are
captured per node (treespec.verify.taps), and the drafter feeds the accepted
path's features to the head.

A head is an ``nn.Module`` with:

``taps``
    which of the target's hidden states it reads, in the order they are
    concatenated on the last axis: an ``int`` i is the output of decoder
    layer i (the residual stream after that layer, before any final norm;
    negative counts from the end, as in Python), :data:`FINAL` is the
    hidden state after the target's final norm, the one its lm_head reads.

``target_hidden_size`` / ``hidden_size`` / ``vocab_size``
    the target's hidden size H (one tap is H wide, so the features are
    ``len(taps) * H`` wide), the head's own hidden size, and the width of the
    logits it returns (always the target's vocabulary: a head with a reduced
    draft vocabulary maps its logits back, tokens outside it at -inf).

``__call__(tokens, features, cache, own=False) -> (logits, hidden)``
    ``tokens`` (B, T) int: the token at position t + 1, the one the target
    emitted after position t; ``features`` (B, T, F): for ``own=False`` the
    target's taps at position t (F = len(taps) * H), for ``own=True`` the head's
    own ``hidden`` from its previous call (F = hidden_size), which is how a head
    drafts past its first token; ``cache``: the list ``make_cache()`` returned
    (mlx-lm caches; the head's attention appends T positions), or None.
    Returns ``logits`` (B, T, vocab_size) for the token at position t + 2 and
    ``hidden`` (B, T, hidden_size).

``make_cache()``
    a list of mlx-lm cache objects, one per attention layer of the head; they
    roll back like any other cache (treespec.caches).
"""

from typing import Tuple, Union

FINAL = "final"

Tap = Union[int, str]

__all__ = ["FINAL", "Tap", "tap_indices"]


def tap_indices(taps: Tuple[Tap, ...], num_layers: int) -> Tuple[Tap, ...]:
    """``taps`` with negative layer indices resolved against ``num_layers``;
    ValueError naming the tap when one is outside the target's layers."""
    out = []
    for tap in taps:
        if tap == FINAL:
            out.append(FINAL)
            continue
        if isinstance(tap, bool) or not isinstance(tap, int):
            raise ValueError(f"tap {tap!r} is neither a layer index nor {FINAL!r}")
        index = tap + num_layers if tap < 0 else tap
        if not 0 <= index < num_layers:
            raise ValueError(f"tap {tap} is outside the target's {num_layers} decoder layers")
        out.append(index)
    return tuple(out)
