"""What building a verify's graph costs on the host, apart from computing it.

The round loop times ``adapter.verify(...)`` (which only builds MLX's lazy
graph) inside its "draft" stage and the evaluation as "verify"
(treespec/rounds.py). On the H100 the row-invariant verify's "draft" stage
was 10-15 ms longer per round than the flat verify's with the same drafter
(h100-3f309e9/). This measures the two halves of one verify per mode on the
running device, medians of interleaved repeats: host time to build the
graph (no evaluation), then time to evaluate it.

    python results/exact-at-speed/graph_build.py --dims 1024x32 --bits 4 --context 128 [--modes flat,rows,kernels]

Beside the verifies: one classic decoding step (the model called on one
token) split the same way, and the host cost of building one call of a
target's first q_proj through MLX's own layer and through the row kernels
(``--modes`` with ``kernels``: CUDA only). ``--bits 0``: a dense target.
"""

import argparse
import json
import platform
import statistics
import subprocess
import time

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from treespec.auto.costcurve import parse_dims
from treespec.backend import row_kernels
from treespec.bench.scaled import build_pair, filled_cache
from treespec.tree import DraftTree
from treespec.verify import adapter_for

TREES = {"chain 2": [-1, 0], "chain 3": [-1, 0, 1], "chain 5": [-1, 0, 1, 2, 3],
         "tree [2,1]": [-1, 0, 0, 1, 2], "tree p[-1,0,0,1]": [-1, 0, 0, 1]}


def one(adapter, cache, parents):
    tree = DraftTree([1 + i for i in range(len(parents))], parents)  # fresh: no memo reused
    t0 = time.perf_counter()
    logits = adapter.verify(tree, cache)
    t1 = time.perf_counter()
    mx.eval(logits)
    t2 = time.perf_counter()
    trim_prompt_cache(cache, len(parents))
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


def step(model, cache):
    """One classic decoding step: the model on one token, built then evaluated."""
    t0 = time.perf_counter()
    logits = model(mx.array([[1]]), cache=cache)
    t1 = time.perf_counter()
    mx.eval(logits)
    t2 = time.perf_counter()
    trim_prompt_cache(cache, 1)
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


CALLS = 64


def per_call(f, x):
    """Host time to build one call of ``f`` (over CALLS calls), then the time to evaluate them, us."""
    t0 = time.perf_counter()
    ys = [f(x) for _ in range(CALLS)]
    t1 = time.perf_counter()
    mx.eval(ys)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e6 / CALLS, (t2 - t1) * 1e6 / CALLS


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="1024x32")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--modes", default="flat,rows", help="of flat, rows, kernels (CUDA)")
    args = ap.parse_args()
    hidden, layers = parse_dims(args.dims)
    target, _ = build_pair(hidden, layers, draft_layers=2, alpha=0.02, bits=args.bits or None)
    make = {"flat": lambda: adapter_for(target),
            "rows": lambda: adapter_for(target, rows=True),
            "kernels": lambda: adapter_for(target, rows=True, kernels=True)}
    modes = {m: make[m]() for m in args.modes.split(",")}
    cache = filled_cache(target, args.context)
    layer = target.model.layers[0].self_attn.q_proj
    x = mx.random.normal((5, 1, hidden)).astype(mx.bfloat16)
    mx.eval(x)
    calls = {"MLX layer": layer}
    if "kernels" in modes:
        calls["row kernel"] = lambda v: row_kernels.linear_rows(layer, v)
    # every measurement, a thunk giving (build, evaluate), run in this order each repeat
    runs = {(m, t): (lambda a=adapter, p=parents: one(a, cache, p))
            for t, parents in TREES.items() for m, adapter in modes.items()}
    runs["step", "one token"] = lambda: step(target, cache)
    runs.update({("call", name): (lambda f=f: per_call(f, x)) for name, f in calls.items()})
    times = {k: ([], []) for k in runs}
    for r in range(args.repeats + 1):  # the first pass warms up, uncounted
        for k, run in runs.items():
            build, evaluate = run()
            if r:
                times[k][0].append(build)
                times[k][1].append(evaluate)
    git = subprocess.run(["git", "log", "-1", "--format=%h"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"device": str(mx.default_device()), "machine": platform.machine(),
                      "mlx": mx.__version__, "git": git, "dims": args.dims, "bits": args.bits,
                      "context": args.context, "repeats": args.repeats}))
    print(f"{'tree':<18} {'mode':<7} {'build ms':>9} {'eval ms':>9}")
    for m, t in [(m, t) for m in modes for t in TREES] + [("step", "one token")]:
        b, e = times[m, t]
        print(f"{t:<18} {m:<7} {statistics.median(b):9.2f} {statistics.median(e):9.2f}")
    print(f"one call of the first q_proj ({hidden} -> {hidden}) on {x.shape[0]} rows, us: build / evaluate, "
          f"the call built {CALLS} times")
    for name in calls:
        b, e = times["call", name]
        print(f"{name:<12} {statistics.median(b):9.1f} {statistics.median(e):9.1f}")


if __name__ == "__main__":
    main()
