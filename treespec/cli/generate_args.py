"""``treespec generate``'s flags, and their reading into decode options.

Light (no MLX model code, no mlx-lm): ``treespec.cli.main`` parses and checks
every flag with this module, through the library's own checks
(treespec.options, spelled as flags), before anything heavy is imported or a
model is loaded; treespec.cli.generate then runs what it resolved.

Flags are mlx-lm generate's where the meaning is the same, with its
defaults: ``-m/--max-tokens`` (100), ``-p/--prompt`` (``-`` reads stdin;
``\\n`` and ``\\t`` escapes as mlx-lm reads them), ``--temp``, ``--top-p`` (1.0
= off), ``--min-p``, ``--top-k``, ``--seed``, ``--max-kv-size``,
``--kv-bits``, ``--kv-group-size``, ``--quantized-kv-start``,
``--draft-model``, ``--num-draft-tokens`` (3), ``--ignore-chat-template``.
treespec's own: ``--mode``, ``--block`` (the verify width: num-draft-tokens
+ 1, an alias; never both), ``--tree-branching``, ``--tree-parents``,
``--budget``, ``--width``, ``--batch-levels``, ``--draft-head``, ``--allow-inexact``,
``--blas``, ``--device``,
``--json``, ``--quiet``. Two defaults differ from mlx-lm's, on purpose: the prompt (the
built-in pair was trained on Python) and the seed (0, so that a sampled run
is reproducible; mlx-lm leaves MLX unseeded).
"""

import sys
from dataclasses import dataclass, field, replace
from typing import List

from ..errors import OptionError, UsageError
from ..distributed import flags as sharding_flags
from .flags import VERIFY_MODES, ints
from .startup import add_device_flag
from ..options import DEFAULT_BLOCK, MAX_DRAFT_NODES, DecodeOptions, KVOptions, Spelling

DEFAULT_PROMPT = "def fibonacci(n):\n    "
DEFAULT_MAX_TOKENS = 100  # mlx-lm generate's
MODES = ("classic", "chain", "tree", "auto")
SHAPE_FLAGS = (("block", "--num-draft-tokens/--block"), ("branching", "--tree-branching"),
               ("parents", "--tree-parents"), ("budget", "--budget"), ("width", "--width"))
KV_FLAGS = ("max_kv_size", "kv_bits", "kv_group_size", "quantized_kv_start")


@dataclass
class Resolved:
    """What the flags ask for: the decode options (``mode`` resolved; for
    ``--mode auto`` the sampling and length, the shape left to auto), how to
    name options in messages, the prompt text, and notes to print."""

    options: DecodeOptions
    spell: Spelling
    prompt: str
    auto: bool = False
    notes: List[str] = field(default_factory=list)


def add_parser(sub):
    g = sub.add_parser(
        "generate", help="decode a prompt (classic, chain or tree), mlx-lm's flags",
        description="Generate text: mlx-lm generate's flags and defaults where the meaning is "
        "the same; chain or tree speculative decoding with a draft model, exact to classic "
        "decoding wherever the exactness probe passed.")
    g.add_argument("--model", help="target mlx-lm checkpoint directory (default: the built-in "
                   "trained pair in treespec/pair/, with its drafter)")
    g.add_argument("--draft-model", help="draft mlx-lm checkpoint directory (with --model; "
                   "without one, --model alone decodes classically)")
    g.add_argument("--draft-head", default=None, metavar="mtp|DIR",
                   help="draft from a hidden-state head fed the target's own hidden states "
                   "instead of a draft model: 'mtp' (the MTP module in the --model checkpoint) "
                   "or a head directory (speculators EAGLE-3, or an MTP head); --mode chain, "
                   "or tree with a fixed shape or --budget/--width (EAGLE-2's dynamic tree)")
    g.add_argument("--mode", choices=MODES, default=None,
                   help="classic, chain or tree (tree is never chosen implicitly); auto picks "
                   "one from measured cost and acceptance. Default: chain with a draft model, "
                   "classic with --model alone")
    size = g.add_mutually_exclusive_group()
    size.add_argument("--num-draft-tokens", type=int, default=None,
                      help=f"draft tokens per round, mlx-lm's (default {DEFAULT_BLOCK - 1}); "
                      f"chain, and the confidence tree's budget when --budget is not given; "
                      f"at most {MAX_DRAFT_NODES}")
    size.add_argument("--block", type=int, default=None,
                      help="the chain's verify width, --num-draft-tokens + 1 (an alias)")
    g.add_argument("--tree-branching", type=ints, default=None,
                   help="--mode tree, fixed tree: children per node at each depth, e.g. 3,2,1")
    g.add_argument("--tree-parents", type=ints, default=None,
                   help="--mode tree, fixed tree: explicit parent list, e.g. -1,0,0,1")
    g.add_argument("--budget", type=int, default=None,
                   help="--mode tree, confidence tree: draft nodes per round "
                   f"(default: --num-draft-tokens; at most {MAX_DRAFT_NODES})")
    g.add_argument("--width", type=int, default=None,
                   help="--mode tree, confidence tree: top-k per expansion (default 4)")
    g.add_argument("--batch-levels", action="store_true",
                   help="--mode tree, fixed tree with a level of several fed nodes: draft "
                   "that level as batch rows of one token over copies of the draft caches "
                   "instead of one forward through the tree mask (same tree, same text)")
    g.add_argument("-m", "--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"most tokens to generate (default {DEFAULT_MAX_TOKENS}, mlx-lm's)")
    g.add_argument("-p", "--prompt", default=DEFAULT_PROMPT,
                   help="the prompt ('-' reads stdin; default: a Python line for the pair)")
    g.add_argument("--ignore-chat-template", action="store_true",
                   help="use the raw prompt even where the tokenizer has a chat template")
    g.add_argument("--temp", type=float, default=0.0,
                   help="sampling temperature; 0 (the default) is greedy, > 0 samples with "
                   "the distribution-exact tree rule")
    g.add_argument("--top-p", type=float, default=1.0, help="sampling top-p (1.0 = off)")
    g.add_argument("--min-p", type=float, default=0.0, help="sampling min-p (0 = off)")
    g.add_argument("--top-k", type=int, default=0, help="sampling top-k (0 = off)")
    g.add_argument("--seed", type=int, default=None,
                   help="sampling seed (default 0): a sampled run is reproducible from it")
    g.add_argument("--max-kv-size", type=int, default=None,
                   help="bound the KV cache (mlx-lm's RotatingKVCache, keep=4)")
    g.add_argument("--kv-bits", type=int, default=None,
                   help="quantize the KV cache to this many bits (mlx-lm's)")
    g.add_argument("--kv-group-size", type=int, default=None,
                   help="with --kv-bits: group size (default 64, mlx-lm's)")
    g.add_argument("--quantized-kv-start", type=int, default=None,
                   help="with --kv-bits: quantize from this position on (default 5000, "
                   "mlx-lm's)")
    g.add_argument("--allow-inexact", action="store_true",
                   help="run chain/tree even where the exactness probe found differences")
    g.add_argument("--verify", choices=VERIFY_MODES, default="flat",
                   help="how the target verifies a round: flat (one forward over the flattened "
                   "tree, default), rows (the row-invariant verify: every node's attention "
                   "over exactly its own keys, what a one-token step computes; "
                   "docs/verify.md#the-row-invariant-verify), kernels (rows, its linear layers "
                   "computed by CUDA kernels in the one-row kernels' order, the weights read once) "
                   "or chunks (rows, its linear layers in calls of at most the rows the census "
                   "measures this backend's products keep: any backend)")
    g.add_argument("--blas", choices=("auto", "reference", "openblas"), default="auto",
                   help="CPU BLAS: re-executes with Debian's OpenBLAS preloaded, or without it")
    add_device_flag(g)
    sharding_flags.add(g, check_ranks=True)
    out = g.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="one JSON object: text, tokens, diagnostics")
    out.add_argument("--quiet", action="store_true", help="print the generated text only")
    g.set_defaults(check=resolve)
    return g


def spelling(args, mode_note: str = "") -> Spelling:
    """Options named by the flags this command line gave them."""
    block = ("--block", lambda b: b) if args.block is not None else \
        ("--num-draft-tokens", lambda b: b - 1)
    flags = {"temperature": ("--temp", lambda v: v), "block": block,
             "branching": ("--tree-branching", lambda v: v),
             "parents": ("--tree-parents", lambda v: v)}
    return Spelling(flags, {"classic": mode_note} if mode_note else None)


def read_prompt(text: str) -> str:
    """mlx-lm generate's reading: ``\\n`` and ``\\t`` escapes, ``-`` for stdin."""
    text = text.replace("\\n", "\n").replace("\\t", "\t")
    return sys.stdin.read() if text == "-" else text


def resolve(args) -> Resolved:
    """Every flag checked (UsageError naming the flag), into ``args.resolved``."""
    notes = []
    if args.draft_model is not None and args.model is None:
        raise UsageError("--draft-model given without --model")
    head = args.draft_head is not None
    mode, note = args.mode, ""
    if mode is None:
        if args.model is not None and args.draft_model is None and not head:
            mode, note = "classic", " (--model alone: no --draft-model given)"
            notes.append("--model without --draft-model: classic decoding (mlx-lm's "
                         "generate_step); give --draft-model for chain or tree")
        else:
            mode = "chain"
    spell = spelling(args, note)
    block = args.block if args.block is not None else (
        None if args.num_draft_tokens is None else args.num_draft_tokens + 1)
    common = dict(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k,
                  top_p=args.top_p, min_p=args.min_p, seed=args.seed,
                  # the built-in pair's drafter is implied, except in classic mode
                  draft_model=args.draft_model is not None or (
                      args.model is None and mode != "classic" and not head),
                  draft_head=head,
                  allow_inexact=args.allow_inexact,
                  kv=KVOptions(args.max_kv_size, args.kv_bits, args.kv_group_size,
                               args.quantized_kv_start))
    shape = dict(block=block, branching=args.tree_branching, parents=args.tree_parents,
                 budget=args.budget, width=args.width)
    auto = mode == "auto"
    sharding = "--sharded" if sharding_flags.way(args) else None
    if head and (auto or sharding is not None):
        raise UsageError(f"--draft-head with {'--mode auto' if auto else sharding}: "
                         "not supported; give --mode chain or tree on one process")
    if args.verify != "flat" and (mode in ("classic", "auto") or sharding is not None):
        why = ({"classic": "classic decoding verifies no draft",
                "auto": "--mode auto calibrates the flat verify"}.get(mode)
               or f"{sharding}'s linears are sharded, which it does not run by rows")
        raise UsageError(f"--verify {args.verify} with "
                         f"{'--mode ' + mode if sharding is None else sharding}:"
                         f" {why}; give --mode chain or tree")
    if auto and sharding is not None:
        # Its calibration is timed on each rank: the ranks would choose apart.
        raise UsageError(f"{sharding}: --mode auto calibrates by timing on each rank, and the "
                         "ranks could choose different shapes; give --mode chain or tree")
    if auto:
        if args.temp != 0:
            raise UsageError(f"--mode auto calibrates greedy decoding; at --temp {args.temp:g} "
                             "pick --mode chain or --mode tree")
        for name, flag in SHAPE_FLAGS:
            if shape[name] is not None:
                raise UsageError(f"{flag} sets a shape, and --mode auto chooses the shape "
                                 "itself; give --mode chain or tree to set one")
        if args.batch_levels:
            raise UsageError("--batch-levels sets how a fixed tree drafts, and --mode auto "
                             "chooses the shape itself; give --mode tree with a fixed shape")
        for name in KV_FLAGS:
            if getattr(common["kv"], name) is not None:
                raise UsageError(f"{spell(name)}: --mode auto calibrates with mlx-lm's "
                                 "default caches; give --mode chain or tree with KV options")
        options = DecodeOptions(mode="chain", **common)
    else:
        options = DecodeOptions(mode=mode, **common, **shape, batch_levels=args.batch_levels)
    try:
        options.check(spell)
    except OptionError as e:
        raise UsageError(str(e))
    if auto and not options.draft_model:
        raise UsageError("--mode auto needs a draft model (--draft-model)")
    args.resolved = Resolved(options, spell, read_prompt(args.prompt), auto, notes)
    return args.resolved


def chosen(options: DecodeOptions, kwargs: dict) -> DecodeOptions:
    """The options of what ``--mode auto`` chose (``kwargs``: its decode
    keyword arguments, treespec.auto.choose.decode_kwargs)."""
    mode = kwargs["mode"]
    shape = {k: kwargs.get(k) for k in ("block", "branching", "parents", "budget", "width")}
    return replace(options, mode=mode, draft_model=mode != "classic",
                   allow_inexact=options.allow_inexact and mode != "classic", **shape)


def decode_kwargs(options: DecodeOptions) -> dict:
    """``treespec.decoding.decode``'s keyword arguments for these options (the
    ones given; the models, prompt and EOS ids are the caller's)."""
    out = dict(mode=options.mode, max_tokens=options.max_tokens,
               temperature=options.temperature, top_k=options.top_k, top_p=options.top_p,
               min_p=options.min_p, allow_inexact=options.allow_inexact)
    for name in ("seed", "block", "branching", "parents", "budget", "width"):
        if getattr(options, name) is not None:
            out[name] = getattr(options, name)
    for name in KV_FLAGS:
        if getattr(options.kv, name) is not None:
            out[name] = getattr(options.kv, name)
    if options.batch_levels:
        out["batch_levels"] = True
    return out
