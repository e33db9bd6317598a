"""treespec's chain against mlx-lm's speculative decoding, the two alone.

    python scripts/ab_chain_mlx_lm.py --block 4 [--repeats 15] [--max-tokens 96]
    python scripts/ab_chain_mlx_lm.py --pair scaled --dims 4096x32 --blocks 3,5 --max-tokens 48

The trained pair and two Python prompts (``--pair weak``: its weak drafter;
``--pair scaled``: the seeded scaled pair of ``--dims``/``--alpha`` and two
seeded token prompts). For each block, each repeat times treespec's chain
(decode mode "chain", gate off unless ``--gate``: the probe is not the
round loop, but each decode call pays for its memo's key) and
mlx-lm's speculative_generate_step back to back (the order alternates per
repeat), and the medians of wall and process CPU time are printed, with
treespec's wall split into what its stats time (prefill, the rounds) and the
rest of the call (setting up: adapters, caches, the drafter). Both texts are
checked against classic first; a pair whose texts differ (the scaled pair
in half precision on a backend whose multi-token forwards are not
bit-identical) is timed with a note, never silently.

The same text can take a different number of rounds: treespec's chain drafts
the argmax of the draft logits, mlx-lm's the argmax of ``logits -
logsumexp(logits)`` in the logits' dtype, which in half precision rounds
near-equal logits together and gives the tie to the lower id. So each block
also prints both decoders' rounds and their ms per round (wall over rounds,
the median of per-repeat ratios): what a round costs, apart from how many
rounds the drafts took.
"""

import argparse
import statistics
import time

from treespec.bench import scaled
from treespec.bench.measure import mlx_lm_run
from treespec.decoding import decode
from treespec.cli.flags import parse_blocks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", "--block", dest="block", type=parse_blocks, default=[4],
                    help="block(s), e.g. 4 or 3,5")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--pair", choices=("default", "weak", "scaled"), default="default")
    ap.add_argument("--gate", action="store_true",
                    help="treespec's chain with its exactness gate on (with --allow-inexact's "
                         "study mode), as generate and the bench run it: each call then pays "
                         "for the gate's key, its probe memoized after the first call")
    scaled.add_pair_arguments(ap)
    args = ap.parse_args()
    target, draft, prompts, what = scaled.decoding_pair(args, 2)
    n = args.max_tokens
    print(f"{what}; {len(prompts)} prompts x {n} tokens, {args.repeats} interleaved repeats")
    ref = [decode(target, p, max_tokens=n).tokens for p in prompts]
    for b in args.block:
        def ours():
            runs = [decode(target, p, mode="chain", draft_model=draft, max_tokens=n, block=b,
                           gate=args.gate, allow_inexact=args.gate) for p in prompts]
            return ([r.tokens for r in runs], sum(sum(r.stats.time_ms.values()) for r in runs),
                    sum(r.stats.rounds for r in runs))

        def theirs():
            runs = [mlx_lm_run(target, draft, p, n, None, b) for p in prompts]
            return [r.tokens for r in runs], None, sum(r.stats["rounds"] for r in runs)

        for name, f in (("treespec", ours), ("mlx-lm", theirs)):
            if f()[0] != ref:
                print(f"block {b}: {name}'s text differs from classic on this backend "
                      "(timed for study only)")
        times = {"treespec": [], "mlx-lm": []}
        for r in range(args.repeats):
            pair = (("treespec", ours), ("mlx-lm", theirs))
            for name, f in pair[::-1] if r % 2 else pair:  # neither always runs second
                c0, t0 = time.process_time(), time.perf_counter()
                _, staged, rounds = f()
                wall = time.perf_counter() - t0
                times[name].append((wall, time.process_time() - c0,
                                    None if staged is None else wall - staged / 1e3, rounds))
        med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in times.items()}
        rest = statistics.median(x[2] for x in times["treespec"])
        for k, (wall, cpu) in med.items():
            extra = (f"  (outside prefill and rounds: {rest * 1e3:.1f} ms)"
                     if k == "treespec" else "")
            print(f"block {b}: {k:9} wall {wall * 1e3:7.1f} ms  cpu {cpu * 1e3:7.1f} ms{extra}")
        ratio = statistics.median(m[0] / o[0] for o, m in zip(times["treespec"], times["mlx-lm"]))
        print(f"block {b}: treespec speed / mlx-lm speed = {med['mlx-lm'][0] / med['treespec'][0]:.3f}"
              f" (wall medians), {ratio:.3f} (median of per-repeat ratios), "
              f"{med['mlx-lm'][1] / med['treespec'][1]:.3f} (cpu)")
        rounds = {k: statistics.median(x[3] for x in v) for k, v in times.items()}
        per_round = statistics.median((o[0] / o[3]) / (m[0] / m[3])
                                      for o, m in zip(times["treespec"], times["mlx-lm"]))
        print(f"block {b}: rounds treespec {rounds['treespec']:g}, mlx-lm {rounds['mlx-lm']:g}; "
              f"treespec ms per round / mlx-lm's = {per_round:.3f} (median of per-repeat "
              "ratios)", flush=True)


if __name__ == "__main__":
    main()
