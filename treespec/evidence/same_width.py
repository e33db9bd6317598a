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

That argument needs more than a width dependence: the backend must give a
row the bits of its width alone, wherever the row sits in the call and
wherever its visible keys sit among masked ones. The verify lays node i at
index i over keys scattered along the tree, the padded forward at depth(i)
over contiguous keys; Debian's BLIS, for one, rounds a masked attention row
by where its keys sit. The census's ``position`` rows
(treespec.backend.census_position) measure that on the model's own shapes
in its dtype: where any differs at a width up to the verify's (or up to
16), :func:`position_reason` says so. That changes what a *difference*
from the reference means (the backend's placement, not necessarily a
defect: the rows are then judged against classic decoding and the envelope,
and the verdict says why), never what an *equality* means: rows equal bit
for bit to mlx-lm's own forward of the same root paths are proven on any
backend, so the reference is built and compared there too
(:func:`position_reason`, asked only where rows differ from the reference).

A sliding-window ring gets its reference where every root path fits in it
after the history (history + deepest path <= the ring's size): classic
decoding then reaches each node without wrapping, its keys in time order,
and mlx-lm's plain n-token forward hands row depth(i) the same keys in the
same order (it appends past the ring's size for the call and masks by the
window, which cuts nothing there), even where the n tokens together overfill
the ring. Where a root path reaches past the ring's size, classic decoding
attends over a wrapped ring, in another order than the time order any
multi-token forward uses (the reference there is one-token steps): None.
:func:`padded_path` needs more (the cache after the forward, trimmed): the
ring must hold all n tokens.

**A wrapped ring on a width-dependent backend** (:func:`time_ordered_rows`).
Where the envelope is measured nonzero, no forward of the verify's width can
have classic decoding's bits anyway, and the slot order the verify lays a
wrapped ring in (treespec.ring) only decides which rounding its rows carry.
There the same padded forwards with the ring in time order (mlx-lm's
multi-token update: its last ``max_size - 1`` keys, the window in the mask)
are a correct n-wide computation of every node's row over the same keys, so
node rows equal to them bit for bit are proven, as above. Of the 30
wrapped-ring trees of suites/verify in bfloat16 and float16, 29 verify to
them bit for bit on this CPU and 26 on an H100 (the others differ by one
rounding of the attention and are judged as before); in float32 none (the
key order's rounding shows). Never where the envelope
is 0: there a verify that dropped the ring layout for time order would equal
them and must FAIL against classic decoding instead (suites/ring pins the
slot order bit for bit on exact backends).
"""

from typing import Dict, Optional, Sequence, Tuple

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache, can_trim_prompt_cache, trim_prompt_cache

from ..backend.census import Row, census, narrowest, widths_text
from ..backend.census_position import HOW as POSITION, position_census
from ..backend.census_shapes import model_dtype, model_specs
from ..caches import leaves
from ..tree import DraftTree
from .controls import clone

__all__ = ["PADDING", "padded_path", "padded_rows", "position_reason", "same_width_path",
           "same_width_rows", "time_ordered_rows", "width_reason"]

PADDING = 0  # the token after a root path; any token would do (the causal mask hides it)
WIDEST = 16  # the position rows are measured at every width up to max(this, the verify's)

_MEASURED: Dict[tuple, list] = {}  # (measure, the shapes, dtype, widest) -> position rows


def _first_differing(model, widest: int, measure, select) -> Optional[Row]:
    """The first census row of ``model``'s own shapes, in its dtype, among
    those ``select`` (rows, dtype -> rows) keeps, that is not identical at
    every width up to ``widest``; None where all are. Measured once per
    ``measure``, shapes, dtype and width in a process."""
    dtype = model_dtype(model)
    key = (measure, tuple((s.op, s.shape) for s in model_specs(model)), dtype, widest)
    if key not in _MEASURED:
        _MEASURED[key] = measure(model, widths=range(1, widest + 1))
    cap, limiting = narrowest(select(_MEASURED[key], dtype))
    return None if cap is None or cap >= widest else limiting[0]


def _described(row: Row) -> str:
    return (f"{row.op} {row.how} {row.dtype} {row.shape}: {row.error or row.verdict} of "
            f"{widths_text(row.widths)}")


def position_reason(model, width: int, measure=position_census) -> Optional[str]:
    """None where the census's position rows of ``model``'s own shapes, in
    its dtype, are identical at every width up to max(``width``, 16); else
    why rows that differ from a reference at the verify's width may differ
    by the backend's placement, not a defect (the first row that differs).
    A position row that could not run here measured nothing: it shows no
    placement dependence, so it excuses no difference.
    ``measure``: treespec.backend.census_position.position_census."""
    row = _first_differing(model, max(width, WIDEST), measure, _ran(POSITION))
    return None if row is None else (
        f"no same-width proof here: the census measures a row's bits depending on its place "
        f"in the call ({_described(row)})")


def _ran(how: str):
    """The census rows of one way of sharing a call (``how``), in a dtype,
    that ran: a row that could not run measured nothing, so it neither
    contradicts a zero nor shows a placement dependence."""
    return lambda rows, dtype: [r for r in rows if r.how == how and r.dtype == dtype and not r.error]


def width_reason(model, width: int, measure=census) -> Optional[str]:
    """None where the census's ``tokens`` rows of ``model``'s own shapes, in
    its dtype, are identical at every width up to ``width`` (those that ran);
    else why an envelope measured 0 there is its samples' zero, not the
    backend's (the first row that differs). The envelope samples a few
    contexts; the census draws inputs that cancel, and finds a
    half-precision product rounding an M-row call differently where the
    samples did not (on an H100, gemma3_text bfloat16: an envelope of 0 at
    widths up to 9, and a tree's row off by 1.2e-7 in one logit).
    ``measure``: treespec.backend.census.census."""
    row = _first_differing(model, width, measure, _ran("tokens"))
    return None if row is None else (
        f"the census measures a row of an M-row call differing from the row alone "
        f"({_described(row)}): the envelope's 0 is its samples', not this backend's")


def same_width_rows(model, before: Sequence, tree: DraftTree,
                    nodes: Optional[Sequence[int]] = None) -> Tuple[Optional[mx.array], str]:
    """(:func:`padded_rows`, ""), or (None, why there is none: a
    sliding-window ring without room for the tree). Where node rows differ
    from them, :func:`position_reason` says whether that may be the
    backend's placement."""
    rows = padded_rows(model, before, tree, nodes)
    if rows is None:
        return None, ("no same-width reference: a root path reaches past the sliding-window "
                      "ring's size (classic decoding wraps it there)")
    return rows, ""


def time_ordered_rows(model, before: Sequence, tree: DraftTree, env) -> Tuple[Optional[mx.array], str]:
    """(:func:`padded_rows` over the wrapped ring in time order, what they
    are) where a root path reaches past a sliding-window ring of ``before``
    and ``env`` (the envelope, or a callable giving it, called only there) is
    measured nonzero; else (None, ""). See the module docstring."""
    if not _no_room(before, max(tree.depths()) + 1):
        return None, ""
    e = env() if callable(env) else env
    if e.faults or e.exact:
        return None, ""
    return padded_rows(model, before, tree, wrapped=True), (
        f"the wrapped ring's keys in time order, not classic decoding's slot order: this "
        f"backend's rows depend on the call's width (envelope {e.value:.3g}), so no "
        f"{len(tree)}-wide forward has classic decoding's bits")


def padded_rows(model, before: Sequence, tree: DraftTree,
                nodes: Optional[Sequence[int]] = None, wrapped: bool = False) -> Optional[mx.array]:
    """Row k: the row at depth(i) of mlx-lm's plain forward over node i's
    root path padded to the tree's n tokens, for the k-th node i of ``nodes``
    (None: every node), each from its own copy of ``before``; None where a
    root path reaches past a sliding-window ring's size (module docstring),
    unless ``wrapped`` (:func:`time_ordered_rows`)."""
    n, rows = len(tree), []
    if not wrapped and _no_room(before, max(tree.depths()) + 1):
        return None
    for i in range(n) if nodes is None else nodes:
        path = [tree.tokens[j] for j in tree.path_to(i)]
        tokens = path + [PADDING] * (n - len(path))
        rows.append(model(mx.array(tokens)[None], cache=clone(before))[0, len(path) - 1])
    out = mx.stack(rows)
    mx.eval(out)
    return out


def _no_room(before: Sequence, n: int) -> bool:
    """A sliding-window ring of ``before`` cannot take ``n`` more tokens unwrapped."""
    return any(isinstance(c, RotatingKVCache) and c.offset + n > c.max_size
               for _, c in leaves(before))


def padded_path(model, before: Sequence, tree: DraftTree, path: Sequence[int]) -> Optional[list]:
    """The rollback contract's reference at the verify's width: a copy of
    ``before`` after mlx-lm's plain forward over the accepted ``path`` (node
    indices, root first) padded to the tree's n tokens, the padding then
    dropped by mlx-lm's own ``trim_prompt_cache``. It holds the path only,
    its rows computed in an n-row forward as the verify computed them; the
    causal mask kept the padding out of them. None where a cache cannot be
    trimmed (a recurrent state: the padding would have moved it) or a
    sliding-window ring has no room for the n tokens."""
    if list(path) != tree.path_to(path[-1]):
        raise ValueError(f"path must be a root path of the tree, got {list(path)}")
    n = len(tree)
    if _no_room(before, n):
        return None
    cache = clone(before)
    tokens = [tree.tokens[i] for i in path]
    mx.eval(model(mx.array(tokens + [PADDING] * (n - len(tokens)))[None], cache=cache))
    if n > len(tokens) and not can_trim_prompt_cache(cache):
        return None
    trim_prompt_cache(cache, n - len(tokens))
    return cache


def same_width_path(model, before: Sequence, tree: DraftTree,
                    path: Sequence[int]) -> Tuple[Optional[list], str]:
    """(:func:`padded_path`, "") as :func:`same_width_rows`; (None, why)
    where a cache cannot drop the padding."""
    cache = padded_path(model, before, tree, path)
    if cache is None:
        return None, ("no same-width reference: a cache cannot drop the padding (a recurrent "
                      "state, or a sliding-window ring without room for the tree)")
    return cache, ""
