# Archived one-question probe (issue 41): scripts/ab_tree_drafting.py as it stood at 7dc635f,
# beside the record(s) it produced; not run or tested since (its imports may have moved).
# Record(s):
#   results/cpu-bench/ab-tree-drafting.txt (measured at 4b8951c, recorded in 9d64248)
# Obsolete as it stands: FixedTreeDrafter no longer has on_device (fixed trees always draft on
# the device), so both of its runs now take the same path.
# The version that produced a record: git show <recording commit>:scripts/ab_tree_drafting.py

"""Fixed trees drafted on the device against the host path, the two alone.

    python scripts/ab_tree_drafting.py [--trees "2,1,1 2,2,1"] [--repeats 9]

The trained pair, two Python prompts x 64 tokens; FixedTreeDrafter with
``on_device`` True (each level's tokens gathered from the parents' device
top-k, one graph per round) and False (one host round trip per level).
Both texts are checked against classic first; medians of interleaved wall
times are printed.
"""

import argparse
import statistics
import sys
import time


from treespec.bench.measure import PROMPTS, parse_trees
from treespec.checkpoints import load_default_pair
from treespec.decoding import decode
from treespec.draft import FixedTreeDrafter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", type=parse_trees, default=parse_trees("2,1,1 2,2,1"))
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    target, draft, tok = load_default_pair()
    prompts = [tok.encode(p) for p in PROMPTS[:2]]
    ref = [decode(target, p, max_tokens=args.max_tokens).tokens for p in prompts]
    for branching in args.trees:
        def run(on_device, branching=branching):
            out = []
            for p in prompts:
                drafter = FixedTreeDrafter(branching=branching)
                drafter.on_device = on_device
                out.append(decode(target, p, mode="tree", draft_model=draft, drafter=drafter,
                                  max_tokens=args.max_tokens, gate=False).tokens)
            return out

        if run(True) != ref or run(False) != ref:
            sys.exit(f"{branching}: a text differs from classic: no figure")
        times = {True: [], False: []}
        for _ in range(args.repeats):
            for on_device in (True, False):
                t0 = time.perf_counter()
                run(on_device)
                times[on_device].append(time.perf_counter() - t0)
        dev, host = statistics.median(times[True]), statistics.median(times[False])
        print(f"fixed {list(branching)}: device {dev * 1e3:.0f} ms, host {host * 1e3:.0f} ms, "
              f"device speedup {host / dev:.3f}")


if __name__ == "__main__":
    main()
