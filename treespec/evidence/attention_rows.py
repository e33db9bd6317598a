"""Rows that differ from the same-width reference inside the attention only,
by the dtype's last place: the summation order of the attention's sums,
proven layer by layer.

Where a verify's node rows differ from mlx-lm's own forwards of the
verify's width (treespec.evidence.same_width), the logits carry every
layer's rounding, and in half precision on a GPU the envelope that bounds
them is too wide for the negative controls to clear (issue 42: over a
wrapped sliding-window ring the verify lays keys in slot order, the
reference in time order; rows then differed by 0.19-0.28 in logits on an
H100, bound 2.5-3.8, weakest control 3.8). This looks where a difference
arises instead of where it ends.

The reference forward is *taught* the verify's attention outputs: each
attention's output projection (``o_proj``) receives, in node i's padded
forward, the verify's rows of node i's root path in place of its own, and
records what its own attention computed. So at every layer the reference's
attention reads exactly the verify's hidden rows, and what follows it is
the verify's too. Then:

1. the taught forwards' logits equal the verify's rows bit for bit: every
   computation outside the attentions (embeddings, norms, projections, MLPs,
   the head) is proven identical, not bounded;
2. at every attention, each node's output differs from the reference
   attention's (same queries, keys and values, the same visible keys, in
   another order) by at most ``ULPS`` unit in the last place of the dtype
   at the row's largest magnitude (:func:`ulps`): the smallest difference
   the dtype can express at that scale, what one more rounding of a sum in
   a different order gives where the kernel accumulates wider than it
   stores;
3. a defect of the smallest kind an attention can have, one key visible
   that must not be (:data:`LEAKED`: the root sees node 1, through the
   same ring layout), moves that attention's output by at least
   ``SEPARATION`` x ``ULPS`` units at the first layer it touches: the
   check has the power to see a mask defect.

The same holds one step on, for decoding on after a commit
(:func:`decode_proof`): forwards from the committed cache (the path's
rows as the n-wide verify computed them) against the same steps from a
cache fed the path one token at a time. The caches differ in rows only the
attentions read; the reference's forwards, taught the committed ones'
attention outputs, must give their logits bit for bit, each attention
output within ``ULPS``, and the control (:data:`STALE`: another branch's
rows in the path's place) must land ``SEPARATION`` x beyond.

All three: the rows are ``within envelope``, the detail giving the units
and the control's figure (the verdict's envelope and control, in logits,
stay empty). Anything else proves nothing: the
verdict stays what treespec.evidence.verdicts.judge made it. It never turns
a difference into FAIL (a float32 attention's order moves its outputs by
several units: measured on this CPU, 2 to 5), only an inconclusive row into
a proven one.
"""

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..mixers import set_slot
from ..standin import StandIn
from ..tree import DraftTree
from ..verify.taps import layer_home
from .controls import clone, leaked_node_verifier
from .same_width import padded_rows
from .verdicts import SEPARATION

__all__ = ["LEAKED", "STALE", "ULPS", "AttentionProof", "attention_proof", "decode_proof",
           "output_projections", "ulps"]

ULPS = 1.0  # the bound: one unit in the last place of the attention's output dtype
LEAKED = "leaked node"  # the tree's control: the root sees node 1
STALE = "wrong branch"  # decoding on's control: another branch's rows in the path's place
OUTPUT = "o_proj"  # the attention's output projection, in every mlx-lm family that has one so named

_MANTISSA = {mx.bfloat16: (7, -133), mx.float16: (10, -24), mx.float32: (23, -149)}


def ulps(a: mx.array, b: mx.array) -> float:
    """The largest |a - b| in units in the last place of their dtype at each
    row's largest magnitude (the last axis a row; subnormal spacing at the
    bottom). A row of an attention's output is a weighted average of value
    rows: a sum added in another order moves each element by a rounding of
    that row's scale, not of the element's own (which cancellation can make
    as small as it likes: measured on an H100, 150 units at an element's
    own magnitude in a bfloat16 chain where the rows differ by one unit at
    their scale)."""
    bits, tiny = _MANTISSA[a.dtype]
    x = np.array(a.astype(mx.float32), dtype=np.float64)
    y = np.array(b.astype(mx.float32), dtype=np.float64)
    if not x.size:
        return 0.0
    big = np.max(np.maximum(np.abs(x), np.abs(y)), axis=-1, keepdims=True)
    exp = np.floor(np.log2(np.where(big > 0, big, 1.0)))
    unit = np.maximum(2.0 ** (exp - bits), 2.0 ** tiny)
    return float(np.max(np.abs(x - y) / unit))


class Taught(StandIn):
    """Stands in for one attention's output projection: records every input
    (the attention's output rows) and feeds the projection, at each call
    while ``lessons`` holds some, the next lesson's rows in place of its
    input's first ones."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "seen", [])  # not children: not in the parameter tree
        object.__setattr__(self, "lessons", [])

    def __call__(self, x):
        self.seen.append(x)
        if self.lessons:
            rows = self.lessons.pop(0)
            x = mx.concatenate([rows, x[:, rows.shape[1]:]], axis=1)
        return self.inner(x)

    def teach(self, lessons: Sequence[mx.array]):
        """The rows of the next calls, one array a call; what it saw forgotten."""
        self.seen.clear()
        self.lessons[:] = list(lessons)


def output_projections(model: nn.Module) -> Tuple[List[Tuple[object, str]], str]:
    """(container, key) of every decoder layer's attention output projection,
    in layer order, and "" ; or ([], why none can be taught: no decoder
    layer list, a layer with two, or none at all). A layer without one (a
    recurrent mixer) is not taught: it must then compute bit for bit."""
    try:
        _, layers = layer_home(model)
    except ValueError as e:
        return [], str(e)
    out = []
    for n, layer in enumerate(layers):
        found = [name for name, m in layer.named_modules()
                 if name.split(".")[-1] == OUTPUT and isinstance(m, nn.Module)]
        if len(found) > 1:
            return [], f"layer {n} has {len(found)} modules named {OUTPUT}"
        if found:
            parent = layer
            *up, key = found[0].split(".")
            for part in up:
                parent = parent[part]
            out.append((parent, key))
    return (out, "") if out else ([], f"no attention output projection ({OUTPUT}) in any layer")


@contextmanager
def taught(sites: Sequence[Tuple[object, str]]):
    """A :class:`Taught` in every site for the block, the projections back
    in place when it ends, however it ends."""
    stands = [Taught(container[key]) for container, key in sites]
    try:
        for (container, key), s in zip(sites, stands):
            set_slot(container, key, s)
        yield stands
    finally:
        for (container, key), s in zip(sites, stands):
            set_slot(container, key, s.inner)


@dataclass(frozen=True)
class AttentionProof:
    max_ulps: float  # the largest attention-output difference from the reference, in units
    layer: int  # the layer (among the taught ones) where it is
    control: Optional[float]  # the control's movement at the first attention it touches, in units
    control_name: str = LEAKED
    reference: str = "mlx-lm's forwards at the verify's width"

    def line(self) -> str:
        return (f"outside the attentions bit for bit against {self.reference} taught these "
                f"attention outputs; each attention output within {self.max_ulps:g} <= {ULPS:g} "
                f"unit in the last place (at the row's scale) of the reference's (layer "
                f"{self.layer}); a {self.control_name} moves one by {self.control:g} units "
                f"(>= {SEPARATION:g} x)")


def _last_call(stands, n: int) -> Optional[List[mx.array]]:
    """Each stand-in's input in the last call it saw, where that is one
    n-row forward's (a first verify may run a check forward before it), or
    None."""
    if any(not s.seen or s.seen[-1].ndim != 3 or s.seen[-1].shape[:2] != (1, n) for s in stands):
        return None
    return [s.seen[-1] for s in stands]


def _verified(stands, verify: Callable, tree: DraftTree, before) -> Tuple[mx.array, Optional[list]]:
    for s in stands:
        s.seen.clear()
    rows = verify(tree, clone(before))
    mx.eval(rows, [s.seen for s in stands])
    return rows, _last_call(stands, len(tree))


def attention_proof(model, before, tree: DraftTree, logits: mx.array, verify: Callable,
                    wrapped: bool = False) -> Tuple[Optional[AttentionProof], str]:
    """(the proof, "") where ``logits`` (``verify(tree, cache)``'s rows from
    ``before``) differ from the same-width reference (mlx-lm's padded forward
    of each root path; ``wrapped``: over a wrapped ring in time order,
    treespec.evidence.same_width) inside the attentions only, by at most
    ``ULPS`` units, and the leaked-node control clears ``SEPARATION`` x that;
    else (None, why not). See the module docstring."""
    sites, why = output_projections(model)
    if not sites:
        return None, why
    n = len(tree)
    with taught(sites) as stands:
        rows, seen = _verified(stands, verify, tree, before)
        if seen is None:
            return None, f"the verify's last call of each {OUTPUT} is not over its {n} rows"
        if not mx.array_equal(rows, logits).item():
            return None, "the verify, run again, does not give the rows judged"
        worst, at, want = 0.0, 0, []
        for i in range(n):
            path = tree.path_to(i)
            for s, x in zip(stands, seen):
                s.teach([x[:, path]])
            ref = padded_rows(model, before, tree, nodes=[i], wrapped=wrapped)
            if ref is None:
                return None, "no same-width reference"
            want.append(ref[0])
            for layer, (s, x) in enumerate(zip(stands, seen)):
                u = ulps(x[0, i], s.seen[-1][0, len(path) - 1])
                if u > worst:
                    worst, at = u, layer
        if not mx.array_equal(mx.stack(want), logits).item():
            return None, "the rows differ outside the attentions too"
        leaky = leaked_node_verifier(model)
        moved = None if leaky is None else _first_moved(seen, _verified(stands, leaky, tree, before)[1])
    return _proven(AttentionProof(worst, at, moved))


def _proven(proof: AttentionProof) -> Tuple[Optional[AttentionProof], str]:
    """The rule's last two steps: the largest attention difference within
    ``ULPS``, the control's movement (None: it moved nothing) ``SEPARATION``
    x beyond."""
    if proof.max_ulps > ULPS:
        return None, (f"an attention output differs from the reference's by {proof.max_ulps:g} "
                      f"units in the last place (layer {proof.layer}), more than {ULPS:g}")
    if proof.control is None:
        return None, f"the {proof.control_name} control moved no attention output"
    if proof.control < SEPARATION * ULPS:
        return None, (f"the {proof.control_name} control moves an attention output by "
                      f"{proof.control:g} units, not {SEPARATION:g} x {ULPS:g}")
    return proof, ""


def _forwards(model, cache, calls: Sequence[Sequence[int]]) -> mx.array:
    """The logits of mlx-lm forwards over each of ``calls`` in turn (one
    token each: one-token steps), from a copy of ``cache``, rows in order."""
    c = clone(cache)
    out = mx.concatenate([model(mx.array([list(call)]), cache=c)[0] for call in calls])
    mx.eval(out)
    return out


def decode_proof(model, cache, reference, calls: Sequence[Sequence[int]],
                 stale) -> Tuple[Optional[AttentionProof], str]:
    """(the proof, "") where forwards over ``calls`` in turn (``[[t] for t in
    tokens]``: one-token steps) from ``cache`` (after a commit: the accepted
    path's rows as the n-wide verify computed them) differ from the same
    forwards from ``reference`` (the path fed one token at a time) inside the
    attentions only, by at most ``ULPS`` units, and those from ``stale`` (the
    control: the path fed one token at a time with its first token replaced,
    another branch's rows in its place, what a commit of the wrong branch
    leaves) move an attention output ``SEPARATION`` x further; else (None,
    why not).

    The reference's forwards are taught the committed forwards' attention
    outputs, call by call, so what is left to differ is what only the
    attentions read: the two caches' rows. Everything else (a recurrent
    state, say) must give the logits bit for bit."""
    sites, why = output_projections(model)
    if not sites:
        return None, why
    with taught(sites) as stands:
        got = _forwards(model, cache, calls)
        seen = [list(s.seen) for s in stands]  # per layer, per call
        if any(len(x) != len(calls) for x in seen):
            return None, f"a forward does not run each {OUTPUT} once"
        for s, x in zip(stands, seen):
            s.teach(x)
        if not mx.array_equal(_forwards(model, reference, calls), got).item():
            return None, "the steps differ outside the attentions too"
        worst, at = max(((ulps(a, b), layer) for layer, s in enumerate(stands)
                         for a, b in zip(seen[layer], s.seen)), key=lambda p: p[0],
                        default=(0.0, 0))
        for s in stands:
            s.teach([])
        _forwards(model, stale, calls)
        moved = _first_moved(_in_time(seen), _in_time([list(s.seen) for s in stands]))
    return _proven(AttentionProof(worst, at, moved, STALE, "the same forwards from the cache "
                                  "fed the path one token at a time"))


def _in_time(per_layer: Sequence[Sequence[mx.array]]) -> List[mx.array]:
    """Per-layer lists of per-step calls, in the order they ran."""
    return [calls[k] for k in range(len(per_layer[0])) for calls in per_layer]


def _first_moved(seen: Sequence[mx.array], other: Optional[Sequence[mx.array]]) -> Optional[float]:
    """The units by which ``other`` differs from ``seen`` at the first layer
    where they differ (there their inputs were still the same); None."""
    for x, y in zip(seen, other or ()):
        if not mx.array_equal(x, y).item():
            return ulps(x, y)
    return None
