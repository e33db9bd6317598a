"""What a tree verify costs on a hybrid (GatedDeltaNet + attention) model.

    python -m benchmarks.hybrid_verify_cost                     # zoo qwen3_5 (hidden 64)
    python -m benchmarks.hybrid_verify_cost --family qwen3_next
    python -m benchmarks.hybrid_verify_cost --dims 1024x8 --dtype bfloat16 --blas openblas

For each tree shape: the verify forward with the tree-aware recurrence
(treespec.verify.tree_recurrence: one batched mixer call per depth) next to a
plain chain verify of the same node count and a chain of the same depth
(depth + 1 nodes), interleaved (``--repeats`` passes, ``--calls`` calls
each, the caches restored before every call, untimed); the ratio is the
median of per-pass ratios. A second table does the same for one recurrent
layer alone; then the per-node state a tree verify keeps alive.

Figures are printed only for shapes whose exactness check passed in this run
(every node's logits bit-identical to a plain forward over its root path;
for the layer alone, its outputs and per-node states).
``--dims HIDDENxLAYERS``: a random qwen3_5 of that size (every fourth layer
attention) instead of the zoo family.
"""

import statistics
import time

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map_with_path
from mlx_lm.models import qwen3_5
from mlx_lm.models.cache import ArraysCache, KVCache

from benchmarks import harness
from treespec import zoo
from treespec.cli.flags import parse_dims
from treespec.mixers import discover
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify.footprint import state_footprint
from treespec.verify.tree_recurrence import TreeRecurrence, tree_mixer_forward


def chains(k, length):
    """Root, then k chains of ``length`` nodes."""
    parents = [-1]
    for _ in range(k):
        parents.append(0)
        parents.extend(range(len(parents) - 1, len(parents) + length - 2))
    return parents


def binary(depth):
    return [-1] + [(i - 1) // 2 for i in range(1, 2 ** (depth + 1) - 1)]


SHAPES = {
    "fan 1+15": [-1] + [0] * 15,
    "binary d3": binary(3),
    "4 chains x4": chains(4, 4),
    "3 chains x5": chains(3, 5),
    "chain 16": list(range(-1, 15)),
}


def random_qwen3_5(hidden, layers, dtype):
    hv = max(2, hidden // 128)
    cfg = {
        "model_type": "qwen3_5", "hidden_size": hidden, "num_hidden_layers": layers,
        "intermediate_size": 3 * hidden, "num_attention_heads": max(1, hidden // 128),
        "num_key_value_heads": 1, "head_dim": 128, "rms_norm_eps": 1e-6, "vocab_size": 4096,
        "linear_num_value_heads": hv, "linear_num_key_heads": max(1, hv // 2),
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                            "partial_rotary_factor": 0.25},
    }
    mx.random.seed(0)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(cfg))
    model.eval()
    if dtype != "float32":  # A_log stays float32, as mlx-lm loads it
        keep = model.cast_predicate
        dt = getattr(mx, dtype)
        model.update(tree_map_with_path(lambda p, x: x.astype(dt) if keep(p) else x,
                                        model.parameters()))
    mx.eval(model.parameters())
    return model


def snapshot(cache):
    """A copy of the caches that a verify may write without touching these."""
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
    mx.eval([a for c in out for a in (c.cache if isinstance(c, ArraysCache)
                                      else (c.keys, c.values))])
    return out


def fresh_step(fn, fresh):
    """An interleaved step: ``fn`` on fresh caches, only ``fn`` timed."""
    def step():
        arg = fresh()
        t0 = time.perf_counter()
        fn(arg)
        return time.perf_counter() - t0
    return step


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
            worst = max(worst, mx.abs(ref.astype(mx.float32)
                                      - logits[i].astype(mx.float32)).max().item())
    return bad, worst


def layer_exactness(mixer, x, tree, fresh):
    """The same for one mixer: outputs and per-node states vs root paths."""
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


def table(say, title, rows, args):
    """Time every exact shape's three items interleaved; print one line each."""
    say(f"\n{title}")
    say(f"{'shape':<13}{'n':>4}{'depth':>6}{'tree':>9}{'chain n':>9}{'chain d+1':>10}"
        f"{'tree/chain n':>13}  exactness")
    items = {}
    for label, (n, d, bad, worst, steps) in rows.items():
        if not bad:
            items.update({(label, k): s for k, s in steps.items()})
    times = harness.interleaved({f"{a}|{b}": s for (a, b), s in items.items()}, args.repeats,
                                args.calls) if items else {}
    for label, (n, d, bad, worst, _) in rows.items():
        if bad:
            say(f"{label:<13}{n:>4}{d:>6}  NOT EXACT in this run ({bad}/{n} nodes, "
                f"max |diff| {worst:.3g}): no figures")
            continue
        med = {k: statistics.median(times[f"{label}|{k}"]) for k in ("tree", "n", "d")}
        r = harness.ratio(times, f"{label}|tree", f"{label}|n")
        say(f"{label:<13}{n:>4}{d:>6}{med['tree']:>9.2f}{med['n']:>9.2f}{med['d']:>10.2f}"
            f"{r:>13.2f}  exact, this run")


def main(argv=None):
    ap = harness.parser("hybrid_verify_cost", __doc__, pairs=(), repeats=15, calls=1)
    ap.add_argument("--family", default="qwen3_5", choices=["qwen3_5", "qwen3_next"])
    ap.add_argument("--dims", type=parse_dims, help="HIDDENxLAYERS: a random qwen3_5 instead")
    ap.add_argument("--prompt", type=int, default=32, help="tokens in the caches (default 32)")
    ap.add_argument("--dtype", default="float32", choices=zoo.DTYPES)
    args = ap.parse_args(argv)
    harness.prepare(args)
    if args.dims:
        model = random_qwen3_5(*args.dims, args.dtype)
        name = f"random qwen3_5 {args.dims[0]}x{args.dims[1]} {args.dtype}"
    else:
        model = zoo.build(args.family, dtype=args.dtype)
        name = f"zoo {args.family} {args.dtype}"
    args.name = args.name or ("hybrid-verify-cost-" + name.replace(" ", "-"))
    rng = np.random.RandomState(0)
    vocab = 256  # every model here has at least this many ids
    prompt = mx.array(rng.randint(0, vocab, size=args.prompt).tolist())[None]
    cache = model.make_cache()
    model(prompt, cache=cache)
    cache = snapshot(cache)
    n_rec = len(discover(model).mixers)
    with harness.record(args, what=f"{name}, {len(model.layers)} layers ({n_rec} recurrent), "
                                   f"caches of {args.prompt} tokens") as say:
        say(f"medians of {args.repeats} interleaved passes x {args.calls} calls, ms; caches "
            "restored before each call (untimed)")
        tree_aware = adapter_for(model, recurrent=TreeRecurrence())
        plain = adapter_for(model)  # chains only: the flattened chain is exact

        def verify(adapter, tree):
            return fresh_step(lambda c: mx.eval(adapter.verify(tree, c)), lambda: snapshot(cache))

        def chain(n):
            return DraftTree.linear(rng.randint(0, vocab, size=n).tolist())

        rows = {}
        for label, parents in SHAPES.items():
            tree = DraftTree(rng.randint(0, vocab, size=len(parents)).tolist(), parents)
            n, d = len(tree), tree.depth()
            bad, worst = exactness(model, cache, tree)
            rows[label] = (n, d, bad, worst, {"tree": verify(tree_aware, tree),
                                              "n": verify(plain, chain(n)),
                                              "d": verify(plain, chain(d + 1))})
        table(say, "whole verify forward (tree: tree-aware recurrence; chains: plain flattened "
                   "verify)", rows, args)

        first = discover(model).mixers[0]
        i, mixer = first.where[0], first.module
        state = cache[i]
        state_dtype = state.cache[0].dtype

        def fresh():
            c = ArraysCache(len(state.cache))
            c.cache = list(state.cache)
            return c

        rows = {}
        for label, parents in SHAPES.items():
            tree = DraftTree([0] * len(parents), parents)
            n, d = len(tree), tree.depth()
            x = mx.random.normal((1, n, hidden_size(model)), key=mx.random.key(1)).astype(
                state_dtype)
            mx.eval(x)
            bad, worst = layer_exactness(mixer, x, tree, fresh)
            rows[label] = (n, d, bad, worst, {
                "tree": fresh_step(lambda c, x=x, tree=tree: mx.eval(
                    tree_mixer_forward(mixer, x, tree, c)[0]), fresh),
                "n": fresh_step(lambda c, x=x: mx.eval(mixer(x, None, c)), fresh),
                "d": fresh_step(lambda c, x=x, d=d: mx.eval(mixer(x[:, : d + 1], None, c)),
                                fresh)})
        table(say, f"one recurrent layer (layer {i}, {type(mixer).__name__}) alone, same trees",
              rows, args)

        say("\nper-node state kept alive by a tree verify of this model:")
        for n in (8, 16, 64):
            say(f"  {n:>3} nodes: {state_footprint(model, n) / 2**20:9.2f} MiB")


def hidden_size(model) -> int:
    a = model.args
    return a.text_config["hidden_size"] if hasattr(a, "text_config") else a.hidden_size


if __name__ == "__main__":
    main()
