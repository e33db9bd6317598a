"""What a tree's node rows are judged against, tried in order, for every
caller that judges them (suites/verify's root-path verdict, the audit's
tree-verify row): one sequence, so a reference added here reaches both.

1. Classic decoding's rows (a plain forward over each root path, or one-token
   steps over a wrapped ring): equal bit for bit, judge says ``bit-exact``.
2. mlx-lm's forwards of the verify's width (treespec.evidence.same_width):
   padded root paths; past a sliding-window ring on a width-dependent
   backend, the ring in time order. Equal bit for bit: proven, no envelope.
3. Otherwise the rows are judged against classic decoding and the envelope
   (treespec.evidence.verdicts.judge), with what the steps above found: the
   ring's placement note, why there was no same-width proof, and, where a
   same-width reference exists but differs, the proof at the attentions
   (treespec.evidence.attention_rows) for judge to try where it would
   otherwise be inconclusive.

:func:`verdict` is that whole sequence as one verdict on all the rows (the
suites' root-path and family verdicts); the audit judges node by node with
:func:`against`'s findings.
"""

from dataclasses import dataclass, replace
from typing import Callable, Optional

import mlx.core as mx

from ..backend.census_position import position_census
from ..tree import DraftTree
from ..verify import adapter_for
from .attention_rows import attention_proof
from .controls import max_abs_diff
from .same_width import position_reason, same_width_rows, time_ordered_rows
from .verdicts import BIT_EXACT, Verdict, judge

__all__ = ["Against", "against", "verdict"]


@dataclass(frozen=True)
class Against:
    rows: Optional[mx.array] = None  # same-width rows the node rows equal bit for bit, else None
    proven: str = ""  # what those rows are (a bit-exact verdict's detail)
    placement: Optional[Callable] = None  # judge's ``placement`` (a ring's layout), or None
    why: str = ""  # why no same-width proof, for the verdict's detail
    attention: Optional[Callable] = None  # judge's ``attention``, or None


def against(model, before, tree: DraftTree, logits: mx.array, refs: mx.array, env,
            measure=position_census, verify: Optional[Callable] = None) -> Against:
    """The references after classic decoding's ``refs`` for ``logits`` (the
    node rows ``verify`` gave from ``before``; treespec's adapter if None).
    ``env``: the envelope or a callable giving it (asked only over a wrapped
    ring); ``measure``: the census's position rows (tests plant them)."""
    if mx.array_equal(logits, refs).item():
        return Against()
    same, why = same_width_rows(model, before, tree)
    how, placement = "", None
    if same is None:  # a ring's layout: the envelope never saw its keys' placement
        placement = lambda: position_reason(model, len(tree), measure)  # noqa: E731
        same, how = time_ordered_rows(model, before, tree, env)  # width-dependent backends only
    if same is None:
        return Against(placement=placement, why=why)
    if mx.array_equal(logits, same).item():
        return Against(same, (f"node rows = mlx-lm's plain forward over each root path at the "
                              f"verify's width {len(tree)}{', ' + how if how else ''}, bit for bit"),
                       placement)
    why = position_reason(model, len(tree), measure) or (
        f"the rows differ from the same-width forwards with {how}" if how else "")
    verify = verify or adapter_for(model).verify
    return Against(placement=placement, why=why, attention=lambda: attention_proof(
        model, before, tree, logits, verify, wrapped=bool(how)))


def verdict(model, before, tree: DraftTree, logits: mx.array, refs: mx.array, env, what: str,
            measure=position_census, verify: Optional[Callable] = None, **evidence) -> Verdict:
    """All of ``logits``' rows judged after :func:`against` (same arguments):
    bit-exact where they equal classic decoding's ``refs`` or the same-width
    forwards, else :func:`~treespec.evidence.verdicts.judge` against ``env``
    with the ring's placement and the proof at the attentions, and why no
    same-width proof held appended to any verdict short of bit-exact.
    ``evidence``: judge's other hooks (controls, isolation, census, leak)."""
    found = against(model, before, tree, logits, refs, env, measure, verify)
    if found.proven:
        return Verdict(BIT_EXACT, 0.0, detail=(
            f"{found.proven} ({max_abs_diff(logits, refs):.3g} from classic decoding's rows, "
            "the forwards of their own widths: the backend's width dependence)"))
    out = judge(logits, refs, env, what=what, placement=found.placement,
                attention=found.attention, **evidence)
    if found.why and out.word != BIT_EXACT:
        out = replace(out, detail="; ".join(x for x in (out.detail, found.why) if x))
    return out
