"""What a tree verify costs against a plain forward of as many tokens, piece by piece.

    python -m benchmarks.verify_cost --dims 4096x32 --repeats 7
    python -m benchmarks.verify_cost --pair default --repeats 9
    python -m benchmarks.verify_cost --pair zoo --family qwen3 --nodes 4,8,16,32

The target of the pair (treespec.bench.scaled's bf16 llama by default), its
caches holding ``--context`` tokens. Every item is one step ended by an
evaluation, timed ``--calls`` times (median) within a pass; the items run
interleaved, in an order rotated every pass, and each ratio is the median
over passes of the item's time over its reference's in the same pass:

- ``TreeAdapter.verify`` of a spine of 9 nodes (two children per spine
  node), of [2,1,1,1] (9 nodes) and of a chain of 5, and (``--nodes``) of
  binary trees of N nodes, each against a plain forward over as many tokens;
  every tree's exactness beside its figure (each node's logits against a
  plain forward over its root path, bit for bit, in this run);
- host graph building alone: the spine's verify against a plain 9-token
  forward (each evaluated untimed after its call), and again each call made
  right after one of the other (the order of a decode loop, where neither
  follows itself); the verify's host work outside its forward (the checks,
  the snapshot, the hold, the injection put in and taken out, the capture of
  the writes, with no forward) against the plain forward's graph building;
- the injection's pieces on a 9-token chain forward: the per-node rope alone,
  the mask alone (bool, additive in the activation dtype), both, against the
  plain forward; sdpa 9x128 with mlx-lm's "causal", a bool and an additive mask.

Load-independent: the primitives in the spine verify's graph against the
plain forward's (``mx.export_to_dot``: on a GPU about one kernel each).
Drafting and committing have their own benchmarks (draft_cost, commit_cost).
"""

import copy
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from benchmarks import harness
from treespec.bench.graph_census import primitives
from treespec.bench.scaled import filled_cache
from treespec.draft import make_drafter
from treespec.rollback import capture_written, snapshot
from treespec.tree import DraftTree
from treespec.verify import adapter_for, injected
from treespec.verify.attention import rope_owners
from treespec.verify.guard import restored_on_error

SPINE = [-1, 0, 0, 1, 1, 3, 3, 5, 5]  # depth 4, two children per spine node
BRANCHING = [2, 1, 1, 1]


def binary(n: int) -> DraftTree:
    """The bushiest tree of n nodes (node i's parent (i - 1) // 2)."""
    return DraftTree(list(range(n)), [-1] + [(i - 1) // 2 for i in range(1, n)])


def exactness(model, adapter, cache, tree) -> str:
    """Whether every node's verify row equals a plain forward over its root
    path, bit for bit (a path of one token compared as row 0 of two: a
    one-token step may take another kernel)."""
    logits = adapter.verify(tree, copy.deepcopy(cache))
    bad = 0
    for i in range(len(tree)):
        toks = [tree.tokens[j] for j in tree.path_to(i)]
        if len(toks) == 1:
            ref = model(mx.array(toks * 2)[None], cache=copy.deepcopy(cache))[0, 0]
        else:
            ref = model(mx.array(toks)[None], cache=copy.deepcopy(cache))[0, -1]
        bad += not mx.array_equal(ref, logits[i]).item()
    return "exact" if not bad else f"NOT EXACT on {bad} of {len(tree)} nodes"


def main(argv=None):
    ap = harness.parser("verify_cost", __doc__, repeats=9, calls=5)
    ap.add_argument("--context", type=int, default=64, help="tokens in the caches (default 64)")
    ap.add_argument("--nodes", default="", help="also binary trees of these sizes, e.g. 4,8,16")
    args = ap.parse_args(argv)
    pair = harness.load_pair(args)
    with harness.record(args, pair) as say:
        run(args, pair.target, say)


def run(args, target, say):
    adapter = adapter_for(target)
    cache = filled_cache(target, args.context)
    dtype = cache[0].keys.dtype if not isinstance(cache[0].keys, tuple) else mx.float16
    spine = DraftTree(list(range(9)), make_drafter("tree", parents=SPINE).shape)
    fixed = DraftTree(list(range(9)), make_drafter("tree", branching=BRANCHING).shape)
    trees = {"spine of 9": spine, f"{BRANCHING} (9)": fixed,
             "chain of 5": DraftTree.linear(list(range(5)))}
    for n in filter(None, args.nodes.split(",")):
        trees[f"binary tree of {int(n)}"] = binary(int(n))
    items, refs, verdicts = {}, {}, {}

    def restore(n):
        trim_prompt_cache(cache, n)

    def forward(T):
        def step():
            mx.eval(target(mx.arange(T)[None], cache=cache))
            restore(T)
        return step

    def verify(tree):
        def step():
            mx.eval(adapter.verify(tree, cache))
            restore(len(tree))
        return step

    # -- verify against a plain forward ------------------------------------------
    for T in sorted({1, 9} | {len(t) for t in trees.values()}):
        items[f"plain forward T={T}"] = forward(T)
    for name, tree in trees.items():
        items[f"verify {name}"] = verify(tree)
        refs[f"verify {name}"] = f"plain forward T={len(tree)}"
        verdicts[f"verify {name}"] = exactness(target, adapter, cache, tree)

    # -- host graph building -----------------------------------------------------
    def building(build, n):
        """Host time to build the graph alone; evaluated (untimed) after the
        call, so that no lazy graph piles up across calls."""
        def step():
            t0 = time.perf_counter()
            out = build()
            dt = time.perf_counter() - t0
            mx.eval(out)
            restore(n)
            return dt
        return step

    def after(other, build, n):
        """``building(build, n)``, each call right after the other's."""
        first, timed_part = building(other, n), building(build, n)

        def step():
            first()
            return timed_part()
        return step

    spine_build = lambda: adapter.verify(spine, cache)  # noqa: E731
    plain_build = lambda: target(mx.arange(9)[None], cache=cache)  # noqa: E731
    plain9 = "host graph building, plain forward of 9"
    items["host graph building, verify of the 9-node spine"] = building(spine_build, 9)
    items[plain9] = building(plain_build, 9)
    refs["host graph building, verify of the 9-node spine"] = plain9
    items["host graph building, spine verify after a plain forward"] = \
        after(plain_build, spine_build, 9)
    items["host graph building, plain forward after a spine verify"] = \
        after(spine_build, plain_build, 9)
    refs["host graph building, spine verify after a plain forward"] = \
        "host graph building, plain forward after a spine verify"

    def setup_alone():
        """What ``adapter.verify`` does around its forward, without one."""
        owners = adapter.check(spine, cache)
        snapshot(cache)
        with restored_on_error(cache), adapter.injection(cache, spine, owners, 0), \
                capture_written(cache):
            pass

    items["verify's host work outside its forward (no forward)"] = setup_alone
    refs["verify's host work outside its forward (no forward)"] = plain9

    # -- the injection's pieces on a 9-token chain forward -------------------------
    owners = rope_owners(target)
    chain9 = DraftTree.linear(list(range(9)))
    masks = {"bool": lambda c, N, w: chain9.mask(c.offset),
             "additive": lambda c, N, w: chain9.additive_mask(c.offset, dtype=dtype),
             "causal": lambda c, N, w: "causal"}

    def partly_injected(rope, mask):
        # owners=[]: no rope replaced, the masks still are (depths given)
        def step():
            with injected(target, cache, chain9.depths(), masks[mask], "rope",
                          owners if rope else []):
                out = target(mx.arange(9)[None], cache=cache)
            mx.eval(out)
            restore(9)
        return step

    for rope, mask in ((False, "bool"), (False, "additive"), (True, "causal"), (True, "additive")):
        key = f"9-token forward, per-node rope {'on' if rope else 'off'}, mask {mask}"
        items[key] = partly_injected(rope, mask)
        refs[key] = "plain forward T=9"

    H, D = 32, 64
    q = mx.random.normal((1, H, 9, D)).astype(dtype)
    k = mx.random.normal((1, H, 128, D)).astype(dtype)
    v = mx.random.normal((1, H, 128, D)).astype(dtype)
    bool_mask = chain9.mask(128 - 9)
    additive = chain9.additive_mask(128 - 9, dtype=dtype)
    mx.eval(q, k, v, bool_mask, additive)
    for name, m in (("causal", "causal"), ("bool", bool_mask), ("additive", additive)):
        key = f"sdpa 9x128, {name} mask"
        items[key] = (lambda m=m: mx.eval(mx.fast.scaled_dot_product_attention(
            q, k, v, scale=D ** -0.5, mask=m)))
        if name != "causal":
            refs[key] = "sdpa 9x128, causal mask"

    graphs = {}
    for name, build in (("verify", spine_build), ("plain", plain_build)):
        out = build()
        graphs[name] = sum(primitives(out).values())
        mx.eval(out)
        restore(9)

    # -- run, interleaved ----------------------------------------------------------
    times = harness.interleaved(items, args.repeats, args.calls)
    say(f"\ncaches of {args.context} tokens; medians of {args.repeats} interleaved passes x "
        f"{args.calls} calls, ms; ratios: medians of per-pass ratios")
    for n, v in times.items():
        shown = f"  x{harness.ratio(times, n, refs[n]):.3f} {refs[n]}" if n in refs else ""
        verdict = f"  [{verdicts[n]}]" if n in verdicts else ""
        say(f"{n:62} {statistics.median(v):8.3f} ms{shown}{verdict}")
    say(f"\ngraph primitives, verify of the 9-node spine {graphs['verify']} against a plain "
        f"9-token forward {graphs['plain']} (x{graphs['verify'] / graphs['plain']:.2f})")


if __name__ == "__main__":
    main()
