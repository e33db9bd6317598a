"""What a tree costs over a chain of the same width, piece by piece, on the
scaled pair (treespec.scaled): each figure is one step with a sync, median
of 30 after 5 warm-up calls.

    python scripts/tree_verify_costs.py [--dims 2048x16] [--alpha 0.02]

- the target's plain forward over T tokens against ``TreeAdapter.verify`` of
  a 9-node tree (host graph building timed alone too);
- the same 9-token forward with only the per-node rope, only the mask
  array, or both injected (``treespec.verify.attention.injected``);
- ``mx.fast.scaled_dot_product_attention`` with mlx-lm's "causal", a bool
  and an additive mask (9 queries, 128 keys, 32 heads of 64);
- one drafting round alone: chain b=5, a spine (the chain plus the
  second-best token at each depth) and branching [2,1,1,1].
"""

import argparse
import statistics
import time


import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from treespec import scaled
from treespec.draft import make_drafter
from treespec.tree import DraftTree
from treespec.verify.adapter import adapter_for
from treespec.verify.attention import injected, rope_owners

SPINE = [-1, 0, 0, 1, 1, 3, 3, 5, 5]  # depth 4, two children per spine node
BRANCHING = [-1, 0, 0, 1, 2, 3, 4, 5, 6]  # [2,1,1,1]


def median_ms(fn, n=30, warmup=5):
    out = []
    for _ in range(n + warmup):
        t0 = time.perf_counter()
        fn()
        out.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(out[warmup:])


def main():
    ap = argparse.ArgumentParser()
    scaled.add_pair_arguments(ap)
    args = ap.parse_args()
    target, draft = scaled.pair_from_arguments(args)
    adapter = adapter_for(target)
    cache = make_prompt_cache(target)
    target(mx.arange(64)[None], cache=cache)
    mx.eval([c.state for c in cache])

    def forward(T):
        def step():
            mx.eval(target(mx.arange(T)[None], cache=cache))
            trim_prompt_cache(cache, T)
        return step

    def verify(parents):
        tree = DraftTree(list(range(len(parents))), parents)

        def step():
            mx.eval(adapter.verify(tree, cache))
            trim_prompt_cache(cache, len(parents))
        return step

    def building_ms(build, n=30, warmup=5):
        """Host time to build the graph alone; evaluated (untimed) before the
        next call, so that no lazy graph piles up across calls."""
        out = []
        for _ in range(n + warmup):
            t0 = time.perf_counter()
            logits = build()
            out.append(1e3 * (time.perf_counter() - t0))
            mx.eval(logits)
            trim_prompt_cache(cache, 9)
            mx.eval([c.state for c in cache])
        return statistics.median(out[warmup:])

    for T in (1, 5, 9):
        print(f"target plain forward T={T}: {median_ms(forward(T)):.2f} ms", flush=True)
    print(f"target verify, spine of 9: {median_ms(verify(SPINE)):.2f} ms")
    print(f"target verify, [2,1,1,1] (9): {median_ms(verify(BRANCHING)):.2f} ms")
    spine = DraftTree(list(range(9)), SPINE)
    print(f"host graph building alone: verify of 9 "
          f"{building_ms(lambda: adapter.verify(spine, cache)):.2f} ms, plain forward of 9 "
          f"{building_ms(lambda: target(mx.arange(9)[None], cache=cache)):.2f} ms")

    chain = DraftTree(list(range(9)), list(range(-1, 8)))
    owners = rope_owners(target)

    def partly_injected(rope, mask):
        def step():
            fn = (lambda c, N, w: chain.mask(c.offset)) if mask else (lambda c, N, w: "causal")
            with injected(target, cache, chain.depths(), fn, "rope", owners):
                if not rope:  # put the real ropes back: the mask alone
                    for _, owner in owners:
                        owner.rope = owner.rope.inner
                out = target(mx.arange(9)[None], cache=cache)
            mx.eval(out)
            trim_prompt_cache(cache, 9)
        return step

    for rope, mask in ((False, True), (True, False), (True, True)):
        print(f"9-token forward, per-node rope {'on' if rope else 'off'}, mask array "
              f"{'on' if mask else 'off'}: {median_ms(partly_injected(rope, mask)):.2f} ms",
              flush=True)

    dtype = target.model.embed_tokens.weight.dtype
    q = mx.random.normal((1, 32, 9, 64)).astype(dtype)
    k = mx.random.normal((1, 32, 128, 64)).astype(dtype)
    v = mx.random.normal((1, 32, 128, 64)).astype(dtype)
    bool_mask = chain.mask(128 - 9)
    additive = mx.where(bool_mask, 0.0, -1e9).astype(dtype)
    mx.eval(q, k, v, bool_mask, additive)
    for name, m in (("causal", "causal"), ("bool", bool_mask), ("additive", additive)):
        ms = median_ms(lambda: mx.eval(mx.fast.scaled_dot_product_attention(
            q, k, v, scale=0.125, mask=m)), n=100)
        print(f"sdpa, {name} mask: {ms:.3f} ms")

    for name, kw in (("chain b=5", dict(mode="chain", block=5)),
                     ("spine of 9", dict(mode="tree", parents=SPINE)),
                     ("[2,1,1,1]", dict(mode="tree", branching=[2, 1, 1, 1]))):
        drafter = make_drafter(kw.pop("mode"), **kw)
        drafter.start(draft, list(range(64)))

        def round_alone():
            before = drafter.cache[0].offset
            rnd = drafter.draft(7)
            mx.eval(rnd.device_tokens)
            trim_prompt_cache(drafter.cache, drafter.cache[0].offset - before)
            drafter.pending = []

        print(f"drafting round alone, {name}: {median_ms(round_alone):.2f} ms")


if __name__ == "__main__":
    main()
