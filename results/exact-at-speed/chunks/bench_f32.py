"""The bench of a float32 scaled pair with the flat, row-invariant and
chunked verifies side by side (``treespec bench`` builds its scaled pair in
bfloat16 only; this builds it in float32, where a BLAS's wider products sum
in another order, and runs the bench's own code on it).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
      PYTHONPATH=. python results/exact-at-speed/chunks/bench_f32.py --dims 768x8 --alpha 0.02 \
      --blocks 3,4,6 --trees="-1,0,0,1,1,2" --max-tokens 32 --prompts 2 --repeats 3
"""

import argparse

from treespec.auto.costcurve import parse_dims
from treespec.backend.row_chunks import RowChunks
from treespec.bench import scaled
from treespec.bench.measure import BenchOptions, bench, build_configs
from treespec.bench.report import format_report, machine_info
from treespec.cli.flags import parse_blocks, parse_trees
from treespec.cli.rows import chunks_plan
from treespec.models import n_params
from treespec.verify import adapter_for, chunks_name

ap = argparse.ArgumentParser()
ap.add_argument("--dims", type=parse_dims, default=(768, 8))
ap.add_argument("--alpha", type=float, default=0.02)
ap.add_argument("--draft-layers", type=int, default=2)
ap.add_argument("--blocks", type=parse_blocks, default=(3, 4, 6))
ap.add_argument("--trees", type=parse_trees, default=())
ap.add_argument("--max-tokens", type=int, default=32)
ap.add_argument("--prompts", type=int, default=2)
ap.add_argument("--repeats", type=int, default=3)
args = ap.parse_args()

hidden, layers = args.dims
target, draft = scaled.build_pair(hidden, layers, args.draft_layers, args.alpha, dtype="float32")
print(f"pair: scaled llama {hidden}x{layers} float32 ({n_params(target) / 1e9:.3f}B), drafter "
      f"its first {args.draft_layers} layers, alpha {args.alpha}", flush=True)
configs = build_configs(args.blocks, args.trees, mlx_lm=False, confidence=False,
                        verify=("flat", "rows", "chunks"))
nodes = max(c.budget for c in configs)
width = chunks_plan(target, nodes, allow_inexact=True).width
print(f"--verify chunks: linear layers in calls of at most {width} rows", flush=True)
rows = adapter_for(target, rows=True)
chunks = adapter_for(target, kernels=RowChunks(width))
for c in configs:
    if c.verify == "rows":
        c.adapter = rows
    elif c.verify == "chunks":
        c.adapter, c.adapter_name = chunks, chunks_name(width)
report = bench(target, draft, scaled.default_prompts(args.prompts), configs,
               BenchOptions(max_tokens=args.max_tokens, repeats=args.repeats, eos=[]),
               log=lambda s: print("  " + s, flush=True))
report.update(machine=machine_info(), model=f"scaled {hidden}x{layers} float32",
              draft_model="its first layers", prompts_text=None)
print(format_report(report))
