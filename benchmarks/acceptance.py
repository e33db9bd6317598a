"""How many tokens each draft shape emits per verify on a pair, greedy: no timing.

    python -m benchmarks.acceptance --pair default
    python -m benchmarks.acceptance --pair scaled --dims 2048x16 --alpha 0.02
    python -m benchmarks.acceptance --pair default --trees="2,2,1 -1,0,0,1,1"
    python -m benchmarks.acceptance --pair zoo --decode --prompts 4 --max-tokens 64

By default from ranks: one classic decode and one teacher-forced draft
forward per prompt (treespec.auto.emission: the draft's rank of every token
of the target's text), from which the tokens every round of any shape would
emit follow; so many shapes cost one decode. Shapes: chains of block 2..9,
spines (each spine node one more child than the spine goes on with, the last
spine node's children all leaves; ``spine d x w``: depth d, w children per
spine node: the bench's p[-1,0,0,1,1,3,3,5,5] is spine 4x2), fixed
branchings, and ``--trees`` (branchings or parent lists, as the bench takes
them). Per shape: nodes verified per round, depth, tokens emitted per
verify over all prompts (the bench's ``emit/v``: total tokens over total
rounds). Which shapes are worth a timed bench; what a round costs is the
bench's and verify_cost's.

``--decode``: real decodes instead (treespec.decoding), for chain blocks 2..8,
the confidence tree of the same node budget (width 3) and fixed trees:
acceptance (accepted over proposed drafts), emitted per verify, and whether
every text equals classic decoding's, in this run.
"""

from benchmarks import harness
from treespec.auto.emission import draft_ranks, rounds
from treespec.cli.flags import parse_trees
from treespec.decoding import decode
from treespec.draft import FixedTreeDrafter, fixed_shape, shape_name
from treespec.tree import DraftTree

BRANCHINGS = ([2, 1, 1], [2, 1, 1, 1], [2, 2, 1], [3, 1, 1, 1], [2, 2, 1, 1], [2, 1, 1, 1, 1],
              [3, 2, 1, 1], [2, 2, 2, 1])
DECODED_BRANCHINGS = ([2, 1], [2, 2], [2, 2, 1], [3, 2, 1], [2, 2, 2, 1])


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
    then ``extra`` (``--trees`` specs)."""
    out = {f"chain b={b}": list(range(-1, b - 1)) for b in range(2, 10)}
    for d in range(2, 8):
        for w in (2, 3):
            out[f"spine {d}x{w}"] = FixedTreeDrafter(parents=spine(d, w)).shape
    for b in BRANCHINGS:
        out[shape_name(b)] = FixedTreeDrafter(branching=b).shape
    for spec in extra:
        out[shape_name(spec)] = FixedTreeDrafter(**fixed_shape(spec)).shape
    return out


def from_ranks(args, pair, prompts, say):
    n = args.max_tokens
    ranks = []
    for p in prompts:
        text = decode(pair.target, p, max_tokens=n).tokens
        ranks.append(draft_ranks(pair.draft, p, text))
        say(f"prompt of {len(p)} tokens: the draft's first choice is the target's token at "
            f"{float((ranks[-1] == 0).mean()):.2f} of positions, one of its first two at "
            f"{float((ranks[-1] <= 1).mean()):.2f}")
    say(f"\n{len(prompts)} prompts x {n} tokens, greedy, from ranks\n"
        f"{'shape':20} {'nodes':>5} {'depth':>5} {'emit/v':>7}")
    for name, parents in shapes(args.trees).items():
        per_round = [e for r in ranks for e in rounds(parents, r, n)]
        depth = int(DraftTree([0] * len(parents), parents).depth())
        say(f"{name:20} {len(parents):5d} {depth:5d} {sum(per_round) / len(per_round):7.2f}")


def decoded(args, pair, prompts, say):
    n = args.max_tokens
    target, draft = pair.target, pair.draft
    classic = [decode(target, p, "classic", max_tokens=n).tokens for p in prompts]
    configs = []
    for block in range(2, 9):
        configs += [(f"chain b={block}", block - 1, dict(mode="chain", block=block)),
                    (f"confidence n={block - 1}", block - 1,
                     dict(mode="tree", budget=block - 1, width=3))]
    for b in list(DECODED_BRANCHINGS) + list(args.trees):
        configs.append((f"fixed {shape_name(b)}", FixedTreeDrafter(**fixed_shape(b)).budget(),
                        dict(mode="tree", **fixed_shape(b))))
    say(f"\n{len(prompts)} prompts x {n} tokens, greedy, decoded\n"
        f"{'configuration':<26} {'budget':>6} {'accept':>7} {'emit/verify':>11} {'exact':>6}")
    for name, budget, kw in configs:
        prop = acc = emitted = rounds_ = 0
        exact = True
        for p, ref in zip(prompts, classic):
            r = decode(target, p, draft_model=draft, max_tokens=n, **kw)
            exact &= r.tokens == ref
            s = r.stats
            prop, acc = prop + s.proposed, acc + s.accepted
            emitted, rounds_ = emitted + s.emitted, rounds_ + s.rounds
        say(f"{name:<26} {budget:>6} {acc / max(prop, 1):>7.3f} {emitted / max(rounds_, 1):>11.3f} "
            f"{str(exact):>6}")


def main(argv=None):
    ap = harness.parser("acceptance", __doc__, pair="default", repeats=None, calls=None)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--trees", type=parse_trees, default=[],
                    help='more shapes, as the bench takes them: --trees="2,2,1 -1,0,0,1,1"')
    ap.add_argument("--decode", action="store_true",
                    help="real decodes (acceptance, emitted per verify, exactness)")
    args = ap.parse_args(argv)
    pair = harness.load_pair(args)
    prompts = pair.prompts(args.prompts)
    with harness.record(args, pair) as say:
        (decoded if args.decode else from_ranks)(args, pair, prompts, say)


if __name__ == "__main__":
    main()
