"""Acceptance and emitted-per-verify, chain blocks 2..8 against trees of the
same node budget, in one run, at temperature 0 (tokens checked against
classic decode in the same run). Not a speed measurement.

Run: python scripts/acceptance_table.py [--family llama] [--pair]
"""

import argparse

import mlx_lm

from treespec import zoo
from treespec.decoding import decode

PROMPTS = ["The target model verifies a whole tree", "def main(): return print(",
           "grüße aus München, café", "A sliding window forgets old positions"]
CODE_PROMPTS = ["def fibonacci(n):\n    ", "import os\n\n\ndef ", "class Stack:\n    def __init__(self):\n        ",
                "for i in range(10):\n    "]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="llama")
    ap.add_argument("--pair", action="store_true", help="the trained pair instead of the zoo")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    if args.pair:
        from treespec.checkpoints import load_default_pair

        target, draft, tok = load_default_pair()
        prompts = CODE_PROMPTS
    else:
        target, tok = mlx_lm.load(str(zoo.checkpoint(args.family)))
        draft, _ = mlx_lm.load(str(zoo.drafter_checkpoint(args.family)))
        prompts = PROMPTS
    prompts = [tok.encode(p) for p in prompts]
    classic = [decode(target, p, "classic", max_tokens=args.max_tokens).tokens for p in prompts]
    print(f"{'config':<26} {'budget':>6} {'accept':>7} {'emit/verify':>11} {'exact':>6}")
    for block in range(2, 9):
        configs = [(f"chain block {block}", dict(mode="chain", block=block)),
                   (f"confidence tree b{block - 1}", dict(mode="tree", budget=block - 1, width=3))]
        for name, kw in configs:
            prop = acc = emitted = rounds = 0
            exact = True
            for p, ref in zip(prompts, classic):
                r = decode(target, p, draft_model=draft, max_tokens=args.max_tokens, **kw)
                exact &= r.tokens == ref
                s = r.stats
                prop, acc, emitted, rounds = prop + s.proposed, acc + s.accepted, emitted + s.emitted, rounds + s.rounds
            print(f"{name:<26} {block - 1:>6} {acc / prop:>7.3f} {emitted / rounds:>11.3f} {str(exact):>6}")
    for branching in ([2, 1], [2, 2], [2, 2, 1], [3, 2, 1], [2, 2, 2, 1]):
        prop = acc = emitted = rounds = 0
        exact = True
        for p, ref in zip(prompts, classic):
            r = decode(target, p, draft_model=draft, max_tokens=args.max_tokens, mode="tree", branching=branching)
            exact &= r.tokens == ref
            s = r.stats
            prop, acc, emitted, rounds = prop + s.proposed, acc + s.accepted, emitted + s.emitted, rounds + s.rounds
        budget = r.stats.requested["budget"]
        print(f"{'fixed tree ' + 'x'.join(map(str, branching)):<26} {budget:>6} {acc / prop:>7.3f} {emitted / rounds:>11.3f} {str(exact):>6}")


if __name__ == "__main__":
    main()
