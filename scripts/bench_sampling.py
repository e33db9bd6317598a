"""Speculative sampling on the trained pair: acceptance and tokens/s of plain
sampling, sampled chains and sampled trees at several temperatures.

    python scripts/bench_sampling.py                       # T = 0.3, 0.7, 1.0
    python scripts/bench_sampling.py --temps 0.7 --repeats 5 --max-tokens 128
    python scripts/bench_sampling.py --chains 3,4 --trees 2x1x1,2x2x1 --top-p 0.95 --json

Configurations: ``classic`` (plain sampling: mlx-lm's generate_step drawing
from the same distribution), ``chain b=B`` (SampledChainDrafter) and ``tree
AxBxC`` (SampledTreeDrafter, fixed branching), all through
treespec.sampling.decode_sampled. Per temperature and repeat, every
configuration decodes every prompt from the same seed (round robin, the
order rotated per repeat, so a slow stretch of a shared CPU hits all alike);
a repeat's figure is the sum over prompts; the table shows medians over
repeats. ``acc`` = accepted drafts / proposed drafts, ``tok/round`` = tokens
per target verify forward, ``speedup`` = median of per-repeat ratios to
classic.

Exactness next to the figures (contract 10): every speculative
configuration runs treespec.evidence.gate's probe of its tree shapes (tree verify
bit-identical to single-token steps) and reports its verdict; a
configuration whose gate declined prints no figure. The sampling rule's
exactness in law is suites/sampling (run it: ``pytest suites/sampling``).
Runs ignore EOS so every run emits --max-tokens tokens.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import mlx.core as mx


import mlx_lm

from treespec.sampling import decode_sampled

PAIR = Path(__file__).resolve().parents[1] / "treespec" / "pair"
# Python prompts (the pair was trained on CPython's stdlib); each ends in a
# newline, not in indentation spaces (treespec/pair/README.md says why).
PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def read_lines(path):\n    with open(path) as f:\n",
    "try:\n    import threading\nexcept ImportError:\n",
]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--temps", default="0.3,0.7,1.0")
    ap.add_argument("--chains", default="4", help="chain blocks, comma separated")
    ap.add_argument("--trees", default="2x1x1,2x2x1", help="branchings, e.g. 2x2x1,3x1")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=0.0)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def configs(args):
    out = [("classic", dict(mode="classic"))]
    for b in filter(None, args.chains.split(",")):
        out.append((f"chain b={int(b)}", dict(mode="chain", block=int(b))))
    for t in filter(None, args.trees.split(",")):
        br = tuple(int(x) for x in t.split("x"))
        out.append((f"tree {t}", dict(mode="tree", branching=br)))
    return out


def one(target, draft, prompt, temp, seed, cfg, args):
    t0 = time.perf_counter()
    r = decode_sampled(target, prompt, draft, temperature=temp, top_k=args.top_k,
                       top_p=args.top_p, seed=seed, max_tokens=args.max_tokens, **cfg)
    dt = time.perf_counter() - t0
    return r, dt


def main(argv=None):
    args = parse_args(argv)
    from treespec.backend.blas import describe

    target, tok = mlx_lm.load(str(PAIR / "target"))
    draft, _ = mlx_lm.load(str(PAIR / "draft"))
    prompts = [tok.encode(p) for p in PROMPTS[: args.prompts]]
    cfgs = configs(args)
    temps = [float(t) for t in args.temps.split(",")]
    rows, gates = [], {}
    # Warm up (compiles, the gate's probes are memoized per shape set).
    for name, cfg in cfgs:
        r, _ = one(target, draft, prompts[0], 1.0, 0, cfg, argparse.Namespace(
            **{**vars(args), "max_tokens": 8}))
        gates[name] = r.stats.gate
    for temp in temps:
        per = {name: [] for name, _ in cfgs}
        for rep in range(args.repeats):
            order = cfgs[rep % len(cfgs):] + cfgs[: rep % len(cfgs)]
            for name, cfg in order:
                tot = {"tokens": 0, "s": 0.0, "proposed": 0, "accepted": 0, "rounds": 0,
                       "emitted": 0, "declined": False}
                for i, prompt in enumerate(prompts):
                    r, dt = one(target, draft, prompt, temp, 1000 * rep + i, cfg, args)
                    s = r.stats
                    tot["tokens"] += len(r.tokens)
                    tot["s"] += dt
                    tot["proposed"] += s.proposed
                    tot["accepted"] += s.accepted
                    tot["rounds"] += s.rounds
                    tot["emitted"] += s.emitted
                    tot["declined"] |= s.mode.startswith("classic (declined")
                per[name].append(tot)
                mx.clear_cache()
        base = per["classic"]
        for name, _ in cfgs:
            runs = per[name]
            tps = [r["tokens"] / r["s"] for r in runs]
            row = {
                "temperature": temp, "config": name,
                "tok_s": statistics.median(tps),
                "acceptance": (statistics.median(r["accepted"] / r["proposed"] for r in runs)
                               if runs[0]["proposed"] else None),
                "tok_per_round": statistics.median(r["emitted"] / r["rounds"] for r in runs),
                "speedup": statistics.median(
                    (r["tokens"] / r["s"]) / (b["tokens"] / b["s"]) for r, b in zip(runs, base)),
                "gate": "-" if gates[name] is None else
                        ("exact" if gates[name]["exact"] else "DECLINED" if not gates[name]["run"]
                         else "INEXACT"),
                "declined": any(r["declined"] for r in runs),
            }
            rows.append(row)
            if not args.json:
                if row["declined"]:
                    print(f"T={temp:<4} {name:14s} gate declined: no figure")
                    continue
                acc = "   -  " if row["acceptance"] is None else f"{row['acceptance']:6.3f}"
                print(f"T={temp:<4} {name:14s} acc {acc}  tok/round {row['tok_per_round']:5.2f}"
                      f"  {row['tok_s']:7.1f} tok/s  x{row['speedup']:.2f}  gate {row['gate']}",
                      flush=True)
    meta = {"blas": describe(), "repeats": args.repeats, "prompts": len(prompts),
            "max_tokens": args.max_tokens, "top_k": args.top_k, "top_p": args.top_p,
            "gates": {k: (v or {}).get("reason") for k, v in gates.items()}}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
    else:
        print(f"# {meta['blas']}; medians of {args.repeats} repeats x {len(prompts)} prompts x "
              f"{args.max_tokens} tokens; gate: "
              + "; ".join(f"{k}: {v}" for k, v in meta["gates"].items() if v))


if __name__ == "__main__":
    main()
