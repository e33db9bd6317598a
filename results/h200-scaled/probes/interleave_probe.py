# Archived one-question probe (issue 41): scripts/interleave_probe.py as it stood at 7dc635f,
# beside the record(s) it produced; not run or tested since (its imports may have moved).
# Record(s):
#   results/h200-scaled/interleave-probe.txt (measured at af03c15 on the H200, recorded in 8b0b444)
# Its question (does interleaving configurations slow them down?) was answered there.
# The version that produced a record: git show <recording commit>:scripts/interleave_probe.py

"""Does interleaving configurations slow them down? The scaled pair, four
configurations (classic, chain b=5, fixed [2,1,1,1], mlx-lm b=5), 64
tokens: once round-robin over two prompts, once back-to-back on one, after
one untimed pass of each. Prints the median ms per token of each.

    python scripts/interleave_probe.py [--dims 2048x16] [--alpha 0.02] [--after-gate]

Written for the H200, where ``treespec bench`` timed speculative rows 2-10x
slower than these loops do (README, "On the H200"). ``--after-gate`` bisects
that: the interleaved timing again after the bench's exactness probes (its
``SharedProbe`` over the probe shapes of chains 3,5,7 and fixed trees), and
once more after ``mx.clear_cache()``, with the allocator's cache size each time.
"""

import argparse
import statistics
import time


import mlx.core as mx

from treespec.bench import scaled
from treespec.bench.measure import Config, SharedProbe, build_configs, run_config

CONFIGS = [Config("classic", "classic"), Config("chain b=5", "chain", block=5),
           Config("fixed [2,1,1,1]", "fixed", branching=(2, 1, 1, 1)),
           Config("mlx-lm b=5", "mlx-lm", block=5)]


def main():
    ap = argparse.ArgumentParser()
    scaled.add_pair_arguments(ap)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--after-gate", action="store_true",
                    help="time again after the bench's gate probes, then after mx.clear_cache()")
    args = ap.parse_args()
    target, draft = scaled.pair_from_arguments(args)
    prompts, mt = scaled.default_prompts(2), args.max_tokens

    def ms_per_token(cfg, prompt):
        return 1e3 * run_config(cfg, target, draft, prompt, mt, None).wall_s / mt

    for cfg in CONFIGS:
        for p in prompts:
            ms_per_token(cfg, p)

    def interleaved(label):
        got = {cfg.name: [] for cfg in CONFIGS}
        for _ in range(args.repeats):
            for cfg in CONFIGS:
                got[cfg.name] += [ms_per_token(cfg, p) for p in prompts]
        print(f"{label}, ms/token:", {n: round(statistics.median(v), 2) for n, v in got.items()},
              f"(allocator cache {mx.get_cache_memory() / 1e6:.0f} MB)", flush=True)

    interleaved("interleaved")
    got = {cfg.name: [ms_per_token(cfg, prompts[0]) for _ in range(args.repeats)]
           for cfg in CONFIGS}
    print("back-to-back, ms/token:", {n: round(statistics.median(v), 2) for n, v in got.items()})
    if args.after_gate:
        probe = SharedProbe()
        t0 = time.perf_counter()
        for c in build_configs([3, 5, 7], [(2, 1, 1), (2, 1, 1, 1), (2, 2, 1, 1)]):
            if c.speculative:
                probe(target, c.probe_shapes(), allow_inexact=True)
        print(f"gate probes: {time.perf_counter() - t0:.1f} s", flush=True)
        interleaved("interleaved after the gate probes")
        mx.clear_cache()
        interleaved("interleaved after mx.clear_cache()")


if __name__ == "__main__":
    main()
