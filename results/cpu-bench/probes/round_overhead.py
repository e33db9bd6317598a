# Archived one-question probe (issue 41): scripts/round_overhead.py as it stood at 7dc635f,
# beside the record(s) it produced; not run or tested since (its imports may have moved).
# Record(s):
#   results/cpu-bench/9516726/round-overhead-random-64x32-block3.txt,
#     callgrind-per-round-random-64x32-block3.txt (measured at 9516726, recorded in 41750b9)
#   at 2858254 (zoo llama, block 3): quoted in README.md, no record kept
# Its child replaces resource.setrlimit at run time (valgrind keeps 12 descriptors below the hard
# limit, and mlx-lm's import asks for a hard limit of 4096, more than a child of a process that
# imported mlx-lm may have), so the instruction count was not ported; its Python calls per round
# are `python -m benchmarks.host_cost --sections calls`.
# The version that produced a record: git show <recording commit>:scripts/round_overhead.py

"""A chain round's host cost against mlx-lm's, in instructions (valgrind's
callgrind counts them whatever the machine's load), and in Python calls.

    python scripts/round_overhead.py [--family llama] [--block 2] [--short 16 --long 80]
    python scripts/round_overhead.py --pair default --calls-only
    python scripts/round_overhead.py --random 64x32 --block 3

Each decoder (treespec's chain, mlx-lm's speculative_generate_step, same
pair, same block, greedy) runs in a fresh process under callgrind twice, for
``--short`` and ``--long`` tokens; the difference over the difference in
rounds is the marginal cost of one round, start-up and prefill cancelled.
The zoo model (tiny, default) makes the host's share of a round large, which
is what this measures; ``--pair`` the trained pair. ``--calls-only`` skips
valgrind and prints the Python function calls per round (cProfile) outside
the model's own modules. ``--random HxL``: a seeded random float32 llama of
that size with a 256-token vocabulary (treespec.auto.costcurve.build_llama) and
a 2-layer one as its drafter: rounds of one or two tokens (the two agree by
chance), but every round drafts and verifies its whole block, with the host
work of as many layers as the H200's 4096x32 and little arithmetic.
"""

import argparse
import cProfile
import os
import pstats
import re
import subprocess
import sys
import tempfile

HERE = os.path.abspath(__file__)


def load(args):
    import mlx_lm

    if args.random:
        from treespec.auto.costcurve import build_llama
        from treespec.cli.flags import parse_dims

        hidden, layers = parse_dims(args.random)
        target = build_llama(hidden, layers, vocab=256)
        draft = build_llama(hidden, 2, vocab=256, seed=1)
        return target, draft, list(range(1, 13))
    if args.pair:
        from treespec.checkpoints import load_default_pair

        target, draft, tok = load_default_pair(args.pair)
    else:
        from treespec import zoo

        target, tok = mlx_lm.load(str(zoo.checkpoint(args.family, dtype="float32")))
        draft, _ = mlx_lm.load(str(zoo.drafter_checkpoint(args.family, dtype="float32")))
    return target, draft, tok.encode("def main(argv):\n    return")


def decode_once(which, target, draft, prompt, n, block) -> int:
    """Decode ``n`` tokens; returns the number of rounds."""
    from treespec.bench.measure import mlx_lm_run
    from treespec.decoding import decode

    if which == "treespec":
        return decode(target, prompt, draft_model=draft, max_tokens=n, gate=False,
                      mode="chain", block=block).stats.rounds
    return mlx_lm_run(target, draft, prompt, n, None, block).stats["rounds"]


def child(args):
    """One decode, in the process valgrind runs."""
    import resource

    set_limit = resource.setrlimit

    def keep_going(*a):  # valgrind holds the open-files hard limit below mlx-lm's ask
        try:
            set_limit(*a)
        except ValueError:
            pass

    resource.setrlimit = keep_going
    target, draft, prompt = load(args)
    print("rounds", decode_once(args.child, target, draft, prompt, args.n, args.block))


def instructions(which, n, args) -> tuple:
    out = tempfile.mktemp(suffix=".callgrind")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, HERE,
           "--child", which, "--n", str(n), "--block", str(args.block), "--family", args.family]
    if args.pair:
        cmd += ["--pair", args.pair]
    if args.random:
        cmd += ["--random", args.random]
    run = subprocess.run(cmd, capture_output=True, text=True)
    os.path.exists(out) and os.remove(out)
    refs = re.search(r"I\s+refs:\s+([\d,]+)", run.stderr)
    rounds = re.search(r"rounds (\d+)", run.stdout)
    if not refs or not rounds:
        sys.exit(f"valgrind run failed: {run.stderr[-2000:]}")
    return int(refs.group(1).replace(",", "")), int(rounds.group(1))


def calls_per_round(args):
    target, draft, prompt = load(args)
    for which in ("treespec", "mlx-lm"):
        decode_once(which, target, draft, prompt, args.long, args.block)  # warm
        prof = cProfile.Profile()
        prof.enable()
        rounds = decode_once(which, target, draft, prompt, args.long, args.block)
        prof.disable()
        total = sum(nc for (f, _, _), (_, nc, _, _, _) in pstats.Stats(prof).stats.items()
                    if "mlx_lm/models" not in f and "mlx/nn" not in f)
        print(f"{which:9} {rounds} rounds, {total / rounds:.0f} Python calls per round "
              "outside the models' modules")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="llama")
    ap.add_argument("--pair", choices=("default", "weak"))
    ap.add_argument("--random", metavar="HIDDENxLAYERS",
                    help="a random llama of this size (vocabulary 256) and a 2-layer drafter")
    ap.add_argument("--block", type=int, default=2)
    ap.add_argument("--short", type=int, default=16)
    ap.add_argument("--long", type=int, default=80)
    ap.add_argument("--calls-only", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    what = (f"random llama {args.random}, vocabulary 256, 2-layer drafter" if args.random
            else f"trained pair ({args.pair} drafter)" if args.pair else f"zoo {args.family} float32")
    print(f"{what}, chain block {args.block}, {args.short} and {args.long} tokens")
    calls_per_round(args)
    if args.calls_only:
        return
    per = {}
    for which in ("treespec", "mlx-lm"):
        (i0, r0), (i1, r1) = (instructions(which, n, args) for n in (args.short, args.long))
        per[which] = (i1 - i0) / (r1 - r0)
        print(f"{which:9} {i0:,} instructions for {r0} rounds, {i1:,} for {r1}: "
              f"{per[which]:,.0f} per round", flush=True)
    print(f"treespec / mlx-lm instructions per round: {per['treespec'] / per['mlx-lm']:.4f} "
          f"({per['treespec'] - per['mlx-lm']:+,.0f} a round)")


if __name__ == "__main__":
    main()
