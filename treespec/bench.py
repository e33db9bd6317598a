"""`treespec bench`: throughput of classic, chain, tree, auto and mlx-lm's own
speculative decoding on one machine, each figure next to the exactness checks
it passed in the same run (contract 10).

    treespec bench                              # the trained pair, this BLAS
    treespec bench --verify-curve --plot out/   # + forward cost for T=1..64, PNGs
    treespec bench --blas openblas --json

Configurations (all greedy, temperature 0):

- ``classic``: mlx-lm's ``generate_step`` (the reference every text is diffed with);
- ``chain b=B``: treespec's chain for each block B of ``--blocks``;
- ``fixed [2,2,1]`` / ``fixed p[-1,0,0,1,1]``: fixed top-k topologies, branching or parent
  lists (``--trees``);
- ``conf n=N``: the confidence-driven tree at node budget N = B - 1 for each block;
- ``mlx-lm b=B``: ``mlx_lm.generate.speculative_generate_step`` (what ``stream_generate``
  runs when given a draft model) with ``num_draft_tokens = B - 1``;
- ``auto``: what :func:`treespec.auto.choose` picks after a short calibration on its
  own prompts (not the bench's).

Gating: every speculative configuration first passes the exactness probe (the
gate's per-shape measurement over its drafter's ``probe_shapes()``, shared across
configurations by :class:`SharedProbe`; mlx-lm's chain verify is probed with the
chain shapes of its block), then, in every timed run, its tokens are compared
with classic's on the same prompt. A configuration failing either prints its
reason and no figure; a figure that stands says ``probe+text``.

Timing: runs are interleaved (round robin over the configurations within each
repeat, the order rotated per repeat) and figures are medians over repeats;
speedups are medians of per-repeat ratios, so a slow stretch of a shared CPU hits
numerator and denominator alike. ``tok/s`` is end to end; ``decode tok/s``
subtracts each prompt's prefill (target, and draft for speculative rows, measured
apart), which at a few dozen tokens is a large share of a run; speedups use decode
tok/s. ``cpu/tok`` (process CPU time per token) is the figure least moved by other
processes on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from .bench_report import EXACT, format_curve, format_report, machine_info, write_plots
from .costcurve import parse_dims
from .draft import FixedTreeDrafter, fixed_shape, shape_name

# Python-code prompts for the trained pair (trained on CPython's stdlib). Each
# ends in a newline, not indentation spaces (treespec/pair/README.md says why).
PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def read_lines(path):\n    with open(path) as f:\n",
    "    def __repr__(self):\n",
    '"""Utilities for parsing command line arguments."""\n\nimport re\n',
    "for i in range(len(items)):\n",
    "try:\n    import threading\nexcept ImportError:\n",
    "    if not isinstance(value, str):\n",
]
FIXED_TREES = ((2, 1, 1), (2, 2, 1), (3, 1, 1, 1))
DEFAULT_BLOCKS = "2..8"


# ----------------------------------------------------------------------------- parsing


def parse_blocks(text: str) -> List[int]:
    """'2..8' -> [2..8]; '2,4,6' -> [2, 4, 6]; every block >= 2."""
    text = text.replace(" ", "")
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split(".."))
            blocks = list(range(lo, hi + 1))
        else:
            blocks = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--blocks wants LO..HI or a comma list, got {text!r}")
    if not blocks or min(blocks) < 2:
        raise argparse.ArgumentTypeError(f"--blocks needs blocks >= 2 (one draft at least), "
                                         f"got {text!r}")
    return sorted(set(blocks))


def parse_trees(text: str) -> List[tuple]:
    """'2,1,1 2,2,1' (or ';'-separated) -> [(2,1,1), (2,2,1)]; '' -> []. A part
    that starts with -1 is a parent list ('-1,0,0,1,1': the chain plus the
    second-best token at each depth); on the command line write it
    ``--trees="-1,0,0,1,1"``, or argparse takes it for an option."""
    out = []
    for part in text.replace(";", " ").split():
        try:
            t = tuple(int(x) for x in part.split(",") if x)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--trees wants branching lists like 2,2,1 or parent lists like -1,0,0,1, "
                f"got {part!r}")
        try:
            if not t:
                raise ValueError("an empty shape")
            FixedTreeDrafter(**fixed_shape(t))
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"--trees: {part!r}: {e}")
        out.append(t)
    return out


# ----------------------------------------------------------------------------- configurations


@dataclass
class Config:
    """One row of the table."""

    name: str
    kind: str  # classic | chain | fixed | confidence | mlx-lm | auto
    block: Optional[int] = None
    budget: int = 0  # draft nodes per round
    branching: Optional[tuple] = None  # fixed: branching factors or a parent list
    width: int = 4
    choice: Optional[dict] = None  # auto's choice
    # Tests substitute a runner: (target, draft, prompt, max_tokens, eos) -> Run.
    runner: Optional[Callable] = None
    shapes: Optional[list] = None  # probe shapes override (tests)

    @property
    def speculative(self) -> bool:
        return self.kind != "classic" and not (self.kind == "auto" and self.effective_kind() == "classic")

    def effective_kind(self) -> str:
        if self.kind != "auto":
            return self.kind
        c = self.choice or {}
        if c.get("mode") == "classic":
            return "classic"
        if c.get("mode") == "chain":
            return "chain"
        return "fixed" if c.get("branching") else "confidence"

    def decode_kwargs(self) -> dict:
        kind = self.effective_kind()
        if kind == "auto":
            raise AssertionError("unreachable")
        if self.kind == "auto":
            c = self.choice
            from .auto import decode_kwargs

            return decode_kwargs(c)
        if kind == "classic":
            return {"mode": "classic"}
        if kind in ("chain", "mlx-lm"):
            return {"mode": "chain", "block": self.block}
        if kind == "fixed":
            return {"mode": "tree", **fixed_shape(self.branching)}
        return {"mode": "tree", "budget": self.budget, "width": self.width}

    def drafter(self):
        from .draft import ChainDrafter, make_drafter

        if self.kind == "mlx-lm":
            return ChainDrafter(self.block)
        kw = self.decode_kwargs()
        mode = kw.pop("mode")
        if mode == "classic":
            return None
        return make_drafter(mode, **kw)

    def probe_shapes(self):
        if self.shapes is not None:
            return self.shapes
        d = self.drafter()
        return None if d is None else d.probe_shapes()


def build_configs(blocks: Sequence[int], trees: Sequence[tuple] = FIXED_TREES, width: int = 4,
                  mlx_lm: bool = True) -> List[Config]:
    configs = [Config("classic", "classic")]
    configs += [Config(f"chain b={b}", "chain", block=b, budget=b - 1) for b in blocks]
    for t in trees:
        n = FixedTreeDrafter(**fixed_shape(t)).budget()
        configs.append(Config(f"fixed {shape_name(t)}", "fixed", branching=tuple(t), budget=n))
    configs += [Config(f"conf n={b - 1}", "confidence", budget=b - 1, width=width) for b in blocks]
    if mlx_lm:
        configs += [Config(f"mlx-lm b={b}", "mlx-lm", block=b, budget=b - 1) for b in blocks]
    return configs


def auto_config(choice: dict) -> Config:
    return Config(f"auto ({describe_choice(choice)})", "auto", block=choice.get("block"),
                  budget=int(choice.get("budget") or 0), choice=choice,
                  branching=tuple(choice["branching"]) if choice.get("branching") else None,
                  width=int(choice.get("width") or 4))


def describe_choice(choice: dict) -> str:
    mode = choice.get("mode")
    if mode == "classic":
        return "classic"
    if mode == "chain":
        return f"chain b={choice['block']}"
    if choice.get("branching"):
        return f"fixed {shape_name(choice['branching'])}"
    return f"conf n={choice['budget']}"


# ----------------------------------------------------------------------------- one run


@dataclass
class Run:
    tokens: List[int]
    wall_s: float
    stats: Optional[dict] = None  # Stats.summary()-like: rounds, proposed, ..., time_ms
    cpu_s: Optional[float] = None  # process CPU time (all threads): robust to a busy machine


def _mlx_lm_run(target, draft, prompt, max_tokens, eos, block) -> Run:
    """mlx-lm's speculative decoding, greedy, stopping at EOS like classic;
    its rounds recovered from ``from_draft`` (a round ends with the target's
    own token)."""
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step

    eos = set(eos or ())
    nd = block - 1
    out: List[int] = []
    st = {"rounds": 0, "proposed": 0, "accepted": 0, "depth_accepted": [0] * nd,
          "depth_reached": [0] * nd, "time_ms": None}
    pending = {"acc": 0, "start": 0}

    def close_round():
        # mlx-lm drafts min(max_tokens - emitted, num_draft_tokens) per round
        drafted = max(min(nd, max_tokens - pending["start"]), pending["acc"])
        st["rounds"] += 1
        st["proposed"] += drafted
        st["accepted"] += pending["acc"]
        for d in range(drafted):
            st["depth_reached"][d] += 1
            st["depth_accepted"][d] += pending["acc"] > d
        pending.update(acc=0, start=len(out))

    t0 = time.perf_counter()
    for tok, _, from_draft in speculative_generate_step(
            mx.array(prompt), target, draft, num_draft_tokens=nd, max_tokens=max_tokens,
            sampler=lambda lp: mx.argmax(lp, axis=-1)):
        out.append(int(tok))
        if from_draft:
            pending["acc"] += 1
        else:
            close_round()
        if out[-1] in eos:
            break
    wall = time.perf_counter() - t0
    if pending["acc"]:  # cut inside a round (max_tokens or an EOS among the drafts)
        close_round()
    st["emitted"] = len(out)
    stats = st
    return Run(out, wall, stats)


def run_config(cfg: Config, target, draft, prompt, max_tokens, eos) -> Run:
    c0 = time.process_time()
    run = _run_config(cfg, target, draft, prompt, max_tokens, eos)
    run.cpu_s = time.process_time() - c0
    return run


def _run_config(cfg: Config, target, draft, prompt, max_tokens, eos) -> Run:
    if cfg.runner is not None:
        return cfg.runner(target, draft, prompt, max_tokens, eos)
    if cfg.kind == "mlx-lm":
        return _mlx_lm_run(target, draft, prompt, max_tokens, eos, cfg.block)
    from .decode import decode

    kw = cfg.decode_kwargs()
    t0 = time.perf_counter()
    # The gate ran (and passed) before the timed runs; decode's own gate would
    # hash the weights on every call, inside the timing.
    result = decode(target, prompt, draft_model=draft if kw["mode"] != "classic" else None,
                    max_tokens=max_tokens, eos_token_ids=eos, gate=False, **kw)
    wall = time.perf_counter() - t0
    s = result.stats
    stats = {"rounds": s.rounds, "proposed": s.proposed, "accepted": s.accepted,
             "emitted": s.emitted, "depth_accepted": list(s.depth_accepted),
             "depth_reached": list(s.depth_reached),
             "time_ms": dict(s.time_ms) if kw["mode"] != "classic" else None}
    return Run(list(result.tokens), wall, stats)


def _merge(stats_list: Sequence[dict]) -> dict:
    out = {"rounds": 0, "proposed": 0, "accepted": 0, "emitted": 0,
           "depth_accepted": [], "depth_reached": [], "time_ms": None}
    for s in stats_list:
        for k in ("rounds", "proposed", "accepted", "emitted"):
            out[k] += s[k]
        for k in ("depth_accepted", "depth_reached"):
            cur = out[k]
            cur += [0] * (len(s[k]) - len(cur))
            for i, v in enumerate(s[k]):
                cur[i] += v
        if s.get("time_ms") is not None:
            tm = out["time_ms"] or {}
            for k, v in s["time_ms"].items():
                tm[k] = tm.get(k, 0.0) + v
            out["time_ms"] = tm
    return out


def _first_diff(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ----------------------------------------------------------------------------- the gate


class SharedProbe:
    """``treespec.gate.decide``, with the per-shape measurements shared across
    configurations. The gate's probe memoizes whole shape lists, and the bench's
    lists overlap heavily (chain b probes the chains 1..b, so blocks 2..8 would
    measure 35 chains where 8 are distinct). Each shape is measured by the gate's
    own ``compare_shape`` (its seed depends on the shape only), and a
    configuration passes only when every shape of its drafter's ``probe_shapes()``
    is bit-identical, as ``decide`` requires."""

    def __init__(self):
        self.results = {}
        self._config = {}

    def __call__(self, model, shapes, allow_inexact: bool = False):
        from .gate import DRAWS, Decision, compare_shape, configuration

        key = id(model)
        if key not in self._config:
            self._config[key] = configuration(model)
        cfg = self._config[key]
        got = []
        for shape in (tuple(int(p) for p in s) for s in shapes):
            if (key, shape) not in self.results:
                self.results[key, shape] = compare_shape(model, shape, DRAWS)
            got.append(self.results[key, shape])
        bad = [r for r in got if not r.identical]
        where = f"{cfg['blas']}, {cfg['device']}"
        if not bad:
            return Decision(True, True, f"probe passed: {len(got)} shapes bit-identical to "
                            f"single-token steps ({where})")
        worst = max(r.max_abs_diff for r in bad)
        flips = sum(r.argmax_flips for r in bad)
        what = (f"{len(bad)} of {len(got)} shapes differ from single-token steps (max |diff| "
                f"{worst:.3g}, {flips} argmax flips; first at M={bad[0].m}) on {where}, "
                f"{cfg['dtypes']}")
        if allow_inexact:
            return Decision(True, False, f"INEXACT, running anyway (--allow-inexact): {what}")
        return Decision(False, False, f"declined: {what}")


# ----------------------------------------------------------------------------- the bench


def prefill_ms(model, prompt, repeats: int = 5) -> float:
    """Median wall ms of prefilling ``prompt[:-1]`` into a fresh cache: what
    every run of this prompt pays before its first new token (the target in
    every configuration, the draft model too in speculative ones)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    if len(prompt) < 2:
        return 0.0
    times = []
    for _ in range(repeats + 1):
        cache = make_prompt_cache(model)
        t0 = time.perf_counter()
        model(mx.array(prompt[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times[1:])


def bench(target, draft, prompts: Sequence[Sequence[int]], configs: Sequence[Config],
          max_tokens: int = 64, repeats: int = 3, eos=None, allow_inexact: bool = False,
          decide: Optional[Callable] = None, log: Callable[[str], None] = lambda s: None,
          warmup_tokens: Optional[int] = None, max_seconds: Optional[float] = None) -> dict:
    """Gate, warm up, run interleaved, aggregate. Returns the report dict
    (rows in config order; a gated row has ``exact`` False and a ``reason``).
    ``max_seconds``: start no repeat after that many seconds of this call (at
    least one runs); the report says how many repeats its medians cover."""
    t_call = time.perf_counter()
    if decide is None:
        decide = SharedProbe()
    prompts = [list(map(int, p)) for p in prompts]
    if not prompts:
        raise ValueError("bench needs at least one prompt")
    if configs[0].kind != "classic":
        raise ValueError("the first configuration must be classic: every text is diffed with it")
    rows = {c.name: {"name": c.name, "kind": c.kind, "block": c.block, "budget": c.budget,
                     "branching": list(c.branching) if c.branching else None,
                     "exact": True, "checks": "reference" if not c.speculative else None,
                     "reason": None, "probe": None, "wall": [], "decode": [], "runs": []}
            for c in configs}
    live = list(configs)
    # 1. The exactness probe, per configuration (memoized per shape set).
    for c in configs:
        if not c.speculative:
            continue
        t0 = time.perf_counter()
        d = decide(target, c.probe_shapes(), allow_inexact=allow_inexact)
        rows[c.name]["probe"] = {"run": d.run, "exact": d.exact, "reason": d.reason,
                                 "seconds": time.perf_counter() - t0}
        if not d.run or not d.exact and not allow_inexact:
            rows[c.name].update(exact=False, reason=f"probe: {d.reason}")
            live.remove(c)
        elif not d.exact:
            rows[c.name]["inexact_allowed"] = True
        log(f"  probe {c.name:<24} {'pass' if d.exact else 'FAIL'}"
            f" ({time.perf_counter() - t0:.1f}s)")
    # 2. Warm-up: every configuration once over every prompt, untimed. On an
    # accelerator a run's first meeting with a shape compiles kernels: on the
    # H200 the first 48-token run of a chain was 5-10x slower than the next
    # (scripts/gpu_round_probe.py; with cuDNN attention on, which also builds
    # a graph per kv length: treespec/cuda_env.py), and a short warm-up meets
    # too few shapes.
    for c in live:
        for p in prompts:
            run_config(c, target, draft, p, max_tokens if warmup_tokens is None
                       else min(warmup_tokens, max_tokens), eos)
    # Prefill per prompt, subtracted from each run's wall for decode tok/s.
    prefill = [(prefill_ms(target, p) if target is not None else 0.0,
                prefill_ms(draft, p) if draft is not None else 0.0) for p in prompts]
    # 3. Interleaved repeats; every run's tokens diffed with classic's.
    reference: List[Optional[List[int]]] = [None] * len(prompts)
    done = 0
    for r in range(repeats):
        if r and max_seconds is not None and time.perf_counter() - t_call > max_seconds:
            log(f"  stopping after {r} of {repeats} repeats: --max-seconds {max_seconds:g} spent")
            break
        done = r + 1
        order = live[1:]
        if order:
            k = r % len(order)
            order = order[k:] + order[:k]
        order = [live[0]] + order  # classic first: the reference of this repeat
        t_rep = time.perf_counter()
        for c in order:
            row = rows[c.name]
            if not row["exact"]:
                continue
            runs = []
            for i, p in enumerate(prompts):
                run = run_config(c, target, draft, p, max_tokens, eos)
                runs.append(run)
                if c is live[0]:
                    if reference[i] is None:
                        reference[i] = run.tokens
                    elif run.tokens != reference[i]:
                        row.update(exact=False, reason=f"classic is not deterministic on "
                                   f"prompt {i} (repeat {r})")
                elif run.tokens != reference[i]:
                    at = _first_diff(run.tokens, reference[i])
                    got = run.tokens[at] if at < len(run.tokens) else "end"
                    want = reference[i][at] if at < len(reference[i]) else "end"
                    why = (f"text: tokens differ from classic on prompt {i} at token {at} "
                           f"(got {got}, classic {want}; repeat {r})")
                    if not allow_inexact:
                        row.update(exact=False, reason=why)
                        break
                    row.setdefault("text_diff", why)  # timed anyway, labelled INEXACT
            if row["exact"]:
                row["wall"].append(sum(x.wall_s for x in runs))
                row["decode"].append(sum(
                    max(x.wall_s - 1e-3 * (pt + (pd if c.speculative else 0.0)), 1e-6)
                    for x, (pt, pd) in zip(runs, prefill)))
                row["runs"].append(runs)
                if c.speculative:
                    flags = ("p" if row.get("inexact_allowed") else "") + \
                        ("t" if row.get("text_diff") else "")
                    row["checks"] = f"INEXACT:{flags}" if flags else EXACT
        log(f"  repeat {r + 1}/{repeats}: {time.perf_counter() - t_rep:.1f}s")
    report = summarize(rows, configs, prompts, max_tokens, done)
    report["repeats_asked"] = repeats
    report["prefill_ms"] = [{"target": pt, "draft": pd} for pt, pd in prefill]
    return report


def summarize(rows: dict, configs: Sequence[Config], prompts, max_tokens, repeats) -> dict:
    """Medians, acceptance and speedups from the raw runs."""
    out = []
    for c in configs:
        row = rows[c.name]
        res = {k: row[k] for k in ("name", "kind", "block", "budget", "branching", "exact",
                                   "checks", "reason", "probe")}
        res["text_diff"] = row.get("text_diff")
        if c.kind == "auto":
            res["choice"] = {k: v for k, v in (c.choice or {}).items() if k != "details"}
        if row["exact"] and row["runs"]:
            tok_s = [sum(len(x.tokens) for x in runs) / w for runs, w in zip(row["runs"], row["wall"])]
            res["tok_s"] = statistics.median(tok_s)
            res["tok_s_all"] = tok_s
            dec = [sum(len(x.tokens) for x in runs) / w
                   for runs, w in zip(row["runs"], row["decode"])]
            res["decode_tok_s"] = statistics.median(dec)
            res["decode_all"] = dec
            res["tokens"] = sum(len(x.tokens) for x in row["runs"][0])
            cpu = [1e3 * sum(x.cpu_s for x in runs) / sum(len(x.tokens) for x in runs)
                   for runs in row["runs"] if all(x.cpu_s is not None for x in runs)]
            res["cpu_ms_per_token"] = statistics.median(cpu) if cpu else None
            res["cpu_all"] = cpu
            st = _merge([x.stats for x in row["runs"][0]]) if row["runs"][0][0].stats else None
            if st and c.speculative:
                res["rounds"] = st["rounds"]
                res["acceptance"] = st["accepted"] / st["proposed"] if st["proposed"] else None
                res["emitted_per_verify"] = (res["tokens"] / st["rounds"]) if st["rounds"] else None
                res["per_depth_acceptance"] = [a / n if n else None for a, n in
                                               zip(st["depth_accepted"], st["depth_reached"])]
                res["mean_nodes"] = 1 + st["proposed"] / st["rounds"] if st["rounds"] else None
                # ms per round, median over repeats, per part
                parts = {}
                for runs, wall in zip(row["runs"], row["wall"]):
                    m = _merge([x.stats for x in runs])
                    if m["time_ms"]:
                        for k in ("draft", "verify", "walk", "commit"):
                            parts.setdefault(k, []).append(m["time_ms"][k] / m["rounds"])
                    parts.setdefault("round", []).append(wall * 1e3 / m["rounds"])
                res["ms_per_round"] = {k: statistics.median(v) for k, v in parts.items()}
            elif not c.speculative:
                res["ms_per_token"] = statistics.median(
                    w * 1e3 / sum(len(x.tokens) for x in runs)
                    for runs, w in zip(row["runs"], row["wall"]))
        out.append(res)
    # Speedups: medians of per-repeat ratios (the runs of one repeat are interleaved).
    by = {r["name"]: r for r in out}
    base = by[configs[0].name]
    # On decode tok/s: the speed a long generation sees (prefill is one-off).
    chains = [r for r in out if r["kind"] == "chain" and r.get("tok_s")]
    best_chain = max(chains, key=lambda r: r["decode_tok_s"]) if chains else None
    for r in out:
        if not r.get("tok_s"):
            continue
        if base.get("decode_all"):
            r["x_classic"] = statistics.median(
                a / b for a, b in zip(r["decode_all"], base["decode_all"]))
        if best_chain:
            r["x_best_chain"] = statistics.median(
                a / b for a, b in zip(r["decode_all"], best_chain["decode_all"]))
    return {"rows": out, "best_chain": best_chain["name"] if best_chain else None,
            "prompts": len(prompts), "max_tokens": max_tokens, "repeats": repeats}


# ----------------------------------------------------------------------------- command


CURVE_TS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64)


def cmd_bench(args) -> int:
    from .cli import CliError, check_same_tokenizer, default_pair, load_checkpoint

    t_start = time.perf_counter()
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else \
        (lambda s: print(s, flush=True))
    if args.plot:  # fail before minutes of measuring, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("--plot needs matplotlib, which is not installed: pip install matplotlib")
    model_path, draft_path = args.model, args.draft_model
    if args.scaled is not None and (model_path or draft_path):
        raise CliError("--scaled builds its own pair; give it without --model/--draft-model")
    if model_path is None and args.scaled is None:
        if draft_path is not None:
            raise CliError("--draft-model given without --model")
        model_path, draft_path = default_pair()
    elif draft_path is None and args.scaled is None:
        raise CliError("--model given without --draft-model: bench compares speculative modes")
    if args.prompts < 1 or args.prompts > len(PROMPTS):
        raise CliError(f"--prompts must be 1..{len(PROMPTS)}")
    machine = machine_info()
    attention = f"; {machine['attention']}" if "attention" in machine else ""  # CUDA only
    say(f"machine: {machine['blas']}; mlx {machine['mlx']}, mlx-lm {machine.get('mlx_lm')}, "
        f"{machine['device']}, {machine['cpus']} CPUs, load {machine.get('loadavg')}; "
        f"treespec git {machine['git']}{attention}")
    auto_prompts = tokenizer = None
    if args.scaled is not None:
        from . import scaled

        hidden, layers = args.scaled
        target, draft = scaled.build_pair(hidden, layers, args.draft_layers, args.alpha)
        # Random weights know no text: seeded token prompts, no EOS; auto
        # calibrates on prompts of its own, as with the trained pair.
        prompts = scaled.default_prompts(args.prompts + 2)
        prompts, auto_prompts = prompts[: args.prompts], prompts[args.prompts:]
        eos = []
        pair = (f"scaled llama {hidden}x{layers} bf16 ({scaled.n_params(target) / 1e9:.2f}B), "
                f"drafter its first {args.draft_layers} layers "
                f"({scaled.n_params(draft) / 1e9:.2f}B), alpha {args.alpha}")
        report_extra = {"machine": machine, "model": pair, "draft_model": pair,
                        "prompts_text": None}
        say(f"pair: {pair}")
    else:
        target, tokenizer = load_checkpoint(model_path, "model")
        draft, draft_tok = load_checkpoint(draft_path, "draft-model")
        check_same_tokenizer(tokenizer, draft_tok, target, draft)
        say(f"pair: target {model_path}, draft {draft_path}")
        texts = PROMPTS[: args.prompts]
        prompts = [tokenizer.encode(t) for t in texts]
        eos = list(tokenizer.eos_token_ids)
        report_extra = {"machine": machine, "model": str(model_path),
                        "draft_model": str(draft_path), "prompts_text": texts}

    curve = None
    if args.verify_curve:
        from .costcurve import verify_cost_curve

        t0 = time.perf_counter()
        curve = verify_cost_curve(target, CURVE_TS, context=64, repeats=7, warmup=2)
        say(format_curve(curve, f"target, {time.perf_counter() - t0:.1f}s"))
        report_extra["verify_curve"] = curve

    configs = build_configs(args.blocks, args.trees, args.width, mlx_lm=not args.no_mlx_lm)
    gate = SharedProbe()
    if not args.no_auto:
        from . import auto

        t0 = time.perf_counter()
        choice = auto.choose(target, draft, auto_prompts, tokenizer=tokenizer,
                             max_block=max(args.blocks), trees=args.trees,
                             width=args.width, allow_inexact=args.allow_inexact,
                             eos_token_ids=eos, decide=gate, log=lambda s: say("  " + s))
        say(f"auto ({time.perf_counter() - t0:.1f}s calibration): {describe_choice(choice)}: "
            f"{choice['reason']}")
        report_extra["auto"] = {k: v for k, v in choice.items()}
        configs.append(auto_config(choice))
        if curve is None:
            curve = choice.get("details", {}).get("curve")

    say(f"bench: {len(configs)} configurations x {len(prompts)} prompts x {args.max_tokens} "
        f"tokens, {args.repeats} interleaved repeats")
    report = bench(target, draft, prompts, configs, max_tokens=args.max_tokens,
                   repeats=args.repeats, eos=eos, allow_inexact=args.allow_inexact,
                   max_seconds=args.max_seconds,
                   decide=gate, log=say)
    report.update(report_extra)
    report["seconds"] = time.perf_counter() - t_start
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


def add_parser(sub):
    p = sub.add_parser("bench", help="throughput of classic, chain, tree, auto and mlx-lm, "
                       "each figure gated by the exactness checks of the same run")
    p.add_argument("--model", help="target mlx-lm checkpoint (default: the trained pair)")
    p.add_argument("--draft-model", help="draft mlx-lm checkpoint (with --model)")
    p.add_argument("--prompts", type=int, default=3, help=f"Python prompts, 1..{len(PROMPTS)}")
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats (medians)")
    p.add_argument("--max-seconds", type=float,
                   help="start no repeat past this many seconds of timed runs (at least one "
                   "runs; the table says how many its medians cover)")
    p.add_argument("--blocks", type=parse_blocks, default=parse_blocks(DEFAULT_BLOCKS),
                   help="chain blocks (and confidence budgets block-1): LO..HI or a list")
    p.add_argument("--trees", type=parse_trees,
                   default=[tuple(t) for t in FIXED_TREES],
                   help="fixed topologies as branching lists or parent lists, e.g. "
                   "--trees=\"2,1,1 -1,0,0,1,1\" ('' for none)")
    p.add_argument("--width", type=int, default=4, help="confidence tree: top-k per expansion")
    p.add_argument("--no-mlx-lm", action="store_true", help="skip mlx-lm's speculative decoding")
    p.add_argument("--no-auto", action="store_true", help="skip auto's calibration and row")
    p.add_argument("--plot", metavar="DIR", help="write PNGs (needs matplotlib)")
    p.add_argument("--verify-curve", action="store_true",
                   help="measure one target forward's cost for T=1..64 and print it")
    p.add_argument("--json", action="store_true", help="one JSON report on stdout")
    p.add_argument("--allow-inexact", action="store_true",
                   help="time configurations whose probe found differences (still text-diffed)")
    p.add_argument("--scaled", type=parse_dims, metavar="HIDDENxLAYERS",
                   help="instead of a checkpoint pair: a random bf16 llama of this size and a "
                   "drafter cut from it (treespec.scaled), e.g. 2048x16 (~0.8B)")
    p.add_argument("--draft-layers", type=int, default=2, help="--scaled: the drafter's depth")
    p.add_argument("--alpha", type=float, default=0.3,
                   help="--scaled: damping of the layers the drafter lacks (sets acceptance)")
    p.add_argument("--blas", choices=("auto", "reference", "openblas"), default="auto",
                   help="CPU BLAS: re-executes with Debian's OpenBLAS preloaded, or without it")
    p.set_defaults(func=cmd_bench)
