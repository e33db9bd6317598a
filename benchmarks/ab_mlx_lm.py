"""treespec's chain against mlx-lm's speculative decoding, the two alone.

    python -m benchmarks.ab_mlx_lm --pair default --blocks 2,3,4 --repeats 15
    python -m benchmarks.ab_mlx_lm --pair scaled --dims 4096x32 --blocks 3,5 --max-tokens 48 --gate
    python -m benchmarks.ab_mlx_lm --pair scaled --dims 64x32 --rounds-only --prompts 24

For each block, each pass times treespec's chain (``decode`` mode "chain",
its gate off unless ``--gate``: the probe is not the round loop, but each
decode call then pays for its memo's key) and mlx-lm's
``speculative_generate_step`` (``num_draft_tokens`` = block - 1) over the
same ``--prompts`` prompts, back to back, the order alternating per pass;
the medians of wall and process CPU time are printed, with treespec's wall
split into what its stats time (prefill, the rounds) and the rest of the
call (setting up: adapters, caches, the drafter), and treespec's speed over
mlx-lm's as the ratio of medians and the median of per-pass ratios. Both
texts are checked against classic first; a pair whose texts differ (the
scaled pair in half precision on a backend whose multi-token forwards are
not bit-identical) is timed with a note, never silently.

The same text can take a different number of rounds: treespec's chain
drafts the argmax of the draft logits, mlx-lm's the argmax of ``logits -
logsumexp(logits)`` in the logits' dtype, which in half precision rounds
near-equal logits together and gives the tie to the lower id. So each block
also prints both decoders' rounds and treespec's ms per round over
mlx-lm's (median of per-pass ratios): what a round costs, apart from how
many rounds the drafts took. ``--rounds-only`` counts the rounds alone, prompt
by prompt, with no timing (how many prompts the two decoders' rounds differ
on).
"""

import statistics
import time

from benchmarks import harness
from treespec.bench.measure import mlx_lm_run
from treespec.cli.flags import parse_blocks
from treespec.decoding import decode


def rounds_only(args, pair, prompts, say):
    """Rounds of both decoders per block, summed over the prompts."""
    target, draft, n = pair.target, pair.draft, args.max_tokens
    ref = [decode(target, p, max_tokens=n).tokens for p in prompts]
    for b in args.blocks:
        ours = [decode(target, p, mode="chain", draft_model=draft, max_tokens=n, block=b,
                       gate=False) for p in prompts]
        theirs = [mlx_lm_run(target, draft, p, n, None, b) for p in prompts]
        for name, runs in (("treespec", ours), ("mlx-lm", theirs)):
            differ = sum(r.tokens != t for r, t in zip(runs, ref))
            if differ:
                say(f"block {b}: {name}'s text differs from classic on {differ} prompts "
                    "(this backend's multi-token forwards are not single steps)")
        r_ours = [r.stats.rounds for r in ours]
        r_theirs = [r.stats["rounds"] for r in theirs]
        apart = sum(a != c for a, c in zip(r_ours, r_theirs))
        say(f"block {b}: rounds treespec {sum(r_ours)}, mlx-lm {sum(r_theirs)} "
            f"({sum(r_ours) / sum(r_theirs):.3f}); they differ on {apart} of {len(prompts)} "
            "prompts")


def timed(args, pair, prompts, say):
    target, draft, n = pair.target, pair.draft, args.max_tokens
    ref = [decode(target, p, max_tokens=n).tokens for p in prompts]
    for b in args.blocks:
        def ours(b=b):
            runs = [decode(target, p, mode="chain", draft_model=draft, max_tokens=n, block=b,
                           gate=args.gate, allow_inexact=args.gate) for p in prompts]
            return ([r.tokens for r in runs], sum(sum(r.stats.time_ms.values()) for r in runs),
                    sum(r.stats.rounds for r in runs))

        def theirs(b=b):
            runs = [mlx_lm_run(target, draft, p, n, None, b) for p in prompts]
            return [r.tokens for r in runs], None, sum(r.stats["rounds"] for r in runs)

        sides = {"treespec": ours, "mlx-lm": theirs}
        for name, f in sides.items():
            if f()[0] != ref:
                say(f"block {b}: {name}'s text differs from classic on this backend "
                    "(timed for study only)")
        times = {k: [] for k in sides}
        for order in harness.rotated(list(sides), args.repeats):  # neither always runs second
            for name in order:
                c0, t0 = time.process_time(), time.perf_counter()
                _, staged, rounds = sides[name]()
                wall = time.perf_counter() - t0
                times[name].append((wall, time.process_time() - c0,
                                    None if staged is None else wall - staged / 1e3, rounds))
        med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in times.items()}
        rest = statistics.median(x[2] for x in times["treespec"])
        for k, (wall, cpu) in med.items():
            extra = (f"  (outside prefill and rounds: {rest * 1e3:.1f} ms)"
                     if k == "treespec" else "")
            say(f"block {b}: {k:9} wall {wall * 1e3:7.1f} ms  cpu {cpu * 1e3:7.1f} ms{extra}")
        per_pass = statistics.median(m[0] / o[0] for o, m in zip(times["treespec"],
                                                                times["mlx-lm"]))
        say(f"block {b}: treespec speed / mlx-lm speed = "
            f"{med['mlx-lm'][0] / med['treespec'][0]:.3f} (wall medians), {per_pass:.3f} "
            f"(median of per-pass ratios), {med['mlx-lm'][1] / med['treespec'][1]:.3f} (cpu)")
        rounds = {k: statistics.median(x[3] for x in v) for k, v in times.items()}
        per_round = statistics.median((o[0] / o[3]) / (m[0] / m[3])
                                      for o, m in zip(times["treespec"], times["mlx-lm"]))
        say(f"block {b}: rounds treespec {rounds['treespec']:g}, mlx-lm {rounds['mlx-lm']:g}; "
            f"treespec ms per round / mlx-lm's = {per_round:.3f} (median of per-pass ratios)")


def main(argv=None):
    ap = harness.parser("ab_mlx_lm", __doc__, pair="default", repeats=15, calls=None)
    ap.add_argument("--blocks", "--block", dest="blocks", type=parse_blocks, default=[4],
                    help="block(s), e.g. 4 or 3,5 (default 4)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--gate", action="store_true",
                    help="treespec's chain with its exactness gate on (with --allow-inexact's "
                         "study mode), as generate and the bench run it")
    ap.add_argument("--rounds-only", action="store_true",
                    help="count both decoders' rounds prompt by prompt, no timing")
    args = ap.parse_args(argv)
    pair = harness.load_pair(args)
    prompts = pair.prompts(args.prompts)
    with harness.record(args, pair) as say:
        say(f"{len(prompts)} prompts x {args.max_tokens} tokens"
            + ("" if args.rounds_only else f", {args.repeats} interleaved passes"))
        (rounds_only if args.rounds_only else timed)(args, pair, prompts, say)


if __name__ == "__main__":
    main()
