# Archived one-question probe (issue 41): scripts/gpu_probe.py as it stood at 7dc635f,
# beside the record(s) it produced; not run or tested since (its imports may have moved).
# Record(s):
#   results/h200-probe.json (the H200, MLX 0.32.4 CUDA; recorded in 107630c)
# The exactness probe and a short text diff on MLX's default device; the exactness suite
# (benchmarks/device/exactness_timed.sh) now runs the probe's checks there.
# The version that produced a record: git show <recording commit>:scripts/gpu_probe.py

"""The exactness probe and a short end-to-end diff on whatever device MLX
defaults to (run on the lent H200 through MLX's CUDA backend).

For each model and dtype: the probe table (chains 1..8 and branching trees),
the gate's decision, and classic vs chain vs tree tokens at temperature 0
(tree and chain forced with allow_inexact so the diff is measured, not
declined). Writes JSON to --out and prints tables.
Run: python scripts/gpu_probe.py --out results.json
"""

import argparse
import json
import time
from pathlib import Path

import mlx.core as mx

from treespec import zoo
from treespec.backend.blas import describe, detect
from treespec.auto.costcurve import build_llama
from treespec.decoding import decode
from treespec.evidence.gate import decide, shapes_for

TREES = [(-1, 0, 0, 1, 1, 2, 2), (-1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8), (-1, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)]


def models():
    import mlx_lm

    pair = Path(__file__).resolve().parents[1] / "treespec" / "pair"
    target, _ = mlx_lm.load(str(pair / "target"))
    draft, _ = mlx_lm.load(str(pair / "draft"))
    yield "trained-pair-float16", target, draft
    for dtype in ("float32", "bfloat16", "float16"):
        yield f"zoo-llama-{dtype}", zoo.build("llama", dtype=dtype), zoo.drafter("llama", dtype=dtype)
        big = build_llama(512, 8, dtype=dtype, seed=0)
        yield f"llama-512x8-{dtype}", big, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_probe.json")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    print(describe(detect()), "mlx", mx.__version__, flush=True)
    results = []
    prompt = zoo.tokenizer().encode("def fibonacci(n):\n    ")
    for name, target, draft in models():
        t0 = time.time()
        dec = decide(target, shapes_for(8, TREES))
        rec = {"model": name, "decision": dec.summary(), "probe": dec.probe.to_json()}
        print(f"== {name}: {dec.reason}\n{dec.probe.table()}", flush=True)
        if draft is not None:
            ref = decode(target, prompt, "classic", max_tokens=args.max_tokens).tokens
            diffs = {}
            for label, kw in {"chain-b5": dict(mode="chain", block=5),
                              "tree-2x2x1": dict(mode="tree", branching=[2, 2, 1]),
                              "tree-conf-b8": dict(mode="tree", budget=8, width=3)}.items():
                got = decode(target, prompt, draft_model=draft, max_tokens=args.max_tokens,
                             allow_inexact=True, **kw).tokens
                first = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None)
                diffs[label] = {"identical": got == ref, "first_diff": first}
            rec["e2e_vs_classic"] = diffs
            print(f"   e2e vs classic: {diffs}", flush=True)
        rec["seconds"] = time.time() - t0
        results.append(rec)
    with open(args.out, "w") as f:
        json.dump({"device": str(mx.default_device()), "blas": describe(detect()),
                   "mlx": mx.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
