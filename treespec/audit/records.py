"""The audit's records: one :class:`Check` per property (and cache or decode
mode), the options, the report, and the tally that compares logits.

Each row carries a status (pass / FAIL / skip / inexact / inconclusive: what
the exit code follows) and a verdict in the suite's words (bit-exact, within
envelope, declined by gate, inconclusive, FAIL; treespec.evidence.numerics): numeric
comparisons are judged against the audited model's envelope measured in the
same run, so an inexact backend reads "within envelope", not "FAIL"."""

from dataclasses import asdict, dataclass
from typing import Any, List, Optional, Tuple

import mlx.core as mx

from ..evidence import numerics

PASS, FAIL, SKIP, INEXACT = "pass", "FAIL", "skip", "inexact"
INCONCLUSIVE = numerics.INCONCLUSIVE
NOT_VERIFIED = "not verified"
# The properties that run the model's own verify and rollback. Where one of
# them ran and every row of it was skipped (refused, nothing to compare), the
# audit compared nothing of what treespec does to this model: whatever the
# other rows say, that is not a pass.
VERIFYING = ("linear-verify", "tree-verify", "rollback")


@dataclass
class Check:
    """One row of the audit: a property (in one cache mode or decode mode)."""

    name: str
    status: str  # pass | FAIL | skip | inexact
    detail: str
    first_failure: Optional[dict] = None
    max_diff: Optional[float] = None
    seconds: float = 0.0
    verdict: str = ""  # the suite's word for this row (set from status when empty)

    def __post_init__(self):
        if not self.verdict:
            self.verdict = {PASS: numerics.BIT_EXACT, FAIL: numerics.FAIL,
                            INCONCLUSIVE: numerics.INCONCLUSIVE}.get(self.status, self.status)

    @property
    def ok(self) -> bool:
        return self.status != FAIL

    @property
    def prop(self) -> str:
        """The property this row belongs to (its name without ``[mode]``)."""
        return self.name.split("[", 1)[0]

    def line(self) -> str:
        return f"{self.name}: {self.verdict}: {self.detail}"


@dataclass
class Options:
    block: int = 4  # chain verify width for e2e and the probe shapes
    draws: int = 3  # random trees per history (and probe draws)
    seed: int = 0
    allow_inexact: bool = False
    tolerance: float = 0.05  # max |diff| accepted as "inexact" with allow_inexact
    max_tokens: Optional[int] = None  # e2e length (default: past the window)
    context: int = 1100  # the long-context rows' history (past 1024 keys); 0: off
    tree_nodes: Tuple[int, ...] = (32, 64)  # their random trees' sizes, besides the drafters'


@dataclass
class Report:
    header: dict
    checks: List[Check]
    probe: Any = None  # treespec.evidence.gate.Probe
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def verdict(self) -> str:
        """FAIL if any row failed, else not verified if a verifying property
        ran without comparing anything, else inconclusive if any row is, else
        pass."""
        if not self.ok:
            return numerics.FAIL
        if self.unverified():
            return NOT_VERIFIED
        if any(c.status == INCONCLUSIVE for c in self.checks):
            return numerics.INCONCLUSIVE
        return PASS

    def failed(self) -> List[str]:
        return [c.name for c in self.checks if not c.ok]

    def unverified(self) -> List[str]:
        """The :data:`VERIFYING` properties that ran and whose every row was
        skipped. A property left out (``--only``) is not among them."""
        ran = {c.prop for c in self.checks}
        return [p for p in VERIFYING if p in ran
                and all(c.status == SKIP for c in self.checks if c.prop == p)]

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "verdict": self.verdict,
            "header": self.header,
            "checks": [{**asdict(c), "ok": c.ok} for c in self.checks],
            "failed": self.failed(),
            "unverified": self.unverified(),
            "probe": self.probe.to_json() if self.probe is not None else None,
            "seconds": round(self.seconds, 2),
        }


def once(measure):
    """``measure()``, run once and only if a comparison needs it (a tree's
    negative controls, its isolation proof, a proof at the attentions)."""
    memo = []

    def run():
        if not memo:
            memo.append(measure())
        return memo[0]

    return run


class Tally:
    """Comparisons of one property: counts per verdict, worst difference,
    first failure."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.count = self.failures = self.inexact = 0
        self.worst = 0.0
        self.first: Optional[dict] = None
        self.notes: List[str] = []
        self.refused: List[str] = []
        self.words = {w: 0 for w in numerics.WORDS}
        self.judged: List[numerics.Verdict] = []  # the non-bit-exact verdicts

    def compare(self, got: mx.array, want: mx.array, where: dict, env=None,
                controls=None, placement=None, isolation=None, census=None, leak=None,
                attention=None) -> bool:
        """``env``: the envelope (or a callable) two forwards of different widths
        are judged with (treespec.evidence.numerics.judge); without one, bit identity
        is required. ``controls``: the comparison's own negative controls;
        ``placement``, ``isolation``, ``census``, ``leak``, ``attention``:
        judge's (a ring layout the envelope did not measure; the controls the
        isolation proof catches; the census contradicting an envelope of 0;
        the verify shown leaking without the envelope; the proof at the
        attentions)."""
        self.count += 1
        if got.shape == want.shape and mx.array_equal(got, want).item():
            self.words[numerics.BIT_EXACT] += 1
            return True
        if got.shape != want.shape:
            diff, flip = float("inf"), True
        else:
            diff = float(mx.max(mx.abs(got.astype(mx.float32) - want.astype(mx.float32))).item())
            flip = _argmax(got) != _argmax(want)
        self.worst = max(self.worst, diff) if diff == diff else float("nan")
        verdict = None
        if env is not None and got.shape == want.shape:
            verdict = numerics.judge(got, want, env, controls, placement=placement,
                                     isolation=isolation, census=census, leak=leak,
                                     attention=attention)
            if verdict.ok:
                self.words[verdict.word] += 1
                self.judged.append(verdict)
                return True
        if self.opts.allow_inexact and diff <= self.opts.tolerance:
            self.inexact += 1
            return True
        self.failures += 1
        if self.first is None:
            self.first = {**where, "max_abs_diff": diff, "argmax_flip": flip}
            if verdict is not None:
                self.first["verdict"] = verdict.detail
        return False

    def fail(self, where: dict):
        self.count += 1
        self.failures += 1
        if self.first is None:
            self.first = where

    def note(self, text: str):
        if text not in self.notes:
            self.notes.append(text)

    def check(self, name: str, what: str) -> Check:
        notes = "".join(f"; {n}" for n in self.notes)
        if self.failures:
            worst = ""
            if self.first and self.worst > self.first.get("max_abs_diff", 0.0):
                worst = f" (max |diff| overall {self.worst:.3g})"
            why = f" [{self.first['verdict']}]" if self.first and "verdict" in self.first else ""
            return Check(name, FAIL, f"{self.failures}/{self.count} {what} differ; first: "
                         f"{_where(self.first)}{worst}{why}{notes}", self.first, self.worst)
        if self.count == 0:
            why = self.refused[0] if self.refused else "nothing to compare"
            return Check(name, SKIP, f"{why}{notes}", None, None)
        if self.inexact:
            return Check(name, INEXACT, f"{self.inexact}/{self.count} {what} within "
                         f"--tolerance {self.opts.tolerance:g} (max |diff| {self.worst:.3g}), "
                         f"the rest bit-identical or within the envelope{notes}", None, self.worst)
        exact = self.words[numerics.BIT_EXACT]
        if self.judged:
            w = numerics.worst(self.judged)
            n = self.count - exact
            status = INCONCLUSIVE if w.word == numerics.INCONCLUSIVE else PASS
            return Check(name, status, f"{exact} {what} bit-identical, {n} {w.word}: {w.detail}"
                         f"{notes}", None, self.worst, verdict=w.word)
        return Check(name, PASS, f"{self.count} {what} bit-identical{notes}", None, self.worst)


def _argmax(x: mx.array) -> int:
    return int(mx.argmax(x.reshape(-1, x.shape[-1])[-1]).item())


def _where(first: Optional[dict]) -> str:
    """A failure location as one readable clause."""
    if not first:
        return "?"
    f = dict(first)
    parts = []
    if "message" in f:
        parts.append(f.pop("message"))
    if "node" in f:
        path = "-".join(map(str, f.get("path", ())))
        parts.append(f"node {f['node']} (path {path})")
    if "step" in f:
        parts.append(f"decode step {f['step']} (tokens {f.get('tokens')})")
    if "committed" in f:
        parts.append(f"after committing {f['committed']}")
    if "history" in f:
        parts.append(f"at {f['history']}")
    if "mode" in f:
        parts.append(f"[{f['mode']}]")
    if "max_abs_diff" in f:
        d = f["max_abs_diff"]
        parts.append(f"max |diff| {d:.3g}" + (", argmax flipped" if f.get("argmax_flip") else ""))
    return " ".join(parts)
