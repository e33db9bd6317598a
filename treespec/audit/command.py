"""``treespec audit``'s command (its flags are treespec.cli.main's)."""

import json

from ..errors import UsageError
from ..cli.process import prepare
from .records import Options
from .runner import PROPERTIES, format_report, run
from .subject import subject


def cmd_audit(args) -> int:
    prepare()
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
    # Inconclusive rows are reported and pass, as pytest reports skips; a
    # model whose verify or rollback compared nothing was not audited: 1.
    return 0 if report.ok and not report.unverified() else 1


def _tree_nodes(text: str) -> tuple:
    try:
        nodes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--tree-nodes: expected comma-separated node counts, got {text!r}")
    if any(n < 1 for n in nodes):
        raise UsageError(f"--tree-nodes: node counts must be at least 1, got {text!r}")
    return nodes

