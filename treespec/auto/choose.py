"""``auto``: choose chain or tree, and its size, from what this machine measures.

    from treespec.auto.choose import choose
    c = choose(target, draft, tokenizer=tok)      # ~20 s of calibration on the CPU
    decode(target, prompt, draft_model=draft, **decode_kwargs(c))
    print(c["reason"])

Inputs, all measured in the calling process:

1. the verify cost curve cost(T) of the target (``treespec.auto.costcurve.verify_cost_curve``,
   one plain forward over T tokens, T = 1..the largest candidate; the minimum of 9,
   made non-decreasing in T);
2. a short greedy calibration on prompts of its own (not the bench's): classic, a
   chain at the smallest and the largest block, and the confidence tree at the
   largest budget, interleaved over ``repeats`` (timings: the minimum over repeats), giving
   - the target's greedy text of each prompt, which one draft forward per prompt turns
     into what any spine would emit on it (``treespec.auto.emission``): spines of depth
     2..max_block-1 are priced without a run of their own,
   - per-depth acceptance of the chain (so the emitted count of every smaller block),
   - the accepted root path and the draft's cumulative log-probabilities of every
     round of the confidence tree (so the emitted count of every smaller budget: a
     budget-n tree is the top n nodes of that ranking, ancestor-closed),
   - the time per round of drafting, verifying and the rest (walk, commit, loop).

The prediction and the choice rules are ``treespec.auto.predict`` (pure: no
model, no clock). Then the run-off: every eligible candidate predicted within
``runoff`` (default 0.9) of the choice, at most ``max_runoff``, and besides them
the best eligible candidate of each kind (classic, chain, tree) they lack,
predicted within ``runoff_floor`` (default 0.8), are timed directly on the
calibration prompts, interleaved, and the fastest measured one is chosen (a
tree by half the margin): the model only ranks, the clock decides between close
ones and between the kinds. ``reason`` gives the numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..evidence import gate
from .calibrate import CALIBRATION_PROMPTS, calibrate, measured_tok_s
from .predict import (
    Candidate,
    emitted_replayed,
    explain,
    monotone,
    per_depth,
    pick,
    pick_measured,
    predict,
    runoff_finalists,
    spine,
)
from .costcurve import verify_cost_curve
from ..draft import FixedTreeDrafter, fixed_shape, make_drafter
from .emission import draft_ranks


@dataclass(frozen=True)
class ChooseOptions:
    """What ``choose`` measures and how it decides, as one value (keywords:
    ``ChooseOptions(max_block=3, repeats=1)``). ``max_block``: the largest
    chain block (and tree budget + 1) priced, >= 2; ``max_tokens`` /
    ``repeats``: each calibration run's length and how many interleaved
    repeats; ``width``: the confidence tree's; ``trees``: fixed shapes
    (branching or parent lists) calibrated too; ``allow_classic``: classic
    may be chosen; ``allow_inexact``: the gate's; ``margin``: what a tree
    must beat the rest by (treespec.auto.predict.pick); ``runoff`` /
    ``runoff_floor`` / ``max_runoff``: the run-off (the module's docstring);
    ``spines``: also price the spines of depth 2..max_block-1 that
    ``trees`` does not name, from the calibration's texts replayed (no run
    of their own)."""

    max_block: int = 8
    max_tokens: int = 40
    repeats: int = 3
    width: int = 4
    trees: Sequence[Sequence[int]] = ()
    allow_classic: bool = True
    allow_inexact: bool = False
    margin: float = 0.05
    runoff: float = 0.9
    runoff_floor: float = 0.8
    max_runoff: int = 4
    spines: bool = True


def choose(target, draft_model, prompts: Optional[Sequence] = None,
           options: ChooseOptions = ChooseOptions(), *, tokenizer=None, eos_token_ids=None,
           decide: Optional[Callable] = None, log: Callable[[str], None] = lambda s: None,
           deadline: Optional[float] = None) -> dict:
    """Measure, predict, gate, choose. Returns
    ``dict(mode, block, budget, branching, width, reason, predicted, details)``;
    ``decode_kwargs(result)`` feeds ``treespec.decoding.decode``. ``prompts``: token
    lists or strings (with ``tokenizer``); default CALIBRATION_PROMPTS. ``options``:
    the knobs (:class:`ChooseOptions`). ``eos_token_ids``: default the tokenizer's.
    ``decide``: the exactness gate (default ``treespec.evidence.gate.decide``).
    ``deadline`` (a time.perf_counter reading): no calibration repeat after the
    first starts past it."""
    o = options
    max_block, max_tokens, repeats, width = o.max_block, o.max_tokens, o.repeats, o.width
    trees, allow_classic, margin = o.trees, o.allow_classic, o.margin
    decide = decide if decide is not None else gate.decide
    if max_block < 2:
        raise ValueError(f"max_block must be >= 2, got {max_block}")
    t_start = time.perf_counter()
    if prompts is None:
        prompts = CALIBRATION_PROMPTS
    prompts = [p if not isinstance(p, str) else _encode(tokenizer, p) for p in prompts]
    if eos_token_ids is None and tokenizer is not None:
        eos_token_ids = list(tokenizer.eos_token_ids)

    fixed_sizes = [FixedTreeDrafter(**fixed_shape(t)).budget() + 1 for t in trees]
    given = {tuple(int(x) for x in t) for t in trees}
    depths = [d for d in range(2, max_block) if spine(d) not in given] if o.spines else []
    t_max = max([max_block] + fixed_sizes + [2 * d + 1 for d in depths])
    t0 = time.perf_counter()
    curve_rows = verify_cost_curve(target, tuple(range(1, t_max + 1)), context=64,
                                   repeats=9, warmup=2)
    # The minimum, like the calibration timings (what the machine can do), made
    # non-decreasing in T: a forward over more tokens never costs less, and a
    # dip is a busy machine's noise that would otherwise pick the block.
    curve = monotone({r["T"]: r["min_ms"] for r in curve_rows})
    log(f"auto: verify cost curve T=1..{t_max} ({time.perf_counter() - t0:.1f}s)")

    specs = [{"kind": "classic"}] if allow_classic else []
    blocks = sorted({2, max_block})
    specs += [{"kind": "chain", "block": b} for b in blocks]
    specs.append({"kind": "confidence", "budget": max_block - 1, "width": width})
    specs += [{"kind": "fixed", "branching": tuple(t),
               "budget": FixedTreeDrafter(**fixed_shape(t)).budget()} for t in trees]
    t0 = time.perf_counter()
    cal = calibrate(target, draft_model, prompts, specs, max_tokens, repeats, eos_token_ids, log,
                    deadline)
    log(f"auto: calibration {len(specs)} configurations x {len(prompts)} prompts x "
        f"{max_tokens} tokens x {repeats} ({time.perf_counter() - t0:.1f}s)")
    classic = next((c for c in cal if c["kind"] == "classic"), None)
    chains = [c for c in cal if c["kind"] == "chain"]
    tree = next((c for c in cal if c["kind"] == "confidence"), None)
    fixed = [c for c in cal if c["kind"] == "fixed"]
    replayed = []
    if depths:
        # The target's greedy text of each calibration prompt (classic's; a
        # chain's equals it under greedy decoding), ranked by the draft model
        # in one forward per prompt: what any spine would emit on it.
        texts = (classic or max(chains, key=lambda c: c["block"]))["texts"]
        ranks = [draft_ranks(draft_model, p, t) for p, t in zip(prompts, texts) if t]
        replayed = [{"depth": d, "emitted": emitted_replayed(spine(d), ranks)} for d in depths]
    cands = predict(curve, classic["ms_per_token"] if classic else None, chains, tree, fixed,
                    max_block=max_block, width=width, spines=replayed)

    def eligible(c):
        d = decide(target, _drafter_for(c).probe_shapes(), allow_inexact=o.allow_inexact)
        return d.run, d.reason

    choice, ranked = pick(cands, margin, eligible, allow_classic)
    # The run-off: the model interpolates (chains between the two measured
    # blocks, trees from one budget), so every eligible candidate within
    # ``runoff`` of the choice, and the best of each kind they lack within
    # ``runoff_floor``, are timed directly, interleaved, and the fastest
    # measured wins (a tree by ``margin / 2`` over the rest: its figures are
    # now measured too, only noisier).
    finalists = runoff_finalists(ranked, choice, lambda c: c.kind == "classic" or eligible(c)[0],
                                 o.runoff, o.runoff_floor, o.max_runoff)
    runoff_rows = []
    if len(finalists) > 1:
        t0 = time.perf_counter()
        runs = calibrate(target, draft_model, prompts, [c.spec() for c in finalists],
                         max_tokens, repeats, eos_token_ids, log)
        runoff_rows = [(c, measured_tok_s(r)) for c, r in zip(finalists, runs)]
        choice = pick_measured(runoff_rows, margin / 2)
        log(f"auto: run-off of {len(finalists)} ({time.perf_counter() - t0:.1f}s): "
            + ", ".join(f"{c.name} {t:.0f}" for c, t in runoff_rows))
    hi = max(chains, key=lambda c: c["block"])
    p_depth = per_depth(hi["accepted"], hi["block"] - 1)
    reason = explain(choice, ranked, curve, p_depth, margin)
    if runoff_rows:
        reason += "; run-off, measured tok/s: " + ", ".join(
            f"{c.name} {t:.0f}" for c, t in runoff_rows)
    out = {"mode": choice.decode_kwargs()["mode"], "block": choice.block,
           "budget": choice.budget if choice.kind != "classic" else None,
           "branching": list(choice.branching) if choice.branching else None,
           "width": choice.width if choice.kind == "confidence" else None,
           "kind": choice.kind, "reason": reason,
           "predicted": [c.to_dict() for c in ranked[:6]],
           "runoff": [{"name": c.name, "tok_s": t} for c, t in runoff_rows],
           "seconds": time.perf_counter() - t_start,
           "details": {"curve": curve_rows, "per_depth_acceptance": p_depth,
                       "calibration": [{k: v for k, v in c.items() if k not in ("records",)}
                                       for c in cal],
                       "candidates": [c.to_dict() for c in ranked]}}
    log(f"auto: chose {choice.name} in {out['seconds']:.1f}s")
    return out


def _drafter_for(c: Candidate):
    kw = c.decode_kwargs()
    mode = kw.pop("mode")
    return make_drafter(mode, **kw)


def _encode(tokenizer, text):
    if tokenizer is None:
        raise ValueError("string prompts need a tokenizer")
    return tokenizer.encode(text)
