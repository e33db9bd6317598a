"""References at the verify's own width: where the backend's products depend
on how many rows share a call, compare a tree's node rows with forwards of
the same width, so that dependence cancels instead of entering the bound.

A verify of an n-node tree multiplies every weight with n rows; classic
decoding, the suite's reference, with one. Off an exact backend the two
differ by the backend's rounding, which the envelope bounds; in half
precision on a GPU that bound is too wide for the negative controls to
clear it (issue 42: 18 of 75 tree-node rows inconclusive on the H200).
But node i's logits are also the row at depth(i) of mlx-lm's own plain
forward over its root path followed by any n - depth(i) - 1 tokens: the
causal mask keeps the later tokens out of that row, and every product of
that forward has the verify's n rows. Where the backend gives a row the same
bits whatever else shares an n-row call (measured, never assumed: the census
says so op by op, and here the comparison itself decides), the node rows
equal these references bit for bit, a contract with no envelope at all: a
defect of any size shows.

So :func:`padded_rows` is a second reference, tried first: bit for bit equal
is ``bit-exact`` against it (the reference named in the detail), anything
else is judged as before, against classic decoding and the envelope. It is
never a reason to pass a difference, only to prove an equality.

Not for a sliding-window ring that is wrapped or would wrap during the
n-token forward (a plain multi-token forward on a wrapped ring puts it in
time order, which neither classic decoding nor the verify does: the
reference there is one-token steps): None. A ring with room for the n
tokens is an appending cache for this forward, and gets its reference.
"""

from typing import Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

from ..caches import leaves
from ..tree import DraftTree
from .controls import clone

__all__ = ["PADDING", "padded_rows"]

PADDING = 0  # the token after a root path; any token would do (the causal mask hides it)


def padded_rows(model, before: Sequence, tree: DraftTree) -> Optional[mx.array]:
    """Row i: the row at depth(i) of mlx-lm's plain forward over node i's
    root path padded to the tree's n tokens, each from its own copy of
    ``before``; None where a sliding-window ring has no room for the n tokens."""
    n, rows = len(tree), []
    if any(isinstance(c, RotatingKVCache) and c.offset + n > c.max_size
           for _, c in leaves(before)):
        return None
    for i in range(n):
        path = [tree.tokens[j] for j in tree.path_to(i)]
        tokens = path + [PADDING] * (n - len(path))
        rows.append(model(mx.array(tokens)[None], cache=clone(before))[0, len(path) - 1])
    out = mx.stack(rows)
    mx.eval(out)
    return out
