"""Chain vs tree on a ~1B bf16 llama where the verify curve is flat (the
lent H200), with a drafter derived from it (the same weights, 4-bit), so
acceptance is realistic for a random-weight model.

Prints the verify cost curve, the exactness probe's verdict, and, per
configuration, acceptance, emitted per verify and tok/s (median of
interleaved repeats). Every configuration's tokens are compared with classic
decode in the same run; figures are labelled with the probe's verdict (the
run forces speculation past a declining gate to measure it: INEXACT rows are
measurements, not exact claims).
Run: python scripts/h200_bench.py --dims 2048x16 --out results.json
"""

import argparse
import json
import statistics
import time

import mlx.core as mx
import mlx.nn as nn

from treespec.blas import describe, detect
from treespec.costcurve import build_llama, parse_dims, verify_cost_curve
from treespec.decode import decode
from treespec.gate import decide, shapes_for


def configs(max_block):
    out = [("classic", dict(mode="classic"))]
    for b in range(2, max_block + 1):
        out.append((f"chain b={b}", dict(mode="chain", block=b)))
        out.append((f"conf n={b - 1}", dict(mode="tree", budget=b - 1, width=3)))
    for br in ([2, 1, 1], [2, 2, 1], [3, 2, 1], [2, 2, 2, 1], [4, 2, 2, 1]):
        out.append(("fixed " + "x".join(map(str, br)), dict(mode="tree", branching=br)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", type=parse_dims, default=(2048, 16))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-block", type=int, default=8)
    ap.add_argument("--out", default="h200_bench.json")
    args = ap.parse_args()
    hidden, layers = args.dims
    target = build_llama(hidden, layers, dtype="bfloat16", seed=0)
    draft = build_llama(hidden, layers, dtype="bfloat16", seed=0)
    nn.quantize(draft, group_size=64, bits=4)
    mx.eval(draft.parameters())
    n_params = sum(v.size for _, v in nn.utils.tree_flatten(target.parameters()))
    head = f"{describe(detect())}; llama {hidden}x{layers} bf16, {n_params / 1e9:.2f}B params"
    print(head, flush=True)
    curve = verify_cost_curve(target, Ts=(1, 2, 4, 8, 16, 32, 64), context=256, repeats=7)
    print("verify curve:", " ".join(f"T={r['T']}:{r['ratio_to_T1']:.2f}x" for r in curve),
          f"(T=1 {curve[0]['median_ms']:.2f} ms)", flush=True)
    verdict = decide(target, shapes_for(args.max_block, [(-1, 0, 0, 1, 1, 2, 2)]))
    print("gate:", verdict.reason, flush=True)
    prompts = [[(17 * i + 3 * j) % 32000 for j in range(32)] for i in range(3)]
    classic = [decode(target, p, "classic", max_tokens=args.max_tokens).tokens for p in prompts]
    rows = {name: {"tps": [], "acc": None, "epv": None, "same": True} for name, _ in configs(args.max_block)}
    for rep in range(args.repeats):
        for name, kw in configs(args.max_block):
            toks = elapsed = proposed = accepted = emitted = rounds = 0
            for p, ref in zip(prompts, classic):
                t0 = time.perf_counter()
                r = decode(target, p, draft_model=draft, max_tokens=args.max_tokens,
                           gate=False, **kw)  # verdict printed above, once
                elapsed += time.perf_counter() - t0 - r.stats.time_ms["prefill"] / 1e3
                toks += len(r.tokens)
                rows[name]["same"] &= r.tokens == ref
                s = r.stats
                proposed, accepted = proposed + s.proposed, accepted + s.accepted
                emitted, rounds = emitted + s.emitted, rounds + s.rounds
            rows[name]["tps"].append(toks / elapsed)
            rows[name]["acc"] = accepted / proposed if proposed else None
            rows[name]["epv"] = emitted / rounds if rounds else None
    base = statistics.median(rows["classic"]["tps"])
    best_chain = max(statistics.median(v["tps"]) for k, v in rows.items() if k.startswith("chain"))
    print(f"{'config':<16} {'accept':>7} {'emit/ver':>8} {'tok/s':>8} {'x classic':>9} {'x best chain':>12} text")
    for name, v in rows.items():
        tps = statistics.median(v["tps"])
        acc = f"{v['acc']:.3f}" if v["acc"] is not None else "-"
        epv = f"{v['epv']:.2f}" if v["epv"] is not None else "-"
        print(f"{name:<16} {acc:>7} {epv:>8} {tps:>8.1f} {tps / base:>9.2f} {tps / best_chain:>12.2f} "
              f"{'= classic' if v['same'] else 'DIFFERS'}")
        v["median_tps"] = tps
    with open(args.out, "w") as f:
        json.dump({"header": head, "curve": curve, "gate": verdict.summary(),
                   "rows": {k: {kk: vv for kk, vv in v.items()} for k, v in rows.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
