# Archived one-question probe (issue 41): scripts/gpu_round_probe.py as it stood at 7dc635f,
# beside the record(s) it produced; not run or tested since (its imports may have moved).
# Record(s):
#   results/h200-round-probe.txt (measured at 3a5c400 on the H200, recorded in 13d22c8)
#   results/h200-scaled/round-probe-bf16.txt, round-probe-f32.txt (af03c15 and db8806d,
#     recorded in 8b0b444)
# Where a round's time went on the H200 (first-call costs, bare steps); benchmarks.round_census
# and benchmarks.verify_cost answer the lasting part. sdpa_cache_probe.py beside it imports it.
# The version that produced a record: git show <recording commit>:scripts/gpu_round_probe.py

"""Where a speculative round's time goes on an accelerator: the same
configuration decoded several times in a row (first-call costs show as a
slow first run), and bare draft / verify steps timed with a sync each.

    python scripts/gpu_round_probe.py --dims 2048x16 --alpha 0.02
    python scripts/gpu_round_probe.py --configs "classic chain:5 tree:2,1,1 parents:-1,0,0,1,1"
"""
import argparse
import statistics
import time


import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from treespec.bench import scaled
from treespec.bench.measure import Config, mlx_lm_run
from treespec.decoding import decode


def step_ms(model, T, context=64, n=20):
    cache = make_prompt_cache(model)
    model(mx.arange(context)[None], cache=cache)
    mx.eval([c.state for c in cache])
    out = []
    for i in range(n + 3):
        t0 = time.perf_counter()
        mx.eval(model(mx.arange(T)[None], cache=cache))
        out.append(1e3 * (time.perf_counter() - t0))
        trim_prompt_cache(cache, T)
    return statistics.median(out[3:])


def parse_config(text):
    """'classic', 'chain:B', 'tree:B1,B2,..' (branching), 'parents:-1,0,..',
    'mlx-lm:B' -> a treespec.bench.measure.Config (its runner is bench.run_config)."""
    kind, _, arg = text.partition(":")
    ints = tuple(int(x) for x in arg.split(",") if x)
    if kind == "classic":
        return Config("classic", "classic")
    if kind == "chain":
        return Config(f"chain b={ints[0]}", "chain", block=ints[0])
    if kind == "tree":
        return Config(f"fixed {arg}", "fixed", branching=ints)
    if kind == "parents":
        return Config(f"parents[{len(ints)}]", "fixed", branching=ints)
    if kind == "mlx-lm":
        return Config(f"mlx-lm b={ints[0]}", "mlx-lm", block=ints[0])
    raise SystemExit(f"unknown config {text!r}")


def main():
    ap = argparse.ArgumentParser()
    scaled.add_pair_arguments(ap)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--configs", default="classic chain:2 chain:3 chain:5 tree:2,1,1",
                    help="classic, chain:B, tree:B1,B2,.. (branching), parents:-1,0,.. ")
    ap.add_argument("--mlx-lm", default="2,3,5", help="mlx-lm blocks ('' for none)")
    ap.add_argument("--steps", action="store_true", help="time bare draft/verify steps first")
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16, or float32 to check texts")
    args = ap.parse_args()
    target, draft = scaled.pair_from_arguments(args, args.dtype)
    if args.steps:
        for name, m in (("target", target), ("draft", draft)):
            print(name, " ".join(f"T={T}:{step_ms(m, T):.2f}ms" for T in (1, 2, 4, 8)), flush=True)
    p = scaled.default_prompts(1)[0]
    cfgs = [parse_config(c) for c in args.configs.split()]
    if any(c.kind == "mlx-lm" for c in cfgs):
        raise SystemExit("give mlx-lm's blocks with --mlx-lm: --configs runs treespec's decode")
    mt = args.max_tokens
    ref = decode(target, p, "classic", max_tokens=mt).tokens

    def text(tokens):
        at = next((i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b), None)
        same = "text = classic" if at is None and len(tokens) == len(ref) else f"text differs at {at}"
        return f"{same} (hash {hash(tuple(tokens)) % 10**6:06d})"

    for cfg in cfgs:
        name, kw = cfg.name, cfg.decode_kwargs()
        for i in range(args.runs):
            t0 = time.perf_counter()
            r = decode(target, p, draft_model=draft, max_tokens=mt, gate=False, **kw)
            dt = time.perf_counter() - t0
            tm = {k: round(v / max(r.stats.rounds, 1), 2) for k, v in r.stats.time_ms.items()}
            print(f"{name:12} run {i}: {len(r.tokens) / dt:7.1f} tok/s, {r.stats.rounds} rounds "
                  f"({len(r.tokens) / max(r.stats.rounds, 1):.2f} per round), "
                  f"ms/round {tm}, {text(r.tokens)}", flush=True)
    for b in [int(x) for x in args.mlx_lm.split(",") if x]:
        for i in range(args.runs):
            run = mlx_lm_run(target, draft, p, mt, None, b)
            print(f"mlx-lm b={b} run {i}: {len(run.tokens) / run.wall_s:7.1f} tok/s, "
                  f"{text(run.tokens)}", flush=True)


if __name__ == "__main__":
    main()
