"""``treespec bench``'s run (its flags are treespec.cli.main's): the pair it runs
on, and its printed report (the measurements are treespec.bench.measure's)."""

import json
import sys
import time

from ..auto import choose as auto
from . import head_rows, scaled
from .measure import (PROMPTS, BenchOptions, auto_config, bench, build_configs,
                      describe_choice)
from .report import format_curve, format_report, machine_info, write_plots
from .shared_probe import SharedProbe
from ..checkpoints import check_same_tokenizer, default_pair, load_checkpoint
from ..auto.costcurve import verify_cost_curve
from ..decoding import batch_levels_refusal
from ..draft.head import head_refusal
from ..heads.load import load_head
from ..distributed import flags as sharding_flags, group as dist, shard
from ..errors import OptionError, UsageError
from ..models import n_params
from ..options import KVOptions, Spelling
from ..cli.process import prepare
from ..cli.rows import chunks_plan, verify_adapter

CURVE_TS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64)


def cmd_bench(args) -> int:
    prepare(args.blas)
    t_start = time.perf_counter()
    # --max-seconds bounds the whole command: from here, not from the timed runs.
    deadline = None if args.max_seconds is None else t_start + args.max_seconds
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else \
        (lambda s: print(s, flush=True))
    how = sharding_flags.way(args)
    # Under --sharded every rank must run the same forwards in the same order:
    # nothing that times a rank may choose what runs (docs/distributed.md).
    if args.max_seconds is not None:
        sharding_flags.refuse_with(how, "--max-seconds", "it stops the bench by each rank's "
                                   "own clock, so the ranks could stop at different runs")
    if not args.no_auto:
        sharding_flags.refuse_with(how, sharding_flags.FLAG, "bench's auto row is chosen by "
                                   "timing on each rank, so the ranks could choose different "
                                   "shapes", "add --no-auto")
    if args.plot:  # fail before minutes of measuring, not after
        try:
            import matplotlib  # noqa: F401  (an optional dependency)
        except ImportError:
            raise UsageError("--plot needs matplotlib, which is not installed: pip install matplotlib")
    model_path, draft_path = args.model, args.draft_model
    if args.scaled is not None and (model_path or draft_path):
        raise UsageError("--scaled builds its own pair; give it without --model/--draft-model")
    if model_path is None and args.scaled is None:
        if draft_path is not None:
            raise UsageError("--draft-model given without --model")
        model_path, draft_path = default_pair()
    elif draft_path is None and args.scaled is None:
        raise UsageError("--model given without --draft-model: bench compares speculative modes")
    if args.width is not None and args.no_confidence and args.no_auto and not args.draft_head:
        raise UsageError("--width sets the confidence trees' width, and --no-confidence with "
                         "--no-auto leaves no confidence tree to run")
    width = 4 if args.width is None else args.width
    # The table's rows depend on the flags alone: built before any model.
    configs = build_configs(args.blocks, args.trees, width, mlx_lm=not args.no_mlx_lm,
                            confidence=not args.no_confidence, batch_levels=args.batch_levels,
                            verify=args.verify)
    try:
        heads = head_rows.parse_specs(args.draft_head)
    except ValueError as e:
        raise UsageError(f"--draft-head: {e}")
    if heads and args.scaled is not None:
        raise UsageError("--draft-head with --scaled: the scaled pair's random target has no "
                         "head made for it; give --draft-head with the built-in pair or --model")
    if heads and how is not None:
        raise UsageError(f"--draft-head with {sharding_flags.FLAG}: not supported (a head "
                         "drafts on one process, as generate's); leave one of them out")
    configs = head_rows.with_heads(configs, heads, args.blocks, args.trees, width)
    if args.bits is not None and args.scaled is None:
        raise UsageError("--bits quantizes the --scaled pair; a checkpoint keeps its own "
                         "quantization (give --bits with --scaled)")
    if args.scaled_dtype is not None and args.scaled is None:
        raise UsageError("--scaled-dtype sets the --scaled pair's dtype; a checkpoint keeps its "
                         "own (give --scaled-dtype with --scaled)")
    if args.scaled is not None:
        scaled_refusal(*args.scaled, args.draft_layers, args.alpha, args.bits)
    if args.batch_levels and not any(c.batch_levels for c in configs):
        raise UsageError("--batch-levels: no tree of --trees feeds a level of two or more "
                         "nodes (their nodes with children form one chain each): nothing to "
                         "batch")
    if args.prompts < 1 or args.prompts > len(PROMPTS):
        raise UsageError(f"--prompts must be 1..{len(PROMPTS)}")
    try:
        group, _ = dist.start(how and sharding_flags.FLAG, sharding_flags.FLAG, sys.argv[1:],
                              (model_path, draft_path))
    except OptionError as e:
        raise UsageError(str(e))
    if group is not None and group.rank() != 0:  # rank 0 prints
        say = lambda s: None  # noqa: E731
    machine = machine_info()
    attention = f"; {machine['attention']}" if "attention" in machine else ""  # CUDA only
    say(f"machine: {machine['blas']}; mlx {machine['mlx']}, mlx-lm {machine.get('mlx_lm')}, "
        f"{machine['device']}, {machine['cpus']} CPUs, load {machine.get('loadavg')}; "
        f"treespec git {machine['git']}{attention}")
    auto_prompts = tokenizer = None
    if args.scaled is not None:
        hidden, layers = args.scaled
        dtype = args.scaled_dtype or "bfloat16"
        target, draft = scaled.build_pair(hidden, layers, args.draft_layers, args.alpha,
                                          dtype=dtype, bits=args.bits)
        if group is not None:  # seeded: the same weights on every rank, then sharded
            target = _sharded(lambda: shard.shard(target, group, how))
        # Random weights know no text: seeded token prompts, no EOS; auto
        # calibrates on prompts of its own, as with the trained pair.
        prompts = scaled.default_prompts(args.prompts + 2)
        prompts, auto_prompts = prompts[: args.prompts], prompts[args.prompts:]
        eos = []
        q = "" if args.bits is None else f" {args.bits}-bit"
        pair = (f"scaled llama {hidden}x{layers} {dtype}{q} ({n_params(target) / 1e9:.2f}B), "
                f"drafter its first {args.draft_layers} layers "
                f"({n_params(draft) / 1e9:.2f}B), alpha {args.alpha}")
        report_extra = {"machine": machine, "model": pair, "draft_model": pair,
                        "prompts_text": None}
        say(f"pair: {pair}")
    else:
        if group is None:
            target, tokenizer = load_checkpoint(model_path, "model")
        else:  # the target sharded across the ranks; the drafter whole on each
            target, tokenizer = _sharded(lambda: shard.load(model_path, group, how=how))
        draft, draft_tok = load_checkpoint(draft_path, "draft-model")
        check_same_tokenizer(tokenizer, draft_tok, target, draft)
        say(f"pair: target {model_path}, draft {draft_path}")
        texts = PROMPTS[: args.prompts]
        prompts = [tokenizer.encode(t) for t in texts]
        eos = list(tokenizer.eos_token_ids)
        report_extra = {"machine": machine, "model": str(model_path),
                        "draft_model": str(draft_path), "prompts_text": texts}
        if heads:
            _load_heads(configs, heads, target, model_path)
            report_extra["draft_heads"] = heads

    curve = None
    if args.verify_curve and deadline is not None and time.perf_counter() > deadline:
        say("verify curve skipped: --max-seconds spent")
    elif args.verify_curve:
        t0 = time.perf_counter()
        curve = verify_cost_curve(target, CURVE_TS, context=64, repeats=7, warmup=2)
        say(format_curve(curve, f"target, {time.perf_counter() - t0:.1f}s"))
        report_extra["verify_curve"] = curve

    for mode in args.verify:
        if mode == "flat":
            continue
        plan = None
        if mode == "chunks":  # the width the census measures for the largest row's round
            nodes = max([c.budget for c in configs if c.verify == mode] or [1])
            plan = chunks_plan(target, nodes, allow_inexact=True)
            say(plan.line())
        adapter, name = verify_adapter(target, mode, plan)
        for c in configs:
            if c.verify == mode:
                c.adapter, c.adapter_name = adapter, name
    if args.batch_levels:
        why = batch_levels_refusal(draft, KVOptions(), Spelling({}))
        if why is not None:
            raise UsageError(why)
    gate = SharedProbe()
    if not args.no_auto:
        t0 = time.perf_counter()
        knobs = auto.ChooseOptions(max_block=max(args.blocks), trees=args.trees, width=width,
                                   allow_inexact=args.allow_inexact)
        choice = auto.choose(target, draft, auto_prompts, knobs, tokenizer=tokenizer,
                             eos_token_ids=eos, decide=gate, log=lambda s: say("  " + s),
                             deadline=deadline)
        say(f"auto ({time.perf_counter() - t0:.1f}s calibration): {describe_choice(choice)}: "
            f"{choice['reason']}")
        report_extra["auto"] = {k: v for k, v in choice.items()}
        configs.append(auto_config(choice))
        if curve is None:
            curve = choice.get("details", {}).get("curve")

    say(f"bench: {len(configs)} configurations x {len(prompts)} prompts x {args.max_tokens} "
        f"tokens, {args.repeats} interleaved repeats")
    report = bench(target, draft, prompts, configs,
                   BenchOptions(max_tokens=args.max_tokens, repeats=args.repeats, eos=eos,
                                allow_inexact=args.allow_inexact),
                   deadline=deadline, decide=gate, log=say)
    report.update(report_extra)
    report["seconds"] = time.perf_counter() - t_start
    if group is not None:
        try:  # every rank emitted the same tokens and took the same verdicts
            dist.same_result(group, _outcome(report), "bench rows (verdicts, tokens, rounds)")
        except dist.RankDivergence as e:
            raise UsageError(f"{sharding_flags.FLAG}: {e}")
        report["distributed"] = {"ranks": group.size(), "sharding": how}
        if group.rank() != 0:  # rank 0 prints
            return 0
    if args.plot:
        report["plots"] = write_plots(report, args.plot, curve)
    if args.json:
        print(json.dumps(report, default=str))
    else:
        print()
        what = "seeded token" if args.scaled else "Python"
        print(f"{len(prompts)} {what} prompts x {args.max_tokens} tokens, median of "
              f"{report['repeats']} interleaved repeats; {machine['blas']}; mlx {machine['mlx']}; "
              f"git {machine['git']}{attention}")
        print(format_report(report))
        if "auto" in report:
            print(f"\nauto chose {describe_choice(report['auto'])}: {report['auto']['reason']}")
        for p in report.get("plots", []):
            print(f"wrote {p}")
        print(f"({report['seconds']:.0f} s)")
    return 0


def _load_heads(configs, heads, target, model_path):
    """Each --draft-head's head for ``target``, set on its rows; a head that
    does not fit is refused naming the flag (treespec.heads.load)."""
    for spec in heads:
        try:
            head = load_head(spec, target, model_path)
        except OptionError as e:
            raise UsageError(str(e))
        why = head_refusal(head, target)
        if why is not None:
            raise UsageError(f"--draft-head {spec}: {why}")
        for c in configs:
            if getattr(c, "head", None) == spec:
                c.head_model = head


def _sharded(load):
    try:
        return load()
    except OptionError as e:
        raise UsageError(str(e))


def _outcome(report: dict) -> str:
    """What every rank of a sharded bench must have found alike (timings
    are each rank's own)."""
    keys = ("name", "exact", "checks", "reason", "tokens", "rounds", "acceptance")
    return json.dumps([[r.get(k) for k in keys] for r in report["rows"]])


def scaled_refusal(hidden: int, layers: int, draft_layers: int, alpha: float, bits) -> None:
    """UsageError naming the flag when ``--scaled`` cannot build its pair, before
    anything is built."""
    if not 0 < draft_layers < layers:
        raise UsageError(f"--draft-layers must be in 1..{layers - 1} for --scaled "
                         f"{hidden}x{layers} (the drafter is the target's first layers), "
                         f"got {draft_layers}")
    if not 0 < alpha <= 1:
        raise UsageError(f"--alpha must be in (0, 1], got {alpha:g}")
    if bits is not None and hidden % 64:
        raise UsageError(f"--bits {bits} quantizes in groups of 64: --scaled's hidden size must "
                         f"be a multiple of 64, got {hidden}")
