#!/usr/bin/env bash
# Issue 18's H200 measurements in one device call, from the repository root, once MLX's CUDA
# backend is installed (../../README.md, "On the H200"; ../../../shared/device/README.md).
# Each step writes $OUT/<step>-<dims>.txt, its command on the first line and its exit status on
# the last, under its own time limit so that the whole fits one 600 s call:
#   DIMS (4096x32)
#   STEPS ("costs:150 levels:80 curve:60 bench:280"), each step:seconds, from
#     costs   tree_verify_costs.py: a tree round's pieces against a chain's, with the
#             drafting rounds' host graph building and primitives by name
#     levels  draft_level_costs.py: one drafting level alone
#     curve   the verify cost curve at T = 1..17
#     census  round_census.py --start-commits: the primitives each round evaluates inside the
#             decode loop, and each configuration again with its commits started on their own
#     census-rows  round_census.py of chain b=5 and [2,1,1,1] with its wide levels injected
#             and as batch rows (FixedTreeDrafter(batch_levels=True)), commits as they are
#     census-nographs, census-graphcache  the same with MLX_USE_CUDA_GRAPHS=0, and with
#             MLX_CUDA_GRAPH_CACHE_SIZE=4000 (whether a tree round's evaluation, as many
#             primitives as a chain round's, costs more for CUDA graphs it cannot reuse)
#     bench   the scaled bench: blocks 3, 5, 9, the spines of depth 4, 5, 7 and [2,1,1,1]
#             (auto prices depths 2-8 itself)
#     bench-rows  the scaled bench of chain b=3 and b=5 against [2,1,1,1] and [2,2,1], each
#             tree injected and as batch rows (--batch-levels), no mlx-lm or confidence rows
#     deep    the scaled bench of deep chains (blocks 7, 9, 11) against deep spines (depth
#             5-8, two children per spine node), 11 repeats, no mlx-lm or confidence rows
#     ab      ab_chain_mlx_lm.py --gate: treespec's chain against mlx-lm's at blocks 3 and 5,
#             gated as every decode call is (study mode), 9 repeats
#     setup   decode_setup_costs.py on 32 thin layers: a decode call's host set-up (the
#             adapters, the gate with its probe memoized), this host's speed at host work
# cuDNN attention is off unless MLX_CUDA_USE_CUDNN_SDPA is set (README: why).
set -u
d=${OUT:?set OUT}
dims=${DIMS:-4096x32}
export MLX_CUDA_USE_CUDNN_SDPA=${MLX_CUDA_USE_CUDNN_SDPA:-0} PYTHONUNBUFFERED=1
export PYTHONPATH=.:${PYTHONPATH:-}

run() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  { echo "\$ $* (limit ${limit} s, git $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    timeout -s INT "$limit" "$@"
    echo "rc=$?"; } > "$d/$name-$dims.txt" 2>&1
  tail -1 "$d/$name-$dims.txt" | sed "s/^/$name: /"
}

spine() {  # depth: the parent list of a spine with two children per spine node
  local p="-1,0,0" i
  for ((i = 1; i < $1; i++)); do p="$p,$((2 * i - 1)),$((2 * i - 1))"; done
  echo "$p"
}

bench() {  # name, seconds, bench arguments...
  local name=$1 limit=$2
  shift 2
  run "$name" "$limit" python3 -m treespec bench --scaled "$dims" --alpha 0.02 --allow-inexact \
    --repeats 7 --max-tokens 48 --prompts 2 --max-seconds $((limit - 20)) "$@"
}

for step in ${STEPS:-costs:150 levels:80 curve:60 bench:280}; do
  name=${step%%:*} limit=${step##*:}
  case $name in
  costs) run costs "$limit" python3 scripts/tree_verify_costs.py --dims "$dims" --repeats 7 ;;
  levels) run draft-levels "$limit" python3 scripts/draft_level_costs.py --dims "$dims" --repeats 7 ;;
  curve) run curve "$limit" python3 -m treespec.auto.costcurve --dims "$dims" --dtypes bfloat16 \
    --Ts 1,3,5,7,9,11,13,15,17 ;;
  census) run census "$limit" python3 scripts/round_census.py --dims "$dims" --start-commits ;;
  census-rows) run census-rows "$limit" python3 scripts/round_census.py --dims "$dims" \
    --configs "chain:5 branching:2,1,1,1 rows:2,1,1,1" ;;
  census-nographs) MLX_USE_CUDA_GRAPHS=0 run census-nographs "$limit" \
    python3 scripts/round_census.py --dims "$dims" --start-commits ;;
  census-graphcache) MLX_CUDA_GRAPH_CACHE_SIZE=4000 run census-graphcache "$limit" \
    python3 scripts/round_census.py --dims "$dims" --start-commits ;;
  bench) bench bench "$limit" --blocks 3,5,9 \
    "--trees=$(spine 4) $(spine 5) $(spine 7) 2,1,1,1" ;;
  bench-rows) bench bench-rows "$limit" --blocks 3,5 --no-mlx-lm --no-confidence --no-auto \
    --batch-levels "--trees=2,1,1,1 2,2,1" ;;
  deep) bench deep "$limit" --blocks 7,9,11 --no-mlx-lm --no-confidence --repeats 11 \
    "--trees=$(spine 5) $(spine 6) $(spine 7) $(spine 8)" ;;
  ab) run ab "$limit" python3 scripts/ab_chain_mlx_lm.py --pair scaled --dims "$dims" \
    --blocks 3,5 --max-tokens 48 --repeats 9 --gate ;;
  setup) run setup "$limit" python3 scripts/decode_setup_costs.py --dims 64x32 ;;
  *) echo "unknown step $name (costs levels curve census census-rows census-nographs census-graphcache" \
    "bench bench-rows deep ab setup)"; exit 2 ;;
  esac
done
