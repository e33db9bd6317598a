"""What a decode returns: the tokens and the round diagnostics, and where a
run stops (max_tokens, the first EOS)."""

from dataclasses import asdict, dataclass, field
from typing import List, Optional, Tuple


@dataclass
class Stats:
    """What a tuning engineer reads after a run."""

    mode: str
    requested: dict = field(default_factory=dict)  # the drafter as configured
    rounds: int = 0
    proposed: int = 0  # draft nodes verified
    accepted: int = 0  # draft nodes accepted
    emitted: int = 0  # tokens committed by verify forwards
    zero_accept_rounds: int = 0
    partial_accept_rounds: int = 0
    full_accept_rounds: int = 0  # accepted down to the tree's deepest level
    depth_reached: List[int] = field(default_factory=list)  # rounds whose tree reached depth d+1
    depth_accepted: List[int] = field(default_factory=list)  # rounds accepting depth d+1
    nodes_per_round: List[int] = field(default_factory=list)
    time_ms: dict = field(default_factory=lambda: {
        "prefill": 0.0, "draft": 0.0, "verify": 0.0, "walk": 0.0, "commit": 0.0})
    notes: List[str] = field(default_factory=list)
    gate: Optional[dict] = None  # the exactness gate's decision, when it ran

    def record(self, tree, walk):
        self.rounds += 1
        drafts = len(tree) - 1
        self.proposed += drafts
        self.accepted += walk.accepted
        self.nodes_per_round.append(len(tree))
        depth = tree.depth()
        if walk.accepted == 0:
            self.zero_accept_rounds += 1
        elif walk.accepted == depth:
            self.full_accept_rounds += 1
        else:
            self.partial_accept_rounds += 1
        while len(self.depth_reached) < depth:
            self.depth_reached.append(0)
            self.depth_accepted.append(0)
        for d in range(depth):
            self.depth_reached[d] += 1
            self.depth_accepted[d] += walk.accepted > d

    def summary(self) -> dict:
        s = asdict(self)
        s["acceptance"] = self.accepted / self.proposed if self.proposed else None
        s["emitted_per_verify"] = self.emitted / self.rounds if self.rounds else None
        s["per_depth_acceptance"] = [
            a / r if r else None for a, r in zip(self.depth_accepted, self.depth_reached)]
        n = self.nodes_per_round
        s["effective"] = {
            "mean_nodes": sum(n) / len(n) if n else None,
            "max_nodes": max(n) if n else None,
            "mean_budget": (sum(n) / len(n) - 1) if n else None,
        }
        s.pop("nodes_per_round")
        return s


@dataclass
class Result:
    tokens: List[int]
    stats: Stats


def eos_set(eos_token_ids) -> set:
    if eos_token_ids is None:
        return set()
    if isinstance(eos_token_ids, int):
        return {eos_token_ids}
    return set(eos_token_ids)


def clip(tokens: List[int], max_tokens: int, eos: set) -> Tuple[List[int], bool]:
    """Cut at max_tokens and just after the first EOS; say whether to stop."""
    out = []
    for t in tokens:
        out.append(t)
        if t in eos or len(out) >= max_tokens:
            return out, True
    return out, False
