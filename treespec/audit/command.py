"""``treespec audit``'s command (its flags are treespec.cli.main's)."""

import json
import sys

from ..checkpoints import load_checkpoint
from ..distributed import flags as sharding_flags, group as dist, shard
from ..errors import OptionError, UsageError
from ..cli.process import prepare
from .records import Options
from .runner import HEAD_PROPERTIES, PROPERTIES, format_report, run
from .subject import subject


def cmd_audit(args) -> int:
    prepare()
    props = None  # every property (the head's too with --draft-head)
    if args.context < 0:
        raise UsageError(f"--context: must be 0 (off) or a number of tokens, got {args.context}")
    if args.only:
        props = [p.strip() for p in args.only.split(",") if p.strip()]
        known = PROPERTIES + HEAD_PROPERTIES
        unknown = [p for p in props if p not in known]
        if unknown:
            raise UsageError(f"--only: unknown properties {unknown}; known: {', '.join(known)}")
        if args.draft_head is None and any(p in HEAD_PROPERTIES for p in props):
            raise UsageError("--only head-state: the head's state needs --draft-head")
    options = Options(block=args.block, draws=args.draws, seed=args.seed,
                      allow_inexact=args.allow_inexact, tolerance=args.tolerance,
                      max_tokens=args.max_tokens, context=args.context,
                      tree_nodes=_tree_nodes(args.tree_nodes))
    how = sharding_flags.way(args)
    if how == sharding_flags.PIPELINE:
        raise UsageError("--sharded pipeline: the audit evaluates forwards piecewise (caches "
                         "apart from logits), and a pipelined rank then skips a send or "
                         "all-gather its peer waits for: the ranks hang "
                         "(docs/distributed.md); audit with --sharded (tensor)")
    try:
        group, _ = dist.start(how and sharding_flags.FLAG, sharding_flags.FLAG, sys.argv[1:],
                              (args.model, args.draft_model))
    except OptionError as e:
        raise UsageError(str(e))
    if args.draft_head is not None and (args.draft_model is not None or group is not None):
        raise UsageError(f"--draft-head with {'--draft-model' if group is None else '--sharded'}: "
                         "the e2e rows draft from one of them; give --draft-head alone, unsharded")
    s = subject(args.model, args.draft_model, args.adapter, options,
                load=load_checkpoint if group is None else _sharded_load(group, how),
                head=args.draft_head)
    if group is not None and not s.custom:
        # The gate's verdict measured on every rank, never read from one rank's disk.
        s.adapter_source = dist.SHARDED_ADAPTER
    report = run(s, props)
    if group is not None:
        try:  # every rank judged every row alike
            dist.same_result(group, json.dumps([[c.name, c.status, c.verdict]
                                                for c in report.checks]), "audit verdicts")
        except dist.RankDivergence as e:
            raise UsageError(f"{sharding_flags.FLAG}: {e}")
        report.header["distributed"] = {"ranks": group.size(), "sharding": how}
        if group.rank() != 0:  # rank 0 prints
            return 0 if report.ok and not report.unverified() else 1
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


def _sharded_load(group, how):
    """The target's loader for a sharded audit: mlx-lm's sharded_load over
    ``group`` (the drafter, if any, loads whole on every rank)."""
    def load(path, role):
        try:
            return shard.load(path, group, role, how)
        except OptionError as e:
            raise UsageError(str(e))
    return load
