"""`treespec generate | bench | audit`."""

import argparse
import json
import sys

import mlx.core as mx

from . import audit, bench_cli
from .auto import choose, decode_kwargs
from .blas import BlasUnavailable, describe, detect, ensure_blas
from .checkpoints import check_same_tokenizer, default_pair, load_checkpoint
from .cuda_env import prefer_mlx_attention
from .decode import decode, detokenize
from .errors import TreeRefused, UsageError


def _ints(text: str):
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def cmd_generate(args) -> int:
    model_path, draft_path = args.model, args.draft_model
    if model_path is None:
        if draft_path is not None:
            raise UsageError("--draft-model given without --model")
        model_path, draft_path = default_pair()
    target, tokenizer = load_checkpoint(model_path, "model")
    draft = None
    if args.mode != "classic":
        if draft_path is None:
            raise UsageError(f"--mode {args.mode} needs --draft-model")
        draft, draft_tok = load_checkpoint(draft_path, "draft-model")
        check_same_tokenizer(tokenizer, draft_tok, target, draft)
    prompt = tokenizer.encode(args.prompt)
    shape = dict(mode=args.mode, block=args.block, branching=args.tree_branching,
                 parents=args.tree_parents, budget=args.budget, width=args.width)
    chosen = None
    if args.mode == "auto":
        if args.temp > 0:
            raise UsageError("--mode auto calibrates greedy decoding; pick chain or tree with --temp")
        chosen = choose(target, draft, tokenizer=tokenizer, allow_inexact=args.allow_inexact)
        print(f"treespec: auto chose {decode_kwargs(chosen)}: {chosen['reason']}", file=sys.stderr)
        shape = {**dict(block=args.block, branching=None, parents=None, budget=None,
                        width=args.width), **decode_kwargs(chosen)}
    try:
        result = decode(target, prompt, draft_model=draft,
                        max_tokens=args.max_tokens,
                        eos_token_ids=list(tokenizer.eos_token_ids), **shape,
                        allow_inexact=args.allow_inexact, temperature=args.temp,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    except TreeRefused as e:
        raise UsageError(f"the target refuses tree verification: {e}")
    except ValueError as e:  # SamplingRefused and bad option combinations
        raise UsageError(str(e))
    # mlx-lm's own streaming detokenizer, so the text is what mlx_lm.generate prints.
    text = detokenize(tokenizer, result.tokens)
    summary = result.stats.summary()
    summary["model"], summary["draft_model"] = str(model_path), draft_path and str(draft_path)
    summary["device"] = str(mx.default_device())
    if chosen is not None:
        summary["auto"] = {"chose": decode_kwargs(chosen), "reason": chosen["reason"]}
    summary["blas"] = describe(detect())
    if args.json:
        print(json.dumps({"text": text, "tokens": result.tokens, "diagnostics": summary}))
    else:
        print(text)
        print("--")
        print(format_diagnostics(summary))
    return 0


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


def format_diagnostics(summary: dict) -> str:
    """One line per field; the inexact warning, when there is one, first."""
    lines = []
    gate = summary.get("gate") or {}
    if gate and not gate.get("exact"):
        lines.append(f"WARNING: {gate.get('reason')}")
    for k, v in summary.items():
        if k == "gate" and v:
            v = f"{'exact' if v['exact'] else 'INEXACT'}; {v['reason']}"
        lines.append(f"{k}: {_fmt(v)}")
    return "\n".join(lines)


def build_parser():
    ap = argparse.ArgumentParser(prog="treespec", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="decode a prompt (classic, chain or tree)")
    g.add_argument("--model", help="target mlx-lm checkpoint directory (default: the zoo pair)")
    g.add_argument("--draft-model", help="draft mlx-lm checkpoint directory")
    g.add_argument("--mode", choices=("classic", "chain", "tree", "auto"), default="chain",
                   help="tree drafting is off unless asked for (default: chain); auto picks "
                        "chain or tree and its size from measured verify cost and acceptance")
    g.add_argument("--block", type=int, default=4, help="chain verify width (drafts + 1)")
    g.add_argument("--tree-branching", type=_ints, default=None,
                   help="fixed tree: children per node at each depth, e.g. 3,2,1")
    g.add_argument("--tree-parents", type=_ints, default=None,
                   help="fixed tree: explicit parent list, e.g. -1,0,0,1")
    g.add_argument("--budget", type=int, default=None,
                   help="confidence tree: draft nodes per round (default: block - 1)")
    g.add_argument("--width", type=int, default=4, help="confidence tree: top-k per expansion")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--prompt", default="def fibonacci(n):\n    ")
    g.add_argument("--json", action="store_true", help="one JSON object: text, tokens, diagnostics")
    g.add_argument("--temp", type=float, default=0.0,
                   help="temperature; > 0 samples with the distribution-exact tree rule")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0, help="sampling seed: a run is reproducible from it")
    g.add_argument("--allow-inexact", action="store_true",
                   help="run chain/tree even where the exactness probe found differences")
    g.add_argument("--blas", choices=("auto", "reference", "openblas"), default="auto",
                   help="CPU BLAS: re-executes with Debian's OpenBLAS preloaded, or without it")
    g.set_defaults(func=cmd_generate)
    # Each other command lives in its own module and adds its own parser.
    audit.add_parser(sub)
    bench_cli.add_parser(sub)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if note := prefer_mlx_attention():  # before any forward: MLX reads it once
        print(f"note: {note}", file=sys.stderr)
    try:
        if getattr(args, "blas", "auto") != "auto":
            try:
                ensure_blas(args.blas)  # may re-execute this very command
            except BlasUnavailable as e:
                raise UsageError(str(e))
        return args.func(args)
    except UsageError as e:
        print(f"treespec {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
