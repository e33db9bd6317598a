"""For every wrapped-ring tree of suites/verify (the chains of test_chain's
ring test, the branching trees at two wrapped histories): are the verify's
rows classic decoding's, the time-ordered same-width forwards', and what does
the proof at the attentions (treespec.evidence.attention_rows) find?

    PYTHONPATH=. python3 results/half-power/attention_probe.py [dtype or id substrings...]
"""
import sys

import mlx.core as mx

from suites.verify import helpers
from suites.verify.test_chain import _cases as chain_cases
from treespec.audit.states import root_path_forwards
from treespec.evidence.attention_rows import attention_proof
from treespec.evidence.same_width import padded_rows
from treespec.verify import adapter_for


def cases():
    yield from (p.values + (p.id,) for p in chain_cases(ring=True))
    for cfg in helpers.CONFIGS:
        if helpers.window(cfg[0]) is None:
            continue
        hists = helpers.histories(cfg[0])
        for hist in (hists[3], hists[4]):
            for name, tree in helpers.branching_trees(cfg[0]).items():
                yield cfg[:3], hist, tree, f"{helpers.config_id(cfg)}-h{hist.offset}-{name}"


only = sys.argv[1:]
for cfg, hist, tree, pid in cases():
    if only and not any(o in pid for o in only):
        continue
    model = helpers.model(*cfg)
    before = helpers.clone(hist.replay(model))
    verify = adapter_for(model).verify
    logits = verify(tree, helpers.clone(before))
    mx.eval(logits)
    refs = root_path_forwards(model, before, tree)
    ordered = padded_rows(model, before, tree, wrapped=True)
    proof, why = attention_proof(model, before, tree, logits, verify, wrapped=True)
    found = (f"proof: max {proof.max_ulps:g} units (layer {proof.layer}), leaked node {proof.control:g}"
             if proof else f"no proof: {why}")
    print(f"{pid}: =classic {mx.array_equal(logits, refs).item()} "
          f"({helpers.max_abs_diff(logits, refs):.3g})  =time-ordered "
          f"{mx.array_equal(logits, ordered).item()} ({helpers.max_abs_diff(logits, ordered):.3g})  "
          f"{found}", flush=True)
