"""The suite's verdict words and the pass rule every numeric comparison is
judged by (the suites and ``treespec audit`` alike); treespec.evidence.numerics
measures the envelope the rule is applied with.

**The pass rule** (:func:`judge`): two forwards of different widths (a tree
node and its root-path forward; a committed cache and a path-only cache
decoding on) each lie within the envelope E of the single-token steps, so
by the triangle inequality within ``TRIANGLE`` x E of each other; E is a
sample maximum, so a factor ``SAFETY`` more covers what other tokens may
show: ``bound = TRIANGLE x SAFETY x E = 8 E`` (:attr:`Envelope.bound`). E = 0
(the reference BLAS): bit identity is required,
exactly as where no envelope exists. **Separation**: negative controls (the
same tree verified with flattened positions, with a plain causal mask, with
one sibling leaked into a node's mask row; for a comparison without a
branching tree of its own, those of the envelope's 8-node tree and a plain
forward with one token substituted) must land at least ``SEPARATION`` x the
bound away; where the weakest does not, the bound cannot tell a defect from
the backend and the verdict is ``inconclusive`` with the numbers, never a
pass.

Words, worst first: FAIL, inconclusive, within envelope, declined by gate,
bit-exact.
"""

from dataclasses import asdict, dataclass, replace
from typing import Dict, Iterable, Optional, Tuple

import mlx.core as mx
import numpy as np

from ..tree import DraftTree

__all__ = ["BIT_EXACT", "DECLINED", "Envelope", "FAIL", "INCONCLUSIVE", "SAFETY", "SEPARATION",
           "TRIANGLE", "UNSOUND", "Verdict", "WITHIN", "WORDS", "bucket", "declined", "judge",
           "tree_path_verdict", "unsound", "widths_of", "worst"]

TRIANGLE = 2.0  # two forwards, each within E of the single steps
SAFETY = 4.0  # E is a sample maximum; measured: other inputs reach up to 7.4 E (docs/numerics.md#the-pass-rule)
SEPARATION = 10.0  # how far beyond the bound every negative control must land

BIT_EXACT, WITHIN, DECLINED, INCONCLUSIVE, FAIL = (
    "bit-exact", "within envelope", "declined by gate", "inconclusive", "FAIL")
WORDS = (FAIL, INCONCLUSIVE, WITHIN, DECLINED, BIT_EXACT)  # worst first


# -- verdicts -----------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One comparison's (or one test's) outcome in the suite's five words."""

    word: str
    max_diff: float = 0.0
    envelope: Optional[float] = None  # E the comparison was judged with
    bound: Optional[float] = None
    control: Optional[float] = None  # the weakest negative control's max |diff|
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.word != FAIL

    @property
    def severity(self) -> int:
        return WORDS.index(self.word)

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and v != v else v) for k, v in asdict(self).items()}

    def line(self) -> str:
        return f"{self.word}: {self.detail}" if self.detail else self.word


def declined(reason: str, max_diff: float = 0.0) -> Verdict:
    """The gate declined (its probe found ``max_diff``): the text is classic's."""
    return Verdict(DECLINED, max_diff, detail=reason)


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The most severe verdict, carrying the largest difference and envelope
    seen over all of them (FAIL > inconclusive > within > declined > exact)."""
    vs = list(verdicts)
    if not vs:
        return Verdict(BIT_EXACT, detail="nothing compared")
    w = min(vs, key=lambda v: v.severity)
    diffs = [v.max_diff for v in vs]
    big = float("nan") if any(d != d for d in diffs) else max(diffs)
    envs = [v.envelope for v in vs if v.envelope is not None]
    return Verdict(w.word, big, max(envs) if envs else None, w.bound, w.control, w.detail)


# -- the envelope -------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """The measured envelope over some widths (see the module docstring)."""

    key: str
    widths: Tuple[int, ...]
    contexts: Tuple[int, ...]
    plain: float  # max |plain forward - single steps|
    tree: Optional[float]  # max |tree path (linear tree) - single steps|; None: refused
    tree_vs_plain: Optional[float]  # max |tree path - plain forward|, same tokens
    controls: Optional[Dict[str, float]] = None  # on the key's branching tree; None: not run
    kv_level: Optional[float] = None  # one KV quantization level's effect (inexact backends)
    faults: Tuple[str, ...] = ()  # unsound kernel products (treespec.backend.soundness): nothing measured

    @property
    def tree_ok(self) -> bool:
        """The tree path's kernels agree with the plain path within the plain
        envelope's bound (bit for bit where that is 0)."""
        return self.tree_vs_plain is None or self.tree_vs_plain <= TRIANGLE * SAFETY * self.plain

    @property
    def value(self) -> float:
        """E: the plain envelope, widened by the tree path only if it is ok,
        and on a KV-quantized cache by one quantization level's effect."""
        e = max(self.plain, self.tree or 0.0) if self.tree_ok else self.plain
        return max(e, self.kv_level or 0.0)

    @property
    def bound(self) -> float:
        return TRIANGLE * SAFETY * self.value

    @property
    def exact(self) -> bool:
        return self.value == 0.0

    def line(self) -> str:
        if self.faults:
            return (f"no envelope: this backend computes the model's quantized products unsoundly "
                    f"({'; '.join(self.faults)}) [{self.key}]")
        tree = "refused" if self.tree is None else f"{self.tree:.3g}"
        ok = "" if self.tree_ok else " (tree path NOT admitted: it differs from the plain path)"
        kv = f", one KV level {self.kv_level:.3g}" if self.kv_level else ""
        return (f"envelope {self.value:.3g} (plain {self.plain:.3g}, tree path {tree}{ok}{kv}) "
                f"over widths {_span(self.widths)}, contexts {list(self.contexts)} [{self.key}]")

    def to_json(self) -> dict:
        return {**asdict(self), "value": self.value, "bound": self.bound, "tree_ok": self.tree_ok}


def _span(widths) -> str:
    w = sorted(widths)
    return f"{w[0]}-{w[-1]}" if len(w) > 2 and w == list(range(w[0], w[-1] + 1)) else ",".join(map(str, w))


def widths_of(tree: DraftTree, *more: int) -> Tuple[int, ...]:
    """The forward widths a root-path comparison of ``tree`` involves: the
    verify's (n), each depth's node count (the tree-aware recurrence runs a
    depth as one batch), every root path's length (depth + 1), and ``more``."""
    depths = [int(d) for d in tree.depths()]
    levels = {depths.count(d) for d in set(depths)}
    return tuple(sorted({len(tree), *levels, *(d + 1 for d in depths), *more}))


def bucket(context: int) -> Tuple[int, int]:
    """Contexts are measured per bucket, each 4x the last: 0, 1-8, 9-32,
    33-128, 129-512, ... The envelope's samples spread over the bucket (its
    ends, its middle, then random contexts in it)."""
    if context <= 0:
        return 0, 0
    hi = 8
    while hi < context:
        hi *= 4
    return (1 if hi == 8 else hi // 4 + 1), hi


# -- judging ----------------------------------------------------------------------


def tree_path_verdict(env: Envelope) -> Optional[Verdict]:
    """The verdict on the tree path's own kernels: a chain verified through
    it (correct by construction) against the plain forward of the same tokens,
    judged with the plain envelope's bound; None where the tree path refused
    the model (nothing measured)."""
    if env.faults:
        return unsound(env)
    tvp = env.tree_vs_plain
    if tvp is None:
        return None
    if tvp == 0:
        return Verdict(BIT_EXACT, 0.0, env.value, env.bound, detail=env.line())
    plain_bound = TRIANGLE * SAFETY * env.plain
    if not env.tree_ok:
        return Verdict(FAIL, tvp, env.plain, plain_bound, detail=(
            f"a chain through the tree path differs from the plain forward of the same tokens by "
            f"{tvp:.3g}, beyond the plain envelope's bound {plain_bound:.3g}: a tree-path kernel "
            f"defect, not rounding ({env.line()})"))
    c = env.controls or {}
    weakest = min(c.values()) if c else None
    figures = ", ".join(f"{k} {v:.3g}" for k, v in c.items()) or "no negative control could be run"
    if weakest is None or not weakest >= SEPARATION * env.bound:
        return Verdict(INCONCLUSIVE, tvp, env.value, env.bound, weakest, detail=(
            f"tree path vs plain {tvp:.3g} within {plain_bound:.3g}, but {figures}: not "
            f"{SEPARATION:g} x the bound {env.bound:.3g} ({env.line()})"))
    return Verdict(WITHIN, tvp, env.value, env.bound, weakest, detail=(
        f"tree path vs plain {tvp:.3g} within {plain_bound:.3g}; {figures} "
        f"(weakest {weakest / env.bound:.3g} x the bound) ({env.line()})"))


UNSOUND = "the backend's kernels are unsound here"


def unsound(env: Envelope, what: str = "") -> Verdict:
    """No verdict on a comparison whose forwards ran on unsound kernels: the
    same product gives different (or infinite) values from call to call, so
    no bound tells a defect from the kernel (treespec.backend.soundness)."""
    return Verdict(INCONCLUSIVE, float("nan"), detail=f"{what}{UNSOUND}: {env.line()}")


def judge(got: mx.array, want: mx.array, env, controls=None, what: str = "",
          placement=None, isolation=None, census=None, leak=None, attention=None) -> Verdict:
    """The verdict on two forwards' logits (any shape; rows along the first
    axis): bit-exact, within the envelope (and the controls separate),
    inconclusive (they do not), or FAIL. ``env``: an :class:`Envelope`, or a
    callable returning one, called only if the two differ (so an exact
    backend measures nothing unless something differs). ``controls``: the
    comparison's own negative controls (a branching tree's; a dict or a
    callable returning one), else the envelope's.

    ``placement`` (a str, or a callable returning one or None, called only
    where it matters): why this backend may round ``got``'s rows by where
    their keys sit among masked ones (the census's position rows,
    treespec.evidence.same_width.position_reason). The envelope is measured
    with every row's keys contiguous; a tree verified over a sliding-window
    ring interleaves them with masked slots. So where the envelope is 0 and
    the rows differ, that difference is the placement the envelope never
    saw or a defect, and the verdict is inconclusive with both reasons,
    never FAIL and never a pass.

    ``census`` (the same, called only where the envelope is 0 and the two
    differ after ``placement``): why the backend's census contradicts that
    zero (treespec.evidence.same_width.width_reason: an op whose row of an
    M-row call differs from the row alone at a width the comparison spans).
    The zero is then its samples', and the difference inconclusive with the
    census row, never FAIL and never a pass (measured: gemma3_text bfloat16
    on an H100, a 9-node tree over an empty 8-slot ring, one logit 1.2e-7
    off, where the census's position rows did not differ).

    ``isolation`` (a dict, or a callable returning one or None, called only
    where a control falls short of the separation rule): which controls the
    isolation proofs catch (treespec.evidence.isolation: the rows bit for
    bit unchanged with the tokens off their root paths replaced or the tree
    flattened in another order, each control's rows not). A control it
    catches needs no separation from the envelope; one it does not still
    does. None: nothing proved.

    ``leak`` (a str, or a callable returning one or None, called only where
    the verdict would otherwise be inconclusive): why the verify under test
    is shown defective without the envelope (treespec.evidence.isolation.leak:
    a node's row moved by tokens off its root path). The verdict is then
    FAIL, naming it.

    ``attention`` (a callable returning (a proof, why not), called only
    where the verdict would otherwise be inconclusive and no leak is shown):
    treespec.evidence.attention_rows (``attention_proof``, ``decode_proof``):
    the two differ inside the attentions only, by one unit in the last place,
    with a defect (a leaked key, another branch's rows) moving them 10x
    further.
    The verdict is then within envelope, naming it; else the detail says
    why there is no such proof."""
    what = f"{what}: " if what else ""

    def settled(verdict: Verdict, prove: bool = True) -> Verdict:
        """An inconclusive ``verdict``, FAIL where a leak shows, else proven
        at the attentions where ``prove`` and they prove it."""
        shown = leak() if callable(leak) else leak
        if shown:
            return replace(verdict, word=FAIL, detail=f"{verdict.detail}; but {shown}")
        if attention is None or not prove:
            return verdict
        proof, why = attention()
        if proof is None:
            return replace(verdict, detail=f"{verdict.detail}; no proof at the attentions: {why}")
        # Its figures are units in the last place at the attentions, not logits: in the detail.
        return Verdict(WITHIN, verdict.max_diff, detail=(
            f"{what}max |diff| {verdict.max_diff:.3g} in logits; {proof.line()}"))

    if got.shape != want.shape:
        return Verdict(FAIL, float("inf"), detail=f"{what}shape {tuple(got.shape)} != {tuple(want.shape)}")
    if mx.array_equal(got, want).item():
        return Verdict(BIT_EXACT, 0.0)
    env = env() if callable(env) else env
    if env.faults:  # a kernel that does not repeat its bits: only a leak that repeats shows
        return settled(unsound(env, what), prove=False)
    a = got.astype(mx.float32).reshape(-1, got.shape[-1]) if got.ndim else got.reshape(1, 1)
    b = want.astype(mx.float32).reshape(a.shape)
    rows = np.array(mx.max(mx.abs(a - b), axis=-1)).astype(np.float64)
    rows[np.isnan(rows)] = np.inf
    diff, at = float(rows.max()), int(rows.argmax())
    where = f" (row {at})" if rows.size > 1 else ""
    if env.exact:
        first = int(np.nonzero(rows > 0)[0][0])
        why = placement() if callable(placement) else placement
        if why:
            return settled(Verdict(INCONCLUSIVE, diff, 0.0, 0.0, detail=(
                f"{what}differs by {diff:.3g}{where}, first at row {first}, where the envelope "
                f"(every row's keys contiguous) is 0; but {why}, and these rows' keys sit among "
                f"masked ones: a placement the envelope did not measure ({env.line()})")))
        zero = census() if callable(census) else census
        if zero:
            return settled(Verdict(INCONCLUSIVE, diff, 0.0, 0.0, detail=(
                f"{what}differs by {diff:.3g}{where}, first at row {first}, where the envelope "
                f"measured 0 ({env.line()}); but {zero}")))
        return Verdict(FAIL, diff, 0.0, 0.0, detail=(
            f"{what}differs by {diff:.3g}{where}, first at row {first}, where this backend is "
            f"bit-exact ({env.line()})"))
    if not diff <= env.bound:
        first = int(np.nonzero(rows > env.bound)[0][0])
        return Verdict(FAIL, diff, env.value, env.bound, detail=(
            f"{what}max |diff| {diff:.3g}{where}, first beyond the bound at row {first}: bound "
            f"{env.bound:.3g} = {TRIANGLE * SAFETY:g} x {env.line()}"))
    c = controls() if callable(controls) else controls
    c = c or env.controls
    weak = {k: v for k, v in (c or {}).items() if not v >= SEPARATION * env.bound}
    caught = []
    if c and weak and isolation is not None:
        proved = isolation() if callable(isolation) else isolation
        caught = [k for k in weak if proved and proved.get(k)]
        weak = {k: v for k, v in weak.items() if k not in caught}
    if not c or weak:
        figures = ("no negative control could be run" if not c else
                   "controls " + ", ".join(f"{k} {v:.3g}" for k, v in c.items()))
        if caught:
            figures += f" ({', '.join(caught)} caught by isolation)"
        return settled(Verdict(
            INCONCLUSIVE, diff, env.value, env.bound, min(weak.values()) if weak else None,
            detail=(f"{what}max |diff| {diff:.3g}{where} within bound {env.bound:.3g}, but "
                    f"{figures}: not {SEPARATION:g} x the bound ({SEPARATION * env.bound:.3g}), "
                    f"so a defect of that size would pass too ({env.line()})")))
    separated = {k: v for k, v in c.items() if k not in caught}
    weakest = min(separated.values()) if separated else None
    proof = (f"; {', '.join(caught)} ({', '.join(f'{c[k]:.3g}' for k in caught)}) caught by "
             "isolation: the rows bit for bit unchanged under a transformation that moves the "
             "control's" if caught else "")
    power = (f"weakest control {weakest:.3g} ({weakest / env.bound:.3g} x the bound)"
             if weakest is not None else "every control caught by isolation")
    return Verdict(WITHIN, diff, env.value, env.bound, weakest, detail=(
        f"{what}max |diff| {diff:.3g}{where} <= bound {env.bound:.3g}; {power}{proof} ({env.line()})"))
