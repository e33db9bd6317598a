"""auto's calibration: short interleaved greedy runs of classic, two chains,
the confidence tree and any fixed trees, timed per round, with the texts
they decoded (treespec.auto.choose turns them into predictions)."""

import statistics
import time

import mlx.core as mx
from mlx_lm.generate import generate_step, generation_stream

from ..decoding import decode
from ..draft import ChainDrafter, ConfidenceDrafter, FixedTreeDrafter, fixed_shape

# Calibration prompts: Python code, distinct from treespec.bench.measure.PROMPTS.
CALIBRATION_PROMPTS = [
    "import json\n\n\ndef load(path):\n",
    "class Node:\n    def __init__(self, value, children=None):\n",
]


def calibrate(target, draft_model, prompts, specs, max_tokens, repeats, eos, log,
              deadline=None):
    """Interleaved greedy runs of each spec; per spec: records of the first
    repeat and per-round timings, the minimum over repeats (interference from
    other processes only ever adds time, so the minimum is the estimate of a
    configuration's own cost that is least at the mercy of a busy machine).
    ``deadline`` (a time.perf_counter reading): no repeat after the first
    starts past it."""
    def run(spec, prompt, mt, keep):
        if spec["kind"] == "classic":
            # mlx-lm's generate_step, greedy; steady state: from the first token
            # (prefill done) to the last, as the speculative rounds exclude prefill.
            stamps, eos_set, text = [], set(eos or ()), []
            t0 = time.perf_counter()
            for tok, _ in generate_step(mx.array(prompt), target, max_tokens=mt,
                                        sampler=lambda lp: mx.argmax(lp, axis=-1)):
                stamps.append(time.perf_counter())
                text.append(int(tok))
                if text[-1] in eos_set:
                    break
            # generate_step's look-ahead forward may still run: let it end here,
            # untimed, not inside the next configuration's timing.
            mx.synchronize(generation_stream)
            return {"tokens": len(stamps), "wall": stamps[-1] - t0,
                    "steady": stamps[-1] - stamps[0], "steps": len(stamps) - 1, "text": text}
        if spec["kind"] == "chain":
            d, mode = ChainDrafter(spec["block"]), "chain"
        elif spec["kind"] == "confidence":
            d, mode = ConfidenceDrafter(spec["budget"], width=spec["width"]), "tree"
        else:
            d, mode = FixedTreeDrafter(**fixed_shape(spec["branching"])), "tree"
        # Each round's cumulative draft log-probabilities, accepted path and
        # draft forwards: what predicts smaller budgets and blocks.
        records = []
        t0 = time.perf_counter()
        r = decode(target, prompt, mode=mode, draft_model=draft_model, max_tokens=mt,
                   eos_token_ids=eos, drafter=d, gate=False,
                   on_round=lambda rnd, walk: records.append(
                       (dict(rnd.logprobs), tuple(walk.path), rnd.forwards)))
        wall = time.perf_counter() - t0
        s = r.stats
        return {"tokens": len(r.tokens), "wall": wall, "rounds": s.rounds, "time": dict(s.time_ms),
                "proposed": s.proposed, "emitted": s.emitted, "text": r.tokens,
                "records": records if keep and spec["kind"] != "fixed" else None}

    for spec in specs:  # warm-up
        run(spec, prompts[0], min(8, max_tokens), False)
    acc = {i: [] for i in range(len(specs))}
    for r in range(repeats):
        if r and deadline is not None and time.perf_counter() > deadline:
            log(f"auto: calibration stopped after {r} of {repeats} repeats (--max-seconds)")
            break
        k = r % len(specs)
        order = list(range(len(specs)))[k:] + list(range(len(specs)))[:k]
        for i in order:
            acc[i].append([run(specs[i], p, max_tokens, r == 0) for p in prompts])
    out = []
    for i, spec in enumerate(specs):
        reps = acc[i]
        first = reps[0]
        res = dict(spec)
        # What the first repeat decoded, per prompt: the text auto replays
        # shapes it never ran on (treespec.auto.emission).
        res["texts"] = [x["text"] for x in first]
        if spec["kind"] == "classic":
            res["ms_per_token"] = min(
                1e3 * sum(x["steady"] for x in rep) / max(1, sum(x["steps"] for x in rep))
                for rep in reps)
            out.append(res)
            continue
        per = {"verify_ms": [], "draft_ms": [], "other_ms": []}
        for rep in reps:
            rounds = sum(x["rounds"] for x in rep)
            t = {k: sum(x["time"][k] for x in rep) for k in rep[0]["time"]}
            wall = 1e3 * sum(x["wall"] for x in rep) - t["prefill"]
            per["verify_ms"].append(t["verify"] / rounds)
            per["draft_ms"].append(t["draft"] / rounds)
            per["other_ms"].append((wall - t["verify"] - t["draft"]) / rounds)
        res.update({k: min(v) for k, v in per.items()})
        rounds = sum(x["rounds"] for x in first)
        res["rounds"] = rounds
        res["nodes"] = 1 + sum(x["proposed"] for x in first) / rounds
        res["emitted"] = sum(x["tokens"] for x in first) / rounds
        recs = [rec for x in first for rec in (x["records"] or [])]
        if spec["kind"] == "chain":
            res["accepted"] = [len(path) - 1 for _, path, _ in recs]
        elif spec["kind"] == "confidence":
            res["records"] = [(lp, path) for lp, path, _ in recs]
            res["steps"] = statistics.mean(n for _, _, n in recs) if recs else None
        out.append(res)
    return out


def measured_tok_s(res: dict) -> float:
    """Steady-state tokens per second of one calibrated spec (its fastest
    repeat): classic from its ms per token, the others from their emitted
    tokens per round over the round's drafting, verifying and the rest."""
    if res["kind"] == "classic":
        return 1e3 / res["ms_per_token"]
    round_ms = res["verify_ms"] + res["draft_ms"] + res["other_ms"]
    return 1e3 * res["emitted"] / round_ms if round_ms > 0 else 0.0
