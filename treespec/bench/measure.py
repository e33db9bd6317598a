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
- ``auto``: what :func:`treespec.auto.choose.choose` picks after a short calibration on its
  own prompts (not the bench's);
- ``... [head NAME]``: a hidden-state head drafting (``--draft-head``, treespec.bench.head_rows).

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

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import speculative_generate_step
from mlx_lm.models.cache import make_prompt_cache

from ..auto.predict import decode_kwargs as auto_decode_kwargs
from .prompts import DEFAULT_BLOCKS, FIXED_TREES, PROMPTS  # noqa: F401  (re-exported)
from .report import EXACT, summarize
from ..decoding import decode
from ..draft import ChainDrafter, FixedTreeDrafter, fixed_shape, make_drafter, shape_name
from ..cli.flags import parse_blocks, parse_trees  # noqa: F401  (bench's flag values)
from .shared_probe import SharedProbe
from ..options import wide_depth
from ..verify import MEMO_NAMES



# ----------------------------------------------------------------------------- configurations


@dataclass
class Config:
    """One row of the table."""

    name: str
    kind: str  # classic | chain | fixed | confidence | mlx-lm | auto (head-*: head_rows)
    block: Optional[int] = None
    budget: int = 0  # draft nodes per round
    branching: Optional[tuple] = None  # fixed: branching factors or a parent list
    width: int = 4
    choice: Optional[dict] = None  # auto's choice
    batch_levels: bool = False  # fixed: wide levels drafted as batch rows
    # Tests substitute a runner: (target, draft, prompt, max_tokens, eos) -> Run.
    runner: Optional[Callable] = None
    shapes: Optional[list] = None  # probe shapes override (tests)
    # "rows"/"kernels"/"chunks": treespec.verify.row_invariant's adapters, set once the
    # target is built; adapter_name: its gate memo name where the mode's is not enough
    verify: str = "flat"
    adapter: Any = None
    adapter_name: Optional[str] = None
    draft_prefill = True  # the draft model prefills the prompt (a head does not)

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
            return auto_decode_kwargs(self.choice)
        if kind == "classic":
            return {"mode": "classic"}
        if kind in ("chain", "mlx-lm"):
            return {"mode": "chain", "block": self.block}
        if kind == "fixed":
            rows = {"batch_levels": True} if self.batch_levels else {}
            return {"mode": "tree", **fixed_shape(self.branching), **rows}
        return {"mode": "tree", "budget": self.budget, "width": self.width}

    def verify_kwargs(self) -> dict:
        """The verify a row runs, for its probe and its decode: {} for the flat
        verify, else the row-invariant adapter and its gate memo name (so a
        probe of it is never the flat verify's memoized verdict)."""
        if self.verify == "flat":
            return {}
        return {"adapter": self.adapter,
                "adapter_name": self.adapter_name or MEMO_NAMES[self.verify]}

    def drafter(self):
        if self.kind == "mlx-lm":
            return ChainDrafter(self.block)
        kw = self.decode_kwargs()
        mode = kw.pop("mode")
        if mode == "classic":
            return None
        return make_drafter(mode, **kw)

    def draft_kwargs(self, draft) -> dict:
        """decode's drafting keywords: the draft model (a head row: its head)."""
        return {"draft_model": draft}

    def probe_shapes(self):
        if self.shapes is not None:
            return self.shapes
        d = self.drafter()
        return None if d is None else d.probe_shapes()


def build_configs(blocks: Sequence[int], trees: Sequence[tuple] = FIXED_TREES, width: int = 4,
                  mlx_lm: bool = True, confidence: bool = True,
                  batch_levels: bool = False, verify: Sequence[str] = ("flat",)) -> List[Config]:
    """The table's rows. ``batch_levels``: each fixed tree with a level of
    several fed nodes (treespec.options.wide_depth) twice, through the tree
    injection and as batch rows ("... rows"), side by side. ``verify``: the
    verify modes of every chain, fixed and confidence row ("flat", the tree
    adapter's one forward; "rows", the row-invariant verify, named
    "... [rows]"; "kernels", that verify with the row kernels, "... [kernels]"),
    side by side in that order."""
    flat = _configs(blocks, trees, width, confidence, batch_levels)
    configs = [flat[0]]
    for v in verify:
        configs += [c if v == "flat" else replace(c, name=f"{c.name} [{v}]", verify=v)
                    for c in flat[1:]]
    if mlx_lm:
        configs += [Config(f"mlx-lm b={b}", "mlx-lm", block=b, budget=b - 1) for b in blocks]
    return configs


def _configs(blocks, trees, width, confidence, batch_levels) -> List[Config]:
    configs = [Config("classic", "classic")]
    configs += [Config(f"chain b={b}", "chain", block=b, budget=b - 1) for b in blocks]
    for t in trees:
        shape = FixedTreeDrafter(**fixed_shape(t))
        n = shape.budget()
        configs.append(Config(f"fixed {shape_name(t)}", "fixed", branching=tuple(t), budget=n))
        if batch_levels and wide_depth(shape.shape) is not None:
            configs.append(Config(f"fixed {shape_name(t)} rows", "fixed", branching=tuple(t),
                                  budget=n, batch_levels=True))
    if confidence:
        configs += [Config(f"conf n={b - 1}", "confidence", budget=b - 1, width=width)
                    for b in blocks]
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


def mlx_lm_run(target, draft, prompt, max_tokens, eos, block) -> Run:
    """mlx-lm's speculative decoding, greedy, stopping at EOS like classic;
    its rounds recovered from ``from_draft`` (a round ends with the target's
    own token)."""
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
        return mlx_lm_run(target, draft, prompt, max_tokens, eos, cfg.block)
    kw = cfg.decode_kwargs()
    t0 = time.perf_counter()
    # The gate ran (and passed) before the timed runs; decode's own gate would
    # hash the weights on every call, inside the timing.
    drafting = cfg.draft_kwargs(draft) if kw["mode"] != "classic" else {}
    result = decode(target, prompt, max_tokens=max_tokens, eos_token_ids=eos, gate=False,
                    **kw, **cfg.verify_kwargs(), **drafting)
    wall = time.perf_counter() - t0
    s = result.stats
    stats = {"rounds": s.rounds, "proposed": s.proposed, "accepted": s.accepted,
             "emitted": s.emitted, "depth_accepted": list(s.depth_accepted),
             "depth_reached": list(s.depth_reached),
             "time_ms": dict(s.time_ms) if kw["mode"] != "classic" else None}
    return Run(list(result.tokens), wall, stats)


def _first_diff(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ----------------------------------------------------------------------------- the bench


def prefill_ms(model, prompt, repeats: int = 5) -> float:
    """Median wall ms of prefilling ``prompt[:-1]`` into a fresh cache: what
    every run of this prompt pays before its first new token (the target in
    every configuration, the draft model too in speculative ones)."""
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


@dataclass(frozen=True)
class BenchOptions:
    """How ``bench`` runs its table, as one value: ``max_tokens`` per run,
    ``repeats`` interleaved, ``eos`` ids ending a run, ``allow_inexact`` (the
    gate's, and texts differing from classic's timed but labelled INEXACT),
    ``warmup_tokens`` per warm-up run (None: max_tokens), ``max_seconds``: the
    call's budget (sets ``bench``'s deadline when it is not given)."""

    max_tokens: int = 64
    repeats: int = 3
    eos: Optional[Sequence[int]] = None
    allow_inexact: bool = False
    warmup_tokens: Optional[int] = None
    max_seconds: Optional[float] = None


def bench(target, draft, prompts: Sequence[Sequence[int]], configs: Sequence[Config],
          options: BenchOptions = BenchOptions(), *, decide: Optional[Callable] = None,
          log: Callable[[str], None] = lambda s: None, deadline: Optional[float] = None,
          clock: Callable[[], float] = time.perf_counter) -> dict:
    """Gate, warm up, run interleaved, aggregate. Returns the report dict
    (rows in config order; a gated row has ``exact`` False and a ``reason``).

    ``deadline`` (a ``clock()`` reading; ``options.max_seconds`` sets it from
    this call's start): nothing new starts once it has passed. Configurations not
    yet probed are skipped, the warm-up stops, and no further timed run
    starts, except classic's first (the reference every text is diffed
    with). A skipped row says so (``skipped``); the report says how many
    repeats ran and whether the warm-up was cut."""
    max_tokens, repeats, eos = options.max_tokens, options.repeats, options.eos
    allow_inexact, warmup_tokens = options.allow_inexact, options.warmup_tokens
    t_call = clock()
    if deadline is None and options.max_seconds is not None:
        deadline = t_call + options.max_seconds

    def spent() -> bool:
        return deadline is not None and clock() > deadline

    def skip(c, stage):
        rows[c.name]["skipped"] = f"not {stage}: --max-seconds spent"
        if c in live:
            live.remove(c)
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
                     "reason": None, "probe": None, "wall": [], "decode": [], "runs": [],
                     "skipped": None}
            for c in configs}
    live = list(configs)
    # 1. The exactness probe, per configuration (memoized per shape set).
    for c in configs:
        if not c.speculative:
            continue
        if spent():
            skip(c, "probed")
            continue
        t0 = time.perf_counter()
        d = decide(target, c.probe_shapes(), allow_inexact=allow_inexact, **c.verify_kwargs())
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
    # accelerator a run's first meeting with a shape compiles kernels (and
    # cuDNN attention builds a graph per kv length: treespec/backend/cuda.py),
    # so a short warm-up would leave those costs inside the timed runs.
    warmed = True
    for c in live:
        for p in prompts:
            if spent():
                warmed = False
                break
            run_config(c, target, draft, p, max_tokens if warmup_tokens is None
                       else min(warmup_tokens, max_tokens), eos)
    # Prefill per prompt, subtracted from each run's wall for decode tok/s.
    prefill = [(prefill_ms(target, p) if target is not None else 0.0,
                prefill_ms(draft, p) if draft is not None else 0.0) for p in prompts]
    # 3. Interleaved repeats; every run's tokens diffed with classic's.
    reference: List[Optional[List[int]]] = [None] * len(prompts)
    done = 0
    for r in range(repeats):
        if r and spent():
            log(f"  stopping after {r} of {repeats} repeats: --max-seconds spent")
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
            if not row["exact"] or row["skipped"]:
                continue
            if spent() and not (r == 0 and c is live[0]):
                if not row["runs"]:
                    skip(c, "timed")
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
                # a head has no prefill of its own: its first round feeds the
                # prompt's features, inside the decode time
                row["decode"].append(sum(
                    max(x.wall_s - 1e-3 * (pt + (pd if c.speculative and c.draft_prefill
                                                 else 0.0)), 1e-6)
                    for x, (pt, pd) in zip(runs, prefill)))
                row["runs"].append(runs)
                if c.speculative:
                    flags = ("p" if row.get("inexact_allowed") else "") + \
                        ("t" if row.get("text_diff") else "")
                    row["checks"] = f"INEXACT:{flags}" if flags else EXACT
        log(f"  repeat {r + 1}/{repeats}: {time.perf_counter() - t_rep:.1f}s")
    report = summarize(rows, configs, prompts, max_tokens, done)
    report["repeats_asked"] = repeats
    report["warmed_up"] = warmed
    report["prefill_ms"] = [{"target": pt, "draft": pd} for pt, pd in prefill]
    return report
