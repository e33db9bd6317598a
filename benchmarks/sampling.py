"""Speculative sampling: acceptance, tokens per round and speed of sampled chains and trees.

    python -m benchmarks.sampling --repeats 5                       # T = 0.3, 0.7, 1.0
    python -m benchmarks.sampling --temps 0.7 --repeats 5 --max-tokens 128
    python -m benchmarks.sampling --chains 3,4 --trees 2x1x1,2x2x1 --top-p 0.95 --json

Configurations: ``classic`` (plain sampling: mlx-lm's generate_step drawing
from the same distribution), ``chain b=B`` (SampledChainDrafter) and ``tree
AxBxC`` (SampledTreeDrafter, fixed branching), all through
treespec.decoding.decode with a temperature (treespec.sampling). Per temperature and pass, every
configuration decodes every prompt from the same seed (the configurations
in an order rotated every pass, so a slow stretch of a shared CPU hits all
alike); a pass's figure is the sum over prompts; the table shows medians
over passes. ``acc`` = accepted drafts / proposed drafts, ``tok/round`` =
tokens per target verify forward, ``speedup`` = median of per-pass ratios
to classic.

Exactness next to the figures (contract 10): every speculative configuration
runs treespec.evidence.gate's probe of its tree shapes (tree verify
bit-identical to single-token steps) once, untimed, and reports its verdict; a
configuration whose gate declined prints no figure (the timed runs then run
with the gate off: it would hash the weights in every call). The sampling rule's exactness in law is
suites/sampling's (``pytest suites/sampling``). Runs ignore EOS so every run
emits ``--max-tokens`` tokens.
"""

import json
import statistics
import time

import mlx.core as mx

from benchmarks import harness
from treespec.decoding import decode


def configs(args):
    out = [("classic", dict(mode="classic"))]
    for b in filter(None, args.chains.split(",")):
        out.append((f"chain b={int(b)}", dict(mode="chain", block=int(b))))
    for t in filter(None, args.trees.split(",")):
        br = tuple(int(x) for x in t.split("x"))
        out.append((f"tree {t}", dict(mode="tree", branching=br)))
    return out


def one(pair, prompt, temp, seed, cfg, args, max_tokens=None, gate=False):
    t0 = time.perf_counter()
    draft = None if cfg["mode"] == "classic" else pair.draft
    r = decode(pair.target, prompt, draft_model=draft, temperature=temp, top_k=args.top_k,
               top_p=args.top_p, seed=seed, gate=gate,
               max_tokens=args.max_tokens if max_tokens is None else max_tokens, **cfg)
    return r, time.perf_counter() - t0


def main(argv=None):
    ap = harness.parser("sampling", __doc__, pair="default", repeats=3, calls=None)
    ap.add_argument("--temps", default="0.3,0.7,1.0")
    ap.add_argument("--chains", default="4", help="chain blocks, comma separated")
    ap.add_argument("--trees", default="2x1x1,2x2x1", help="branchings, e.g. 2x2x1,3x1")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=0.0)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="the rows as JSON, not a table")
    args = ap.parse_args(argv)
    pair = harness.load_pair(args)
    prompts = pair.prompts(args.prompts)
    cfgs = dict(configs(args))
    temps = [float(t) for t in args.temps.split(",")]
    with harness.record(args, pair) as say:
        rows, gates = [], {}
        for name, cfg in cfgs.items():  # warm-up: compiles; the gate's probes, memoized
            r, _ = one(pair, prompts[0], 1.0, 0, cfg, args, max_tokens=8, gate=True)
            gates[name] = r.stats.gate
        # timed with the gate off (it would hash the weights in every call), its verdict above
        cfgs = {k: v for k, v in cfgs.items() if not (gates[k] and not gates[k]["run"])}
        for temp in temps:
            per = {name: [] for name in cfgs}
            for rep, order in enumerate(harness.rotated(list(cfgs), args.repeats)):
                for name in order:
                    tot = {"tokens": 0, "s": 0.0, "proposed": 0, "accepted": 0, "rounds": 0,
                           "emitted": 0}
                    for i, prompt in enumerate(prompts):
                        r, dt = one(pair, prompt, temp, 1000 * rep + i, cfgs[name], args)
                        s = r.stats
                        tot["tokens"] += len(r.tokens)
                        tot["s"] += dt
                        tot["proposed"] += s.proposed
                        tot["accepted"] += s.accepted
                        tot["rounds"] += s.rounds
                        tot["emitted"] += s.emitted
                    per[name].append(tot)
                    mx.clear_cache()
            base = per["classic"]
            for name in cfgs:
                runs, gate = per[name], gates[name]
                row = {
                    "temperature": temp, "config": name,
                    "tok_s": statistics.median(r["tokens"] / r["s"] for r in runs),
                    "acceptance": (statistics.median(r["accepted"] / r["proposed"] for r in runs)
                                   if runs[0]["proposed"] else None),
                    "tok_per_round": statistics.median(r["emitted"] / r["rounds"] for r in runs),
                    "speedup": statistics.median((r["tokens"] / r["s"]) / (b["tokens"] / b["s"])
                                                 for r, b in zip(runs, base)),
                    "gate": "-" if gate is None else ("exact" if gate["exact"] else
                                                      "DECLINED" if not gate["run"] else "INEXACT"),
                }
                rows.append(row)
                if args.json:
                    continue
                acc = "   -  " if row["acceptance"] is None else f"{row['acceptance']:6.3f}"
                say(f"T={temp:<4} {name:14s} acc {acc}  tok/round {row['tok_per_round']:5.2f}"
                    f"  {row['tok_s']:7.1f} tok/s  x{row['speedup']:.2f}  gate {row['gate']}")
        for name in gates.keys() - cfgs.keys():
            say(f"{name}: its gate declined: no figure")
        reasons = {k: (v or {}).get("reason") for k, v in gates.items()}
        if args.json:
            say(json.dumps({"repeats": args.repeats, "prompts": len(prompts),
                            "max_tokens": args.max_tokens, "top_k": args.top_k,
                            "top_p": args.top_p, "gates": reasons, "rows": rows}, indent=1))
        else:
            say(f"medians of {args.repeats} passes x {len(prompts)} prompts x {args.max_tokens} "
                "tokens; gate: " + "; ".join(f"{k}: {v}" for k, v in reasons.items() if v))


if __name__ == "__main__":
    main()
