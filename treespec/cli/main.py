"""`treespec generate | bench | audit`: the command line.

Start-up is kept light: this module and what it imports (the flags of every
command, their parsers and checks: treespec.cli.generate_args, treespec.cli.flags,
treespec.options) need neither mlx-lm nor MLX's model code, so ``--help`` and
every flag error come back before anything heavy loads. Each command's work
lives in its own module, named in :data:`COMMANDS` and imported only once its
flags have parsed and passed their checks: the one import this package makes
at run time (suites/project/test_layering.py counts the table as imports of
this module, so the layering rules hold through it). Between the two, the
process is set up as treespec.cli.startup says: TF32 off, and ``--device``
applied before the command's module imports mlx-lm.
"""

import argparse
import importlib
import sys

from . import generate_args, startup
from ..bench.prompts import DEFAULT_BLOCKS, FIXED_TREES, PROMPTS
from ..distributed import flags as sharding_flags
from ..errors import UsageError
from .flags import parse_verify, parse_blocks, parse_dims, parse_trees
from . import census as census_flags

# subcommand -> "module:function" run with the parsed arguments (exit status).
COMMANDS = {
    "generate": "treespec.cli.generate:cmd_generate",
    "bench": "treespec.bench.command:cmd_bench",
    "audit": "treespec.audit.command:cmd_audit",
    "census": "treespec.backend.census_command:cmd_census",
}


def add_bench_parser(sub):
    p = sub.add_parser("bench", help="throughput of classic, chain, tree, auto and mlx-lm, "
                       "each figure gated by the exactness checks of the same run")
    p.add_argument("--model", help="target mlx-lm checkpoint (default: the trained pair)")
    p.add_argument("--draft-model", help="draft mlx-lm checkpoint (with --model)")
    p.add_argument("--prompts", type=int, default=3, help=f"Python prompts, 1..{len(PROMPTS)}")
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats (medians)")
    p.add_argument("--max-seconds", type=float,
                   help="bound the whole bench (calibration, probes, warm-up and timed runs): "
                   "nothing new starts past it, and the report says what was left out")
    p.add_argument("--blocks", type=parse_blocks, default=parse_blocks(DEFAULT_BLOCKS),
                   help="chain blocks (and confidence budgets block-1): LO..HI or a list")
    p.add_argument("--trees", type=parse_trees,
                   default=[tuple(t) for t in FIXED_TREES],
                   help="fixed topologies as branching lists or parent lists, e.g. "
                   "--trees=\"2,1,1 -1,0,0,1,1\" ('' for none)")
    p.add_argument("--batch-levels", action="store_true",
                   help="each fixed tree of --trees with a level of several fed nodes also as "
                   "a row drafting that level as batch rows (generate's --batch-levels)")
    p.add_argument("--width", type=int,
                   help="confidence tree (and a --draft-head's dynamic tree): top-k per "
                   "expansion (default 4)")
    p.add_argument("--no-mlx-lm", action="store_true", help="skip mlx-lm's speculative decoding")
    p.add_argument("--no-confidence", action="store_true",
                   help="skip the confidence-tree rows (auto still weighs confidence trees)")
    p.add_argument("--no-auto", action="store_true", help="skip auto's calibration and row")
    p.add_argument("--plot", metavar="DIR", help="write PNGs (needs matplotlib)")
    p.add_argument("--verify-curve", action="store_true",
                   help="measure one target forward's cost for T=1..64 and print it")
    p.add_argument("--json", action="store_true", help="one JSON report on stdout")
    p.add_argument("--allow-inexact", action="store_true",
                   help="time configurations whose probe found differences (still text-diffed)")
    p.add_argument("--scaled", type=parse_dims, metavar="HIDDENxLAYERS",
                   help="instead of a checkpoint pair: a random llama of this size and a "
                   "drafter cut from it (treespec.bench.scaled), e.g. 2048x16 (~0.8B)")
    p.add_argument("--scaled-dtype", choices=("bfloat16", "float16", "float32"),
                   help="--scaled: the pair's dtype (default bfloat16); float32 is where a "
                   "CPU BLAS's wider products sum in another order")
    p.add_argument("--draft-layers", type=int, default=2, help="--scaled: the drafter's depth")
    p.add_argument("--bits", type=int, choices=(4, 8),
                   help="--scaled: quantize both models' linears (and the target's head) to "
                   "this many bits (affine, group 64), as mlx_lm.convert -q does")
    p.add_argument("--draft-head", action="append", metavar="mtp|DIR[,...]",
                   help="also bench a hidden-state head (generate's --draft-head; repeat it or "
                   "give a comma list): its chains (--blocks), fixed trees (--trees) and "
                   "EAGLE-2 dynamic trees of budget block-1 and --width, beside the draft "
                   "model's rows, gated alike")
    p.add_argument("--verify", type=parse_verify, default=("flat",),
                   help="verify modes of the chain, fixed and confidence rows, side by side: "
                   "flat (one forward over the flattened tree), rows (the row-invariant "
                   "verify: attention node by node over its own keys), kernels (rows with "
                   "its linears in CUDA row kernels), chunks (rows with its linears in calls "
                   "of the rows the census measures the products keep), or a comma list "
                   "such as flat,rows")
    p.add_argument("--alpha", type=float, default=0.3,
                   help="--scaled: damping of the layers the drafter lacks (sets acceptance)")
    p.add_argument("--blas", choices=("auto", "reference", "openblas"), default="auto",
                   help="CPU BLAS: re-executes with Debian's OpenBLAS preloaded, or without it")
    startup.add_device_flag(p)
    sharding_flags.add(p)


def add_audit_parser(sub):
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
    p.add_argument("--draft-head", metavar="mtp|DIR",
                   help="a hidden-state head drafts the e2e rows instead (a chain, a fixed "
                   "tree, EAGLE-2's dynamic tree), and the head-state rows compare its cache "
                   "after every round with a fresh head's fed the accepted text: mtp (the "
                   "checkpoint's own) or a head directory")
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
    p.add_argument("--only", help="comma-separated subset of the audit's properties (an "
                   "unknown name is an error that lists them)")
    startup.add_device_flag(p)
    sharding_flags.add(p)


def add_census_parser(sub):
    p = sub.add_parser(
        "census", help="which ops give a row of an M-row call the bits of that row alone",
        description="The backend census: for the running backend, each op (matmul, quantized "
        "matmul, attention with and without an array mask, rms_norm, rope, conv1d, the "
        "recurrent kernels) at the default shapes or a model's own, and the smallest M from "
        "which a row of an M-row call differs from that row computed alone.")
    p.add_argument("--model", help="mlx-lm checkpoint directory: its own shapes and dtype "
                   "(default: a fixed set of representative shapes)")
    p.add_argument("--dtype", help="comma list of float32, bfloat16, float16 (default: all "
                   "three, or the model's own dtype)")
    p.add_argument("--widths", default=census_flags.DEFAULT_WIDTHS,
                   help="the M measured: LO..HI or a comma list (default 1..16)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    startup.add_device_flag(p)
    p.set_defaults(check=census_flags.check)


def build_parser():
    ap = argparse.ArgumentParser(prog="treespec", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    generate_args.add_parser(sub)
    add_bench_parser(sub)
    add_audit_parser(sub)
    add_census_parser(sub)
    return ap


def command(name: str):
    """The function :data:`COMMANDS` names for ``name``, imported now."""
    module, _, attr = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def main(argv=None) -> int:
    # Before MLX multiplies anything (it reads the switch at the first product);
    # a --blas re-execution inherits it.
    startup.float32_products()
    args = build_parser().parse_args(argv)
    try:
        check = getattr(args, "check", None)
        if check is not None:
            check(args)  # every flag, before anything heavy is imported
        startup.refuse_blas_on_gpu(getattr(args, "blas", "auto"), args.device)
        # Before the command's module imports mlx-lm: mlx_lm.generate makes its
        # stream on the default device at import (treespec.cli.startup).
        startup.apply_device(args.device)
        return command(args.command)(args)
    except UsageError as e:
        print(f"treespec {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
