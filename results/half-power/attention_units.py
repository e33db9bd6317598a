"""Where a wrapped-ring chain's attention outputs differ from the taught
same-width reference's (treespec.evidence.attention_rows), per layer: the
largest difference in units in the last place at each element's magnitude
and at its row's largest magnitude, the largest |difference|, the row's
largest |value|, and the layer's cache type.

    PYTHONPATH=. python3 results/half-power/attention_units.py [id substrings...]
"""
import sys

import mlx.core as mx
import numpy as np

from suites.verify import helpers
from suites.verify.test_chain import _cases as chain_cases
from treespec.evidence.attention_rows import output_projections, taught, ulps
from treespec.evidence.same_width import padded_rows
from treespec.verify import adapter_for

only = sys.argv[1:]
for p in chain_cases(ring=True):
    cfg, hist, tree = p.values
    if only and not any(o in p.id for o in only):
        continue
    model = helpers.model(*cfg)
    before = helpers.clone(hist.replay(model))
    verify = adapter_for(model).verify
    verify(tree, helpers.clone(before))  # a first verify may run a check forward
    sites, _ = output_projections(model)
    with taught(sites) as stands:
        for s in stands:
            s.seen.clear()
        mx.eval(verify(tree, helpers.clone(before)))
        seen = [s.seen[-1] for s in stands]
        per = {}
        for i in range(len(tree)):
            path = tree.path_to(i)
            for s, x in zip(stands, seen):
                s.seen.clear()
                object.__setattr__(s, "rows", x[:, path])
            padded_rows(model, before, tree, nodes=[i], wrapped=True)
            for layer, (s, x) in enumerate(zip(stands, seen)):
                a, b = x[0, i], s.seen[-1][0, len(path) - 1]
                big = mx.max(mx.abs(a.astype(mx.float32))).item()
                row_unit = ulps(mx.full(a.shape, big, dtype=a.dtype), mx.zeros(a.shape, a.dtype)) / big if big else 1
                d = mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item()
                cur = per.get(layer, (0, 0, 0, 0))
                per[layer] = tuple(max(u, v) for u, v in zip(cur, (ulps(a, b), d / (1 / row_unit) if big else 0, d, big)))
        for s in stands:
            object.__setattr__(s, "rows", None)
    kinds = [type(c).__name__ for c in before]
    print(p.id, " | ".join(f"L{l} {kinds[l] if l < len(kinds) else '?'}: {u:g} u/elem, {r:g} u/row, "
                           f"|d| {d:.3g}, max|x| {m:.3g}" for l, (u, r, d, m) in per.items()), flush=True)
