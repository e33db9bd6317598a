"""Tree verify vs chain verify of the same node count.

    python scripts/verify_bench.py [--runs 21] [--nodes 4 8 16 32] [--prompt 64]

A chain verify is mlx-lm's plain ``model(tokens[None], cache=cache)``; a
tree verify is ``adapter.verify(tree, cache)`` over a tree with the same
number of nodes, so the ratio is what the mask and per-node RoPE injection
cost (the FLOPs are the same). Runs on the largest zoo model, and on the
largest attention-only one too when the largest is a hybrid (whose tree goes
through the tree-aware recurrence).

Each figure is the median of ``--runs`` timed forwards, each from its own
copy of a prefilled cache, after one warm-up. Contract 10: a figure is
printed only next to the exactness check that passed for that very tree and
cache state in the same run (every node's logits equal to a plain forward
over its root path, bit for bit).
"""

import argparse
import copy
import os
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from treespec import caches, zoo
from treespec.models import n_params
from treespec.tree import DraftTree
from treespec.verify import adapter_for


def heap_tree(n: int, tokens) -> DraftTree:
    """A binary tree of n nodes (parent of i is (i-1)//2): the bushiest
    shape of its size, depth log2(n)."""
    return DraftTree(tokens[:n], [-1] + [(i - 1) // 2 for i in range(1, n)])


def exact(model, adapter, cache, tree) -> bool:
    """Every node's verify row equals a plain forward over its root path."""
    logits = adapter.verify(tree, copy.deepcopy(cache))
    for i in range(len(tree)):
        toks = [tree.tokens[j] for j in tree.path_to(i)]
        ref = model(mx.array(toks)[None], cache=copy.deepcopy(cache))[0, -1]
        if len(toks) == 1:  # a one-token step may see rotated keys; compare row 0 of two
            ref = model(mx.array(toks * 2)[None], cache=copy.deepcopy(cache))[0, 0]
        if not mx.array_equal(ref, logits[i]):
            return False
    return True


def timed(fns: dict, cache, runs: int) -> dict:
    """Median ms of each fn(cache copy), the forward evaluated with its
    caches. The fns take turns run by run, so a load change on the machine
    hits them alike; one warm-up round is dropped."""
    times = {k: [] for k in fns}
    for r in range(runs + 1):
        for k, fn in fns.items():
            c = copy.deepcopy(cache)
            mx.eval([x.state for x in c])
            t0 = time.perf_counter()
            out = fn(c)
            mx.eval(out, [x.state for x in c])
            if r:
                times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def hybrid(model) -> bool:
    return any(caches.mode_of(c).recurrent for c in make_prompt_cache(model))


def bench(family: str, nodes, runs: int, prompt: int):
    model = zoo.build(family)
    adapter = adapter_for(model)
    toks = [int(t) for t in mx.random.randint(0, zoo.VOCAB_SIZE, (prompt + max(nodes),),
                                               key=mx.random.key(0)).tolist()]
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array(toks[:prompt])[None], cache=cache))
    draft = toks[prompt:]
    print(f"\n{family}: {n_params(model):,} parameters, prompt {prompt} tokens, "
          f"median of {runs} runs")
    print(f"{'nodes':>5}  {'tree':<7} {'exact':<5} {'chain ms':>9} {'tree ms':>9} {'ratio':>6}"
          f"  {'1-token step ms':>15}")
    step = timed({"step": lambda c: model(mx.array(draft[:1])[None], cache=c)}, cache, runs)
    for n in nodes:
        tree = heap_tree(n, draft)
        ok = exact(model, adapter, cache, tree)
        ms = timed(
            {
                "chain": lambda c: model(mx.array(draft[:n])[None], cache=c),
                "tree": lambda c: adapter.verify(tree, c),
            },
            cache,
            runs,
        )
        shape = "binary"
        figures = (
            f"{ms['chain']:9.2f} {ms['tree']:9.2f} {ms['tree'] / ms['chain']:6.3f}"
            if ok
            else f"{'-':>9} {'-':>9} {'-':>6}  (no figures: exactness failed)"
        )
        print(f"{n:5d}  {shape:<7} {'yes' if ok else 'NO':<5} {figures}  {step['step']:15.2f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=21)
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32])
    p.add_argument("--prompt", type=int, default=64)
    args = p.parse_args(argv)
    built = {f: zoo.build(f) for f in zoo.FAMILIES}
    models = {f: n_params(m) for f, m in built.items()}
    largest = max(models, key=models.get)
    families = [largest]
    if hybrid(built[largest]):
        attn = {f: s for f, s in models.items() if not hybrid(built[f])}
        families.append(max(attn, key=attn.get))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"MLX {mx.__version__}, device {mx.default_device()}, {os.cpu_count()} CPUs, "
          f"load average {load} (other processes skew the medians)")
    for family in families:
        bench(family, args.nodes, args.runs, args.prompt)


if __name__ == "__main__":
    main()
