"""``treespec generate``'s run, once its flags have passed their checks
(treespec.cli.generate_args): load the checkpoints, encode the prompt as
mlx-lm generate does, decode, print.

Output: the text, ``--``, one diagnostics line per field (fields that do not
apply to the mode are left out), then a final line: tokens, tok/s, and the
gate's decision with the probe's cost when it was paid. ``--json``: one JSON
object on stdout (the final line goes to stderr); ``--quiet``: the text only.
"""

import json
import sys
import time
import warnings

from ..auto.choose import ChooseOptions, choose
from ..auto.predict import decode_kwargs as auto_kwargs
from ..backend.blas import describe, detect
from ..checkpoints import check_same_tokenizer, default_pair, load_checkpoint
from ..decoding import check, decode, detokenize
from ..distributed import group as dist, shard
from ..errors import OptionError, TreeRefused, UsageError
from ..heads.load import load_head
from .generate_args import chosen as auto_options, decode_kwargs
from ..models import PositionWarning
from .process import prepare
from .startup import settings
from .rows import chunks_plan, rows_cap, verify_adapter


def encode_prompt(tokenizer, text: str, ignore_chat_template: bool = False):
    """mlx-lm generate's encoding: through the tokenizer's chat template when
    it has one (as the user's message), else the raw text."""
    if not ignore_chat_template and getattr(tokenizer, "has_chat_template", False):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             tokenize=False, add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(text)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items() if x is not None)
    return str(v)


# Round statistics: nothing to say of a run that verified no draft.
SPECULATIVE_FIELDS = ("rounds", "proposed", "accepted", "zero_accept_rounds",
                      "partial_accept_rounds", "full_accept_rounds", "depth_reached",
                      "depth_accepted", "acceptance", "emitted_per_verify",
                      "per_depth_acceptance", "effective")


def _empty(v) -> bool:
    return v is None or v == [] or v == {} or (
        isinstance(v, dict) and all(x is None for x in v.values()))


def format_diagnostics(summary: dict) -> str:
    """One line per field that applies (None and empty fields, and round
    statistics of a run that drafted nothing, are left out); the inexact
    warning, when there is one, first."""
    lines = []
    gate = summary.get("gate") or {}
    if gate and not gate.get("exact"):
        lines.append(f"WARNING: {gate.get('reason')}")
    drafted = bool(summary.get("proposed"))
    for k, v in summary.items():
        if _empty(v) or (not drafted and k in SPECULATIVE_FIELDS):
            continue
        if k == "time_ms" and not drafted:
            v = {t: ms for t, ms in v.items() if ms}
        if k == "gate":
            v = f"{'exact' if v['exact'] else 'INEXACT'}; {v['reason']}"
        lines.append(f"{k}: {_fmt(v)}")
    return "\n".join(lines)


def gate_words(summary: dict) -> str:
    """The gate's decision and what the probe cost, in a few words."""
    gate = summary.get("gate")
    if not gate:
        return "gate: not needed (classic decoding)"
    where = ""
    if gate.get("probe_seconds"):  # paid in this run (in every cache mode it probed)
        where = f", probe {gate['probe_seconds']:.1f} s" + (
            " (memoized)" if gate.get("probe_memo") else "")
    elif gate.get("probe_source") == "disk memo":
        where = ", probe read from its memo"
    if not gate["run"]:
        return f"gate: declined, ran classic{where}"
    return f"gate: {'exact' if gate['exact'] else 'INEXACT (--allow-inexact)'}{where}"


def final_line(summary: dict, n_tokens: int, seconds: float) -> str:
    """Tokens, tok/s (wall of the decode, the probe's time left out: it is
    given on its own), and the gate's decision."""
    probe = (summary.get("gate") or {}).get("probe_seconds") or 0.0
    run = max(seconds - probe, 1e-9)
    return (f"{n_tokens} tokens in {run:.2f} s, {n_tokens / run:.1f} tok/s "
            f"({summary['mode']}); {gate_words(summary)}")




def _load(args, options, group=None):
    model_path, draft_path = args.model, args.draft_model
    if model_path is None:
        model_path, draft_path = default_pair()
    if group is None:
        target, tokenizer = load_checkpoint(model_path, "model")
    else:  # the target sharded across the ranks; the drafter whole on each
        try:
            target, tokenizer = shard.load(model_path, group, how=args.sharded)
        except OptionError as e:
            raise UsageError(str(e))
    draft = None
    if options.draft_head:
        try:
            return target, load_head(args.draft_head, target, model_path), tokenizer, \
                model_path, args.draft_head
        except OptionError as e:
            raise UsageError(str(e))
    if options.mode != "classic" or args.resolved.auto:
        draft, draft_tok = load_checkpoint(draft_path, "draft-model")
        check_same_tokenizer(tokenizer, draft_tok, target, draft)
    return target, draft, tokenizer, model_path, draft_path


def _sharding(args):
    return "--sharded" if args.sharded else None


def cmd_generate(args) -> int:
    resolved = args.resolved
    options, spell, say = resolved.options, resolved.spell, not args.quiet
    prepare(args.blas, quiet=args.quiet)
    paths = (args.model, args.draft_model) if args.model is not None else default_pair()
    try:
        group, ranks = dist.start(_sharding(args), "--sharded", sys.argv[1:],
                                  paths, args.check_ranks)
    except OptionError as e:
        raise UsageError(str(e))
    say = say and (group is None or group.rank() == 0)  # rank 0 prints
    for note in resolved.notes:
        if say:
            print(f"note: {note}", file=sys.stderr)
    target, draft, tokenizer, model_path, draft_path = _load(args, options, group)
    prompt = encode_prompt(tokenizer, resolved.prompt, args.ignore_chat_template)
    chosen = None
    if resolved.auto:
        chosen = choose(target, draft, options=ChooseOptions(allow_inexact=options.allow_inexact),
                        tokenizer=tokenizer)
        options = auto_options(options, auto_kwargs(chosen))
    kwargs = decode_kwargs(options)
    if args.verify != "flat":
        plan = (chunks_plan(target, options.draft_nodes(), options.allow_inexact)
                if args.verify == "chunks" else None)
        kwargs["adapter"], kwargs["adapter_name"] = verify_adapter(target, args.verify, plan)
        cap = None
        if args.verify == "rows":
            cap = rows_cap(target, options.draft_nodes(), options.allow_inexact)
        elif plan is not None:
            cap = plan.cap
            if say:
                print(f"note: {plan.line()}", file=sys.stderr)
        else:  # kernels: the census's linear rows are MLX's, not the kernels'; no cap (the
            # gate measures the verify at each round's width either way)
            left = kwargs["adapter"].covered()
            if left and say:
                print(f"note: --verify kernels: {len(left)} linear layers run through MLX's "
                      f"own kernels ({left[0][0]}: {left[0][1]}); the gate measures them",
                      file=sys.stderr)
        if cap is not None:
            kwargs["max_nodes"], why = cap
            if say:
                print(f"note: --verify {args.verify}: rounds verify at most {cap[0]} nodes, the "
                      f"most this backend keeps a row's bits for ({why})", file=sys.stderr)
    if group is not None:
        kwargs.update(dist.decode_kwargs(ranks))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PositionWarning)
        try:
            check(options, target, None if options.draft_head else draft, len(prompt), spell)
        except OptionError as e:
            raise UsageError(str(e))
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)  # shown even with --quiet
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PositionWarning)  # said above, once
            drafting = kwargs["mode"] != "classic"
            result = decode(target, prompt, draft_model=draft if drafting and not
                            options.draft_head else None,
                            draft_head=draft if drafting and options.draft_head else None,
                            eos_token_ids=list(tokenizer.eos_token_ids), **kwargs)
        if ranks is not None:
            ranks.final(result.tokens)
    except TreeRefused as e:
        raise UsageError(f"the target refuses tree verification: {e}")
    except dist.RankDivergence as e:
        raise UsageError(f"--check-ranks: {e}")
    except ValueError as e:  # refusals of sampling, rollback and options
        raise UsageError(str(e))
    seconds = time.perf_counter() - t0
    # mlx-lm's own streaming detokenizer, so the text is what mlx_lm.generate prints.
    text = detokenize(tokenizer, result.tokens)
    summary = result.stats.summary()
    summary["model"] = str(model_path)
    if kwargs["mode"] != "classic":
        summary["draft_head" if options.draft_head else "draft_model"] = str(draft_path)
    if chosen is not None:  # auto's reason, said once, here
        summary["auto"] = {"chose": auto_kwargs(chosen), "reason": chosen["reason"]}
    summary.update(settings())  # the device and TF32: which device made this record, how
    summary["blas"] = describe(detect())
    summary["verify"] = args.verify
    if group is not None:
        summary["distributed"] = {"ranks": group.size(), "sharding": args.sharded,
                                  "check_ranks": ranks is not None}
        if group.rank() != 0:  # rank 0 prints
            return 0
    last = final_line(summary, len(result.tokens), seconds)
    if args.json:
        print(json.dumps({"text": text, "tokens": result.tokens, "diagnostics": summary,
                          "seconds": seconds}))
        print(last, file=sys.stderr)
    elif args.quiet:
        print(text)
    else:
        print(text)
        print("--")
        print(format_diagnostics(summary))
        print(last)
    return 0
