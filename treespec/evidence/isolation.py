"""Isolation: each node's verify row, proved bit for bit independent of every
token off its root path and of where the tree's flattening puts it, and which
negative controls those proofs catch.

The tree-node contract compares node rows with root-path forwards within the
backend's envelope; the negative controls say whether a defect would land
outside it. In half precision on a GPU the envelope (every layer's rounding
across widths) is so wide that the weakest control, a sibling leaked into a
node's view, lands a few times the bound away, not ten: the row stays
inconclusive (issue 42: gemma4_text float16 on an H100).

But a mask defect has a second signature that needs no envelope. Verify the
same tree again with every node off node i's root path given another token
(same topology, same width, same layout, so every product has the same rows
and every row its same place in the call): a correct verify gives row i the
same bits, because the mask hides those nodes' keys (their attention weights
are exactly 0, their values enter as exact zeros) and no product mixes rows;
a verify that lets node i see any of them gives row i other bits. Equality
is a proof, on any backend that computes a row from its own inputs; where a
backend does not (a non-deterministic kernel, say), the rows differ, nothing
is proved, and the verdict is what it was.

A position defect has one too. Flatten the same tree in another order (each
node's children in reverse, still topological): every node keeps its tokens,
ancestors and depth, so a correct verify gives it the same row wherever it
now sits, on a backend that rounds a row the same whatever its index in the
call and wherever its visible keys sit among masked ones (the census's
position rows measure that; here the comparison itself decides). A verify
that takes a node's position from its index (the flattened-positions
control), or its view from index order (the causal-mask control), gives
moved nodes other rows.

So :func:`isolation` runs both transformations on the correct verify, and
keeps those under which its rows are unchanged, bit for bit (a proof each);
then runs each negative control through the kept ones: a control whose rows
change under one is caught by isolation (measured in the run: the proof's
power against that defect is shown, never assumed). A control isolation does
not catch still has to clear the envelope's separation rule. It is never a
reason to pass a difference from the root-path forwards: that is still judged
against the envelope.

The first transformation is also a proof of a defect, where the verify under
test fails it (:func:`leak`): a node's row that changes when only tokens off
its root path change, from a verify that gives the same bits when repeated on
the same inputs, sees keys its mask must hide. Same shapes, same kernels, the
node's own inputs unchanged: no backend's rounding moves it. So where the
envelope cannot decide (it measured 0 on a backend whose census says rows
round by width or place; or the controls do not separate), a leak FAILs.
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx

from ..tree import DraftTree, renumbered
from .controls import adapter_or_none, clone, verifiers

__all__ = ["isolation", "leak", "off_path", "reordered", "reordered_rows", "substituted_rows"]


def off_path(tree: DraftTree, node: int, vocab: int) -> DraftTree:
    """``tree`` with every token off ``node``'s root path replaced by the
    next id of the vocabulary (so each differs), same topology."""
    keep = set(tree.path_to(node))
    return DraftTree([t if i in keep else (t + 1) % vocab for i, t in enumerate(tree.tokens)],
                     list(tree.parents))


def substituted_rows(verify: Callable, before: Sequence, tree: DraftTree, vocab: int) -> mx.array:
    """Row i of ``verify`` (tree, cache -> node rows) over :func:`off_path`
    of ``tree`` at node i, each from a copy of ``before``, stacked."""
    rows: List[mx.array] = []
    for i in range(len(tree)):
        out = verify(off_path(tree, i, vocab), clone(before))
        rows.append(out.reshape(-1, out.shape[-1])[i])
        mx.eval(rows[-1])
    return mx.stack(rows)


def reordered(tree: DraftTree) -> Optional[Tuple[DraftTree, List[int]]]:
    """The same tree flattened in preorder with each node's children in
    reverse (``order[k]``: the old index of new node k), or None where that
    is the order it already has (nothing moves)."""
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(tree.children(node))  # popped last first: children in reverse
    if order == list(range(len(tree))):
        return None
    return DraftTree([tree.tokens[o] for o in order], renumbered(tree.parents, order)), order


def reordered_rows(verify: Callable, before: Sequence, tree: DraftTree) -> mx.array:
    """``verify`` (tree, cache -> node rows) over :func:`reordered` ``tree``
    from a copy of ``before``, its rows put back in ``tree``'s node order."""
    moved, order = reordered(tree)
    out = verify(moved, clone(before))
    return out.reshape(-1, out.shape[-1])[mx.argsort(mx.array(order))]


def isolation(model, before: Sequence, tree: DraftTree,
              found: Optional[Tuple[Callable, Dict[str, Callable]]] = None) -> Optional[Dict[str, bool]]:
    """None where nothing is proved: a linear tree or a model without an
    adapter (no controls: treespec.evidence.controls.verifiers), or a
    correct verify whose rows change under both transformations (tokens off
    each node's path substituted; the tree flattened in another order). Else,
    for each negative control, whether isolation catches it: its rows change
    under a transformation that left the correct verify's unchanged.
    ``found``: the verify and the controls' (default
    :func:`treespec.evidence.controls.verifiers`)."""
    found = found if found is not None else verifiers(model, tree)
    if found is None:
        return None
    real, defective = found
    rows = real(tree, clone(before))
    rows = rows.reshape(-1, rows.shape[-1])
    vocab = rows.shape[-1]
    transforms = [lambda verify: substituted_rows(verify, before, tree, vocab)]
    if reordered(tree) is not None:
        transforms.append(lambda verify: reordered_rows(verify, before, tree))
    proofs = [t for t in transforms if mx.array_equal(t(real), rows).item()]
    if not proofs:
        return None
    caught = {}
    for name, verify in defective.items():
        own = verify(tree, clone(before))
        own = own.reshape(rows.shape)
        caught[name] = any(not mx.array_equal(t(verify), own).item() for t in proofs)
    return caught


def leak(model, before: Sequence, tree: DraftTree,
         verify: Optional[Callable] = None) -> Optional[str]:
    """Why ``verify`` (tree, cache -> node rows; default: ``model``'s
    adapter's) lets a node see nodes off its root path, or None where that is
    not shown: some node's row changes when every token off its root path is
    replaced (:func:`substituted_rows`) while the verify repeated on the same
    inputs gives the same bits. None also where the repeat differs (the
    backend is not deterministic: nothing is shown) or there is no adapter."""
    if verify is None:
        real = adapter_or_none(model)
        if real is None:
            return None
        verify = real.verify
    first = verify(tree, clone(before))
    rows = first.reshape(-1, first.shape[-1])
    again = verify(tree, clone(before))
    if not mx.array_equal(again.reshape(rows.shape), rows).item():
        return None
    moved = substituted_rows(verify, before, tree, rows.shape[-1])
    per_node = mx.max(mx.abs(moved.astype(mx.float32) - rows.astype(mx.float32)), axis=-1)
    changed = [i for i, d in enumerate(per_node.tolist()) if d != 0]
    if not changed:
        return None
    i = max(changed, key=lambda k: per_node[k].item())
    return (f"a leak: node {i}'s row changes by {per_node[i].item():.3g} when only tokens off its "
            f"root path change ({len(changed)} of {len(tree)} nodes do), while the verify repeated "
            "gives the same bits: it sees keys its mask must hide")
