"""What ``auto`` predicts with and how it chooses (pure: arrays of
measurements in, candidates out; ``treespec.auto.choose`` measures and calls it).

The model, per candidate (chain b = 2..max_block, confidence tree n = 1..max_block-1,
fixed trees when asked, spines of depth 2..max_block-1, and classic):

    tokens per ms = E[emitted per round] / (verify(T) + draft + other)

Chains: verify(T) = alpha + beta * cost(T) and draft and other costs linear in the block,
fitted on the two measured chains (their sum is what counts: a chain round runs drafting and
verifying as one graph, so its draft column holds most of the verify); a confidence tree's
verify forward is cost(T) of its mean width, and the rest of its measured round (draft and verify
columns less cost(T)) is drafting, proportional to the number of expansion steps; fixed trees are
taken as measured; a spine never run emits what the replay of the calibration's texts
says (``treespec.auto.emission``) and costs the chain round of its depth with a verify of its
width. Classic is its measured time per token. All of it is steady
state: prefill is left out of every figure (a speculative run also prefills the draft
model, a cost that a short generation feels and a long one does not).

The choice is the highest predicted throughput, except that a tree must beat the best
chain (and classic) by ``margin`` to be chosen over it: a tree's estimate comes from
one budget's run, a chain's from two. Every candidate is gated by the exactness probe
(``treespec.evidence.gate.decide``) in order of preference, so an inexact configuration is
never chosen (``pick``; the probe is the caller's ``eligible``). ``explain`` gives
the numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence

from ..draft import FixedTreeDrafter, fixed_shape, shape_name
from .emission import rounds as replayed_rounds

KIND_RANK = {"classic": 0, "chain": 1, "fixed": 2, "confidence": 3}


# ----------------------------------------------------------------------------- the model


@dataclass
class Candidate:
    kind: str  # classic | chain | fixed | confidence
    block: Optional[int] = None  # chain
    budget: int = 0  # draft nodes per round
    branching: Optional[tuple] = None  # fixed: branching factors or a parent list (draft.fixed_shape)
    width: int = 4
    nodes: float = 1.0  # verify width T (mean)
    emitted: float = 1.0  # expected tokens per verify round
    verify_ms: float = 0.0
    draft_ms: float = 0.0
    other_ms: float = 0.0
    source: str = "model"  # measured | model | replay (emitted replayed, costs modelled)
    eligible: Optional[bool] = None  # probe verdict, once asked
    why: Optional[str] = None

    @property
    def round_ms(self) -> float:
        return self.verify_ms + self.draft_ms + self.other_ms

    @property
    def tok_s(self) -> float:
        return 1e3 * self.emitted / self.round_ms if self.round_ms > 0 else 0.0

    @property
    def name(self) -> str:
        if self.kind == "classic":
            return "classic"
        if self.kind == "chain":
            return f"chain b={self.block}"
        if self.kind == "fixed":
            return "fixed " + shape_name(self.branching)
        return f"conf n={self.budget}"

    def decode_kwargs(self) -> dict:
        if self.kind == "classic":
            return {"mode": "classic"}
        if self.kind == "chain":
            return {"mode": "chain", "block": self.block}
        if self.kind == "fixed":
            return {"mode": "tree", **fixed_shape(self.branching)}
        return {"mode": "tree", "budget": self.budget, "width": self.width}

    def spec(self) -> dict:
        """This candidate as an ``auto_calibrate.calibrate`` spec."""
        if self.kind == "classic":
            return {"kind": "classic"}
        if self.kind == "chain":
            return {"kind": "chain", "block": self.block}
        if self.kind == "fixed":
            return {"kind": "fixed", "branching": tuple(self.branching), "budget": self.budget}
        return {"kind": "confidence", "budget": self.budget, "width": self.width}

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(name=self.name, round_ms=self.round_ms, tok_s=self.tok_s)
        return d


def emitted_chain(accepted: Sequence[int], block: int) -> float:
    """Mean tokens per round a chain of ``block`` would emit, from the accepted
    draft counts of rounds of a longer chain (greedy: a shorter chain accepts
    the same prefix, cut at block - 1)."""
    if not accepted:
        raise ValueError("no calibration rounds")
    return 1.0 + sum(min(a, block - 1) for a in accepted) / len(accepted)


def tree_ranks(logprobs: Dict[int, float]) -> Dict[int, int]:
    """Rank of each non-root node in the confidence drafter's own order:
    -cumulative logprob, ties in the dict's order (a round's ``logprobs``
    lists its nodes in the drafter's rank order, which breaks ties by
    creation; its tree is laid out in first-choice order, not created so)."""
    order = sorted((n for n in logprobs if n != 0), key=lambda n: -logprobs[n])  # stable
    return {n: r for r, n in enumerate(order)}


def emitted_by_budget(records: Sequence[tuple], max_budget: int) -> List[float]:
    """E[emitted] of a confidence tree of budget n = 0..max_budget, from rounds of
    one with a larger budget: ``records`` = [(logprobs {node: cum logprob}, path)].
    A budget-n tree keeps the top n nodes (an ancestor-closed set), so it accepts
    the prefix of the recorded path whose nodes rank below n."""
    if not records:
        raise ValueError("no calibration rounds")
    out = []
    for n in range(max_budget + 1):
        total = 0
        for logprobs, path in records:
            rank = tree_ranks(logprobs)
            k = 0
            for node in path[1:]:
                if rank.get(node, n) >= n:
                    break
                k += 1
            total += 1 + k
        out.append(total / len(records))
    return out


def spine(depth: int) -> tuple:
    """The parent list of the spine of ``depth``: a chain of first choices,
    each with its second choice beside it as a leaf, spelled as ``--trees``
    takes it ([-1, 0, 0, 1, 1, 3, 3] for depth 3)."""
    parents, node = [-1], 0
    for _ in range(depth):
        parents += [node, node]
        node = len(parents) - 2
    return tuple(parents)


def emitted_replayed(parents: Sequence[int], ranks: Sequence) -> float:
    """Mean tokens per round a fixed shape emits over the texts whose draft
    ranks are ``ranks`` (one array per text, ``treespec.auto.emission.draft_ranks``),
    the shape laid out in first-choice order as its drafter verifies it; a
    round loop of each text's length (``treespec.auto.emission.rounds``)."""
    shape = FixedTreeDrafter(parents=parents).shape
    per = [e for r in ranks if len(r) for e in replayed_rounds(shape, r, len(r))]
    if not per:
        raise ValueError("no text to replay")
    return sum(per) / len(per)


def monotone(curve: Dict[int, float]) -> Dict[int, float]:
    """The closest non-decreasing curve in least squares (pool adjacent
    violators), keyed like ``curve``."""
    ts = sorted(curve)
    blocks = []  # [sum, count]
    for t in ts:
        blocks.append([curve[t], 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s_, n_ = blocks.pop()
            blocks[-1][0] += s_
            blocks[-1][1] += n_
    out, i = {}, 0
    for total, n in blocks:
        for t in ts[i:i + n]:
            out[t] = total / n
        i += n
    return out


def _interp(curve: Dict[int, float], t: float) -> float:
    """cost(T) at a possibly fractional or unmeasured T (linear; extrapolated
    from the last two points)."""
    ts = sorted(curve)
    if t in curve:
        return curve[t]
    if t <= ts[0]:
        lo, hi = ts[0], ts[1] if len(ts) > 1 else ts[0]
    elif t >= ts[-1]:
        lo, hi = (ts[-2], ts[-1]) if len(ts) > 1 else (ts[-1], ts[-1])
    else:
        hi = next(x for x in ts if x > t)
        lo = max(x for x in ts if x < t)
    if hi == lo:
        return curve[lo]
    return curve[lo] + (curve[hi] - curve[lo]) * (t - lo) / (hi - lo)


def predict(curve: Dict[int, float], classic_ms: Optional[float], chains: Sequence[dict],
            tree: Optional[dict] = None, fixed: Sequence[dict] = (),
            max_block: int = 8, width: int = 4,
            spines: Sequence[dict] = ()) -> List[Candidate]:
    """Every candidate's predicted throughput. Pure: synthetic inputs welcome.

    curve: {T: ms of one target forward over T tokens}.
    classic_ms: measured ms per token of classic decoding (None: no classic candidate).
    chains: measured chain runs (one or two blocks), each
        {block, accepted: [per-round accepted drafts], verify_ms, draft_ms, other_ms}
        (per round); acceptance is taken from the largest block.
    tree: a measured confidence run {budget, width, records: [(logprobs, path)],
        nodes (mean verify width), verify_ms, draft_ms, other_ms, steps (mean draft
        forwards per round: one per depth, the root's and one per frontier)}.
    fixed: measured fixed-tree runs {branching, budget, emitted, nodes, verify_ms,
        draft_ms, other_ms}.
    spines: spines never run, {depth, emitted} (emitted replayed from the
        texts: ``emitted_replayed``), depth at most max_block - 1. A spine of
        depth d drafts as the chain of block d + 1 does (one one-token draft
        forward per depth: its fed nodes are its first choices) and verifies
        2d + 1 nodes: that chain's round, its verify moved along the line
        through the chains to T = 2d + 1.
    """
    if not chains:
        raise ValueError("predict needs at least one measured chain")
    chains = sorted(chains, key=lambda c: c["block"])
    lo, hi = chains[0], chains[-1]
    accepted = hi["accepted"]
    cands: List[Candidate] = []
    if classic_ms:
        cands.append(Candidate("classic", verify_ms=classic_ms, source="measured"))
    # verify(T) = alpha + beta * cost(T): two chains fix both, one fixes beta = ratio.
    c_lo, c_hi = _interp(curve, lo["block"]), _interp(curve, hi["block"])
    if lo is not hi and c_hi > c_lo:
        beta = (hi["verify_ms"] - lo["verify_ms"]) / (c_hi - c_lo)
        beta = max(beta, 0.0)
        alpha = hi["verify_ms"] - beta * c_hi
    else:
        beta, alpha = hi["verify_ms"] / c_hi, 0.0

    def verify_at(t):
        return alpha + beta * _interp(curve, t)

    def lin(key, b):
        if lo is hi:
            # draft scales with the draft forwards (block - 1); the rest is per round
            return hi[key] * (b - 1) / (hi["block"] - 1) if key == "draft_ms" else hi[key]
        f = (b - lo["block"]) / (hi["block"] - lo["block"])
        return max(lo[key] + f * (hi[key] - lo[key]), 0.0)

    measured = {c["block"]: c for c in chains}
    for b in range(2, max_block + 1):
        m = measured.get(b)
        cands.append(Candidate(
            "chain", block=b, budget=b - 1, nodes=b, emitted=emitted_chain(accepted, b),
            verify_ms=m["verify_ms"] if m else verify_at(b),
            draft_ms=m["draft_ms"] if m else lin("draft_ms", b),
            other_ms=m["other_ms"] if m else lin("other_ms", b),
            source="measured" if m else "model"))
    if tree:
        big = tree["budget"]
        es = emitted_by_budget(tree["records"], big)
        steps = tree.get("steps") or big
        # The verify forward is the curve's; everything else the draft and
        # verify columns hold is drafting. Neither column alone can be trusted
        # with the forward: a backend may finish the queued verify inside the
        # drafting wait, and moving such a column along the curve can predict
        # a negative cost for a small budget.
        drafting = max(tree["draft_ms"] + tree["verify_ms"] - _interp(curve, tree["nodes"]), 0.0)
        for n in range(1, big + 1):
            # Nodes actually verified scale with the budget (rounds cut short by
            # max_tokens make the measured mean a little smaller than big + 1).
            nodes = 1 + n * (tree["nodes"] - 1) / big
            cands.append(Candidate(
                "confidence", budget=n, width=tree.get("width", width), nodes=nodes,
                emitted=es[n], verify_ms=_interp(curve, nodes),
                # one draft forward per depth: a budget-n tree drafts n deep
                # (treespec.draft.confidence)
                draft_ms=drafting * min(n, steps) / steps,
                other_ms=tree["other_ms"], source="measured" if n == big else "model"))
    chain_of = {c.block: c for c in cands if c.kind == "chain"}
    for sp in spines:
        d = sp["depth"]
        if not 1 <= d < max_block:
            raise ValueError(f"a spine's depth must be 1..max_block - 1 = {max_block - 1}, got {d}")
        c = chain_of[d + 1]
        cands.append(Candidate(
            "fixed", budget=2 * d, branching=spine(d), nodes=2 * d + 1, emitted=sp["emitted"],
            verify_ms=c.verify_ms + verify_at(2 * d + 1) - verify_at(d + 1),
            draft_ms=c.draft_ms, other_ms=c.other_ms, source="replay"))
    for f in fixed:
        cands.append(Candidate(
            "fixed", budget=f["budget"], branching=tuple(f["branching"]), nodes=f["nodes"],
            emitted=f["emitted"], verify_ms=f["verify_ms"], draft_ms=f["draft_ms"],
            other_ms=f["other_ms"], source="measured"))
    return cands


def pick(cands: Sequence[Candidate], margin: float = 0.05,
         eligible: Optional[Callable[[Candidate], tuple]] = None,
         allow_classic: bool = True) -> tuple:
    """(choice, ranked list). The fastest predicted candidate, except that a tree
    needs ``margin`` over the best non-tree one. ``eligible(c) -> (ok, why)`` (the
    exactness probe) is asked in order of preference until one passes."""
    pool = [c for c in cands if allow_classic or c.kind != "classic"]
    if not pool:
        raise ValueError("no candidates")

    def score(c):
        # Trees are handicapped by the margin; ties go to the simpler kind, then
        # to the smaller verify.
        s = c.tok_s * ((1 - margin) if c.kind in ("fixed", "confidence") else 1.0)
        return (-s, KIND_RANK[c.kind], c.nodes)

    ranked = sorted(pool, key=score)
    for c in ranked:
        if eligible is None or c.kind == "classic":
            c.eligible = True
            return c, ranked
        ok, why = eligible(c)
        c.eligible, c.why = ok, why
        if ok:
            return c, ranked
    raise RuntimeError("no candidate passed the exactness probe: "
                       + "; ".join(f"{c.name}: {c.why}" for c in ranked if c.why))


def _group(c: Candidate) -> str:
    return "tree" if c.kind in ("fixed", "confidence") else c.kind


def runoff_finalists(ranked: Sequence[Candidate], choice: Candidate,
                     eligible: Callable[[Candidate], bool], runoff: float = 0.9,
                     floor: float = 0.8, limit: int = 4) -> list:
    """The candidates the run-off times: the ``choice`` and the eligible
    candidates predicted within ``runoff`` of it, in ``ranked`` order, at most
    ``limit`` of these; and besides them, the best-predicted eligible
    candidate of each group (classic, chains, trees) none of those belongs
    to, if predicted within ``floor`` of the choice. A prediction can be off
    by more than the run-off's window (on a host whose pace drifts between
    the calibration's runs: results/h200-scaled/README.md), so the best of each
    group is measured rather than ruled out by its prediction alone; it is
    added, not put in place of a candidate of the window. ``eligible(c)``
    (the exactness probe) is asked only of candidates considered, once each."""
    verdicts = {}

    def ok(c):
        if id(c) not in verdicts:
            verdicts[id(c)] = eligible(c)
        return verdicts[id(c)]

    window = [choice]
    for c in ranked:
        if len(window) < limit and c is not choice and c.tok_s >= runoff * choice.tok_s \
                and ok(c):
            window.append(c)
    groups = {_group(c) for c in window}
    extra = []
    for group in ("classic", "chain", "tree"):
        if group not in groups:
            best = next((c for c in ranked if _group(c) == group
                         and c.tok_s >= floor * choice.tok_s and ok(c)), None)
            if best is not None:
                extra.append(best)
    return window + extra


def pick_measured(rows: Sequence[tuple], margin: float) -> Candidate:
    """The fastest of (candidate, measured tok/s) rows; a tree must beat the
    fastest non-tree row by ``margin``; ties to the simpler kind."""
    def score(row):
        c, tok_s = row
        s = tok_s * ((1 - margin) if c.kind in ("fixed", "confidence") else 1.0)
        return (-s, KIND_RANK[c.kind], c.nodes)

    return sorted(rows, key=score)[0][0]


def explain(choice: Candidate, ranked: Sequence[Candidate], curve: Dict[int, float],
            accepted_p: Sequence[float], margin: float) -> str:
    def fmt(c):
        return (f"{c.name} {c.tok_s:.0f} tok/s ({c.emitted:.2f} emitted / {c.round_ms:.1f} ms"
                + (f": verify {c.verify_ms:.1f} + draft {c.draft_ms:.1f} + other {c.other_ms:.1f}"
                   if c.kind != "classic" else " per token") + f", {c.source})")

    best_of = {}
    for c in ranked:
        best_of.setdefault("tree" if c.kind in ("fixed", "confidence") else c.kind, c)
    parts = [f"predicted {fmt(choice)}"]
    for k in ("classic", "chain", "tree"):
        c = best_of.get(k)
        if c is not None and c is not choice:
            parts.append(f"best {k}: {fmt(c)}")
    skipped = [c for c in ranked if c.eligible is False]
    if skipped:
        parts.append("gated out: " + "; ".join(f"{c.name} ({c.why})" for c in skipped))
    ts = [t for t in (2, 4, 8) if t in curve]
    c1 = curve.get(1)
    if c1:
        parts.append("verify cost(T)/cost(1) " + ", ".join(f"T={t} {curve[t] / c1:.2f}" for t in ts)
                     + f" (cost(1) {c1:.2f} ms)")
    if accepted_p:
        parts.append("chain per-depth acceptance " + " ".join(f"{p:.2f}" for p in accepted_p))
    if choice.kind in ("fixed", "confidence"):
        parts.append(f"a tree needs {margin:.0%} over the best chain")
    parts.append("figures are steady state (prefill excluded), from the fastest of the "
                 "interleaved calibration repeats")
    return "; ".join(parts)


def decode_kwargs(choice: dict) -> dict:
    """The ``treespec.decoding.decode`` keyword arguments of a choice."""
    mode = choice["mode"]
    if mode == "classic":
        return {"mode": "classic"}
    if mode == "chain":
        return {"mode": "chain", "block": choice["block"]}
    if choice.get("branching"):
        return {"mode": "tree", **fixed_shape(choice["branching"])}
    out = {"mode": "tree", "budget": choice["budget"]}
    if choice.get("width") is not None:
        out["width"] = choice["width"]
    return out


def per_depth(accepted: Sequence[int], depth: int) -> List[float]:
    """Conditional acceptance at each depth: P(accept d+1 | accepted d)."""
    out = []
    for d in range(depth):
        reached = sum(1 for a in accepted if a >= d)
        out.append(sum(1 for a in accepted if a > d) / reached if reached else 0.0)
    return out
