"""Audit properties at the sizes a real run reaches
(docs/contracts.md#auditing-a-checkpoint-or-adapter): ``--context N`` tokens
of history (default 1100: past the 1024 keys where attention kernels switch
paths, which the short histories of the other rows never reach) and trees
of the sizes the drafters will verify (the e2e drafters' widest chain and
largest tree, and ``--tree-nodes``, default 32 and 64: EAGLE-sized trees,
past the 32 rows where matmuls switch GEMM paths).

Two rows: ``long-context[tree-verify]`` (every node against a plain forward
over its root path, judged like tree-verify) and ``long-context[probe]``
(treespec.evidence.gate's probe of those shapes at that context, one draw: identical,
or within the envelope, the gate then declining, or FAIL)."""

import random
from typing import List

from ..evidence import numerics
from ..tree import DraftTree
from .probe_props import _probe, probe_shapes
from .records import FAIL, INEXACT, PASS, SKIP, Check
from .states import CacheMode, History, random_tree
from .subject import Subject, the_adapter, vocab
from .verify_props import verify_trees


def long_shapes(s: Subject) -> List[tuple]:
    """The widest chain and the largest branching tree the drafters verify
    (their probe shapes), and a random tree of each ``--tree-nodes`` size."""
    shapes = probe_shapes(s.options.block)
    chains = [sh for sh in shapes if list(sh) == list(range(-1, len(sh) - 1))]
    trees = [sh for sh in shapes if sh not in chains]
    out = [max(chains, key=len)] if chains else []
    out += [max(trees, key=len)] if trees else []
    rng = random.Random(f"{s.options.seed}:long-trees")
    for n in s.options.tree_nodes:
        out.append(tuple(random_tree(rng, vocab(s), n).parents))
    return out


def check_long_context(s: Subject) -> List[Check]:
    n = s.options.context
    if n <= 0:
        return [Check("long-context", SKIP, "off (--context 0)")]
    shapes = long_shapes(s)
    rng = random.Random(f"{s.options.seed}:long")
    v = vocab(s)
    hist = History(tuple(rng.randrange(v) for _ in range(n)))
    trees = [DraftTree([rng.randrange(v) for _ in sh], list(sh)) for sh in shapes]
    sizes = sorted({len(t) for t in trees})
    tally, count = verify_trees(s, CacheMode(), {hist: trees})
    rows = [tally.check("long-context[tree-verify]",
                        f"nodes of {count} trees of {sizes} nodes at context {n}")]
    rows.append(_probe_row(s, shapes, n))
    return rows


def _probe_row(s: Subject, shapes, n: int) -> Check:
    probe, refused = _probe(s, shapes, n, draws=1)
    note = f"; {len(refused)} shapes refused ({refused[0][1]})" if refused else ""
    bad = [r for r in probe.shapes if not r.identical]
    ms = sorted({r.m for r in probe.shapes})
    if not bad:
        return Check("long-context[probe]", PASS, f"{len(probe.shapes)} shapes (M {ms[0]}-{ms[-1]}) "
                     f"at context {n} bit-identical to single-token steps{note}", max_diff=0.0)
    first = {"shape": list(bad[0].shape), "node": bad[0].first_node,
             "max_abs_diff": bad[0].max_abs_diff,
             "message": f"M={bad[0].m} node {bad[0].first_node} at context {n}"}
    detail = (f"{len(bad)}/{len(probe.shapes)} shapes at context {n} differ from single-token "
              f"steps, max |diff| {probe.max_abs_diff:.3g}; first: {first['message']}")
    widths = sorted({w for sh in shapes for w in numerics.widths_of(DraftTree([0] * len(sh), list(sh)))})
    env = numerics.envelope(s.model, n, widths, adapter=the_adapter(s), adapter_name=s.adapter_source)
    if not env.exact and probe.max_abs_diff <= env.bound:
        return Check("long-context[probe]", PASS, f"{detail}: within the backend's envelope "
                     f"(bound {env.bound:.3g}), so treespec.evidence.gate declines speculative decoding "
                     f"here unless --allow-inexact{note}", first, probe.max_abs_diff,
                     verdict=numerics.DECLINED)
    detail += f"; beyond the envelope's bound {env.bound:.3g} ({env.line()})"
    return Check("long-context[probe]", INEXACT if s.options.allow_inexact else FAIL,
                 detail + note, first, probe.max_abs_diff)
