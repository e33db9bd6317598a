"""``treespec bench --draft-head``: the rows of a hidden-state head
(treespec.draft.head) beside the draft model's, gated like them.

For each head spec (``mtp`` or a head directory, treespec.heads.load) and
the bench's ``--blocks``, ``--trees`` and ``--width``:

- ``chain b=B [head NAME]``: B - 1 greedy drafts, one head forward a depth;
- ``fixed SHAPE [head NAME]``: each fixed tree, a node's r-th child its r-th
  best token;
- ``dynamic n=N w=W [head NAME]``: EAGLE-2's dynamic tree of N = B - 1 nodes,
  expanding the W best frontier nodes a depth.

A row's probe shapes are its HeadDrafter's ``probe_shapes()`` (the target's
verify is what the gate measures; the head only proposes), and every timed
run's text is diffed with classic's, as for every row (treespec.bench.measure).
The head is loaded by the command once the target is built and set on each
row (``head_model``); a head prefills nothing of its own (its first round
feeds the prompt's features), so decode tok/s subtracts the target's
prefill only.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

from ..draft import FixedTreeDrafter, fixed_shape, shape_name
from ..draft.head import HeadDrafter
from .measure import Config

__all__ = ["HeadConfig", "head_configs", "head_name", "parse_specs", "with_heads"]

KINDS = ("head-chain", "head-fixed", "head-dynamic")


@dataclass
class HeadConfig(Config):
    """A row drafted by a head: ``head`` the ``--draft-head`` spec,
    ``head_model`` the loaded head (None until the command sets it)."""

    head: str = ""
    head_model: Any = None
    draft_prefill = False

    def decode_kwargs(self) -> dict:
        if self.kind == "head-chain":
            return {"mode": "chain", "block": self.block}
        if self.kind == "head-fixed":
            return {"mode": "tree", **fixed_shape(self.branching)}
        return {"mode": "tree", "budget": self.budget, "width": self.width}

    def drafter(self) -> HeadDrafter:
        kw = self.decode_kwargs()
        return HeadDrafter(self.head_model, kw.pop("mode"), **kw)

    def draft_kwargs(self, draft) -> dict:
        if self.head_model is None:
            raise ValueError(f"{self.name}: its head is not loaded (set head_model)")
        return {"draft_head": self.head_model}


def head_name(spec: str) -> str:
    """A spec as the rows name it: ``mtp``, or the head directory's name."""
    return spec if spec == "mtp" else (Path(spec).name or spec)


def head_configs(spec: str, blocks: Sequence[int], trees: Sequence[tuple],
                 width: int = 4) -> List[HeadConfig]:
    """One head's rows, at the draft model's rows' budgets."""
    tag = f" [head {head_name(spec)}]"
    out = [HeadConfig(f"chain b={b}{tag}", "head-chain", block=b, budget=b - 1, head=spec)
           for b in blocks]
    for t in trees:
        n = FixedTreeDrafter(**fixed_shape(t)).budget()
        out.append(HeadConfig(f"fixed {shape_name(t)}{tag}", "head-fixed", branching=tuple(t),
                              budget=n, head=spec))
    out += [HeadConfig(f"dynamic n={b - 1} w={width}{tag}", "head-dynamic", budget=b - 1,
                       width=width, head=spec) for b in blocks]
    return out


def with_heads(configs: List[Config], specs: Sequence[str], blocks: Sequence[int],
               trees: Sequence[tuple], width: int = 4) -> List[Config]:
    """``configs`` with every head's rows after the draft model's own and
    before mlx-lm's."""
    at = next((i for i, c in enumerate(configs) if c.kind == "mlx-lm"), len(configs))
    rows = [c for s in specs for c in head_configs(s, blocks, trees, width)]
    return configs[:at] + rows + configs[at:]


def parse_specs(values: Optional[Sequence[str]]) -> List[str]:
    """``--draft-head`` values (repeated, or comma lists) as one list of
    specs, in order; a spec given twice or an empty one is refused (the
    caller names the flag)."""
    specs = [s.strip() for v in (values or ()) for s in v.split(",")]
    if any(not s for s in specs):
        raise ValueError("an empty head spec (give mtp or a head directory)")
    names = [head_name(s) for s in specs]
    dup = next((s for s, n in zip(specs, names) if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"{dup}: two heads would name their rows [head {head_name(dup)}]")
    return specs
