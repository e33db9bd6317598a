"""Where a speculative round's time goes on an accelerator: the same
configuration decoded several times in a row (first-call costs show as a
slow first run), and bare draft / verify steps timed with a sync each.

    python scripts/gpu_round_probe.py --dims 2048x16 --alpha 0.02
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache  # noqa: E402

from treespec import scaled  # noqa: E402
from treespec.bench import _mlx_lm_run  # noqa: E402
from treespec.costcurve import parse_dims  # noqa: E402
from treespec.decode import decode  # noqa: E402


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", type=parse_dims, default=(2048, 16))
    ap.add_argument("--alpha", type=float, default=0.02)
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    target, draft = scaled.build_pair(*args.dims, 2, args.alpha)
    for name, m in (("target", target), ("draft", draft)):
        print(name, " ".join(f"T={T}:{step_ms(m, T):.2f}ms" for T in (1, 2, 4, 8)), flush=True)
    p = scaled.default_prompts(1)[0]
    cfgs = [("classic", dict(mode="classic")), ("chain b=2", dict(mode="chain", block=2)),
            ("chain b=3", dict(mode="chain", block=3)), ("chain b=5", dict(mode="chain", block=5)),
            ("fixed 2,1,1", dict(mode="tree", branching=[2, 1, 1]))]
    ref = decode(target, p, "classic", max_tokens=48).tokens

    def text(tokens):
        at = next((i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b), None)
        return "text = classic" if at is None and len(tokens) == len(ref) else f"text differs at {at}"

    for name, kw in cfgs:
        for i in range(args.runs):
            t0 = time.perf_counter()
            r = decode(target, p, draft_model=draft, max_tokens=48, gate=False, **kw)
            dt = time.perf_counter() - t0
            tm = {k: round(v / max(r.stats.rounds, 1), 2) for k, v in r.stats.time_ms.items()}
            print(f"{name:12} run {i}: {len(r.tokens) / dt:7.1f} tok/s, {r.stats.rounds} rounds, "
                  f"ms/round {tm}, {text(r.tokens)}", flush=True)
    for b in (2, 3, 5):
        for i in range(args.runs):
            run = _mlx_lm_run(target, draft, p, 48, None, b)
            print(f"mlx-lm b={b} run {i}: {len(run.tokens) / run.wall_s:7.1f} tok/s, "
                  f"{text(run.tokens)}", flush=True)


if __name__ == "__main__":
    main()
