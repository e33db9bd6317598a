"""Which isolation proofs hold on this backend (treespec.evidence.isolation), over the suite's own
models, histories and branching trees (suites/verify/helpers): per family and dtype, one code per
history x tree, one digit per negative control (1: caught by isolation; flattened positions,
causal mask, leaked sibling[, flattened recurrence]), "N" where the verify is not isolated at all.

    PYTHONPATH=. python3 results/half-power/isolation_proofs.py [family:dtype,...]
"""

import sys

from suites.verify import helpers
from treespec.evidence.isolation import isolation

CASES = [f"{f}:{d}" for f in ("gemma3_text", "gemma4_text", "llama", "qwen3_5")
         for d in ("float32", "bfloat16", "float16")]


def main():
    for case in (sys.argv[1].split(",") if len(sys.argv) > 1 else CASES):
        family, dtype = case.split(":")
        model = helpers.model(family, dtype)
        codes = []
        for h in helpers.histories(family):
            before = h.replay(model)
            for tree in helpers.branching_trees(family).values():
                proof = isolation(model, before, tree)
                codes.append("N" if proof is None else "".join("1" if v else "0" for v in proof.values()))
        print(family, dtype, " ".join(codes), flush=True)


if __name__ == "__main__":
    main()
