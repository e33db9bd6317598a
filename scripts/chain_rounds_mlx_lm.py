"""How many rounds treespec's chain and mlx-lm's speculative decoding take for
the same text. Not a speed measurement: rounds are counted, not timed.

    python scripts/chain_rounds_mlx_lm.py --pair scaled --dims 64x32 --prompts 24
    python scripts/chain_rounds_mlx_lm.py --pair default|weak

Both decoders verify with the target's own greedy rule (the argmax of
``logits - logsumexp(logits)`` in the logits' dtype), so both emit classic
decoding's text (checked here, prompt by prompt). They draft by different
rules: treespec's chain takes the argmax of the draft logits, mlx-lm's the
argmax of the draft's ``logits - logsumexp(logits)`` in their dtype, which in
half precision rounds near-equal logits together and gives the tie to the
lower id. So a draft token can differ, and with it a round's acceptance.
Prints, per block, both decoders' rounds summed over the prompts and the
number of prompts on which they differ.
"""

import argparse

from treespec.bench import scaled
from treespec.bench.measure import mlx_lm_run
from treespec.decoding import decode
from treespec.cli.flags import parse_blocks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=parse_blocks, default=[3, 4, 5, 7])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8,
                    help="prompts: the scaled pair's seeded ones, or the first of bench's "
                    "(8) for the trained pairs")
    ap.add_argument("--pair", choices=("default", "weak", "scaled"), default="scaled")
    scaled.add_pair_arguments(ap)
    args = ap.parse_args()
    target, draft, prompts, what = scaled.decoding_pair(args, args.prompts)
    n = args.max_tokens
    print(f"{what}; {len(prompts)} prompts x {n} tokens")
    ref = [decode(target, p, max_tokens=n).tokens for p in prompts]
    for b in args.blocks:
        ours = [decode(target, p, mode="chain", draft_model=draft, max_tokens=n, block=b,
                       gate=False) for p in prompts]
        theirs = [mlx_lm_run(target, draft, p, n, None, b) for p in prompts]
        for name, runs in (("treespec", ours), ("mlx-lm", theirs)):
            differ = sum(r.tokens != t for r, t in zip(runs, ref))
            if differ:
                print(f"block {b}: {name}'s text differs from classic on {differ} prompts "
                      "(this backend's multi-token forwards are not single steps)")
        r_ours = [r.stats.rounds for r in ours]
        r_theirs = [r.stats["rounds"] for r in theirs]
        apart = sum(a != c for a, c in zip(r_ours, r_theirs))
        print(f"block {b}: rounds treespec {sum(r_ours)}, mlx-lm {sum(r_theirs)} "
              f"({sum(r_ours) / sum(r_theirs):.3f}); they differ on {apart} of {len(prompts)} "
              "prompts", flush=True)


if __name__ == "__main__":
    main()
