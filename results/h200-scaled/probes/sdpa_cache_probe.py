# Archived one-question probe (issue 41): scripts/sdpa_cache_probe.py as it stood at 7dc635f,
# beside the record(s) it produced; not run or tested since (its imports may have moved).
# Record(s):
#   results/h200-scaled/sdpa-cache-probe.txt (measured at e564b94 on the H200, recorded in 942bef3)
# Its question (what a round pays when cuDNN attention meets a kv length it has not met) was
# answered there; it imports parse_config from gpu_round_probe.py beside it (run from this folder).
# The version that produced a record: git show <recording commit>:scripts/sdpa_cache_probe.py

"""What a speculative round pays on MLX CUDA when its attention meets a kv
length it has not met before.

MLX's CUDA backend runs a multi-token attention (a verify, a drafter's
catch-up forward) through a cuDNN graph that it builds on the host and keeps
in an LRU cache keyed by the exact q/k/v shapes and strides, so by the kv
length: 256 entries unless ``MLX_CUDA_SDPA_CACHE_SIZE`` says otherwise
(``MLX_CUDA_USE_CUDNN_SDPA=0`` turns the path off). Single-token decoding is
keyed by the cache's allocated length and hits. Every configuration here is
run once on a short prompt (kernels compiled), then on prompts whose lengths
put every round at kv lengths no earlier run reached ("cold"), then on those
prompts again ("warm": the bench's situation, where the same greedy runs
repeat the same lengths). Run it once per setting of those variables:

    python scripts/sdpa_cache_probe.py
    MLX_CUDA_SDPA_CACHE_SIZE=65536 python scripts/sdpa_cache_probe.py
    MLX_CUDA_USE_CUDNN_SDPA=0 python scripts/sdpa_cache_probe.py
"""

import argparse
import os
import statistics


from gpu_round_probe import parse_config

from treespec.bench import scaled
from treespec.bench.measure import run_config

ENV = ("MLX_CUDA_SDPA_CACHE_SIZE", "MLX_CUDA_USE_CUDNN_SDPA", "MLX_USE_CUDA_GRAPHS")


def main():
    ap = argparse.ArgumentParser()
    scaled.add_pair_arguments(ap)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--configs", default="classic chain:5 chain:7 tree:2,1,1,1 mlx-lm:5",
                    help="classic, chain:B, tree:B1,B2,.., parents:-1,0,.., mlx-lm:B")
    # Offsets of a 64-token run on these lengths never overlap another's.
    ap.add_argument("--lengths", default="24 100 180 260",
                    help="prompt lengths: the first warms up, the rest are timed")
    args = ap.parse_args()
    print("settings:", {k: os.environ.get(k, "default") for k in ENV}, flush=True)
    target, draft = scaled.pair_from_arguments(args)
    lengths = [int(x) for x in args.lengths.split()]
    prompts = [scaled.default_prompts(1, n)[0] for n in lengths]
    mt = args.max_tokens

    def ms_per_token(cfg, prompt):
        run = run_config(cfg, target, draft, prompt, mt, None)
        return 1e3 * run.wall_s / len(run.tokens)

    for cfg in map(parse_config, args.configs.split()):
        ms_per_token(cfg, prompts[0])
        cold = [ms_per_token(cfg, p) for p in prompts[1:]]
        warm = [ms_per_token(cfg, p) for p in prompts[1:]]
        print(f"{cfg.name:18} ms/token cold {statistics.median(cold):7.2f}  warm "
              f"{statistics.median(warm):7.2f}  (cold {' '.join(f'{x:.2f}' for x in cold)})",
              flush=True)


if __name__ == "__main__":
    main()
