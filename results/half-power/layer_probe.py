"""Would comparing each decoder layer's output give the half-precision tree rows their power?

The tree-node contract compares final logits; in half precision on a GPU the envelope there (every
layer's rounding, accumulated) is so wide that the negative controls do not land 10 x the bound
beyond it (gemma3_text bfloat16, gemma4_text float16 on wrapped rings: results/half-power). This
measures, per decoder layer output (taps) and for the logits, on the suite's own models, histories
and trees (suites/verify/helpers):

- E_L: the envelope at layer L, as treespec.evidence.numerics measures it at the logits (a plain
  mlx-lm forward of M tokens against M one-token steps, time-ordered caches, random contexts
  spread over the context's bucket, widths 2 .. n);
- the verify's node rows against classic decoding's one-token steps along each root path;
- every negative control's node rows (treespec.evidence.controls) against the same steps;

and prints, per case, the largest ratio over layers of (weakest control) / (8 E_L) next to the
logits' ratio, and whether the verify's rows stay within 8 E_L at every layer.

    PYTHONPATH=. python3 results/half-power/layer_probe.py --out DIR \\
        --cases gemma3_text:bfloat16,gemma4_text:float16,llama:bfloat16
"""

import argparse
import json
import os
import random
import time

import mlx.core as mx

from suites.verify import helpers
from treespec.evidence import controls as C
from treespec.evidence.numerics import SAMPLES, _time_ordered
from treespec.evidence.verdicts import bucket
from treespec.heads.base import FINAL
from treespec.verify.taps import layer_home, tapped
from treespec.zoo import VOCAB_SIZE

BOUND = 8.0  # treespec.evidence.verdicts: TRIANGLE x SAFETY


def per_tap(outs, logits):
    """[(1, T, H) per layer ..., final norm, logits] of one forward (the last call of each tap)."""
    return [o[-1] for o in outs] + [logits.reshape(1, -1, logits.shape[-1])]


def run(model, taps, fn):
    with tapped(model, taps) as tp:
        logits = fn()
    return per_tap(tp.outputs, logits)


def diffs(a, b):
    """max |a - b| per tap, rows aligned."""
    return [float(mx.max(mx.abs(x.astype(mx.float32) - y.astype(mx.float32))).item()) for x, y in zip(a, b)]


def steps(model, taps, before, toks):
    """One-token steps over toks from a copy of before: per tap, (1, len, H) of each step's row."""
    cache, rows = C.clone(before), []
    for t in toks:
        rows.append(run(model, taps, lambda: model(mx.array([[t]]), cache=cache)[0, -1:]))
    return [mx.concatenate([r[k] for r in rows], axis=1) for k in range(len(rows[0]))]


def envelope(model, taps, context, widths, seed=0):
    """Per tap, E: max over samples and widths of |plain M-token forward - M one-token steps|."""
    lo, hi = bucket(context)
    rng = random.Random(f"{seed}:layer-probe")
    ctxs = [lo, hi, (lo + hi) // 2] + [rng.randint(lo, hi) for _ in range(SAMPLES - 3)]
    env = None
    for c in ctxs[:SAMPLES]:
        base = _time_ordered(model, None, None, [rng.randrange(VOCAB_SIZE) for _ in range(c)])
        toks = [rng.randrange(VOCAB_SIZE) for _ in range(max(widths))]
        ref = steps(model, taps, base, toks)
        for m in widths:
            p = run(model, taps, lambda: model(mx.array(toks[:m])[None], cache=C.clone(base))[0])
            d = diffs(p, [r[:, :m] for r in ref])
            env = d if env is None else [max(x, y) for x, y in zip(env, d)]
    return env, ctxs[:SAMPLES]


def verify_rows(model, taps, adapter, tree, before):
    return run(model, taps, lambda: adapter.verify(tree, C.clone(before)))


def case(family, dtype, hist_index, tree_name):
    model = helpers.model(family, dtype)
    n_layers = len(layer_home(model)[1])
    taps = tuple(range(n_layers)) + (FINAL,)
    hist = helpers.histories(family)[hist_index]
    before = hist.replay(model)
    tree = helpers.branching_trees(family)[tree_name]
    n = len(tree)
    # classic: each node's one-token steps over its root path; its last row per tap
    ref = [[] for _ in range(n_layers + 2)]
    for i in range(n):
        s = steps(model, taps, before, [tree.tokens[j] for j in tree.path_to(i)])
        for k, r in enumerate(s):
            ref[k].append(r[:, -1:])
    ref = [mx.concatenate(r, axis=1) for r in ref]
    real = C.adapter_or_none(model)
    got = verify_rows(model, taps, real, tree, before)
    out = {"family": family, "dtype": dtype, "history": hist_index, "offset": hist.offset,
           "tree": tree_name, "nodes": n, "verify": diffs(got, ref), "controls": {}}
    for defect in C.CONTROLS:
        ctl = type(f"Control[{defect}]", (C._Control,), {"defect": defect})(model, real.family)
        out["controls"][defect] = diffs(verify_rows(model, taps, ctl, tree, before), ref)
    return out


def summarize(r, env):
    names = [str(i) for i in range(len(env) - 2)] + ["norm", "logits"]
    bounds = [BOUND * e for e in env]
    within = all(v <= b for v, b in zip(r["verify"], bounds))
    weakest = [min(c[k] for c in r["controls"].values() if c[k] > 0) if any(c[k] > 0 for c in r["controls"].values())
               else 0.0 for k in range(len(env))]
    ratio = [w / b if b else float("inf") for w, b in zip(weakest, bounds)]
    # per control: its best layer's ratio; the weakest control's best ratio decides power
    best = {d: max((c[k] / bounds[k] if bounds[k] else float("inf")) for k in range(len(env)))
            for d, c in r["controls"].items()}
    return {"layers": names, "bound": bounds, "within_every_layer": within, "weakest_ratio": ratio,
            "best_ratio_per_control": best, "logits_ratio": ratio[-1],
            "power_by_layers": min(best.values()) if best else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="gemma3_text:bfloat16,gemma4_text:float16,llama:bfloat16")
    ap.add_argument("--histories", default="3,4,5")
    ap.add_argument("--trees", default="bushy,deeper-than-window")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows, t0 = [], time.time()
    dev = str(mx.default_device())
    for spec in a.cases.split(","):
        family, dtype = spec.split(":")
        envs = {}
        for h in map(int, a.histories.split(",")):
            for t in a.trees.split(","):
                r = case(family, dtype, h, t)
                key = (bucket(r["offset"]), r["nodes"])
                if key not in envs:
                    envs[key] = envelope(helpers.model(family, dtype), tuple(range(len(r["verify"]) - 2)) + (FINAL,),
                                         r["offset"], range(2, r["nodes"] + 1))
                env, ctxs = envs[key]
                r.update(envelope=env, contexts=ctxs, device=dev, **summarize(r, env))
                rows.append(r)
                print(f"{family} {dtype} h{h} {t}: logits ratio {r['logits_ratio']:.3g}, by layers "
                      f"{r['power_by_layers']:.3g} ({ {k: round(v, 1) for k, v in r['best_ratio_per_control'].items()} }), "
                      f"within every layer {r['within_every_layer']}; E {['%.3g' % e for e in env]}; "
                      f"verify {['%.3g' % v for v in r['verify']]}  [{time.time() - t0:.0f} s]", flush=True)
                with open(os.path.join(a.out, "layer_probe.json"), "w") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
