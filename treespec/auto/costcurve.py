"""The verify cost curve: what one target forward over T tokens costs, and whether it is exact.

Tree speculative decoding pays off only when a forward over T draft nodes costs little more than a
forward over one token. On the MLX CPU backend that is decided by the BLAS (see treespec.backend.blas):
with the wheel's bundled reference BLAS a T-token forward costs about T single steps; with
OpenBLAS preloaded the curve is nearly flat, but float32 forwards over T>=4 tokens stop being
bit-identical to T single-token steps.

    python -m treespec.auto.costcurve                          # zoo llama (or a tiny one), this BLAS
    python -m treespec.auto.costcurve --dims 512x8 --both-blas # 512-wide 8-layer llama, both BLAS
    python -m treespec.auto.costcurve --dims 512x8 --both-blas --exactness 16 --dtypes float32,bfloat16,q4
    python -m treespec.auto.costcurve --model PATH --blas openblas

``--exactness N`` measures, for T in 1..N, whether one T-token forward equals T single-token steps
(max abs logit difference, argmax flips). It is a measurement for the record; the gate
(treespec.evidence.gate) owns the verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx_lm.models import llama
import numpy as np
from mlx_lm.models.cache import trim_prompt_cache

from ..backend import blas as _blas
from .. import zoo
from ..cli.flags import parse_dims
from ..models import prefilled, vocab_size

DEFAULT_TS = (1, 2, 4, 8, 16, 32, 64)


# ----------------------------------------------------------------------------- models


@dataclass(frozen=True)
class Widths:
    """A llama's widths besides ``hidden``; None: derived from ``hidden`` (head_dim 64,
    GQA 2:1, SwiGLU ~8/3 wide)."""

    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None


def build_llama(
    hidden: int = 512,
    layers: int = 8,
    *,
    vocab: int = 32000,
    dtype: str = "float32",
    bits: int | None = None,
    group_size: int = 64,
    seed: int = 0,
    tied: bool = True,
    widths: Widths = Widths(),
) -> nn.Module:
    """A seeded random-weight mlx-lm llama (head_dim 64, GQA 2:1, SwiGLU ~8/3 wide unless
    ``widths`` says otherwise).

    bits=4/8 quantizes every Linear and the (tied) embedding with nn.quantize, activations stay
    in `dtype`.
    """
    heads = widths.heads or max(1, hidden // 64)
    kv_heads = widths.kv_heads or max(1, heads // 2)
    ffn = widths.ffn or int(np.ceil(8 * hidden / 3 / 64) * 64)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=ffn,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5,
        vocab_size=vocab,
        tie_word_embeddings=tied,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    model.set_dtype(getattr(mx, dtype))
    if bits is not None:
        nn.quantize(model, group_size=group_size, bits=bits)
    model.eval()
    mx.eval(model.parameters())
    return model


def _parse_dtype(spec: str) -> tuple[str, int | None]:
    """'float32' | 'bfloat16' | 'float16' | 'q4' (4-bit weights, float32 activations) | 'q8'."""
    if spec.startswith("q") and spec[1:].isdigit():
        return "float32", int(spec[1:])
    if spec in ("float32", "bfloat16", "float16"):
        return spec, None
    raise ValueError(f"unknown dtype spec {spec!r} (float32, bfloat16, float16, q4, q8)")


def make_model(spec: str, *, model_path: str | None, dims: tuple[int, int] | None, seed: int):
    """(model, label) for a dtype spec: --model checkpoint, --dims llama, else zoo llama."""
    dtype, bits = _parse_dtype(spec)
    if model_path:
        model, _ = mlx_lm.load(model_path)
        return model, f"{model_path}"
    if dims is None:
        return zoo.build("llama", dtype=dtype, bits=bits, seed=seed), f"zoo llama {spec} seed {seed}"
    hidden, layers = dims
    model = build_llama(hidden, layers, dtype=dtype, bits=bits, seed=seed)
    return model, f"llama {hidden}x{layers} {spec} seed {seed}"


def _random_context(model, context: int, rng: np.random.RandomState, vocab: int):
    """A fresh cache prefilled with ``context`` seeded random tokens."""
    return prefilled(model, rng.randint(0, vocab, size=context).tolist())


# ----------------------------------------------------------------------------- measurements


def verify_cost_curve(
    model,
    Ts=DEFAULT_TS,
    context: int = 64,
    repeats: int = 5,
    warmup: int = 2,
    seed: int = 0,
) -> list[dict]:
    """Median wall time of one forward over T tokens on a cache prefilled with `context` tokens.

    The cache is trimmed back to `context` after every forward (trim_prompt_cache), so each
    repeat starts from the same state; logits of all T positions are evaluated (as a verify
    forward needs them). Returns [{T, median_ms, min_ms, ratio_to_T1}] in the order of Ts.
    """
    rng = np.random.RandomState(seed)
    vocab = vocab_size(model)
    cache = _random_context(model, context, rng, vocab)
    rows = []
    for T in Ts:
        tokens = mx.array(rng.randint(0, vocab, size=(1, T)))
        mx.eval(tokens)
        times = []
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            logits = model(tokens, cache=cache)
            mx.eval(logits)
            dt = time.perf_counter() - t0
            trimmed = trim_prompt_cache(cache, T)
            if trimmed != T:
                raise RuntimeError(f"cache trimmed {trimmed} of {T} tokens; cannot re-measure")
            if i >= warmup:
                times.append(dt * 1e3)
        rows.append({"T": T, "median_ms": statistics.median(times), "min_ms": min(times)})
    base = next((r["median_ms"] for r in rows if r["T"] == 1), rows[0]["median_ms"])
    for r in rows:
        r["ratio_to_T1"] = r["median_ms"] / base
    return rows


def stepwise_exactness(model, T_max: int = 16, context: int = 32, seed: int = 0) -> list[dict]:
    """For T in 1..T_max: one T-token forward vs T single-token steps, from the same cache.

    Returns [{T, max_abs_diff, identical, argmax_flips}] (logits compared in float32).
    """
    rng = np.random.RandomState(seed + 1)
    vocab = vocab_size(model)
    cache = _random_context(model, context, rng, vocab)
    rows = []
    for T in range(1, T_max + 1):
        tokens = mx.array(rng.randint(0, vocab, size=(1, T)))
        full = model(tokens, cache=cache)[0].astype(mx.float32)
        mx.eval(full)
        trim_prompt_cache(cache, T)
        steps = []
        for i in range(T):
            out = model(tokens[:, i : i + 1], cache=cache)[0, 0].astype(mx.float32)
            mx.eval(out)
            steps.append(out)
        trim_prompt_cache(cache, T)
        stepped = mx.stack(steps)
        a, b = np.array(full), np.array(stepped)
        rows.append(
            {
                "T": T,
                "max_abs_diff": float(np.max(np.abs(a - b))),
                "identical": bool(np.array_equal(a, b)),
                "argmax_flips": int(np.sum(a.argmax(-1) != b.argmax(-1))),
            }
        )
    return rows


def matmul_gflops(n: int = 1024, repeats: int = 3) -> float:
    """float32 n x n matmul throughput (best of `repeats`), the BLAS speed at a glance."""
    a = mx.random.normal((n, n), key=mx.random.key(0))
    b = mx.random.normal((n, n), key=mx.random.key(1))
    mx.eval(a, b, a @ b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(a @ b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


# ----------------------------------------------------------------------------- CLI


def _run_here(args) -> dict:
    info = _blas.ensure_blas(args.blas)
    out = {"blas": _blas.describe(info), "key": info.key(), "name": info.name, "threads": info.threads}
    out["gflops"] = matmul_gflops()
    specs = [s for s in args.dtypes.split(",") if s]
    out["curves"], out["exactness"], out["labels"] = {}, {}, {}
    for spec in specs:
        model, label = make_model(spec, model_path=args.model, dims=args.dims, seed=args.seed)
        out["labels"][spec] = label
        if not args.no_curve:
            out["curves"][spec] = verify_cost_curve(
                model, args.Ts, args.context, args.repeats, args.warmup, args.seed
            )
        if args.exactness:
            out["exactness"][spec] = stepwise_exactness(model, args.exactness, args.context, args.seed)
        del model
    return out


def _child_argv(args, choice: str) -> list[str]:
    argv = [sys.executable, "-m", "treespec.auto.costcurve", "--blas", choice, "--json"]
    argv += ["--Ts", ",".join(map(str, args.Ts)), "--context", str(args.context)]
    argv += ["--repeats", str(args.repeats), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    argv += ["--dtypes", args.dtypes]
    if args.model:
        argv += ["--model", args.model]
    if args.dims:
        argv += ["--dims", f"{args.dims[0]}x{args.dims[1]}"]
    if args.exactness:
        argv += ["--exactness", str(args.exactness)]
    if args.no_curve:
        argv += ["--no-curve"]
    return argv


def _run_child(args, choice: str) -> dict:
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env.pop(_blas.REEXEC_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        _child_argv(args, choice), cwd=root, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        msg = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        return {"error": msg, "blas": f"BLAS: {choice} (failed)"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1])


def _fmt_exactness(rows: list[dict]) -> str:
    worst = max(r["max_abs_diff"] for r in rows)
    diff_T = [r["T"] for r in rows if not r["identical"]]
    flips = sum(r["argmax_flips"] for r in rows)
    if not diff_T:
        return "bit-identical"
    return f"max {worst:.2g}; differs at T={_ranges(diff_T)}; argmax flips {flips}"


def _ranges(xs: list[int]) -> str:
    out, start, prev = [], xs[0], xs[0]
    for x in xs[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(out)


def _print_results(results: list[dict], args) -> None:
    for res in results:
        head = res["blas"]
        if "error" in res:
            print(f"{head}: {res['error']}")
            continue
        print(f"{head}; key {res['key']}; 1024^2 f32 matmul {res['gflops']:.1f} GFLOPS")
    ok = [r for r in results if "error" not in r]
    if not ok:
        return
    specs = list(ok[0]["labels"])
    names = [f"{r['name']}" + (f" ({r['threads']}t)" if r.get("threads") else "") for r in ok]
    for spec in specs:
        if ok[0]["curves"].get(spec):
            print(f"\nverify cost curve: {ok[0]['labels'][spec]}, context {args.context}, "
                  f"median of {args.repeats} (warmup {args.warmup})")
            head = f"{'T':>4} " + "".join(f"| {n:^24} " for n in names)
            print(head)
            print(f"{'':>4} " + "".join(f"| {'ms':>10} {'x T=1':>8}     " for _ in names))
            for i, T in enumerate(args.Ts):
                cells = "".join(
                    f"| {r['curves'][spec][i]['median_ms']:>10.1f} {r['curves'][spec][i]['ratio_to_T1']:>8.2f}     "
                    for r in ok
                )
                print(f"{T:>4} {cells}")
    if args.exactness:
        print(f"\nT-token forward vs T single steps, T=1..{args.exactness}, context {args.context}")
        for spec in specs:
            for name, r in zip(names, ok):
                print(f"  {ok[0]['labels'][spec]:<36} {name:<16} {_fmt_exactness(r['exactness'][spec])}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m treespec.auto.costcurve", description=__doc__.split("\n\n")[0])
    p.add_argument("--blas", choices=_blas.CHOICES, default="auto", help="CPU BLAS (re-execs)")
    p.add_argument("--both-blas", action="store_true", help="run under reference and OpenBLAS, one table")
    p.add_argument("--model", help="mlx_lm.load checkpoint directory")
    p.add_argument("--dims", type=parse_dims, help="seeded random llama HIDDENxLAYERS, e.g. 512x8")
    p.add_argument("--dtypes", default="float32", help="comma list: float32,bfloat16,float16,q4,q8")
    p.add_argument("--Ts", type=lambda s: tuple(int(x) for x in s.split(",")), default=DEFAULT_TS)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exactness", type=int, default=0, metavar="TMAX",
                   help="also compare one T-token forward with T single steps, T=1..TMAX")
    p.add_argument("--no-curve", action="store_true", help="skip the timing curve")
    p.add_argument("--json", action="store_true", help="print one JSON line (used by --both-blas)")
    args = p.parse_args(argv)

    if args.both_blas:
        results = [_run_child(args, "reference"), _run_child(args, "openblas")]
    else:
        try:
            results = [_run_here(args)]
        except _blas.BlasUnavailable as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(results[0]))
            return 0
    _print_results(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
