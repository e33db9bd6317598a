"""Tokens per verify of many draft shapes, from one classic decode and one
teacher-forced draft forward per prompt (treespec.auto.emission): which shapes are
worth a timed bench.

    python scripts/shape_emission.py --pair default [--max-tokens 48] [--prompts 2]
    python scripts/shape_emission.py --dims 2048x16 --alpha 0.02 [--prompts 2]
    python scripts/shape_emission.py --pair default --trees="2,2,1 -1,0,0,1,1"   # these too

The trained pair takes the bench's Python prompts; the scaled pair its seeded
token prompts (treespec.bench.scaled.default_prompts). Shapes: chains of block 2..9,
spines (each spine node one more child than the spine goes on with, the
last spine node's children all leaves; ``spine d x w``: depth d, w children
per spine node; the bench's p[-1,0,0,1,1,3,3,5,5] is spine 4x2), and fixed
branchings. Per shape: nodes verified per round, depth, and tokens emitted
per verify over all prompts (the bench's ``emit/v``: total tokens over total
rounds). Greedy; no timing: what a round costs on a machine is the bench's
and ``tree_verify_costs.py``'s.
"""

import argparse
import time

from treespec.bench import scaled
from treespec.bench.prompts import PROMPTS
from treespec.checkpoints import load_default_pair
from treespec.decoding import decode
from treespec.draft import FixedTreeDrafter, fixed_shape, shape_name
from treespec.auto.emission import draft_ranks, rounds
from treespec.cli.flags import parse_trees
from treespec.tree import DraftTree

BRANCHINGS = ([2, 1, 1], [2, 1, 1, 1], [2, 2, 1], [3, 1, 1, 1], [2, 2, 1, 1], [2, 1, 1, 1, 1],
              [3, 2, 1, 1], [2, 2, 2, 1])


def spine(depth: int, width: int) -> list:
    """A spine's parent list: at each depth the spine node's first child
    goes on, its other width - 1 children are leaves."""
    parents, node = [-1], 0
    for _ in range(depth):
        first = len(parents)
        parents += [node] * width
        node = first
    return parents


def shapes(extra=()) -> dict:
    """name -> parent list in first-choice order: the built-in families,
    then ``extra`` (``--trees`` specs, branchings or parent lists)."""
    out = {f"chain b={b}": list(range(-1, b - 1)) for b in range(2, 10)}
    for d in range(2, 8):
        for w in (2, 3):
            out[f"spine {d}x{w}"] = FixedTreeDrafter(parents=spine(d, w)).shape
    for b in BRANCHINGS:
        out["[" + ",".join(map(str, b)) + "]"] = FixedTreeDrafter(branching=b).shape
    for spec in extra:
        out[shape_name(spec)] = FixedTreeDrafter(**fixed_shape(spec)).shape
    return out


def main():
    ap = argparse.ArgumentParser()
    scaled.add_pair_arguments(ap)
    ap.add_argument("--pair", choices=("default", "weak"),
                    help="the built-in trained pair (its target and that drafter) instead")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--trees", type=parse_trees, default=[],
                    help='more shapes, as the bench takes them: --trees="2,2,1 -1,0,0,1,1"')
    args = ap.parse_args()
    if args.pair:
        target, draft, tok = load_default_pair(args.pair)
        prompts = [tok.encode(p) for p in PROMPTS[:args.prompts]]
        what = f"trained pair, {args.pair} drafter"
    else:
        target, draft, what = scaled.study_pair(args)
        prompts = scaled.default_prompts(args.prompts)
    scaled.announce(what)
    n = args.max_tokens
    ranks = []
    for p in prompts:
        t0 = time.perf_counter()
        text = decode(target, p, max_tokens=n).tokens
        ranks.append(draft_ranks(draft, p, text))
        top1 = float((ranks[-1] == 0).mean())
        print(f"prompt of {len(p)} tokens: classic text and draft ranks in "
              f"{time.perf_counter() - t0:.1f}s; the draft's first choice is the target's "
              f"token at {top1:.2f} of positions, one of its first two at "
              f"{float((ranks[-1] <= 1).mean()):.2f}", flush=True)
    print(f"\n{len(prompts)} prompts x {n} tokens, greedy\n"
          f"{'shape':20} {'nodes':>5} {'depth':>5} {'emit/v':>7}")
    for name, parents in shapes(args.trees).items():
        per_round = [e for r in ranks for e in rounds(parents, r, n)]
        depth = int(DraftTree([0] * len(parents), parents).depth())
        print(f"{name:20} {len(parents):5d} {depth:5d} {sum(per_round) / len(per_round):7.2f}")


if __name__ == "__main__":
    main()
