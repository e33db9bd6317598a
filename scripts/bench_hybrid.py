"""What a tree verify costs on a hybrid (GatedDeltaNet + attention) model.

For each tree shape: the verify forward with the tree-aware recurrence
(treespec.verify.tree_recurrence, one batched mixer call per depth) next to a plain
chain verify of the same node count and a chain of the same depth (depth + 1
nodes), medians of --repeats runs, caches restored before every run (not
timed). A second table does the same for one recurrent layer alone.

Figures are printed only for shapes whose exactness check passed in this run
(every node's logits bit-identical to a plain forward over its root path).

    python scripts/bench_hybrid.py                    # zoo qwen3_5 (hidden 64)
    python scripts/bench_hybrid.py --family qwen3_next
    python scripts/bench_hybrid.py --dims 1024x8      # random qwen3_5, 1024 wide, 8 layers
    python scripts/bench_hybrid.py --dims 1024x8 --dtype bfloat16 --blas openblas

Run it with the BLAS the numbers are for (treespec.backend.blas describes the one loaded).
"""

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache


from treespec.backend import blas
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify.footprint import state_footprint
from treespec.mixers import discover
from treespec.verify.tree_recurrence import TreeRecurrence, tree_mixer_forward


def _chains(k, length):
    """Root, then k chains of ``length`` nodes."""
    parents = [-1]
    for _ in range(k):
        parents.append(0)
        parents.extend(range(len(parents) - 1, len(parents) + length - 2))
    return parents


def _binary(depth):
    return [-1] + [(i - 1) // 2 for i in range(1, 2 ** (depth + 1) - 1)]


SHAPES = {
    "fan 1+15": [-1] + [0] * 15,
    "binary d3": _binary(3),
    "4 chains x4": _chains(4, 4),
    "3 chains x5": _chains(3, 5),
    "chain 16": list(range(-1, 15)),
}


def build(args):
    if args.dims is None:
        from treespec import zoo

        return zoo.build(args.family, dtype=args.dtype)
    from mlx_lm.models import qwen3_5

    hidden, layers = (int(x) for x in args.dims.split("x"))
    hv = max(2, hidden // 128)
    cfg = {
        "model_type": "qwen3_5",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": 3 * hidden,
        "num_attention_heads": max(1, hidden // 128),
        "num_key_value_heads": 1,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "vocab_size": 4096,
        "linear_num_value_heads": hv,
        "linear_num_key_heads": max(1, hv // 2),
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    }
    mx.random.seed(0)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(cfg))
    model.eval()
    if args.dtype != "float32":  # A_log stays float32, as mlx-lm loads it
        from mlx.utils import tree_map_with_path

        keep = model.cast_predicate
        dt = getattr(mx, args.dtype)
        model.update(tree_map_with_path(lambda p, x: x.astype(dt) if keep(p) else x, model.parameters()))
    mx.eval(model.parameters())
    return model


def snapshot(cache):
    out = []
    for c in cache:
        if isinstance(c, ArraysCache):
            n = ArraysCache(len(c.cache))
            n.cache = list(c.cache)
        else:
            n = KVCache()
            n.keys = mx.contiguous(c.keys[..., : c.offset, :])
            n.values = mx.contiguous(c.values[..., : c.offset, :])
            n.offset = c.offset
        out.append(n)
    mx.eval([a for c in out for a in (c.cache if isinstance(c, ArraysCache) else (c.keys, c.values))])
    return out


def median_ms(fn, repeats, setup=lambda: None):
    fn(setup())  # warm-up (mx.compile traces, allocations)
    times = []
    for _ in range(repeats):
        arg = setup()
        t0 = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def exactness(model, cache, tree):
    """(nodes whose verify logits differ from a plain forward over their root
    path, the largest |difference|)."""
    logits = adapter_for(model, recurrent=TreeRecurrence()).verify(tree, snapshot(cache))
    bad, worst = 0, 0.0
    for i in range(len(tree)):
        toks = mx.array([tree.tokens[j] for j in tree.path_to(i)])[None]
        ref = model(toks, cache=snapshot(cache))[0, -1]
        if not mx.array_equal(ref, logits[i]).item():
            bad += 1
            worst = max(worst, mx.abs(ref.astype(mx.float32) - logits[i].astype(mx.float32)).max().item())
    return bad, worst


def layer_exactness(mixer, x, tree, state):
    """The same for one mixer: outputs and per-node states vs root paths."""
    def fresh():
        c = ArraysCache(len(state.cache))
        c.cache = list(state.cache)
        return c

    out, states = tree_mixer_forward(mixer, x, tree, fresh())
    bad, worst = 0, 0.0
    for i in range(len(tree)):
        c = fresh()
        ref = mixer(x[:, tree.path_to(i)], None, c)[0, -1]
        pairs = [(ref, out[0, i])] + list(zip(c.cache, states.node(i)))
        diffs = [mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()
                 for a, b in pairs if not mx.array_equal(a, b).item()]
        if diffs:
            bad += 1
            worst = max([worst] + diffs)
    return bad, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="qwen3_5", choices=["qwen3_5", "qwen3_next"])
    ap.add_argument("--dims", default=None, help="HIDDENxLAYERS: a random qwen3_5 instead of the zoo")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--blas", default="auto", choices=list(blas.CHOICES),
                    help="re-exec with this CPU BLAS (openblas: fast, float32 not exact)")
    args = ap.parse_args()
    blas.ensure_blas(args.blas)

    model = build(args)
    rng = np.random.RandomState(0)
    vocab = 256  # every model here has at least this many ids
    prompt = mx.array(rng.randint(0, vocab, size=args.prompt).tolist())[None]
    cache = model.make_cache()
    model(prompt, cache=cache)
    cache = snapshot(cache)
    name = (args.dims and f"random qwen3_5 {args.dims}" or f"zoo {args.family}") + f" {args.dtype}"
    n_rec = len(discover(model).mixers)
    print(f"model: {name}, {len(model.layers)} layers ({n_rec} recurrent), prompt {args.prompt}")
    print(f"blas: {blas.describe()}")
    print(f"median of {args.repeats} runs, ms; caches restored before each run (untimed)\n")

    tree_aware = adapter_for(model, recurrent=TreeRecurrence())
    plain = adapter_for(model)  # chains only: the flattened chain is exact

    def verify(adapter, tree):
        return lambda c: mx.eval(adapter.verify(tree, c))

    def chain(n):
        return DraftTree.linear(rng.randint(0, vocab, size=n).tolist())

    hdr = f"{'shape':<13}{'n':>4}{'depth':>6}{'tree':>9}{'chain n':>9}{'chain d+1':>10}{'tree/chain n':>13}  exactness"
    print("whole verify forward (tree: tree-aware recurrence; chains: plain flattened verify)")
    print(hdr)
    for label, parents in SHAPES.items():
        tree = DraftTree(rng.randint(0, vocab, size=len(parents)).tolist(), parents)
        n, d = len(tree), tree.depth()
        bad, worst = exactness(model, cache, tree)
        if bad:
            print(f"{label:<13}{n:>4}{d:>6}  NOT EXACT in this run ({bad}/{n} nodes, "
                  f"max |diff| {worst:.3g}): no figures")
            continue
        t = median_ms(verify(tree_aware, tree), args.repeats, lambda: snapshot(cache))
        cn = median_ms(verify(plain, chain(n)), args.repeats, lambda: snapshot(cache))
        cd = median_ms(verify(plain, chain(d + 1)), args.repeats, lambda: snapshot(cache))
        print(f"{label:<13}{n:>4}{d:>6}{t:>9.2f}{cn:>9.2f}{cd:>10.2f}{t / cn:>13.2f}  exact, this run")

    first = discover(model).mixers[0]
    i, mixer = first.where[0], first.module
    D = model.args.text_config["hidden_size"] if hasattr(model.args, "text_config") else model.args.hidden_size
    state = cache[i]
    print(f"\none recurrent layer (layer {i}, {type(mixer).__name__}) alone, same trees")
    print(f"{'shape':<13}{'n':>4}{'depth':>6}{'tree':>9}{'chain n':>9}{'chain d+1':>10}{'tree/chain n':>13}  exactness")
    for label, parents in SHAPES.items():
        tree = DraftTree([0] * len(parents), parents)
        n, d = len(tree), tree.depth()
        x = mx.random.normal((1, n, D), key=mx.random.key(1)).astype(state.cache[0].dtype)
        mx.eval(x)

        def fresh():
            c = ArraysCache(len(state.cache))
            c.cache = list(state.cache)
            return c

        bad, worst = layer_exactness(mixer, x, tree, state)
        if bad:
            print(f"{label:<13}{n:>4}{d:>6}  NOT EXACT in this run ({bad}/{n} nodes, "
                  f"max |diff| {worst:.3g}): no figures")
            continue
        t = median_ms(lambda c: mx.eval(tree_mixer_forward(mixer, x, tree, c)[0]), args.repeats, fresh)
        cn = median_ms(lambda c: mx.eval(mixer(x, None, c)), args.repeats, fresh)
        cd = median_ms(lambda c: mx.eval(mixer(x[:, : d + 1], None, c)), args.repeats, fresh)
        print(f"{label:<13}{n:>4}{d:>6}{t:>9.2f}{cn:>9.2f}{cd:>10.2f}{t / cn:>13.2f}  exact, this run")

    print("\nper-node state kept alive by a tree verify of this model:")
    for n in (8, 16, 64):
        print(f"  {n:>3} nodes: {state_footprint(model, n) / 2**20:9.2f} MiB")


if __name__ == "__main__":
    main()
