# Archived one-question probe (issue 41): scripts/classic_pace_probe.py as it stood at 7dc635f,
# beside the record(s) it produced; not run or tested since (its imports may have moved).
# Record(s):
#   results/h200-scaled/df344df/classic-pace-default.txt, classic-pace-no-graphs.txt,
#     classic-pace-graphcache-4000.txt (measured at df344df on the H200, recorded in d9eb66a)
# Its question (does classic slow down once other configurations ran in the same process?)
# was answered there: the pace drifts within a process whether or not anything ran between.
# The version that produced a record: git show <recording commit>:scripts/classic_pace_probe.py

"""Does classic decoding slow down once other configurations have run in the
same process? (auto's calibration times classic faster than a bench's timed
rows do on the H200: README, "auto on the H200".)

    python scripts/classic_pace_probe.py [--dims 4096x32] [--rounds 3]

One process, the scaled pair: classic's steady per-token pace (mlx-lm's
``generate_step``, greedy, from the first token to the last, as auto's
calibration times it), and its whole-call pace (tokens over the call's wall
time, prefill included, as a bench row's "round" column), first with nothing
else run, then after each round of the other configurations a bench
interleaves (treespec chain b=3 and b=5, the spine, [2,1,1,1], the confidence
tree n=4, mlx-lm's speculative decoding at b=3 and b=5). Run it under
different ``MLX_CUDA_GRAPH_CACHE_SIZE`` settings to see whether the CUDA graph
cache is what the others evict.
"""

import argparse
import os
import statistics
import time

import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step

from treespec.bench import scaled
from treespec.decoding import decode
from treespec.draft import make_drafter


def classic_pace(target, prompt, tokens=40):
    stamps = []
    t0 = time.perf_counter()
    for tok, _ in generate_step(mx.array(prompt), target, max_tokens=tokens,
                                sampler=lambda lp: mx.argmax(lp, axis=-1)):
        int(tok)
        stamps.append(time.perf_counter())
    return (1e3 * (stamps[-1] - stamps[0]) / (len(stamps) - 1),
            1e3 * (stamps[-1] - t0) / len(stamps))


def main():
    ap = argparse.ArgumentParser()
    scaled.add_pair_arguments(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="classic calls per measurement")
    args = ap.parse_args()
    target, draft = scaled.pair_from_arguments(args)
    prompts = scaled.default_prompts(2)
    print(f"scaled {args.dims[0]}x{args.dims[1]}; mlx {mx.__version__}, {mx.default_device()}; "
          f"MLX_CUDA_GRAPH_CACHE_SIZE={os.environ.get('MLX_CUDA_GRAPH_CACHE_SIZE', 'unset')}",
          flush=True)

    def others():
        for kw in (dict(mode="chain", block=3), dict(mode="chain", block=5),
                   dict(mode="tree", parents=[-1, 0, 0, 1, 1, 3, 3, 5, 5]),
                   dict(mode="tree", branching=[2, 1, 1, 1]), dict(mode="tree", budget=4)):
            kw = dict(kw)
            mode = kw.pop("mode")
            for p in prompts:
                decode(target, p, mode="chain" if mode == "chain" else "tree",
                       draft_model=draft, max_tokens=48, drafter=make_drafter(mode, **kw),
                       gate=False)
        for nd in (2, 4):
            for p in prompts:
                for _ in speculative_generate_step(mx.array(p), target, draft,
                                                   num_draft_tokens=nd, max_tokens=48,
                                                   sampler=lambda lp: mx.argmax(lp, axis=-1)):
                    pass

    def measure(label):
        steady, whole = [], []
        for _ in range(args.repeats):
            for p in prompts:
                s, w = classic_pace(target, p, 48)
                steady.append(s)
                whole.append(w)
        print(f"{label:42} steady {min(steady):6.2f} min {statistics.median(steady):6.2f} median"
              f"   whole call {statistics.median(whole):6.2f} median  ms/token", flush=True)

    classic_pace(target, prompts[0], 8)  # warm-up
    measure("classic alone")
    for r in range(args.rounds):
        t0 = time.perf_counter()
        others()
        print(f"  (the other configurations, round {r + 1}: {time.perf_counter() - t0:.1f}s)")
        measure(f"classic after round {r + 1} of the others")
        measure("classic again, nothing in between")


if __name__ == "__main__":
    main()
