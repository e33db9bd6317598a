"""``treespec audit``: its flags and its command."""

import json

from ..errors import UsageError
from .records import Options
from .runner import PROPERTIES, format_report, run
from .subject import subject


def cmd_audit(args) -> int:
    props = PROPERTIES
    if args.context < 0:
        raise UsageError(f"--context: must be 0 (off) or a number of tokens, got {args.context}")
    if args.only:
        props = [p.strip() for p in args.only.split(",") if p.strip()]
        unknown = [p for p in props if p not in PROPERTIES]
        if unknown:
            raise UsageError(f"--only: unknown properties {unknown}; known: {', '.join(PROPERTIES)}")
    options = Options(block=args.block, draws=args.draws, seed=args.seed,
                      allow_inexact=args.allow_inexact, tolerance=args.tolerance,
                      max_tokens=args.max_tokens, context=args.context,
                      tree_nodes=_tree_nodes(args.tree_nodes))
    report = run(subject(args.model, args.draft_model, args.adapter, options), props)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(format_report(report))
    return 0 if report.ok else 1  # inconclusive rows are reported, as pytest reports skips


def _tree_nodes(text: str) -> tuple:
    try:
        nodes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--tree-nodes: expected comma-separated node counts, got {text!r}")
    if any(n < 1 for n in nodes):
        raise UsageError(f"--tree-nodes: node counts must be at least 1, got {text!r}")
    return nodes


def add_parser(sub):
    p = sub.add_parser(
        "audit",
        help="run the exactness contracts against a checkpoint and its tree adapter",
        description="Audit tree speculative decoding on one mlx-lm checkpoint: adapter, "
        "per-node verify, rollback in every cache mode, walks, end-to-end text and the "
        "exactness probe. Exit status 1 if any property fails.",
    )
    p.add_argument("--model", required=True, help="mlx-lm checkpoint directory to audit")
    p.add_argument("--draft-model", help="drafter checkpoint for the e2e text diff "
                   "(default: the model drafts for itself)")
    p.add_argument("--adapter", help="module:attr of a callable model -> adapter (the "
                   "TreeAdapter interface; a walk(tree, target_tokens) method overrides the walk) "
                   "used instead of treespec.verify.adapter_for")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--block", type=int, default=4, help="chain verify width for the e2e "
                   "chain mode and the probe shapes (default 4)")
    p.add_argument("--allow-inexact", action="store_true", help="accept differences up to "
                   "--tolerance (reported as 'inexact') instead of requiring bit identity")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="max |diff| of logits accepted with --allow-inexact (default 0.05)")
    p.add_argument("--draws", type=int, default=3, help="random trees per cache state (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="e2e length (default: 32, or the sliding window + 16)")
    p.add_argument("--context", type=int, default=1100, help="history length of the "
                   "long-context rows (default 1100: past the 1024 keys where attention kernels "
                   "switch paths; 0 turns them off)")
    p.add_argument("--tree-nodes", default="32,64", help="node counts of the random trees the "
                   "long-context rows verify and probe besides the drafters' shapes (default "
                   "32,64: EAGLE-sized, past the 32 rows where matmuls switch GEMM paths)")
    p.add_argument("--only", help=f"comma-separated subset of: {', '.join(PROPERTIES)}")
    p.set_defaults(func=cmd_audit)
