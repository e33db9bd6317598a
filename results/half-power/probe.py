"""Item 5 of issue 42, a measurement for choosing a rule: on a backend whose
M-row products differ from one row (CUDA in bfloat16/float16), how far are a
tree verify's node rows from three references, and how far its negative
controls?

- R, steps: classic decoding over each node's root path (what the suite
  compares with today; the envelope E measures a plain forward's distance
  from it at the tree's widths);
- W, same width through the tree path: node i's root path padded with other
  tokens to the verify's n, verified as a chain through the tree path
  (array mask, per-node RoPE), row depth(i): every product at the verify's
  own M, so the backend's dependence on M cancels and only the layout of the
  visible keys differs;
- P, same width plain: the same padded chain as a plain mlx-lm forward (causal
  mask), row depth(i).

Printed per (family, dtype, history, tree): max |L - R|, |L - W|, |L - P|, the
envelope E and its bound 8E, the tree path's chain against the plain forward
at the same width (E's tree_vs_plain), and the weakest control measured
against R and against W. One JSON line each.

    PYTHONPATH=. python results/half-power/probe.py [--families llama,...] [--dtypes ...]
"""

import argparse
import json
import random
import time

import mlx.core as mx

from treespec import zoo
from treespec.audit.states import classic
from treespec.backend.blas import describe
from treespec.evidence import numerics
from treespec.evidence.controls import clone, controls, max_abs_diff
from treespec.tree import DraftTree
from treespec.verify import adapter_for

TREES = {
    "fan": [-1, 0, 0, 0, 0],
    "bushy": [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 6, 9],
}


def history(model, n: int, seed: int) -> list:
    rng = random.Random(seed)
    cache = clone(numerics.make_prompt_cache(model))
    if n:
        mx.eval(model(mx.array([[rng.randrange(zoo.VOCAB_SIZE) for _ in range(n)]]), cache=cache))
    return cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="llama,qwen3,gemma3_text,qwen3_5")
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--contexts", default="3,12")
    args = ap.parse_args()
    print(json.dumps({"backend": describe(), "device": str(mx.default_device()),
                      "info": {k: str(v) for k, v in mx.device_info().items()}}), flush=True)
    for family in args.families.split(","):
        for dtype in args.dtypes.split(","):
            model = zoo.build(family, dtype)
            adapter = adapter_for(model)
            for context in map(int, args.contexts.split(",")):
                before = history(model, context, seed=context)
                for name, parents in TREES.items():
                    t0 = time.perf_counter()
                    rng = random.Random(f"{name}:{context}")
                    tree = DraftTree([rng.randrange(zoo.VOCAB_SIZE) for _ in parents], parents)
                    n = len(tree)
                    logits = adapter.verify(tree, clone(before))
                    steps, width, plain = [], [], []
                    for i in range(n):
                        path = [tree.tokens[j] for j in tree.path_to(i)]
                        steps.append(classic(model, clone(before), path)[-1])
                        padded = path + [rng.randrange(zoo.VOCAB_SIZE) for _ in range(n - len(path))]
                        chain = DraftTree.linear(padded)
                        width.append(adapter.verify(chain, clone(before), inject=True)[len(path) - 1])
                        plain.append(model(mx.array(padded)[None], cache=clone(before))[0, len(path) - 1])
                    R, W, P = mx.stack(steps), mx.stack(width), mx.stack(plain)
                    env = numerics.envelope(model, context, numerics.widths_of(tree, 2))
                    cR = controls(model, before, tree, R) or {}
                    cW = controls(model, before, tree, W) or {}
                    print(json.dumps({
                        "family": family, "dtype": dtype, "context": context, "tree": name, "n": n,
                        "L-R": max_abs_diff(logits, R), "L-W": max_abs_diff(logits, W),
                        "L-P": max_abs_diff(logits, P), "W-P": max_abs_diff(W, P),
                        "E": env.value, "bound": env.bound, "tree_vs_plain": env.tree_vs_plain,
                        "controls_vs_R": cR, "controls_vs_W": cW,
                        "weakest_R": min(cR.values()) if cR else None,
                        "weakest_W": min(cW.values()) if cW else None,
                        "seconds": round(time.perf_counter() - t0, 2)}), flush=True)


if __name__ == "__main__":
    main()
