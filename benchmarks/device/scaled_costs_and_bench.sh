#!/usr/bin/env bash
# The scaled pair's costs and bench on an accelerator, step by step, in one device call (README.md,
# "On the H200"), from the repository root, once MLX's CUDA backend is installed. Each step writes
# $OUT/<step>-<dims>.txt, its command on the first line and its exit status on the last, under its
# own time limit so that the whole fits one 600 s call; the benchmarks' own records go to
# $OUT/gpu-bench/<commit>/ (benchmarks/harness.py).
#   OUT (required), DIMS (4096x32),
#   STEPS ("costs:150 levels:80 curve:60 bench:280"), each step:seconds, from
#     costs   benchmarks.verify_cost: a tree verify's pieces against a plain forward's
#     levels  benchmarks.draft_cost: one drafting level, and one drafting round per drafter
#     commits benchmarks.commit_cost --by-hand: a branch commit against the verify, and its
#             row moves done by hand
#     curve   the verify cost curve at T = 1..17 (treespec.auto.costcurve)
#     census  benchmarks.round_census --start-commits: the primitives each round evaluates inside
#             the decode loop, and each configuration again with its commits started on their own
#     census-rows  benchmarks.round_census of chain b=5 and [2,1,1,1] with its wide levels
#             injected and as batch rows (FixedTreeDrafter(batch_levels=True))
#     census-nographs, census-graphcache  the census with MLX_USE_CUDA_GRAPHS=0, and with
#             MLX_CUDA_GRAPH_CACHE_SIZE=4000
#     bench   treespec bench --scaled: blocks 3, 5, 9, the spines of depth 4, 5, 7 and [2,1,1,1]
#             (auto prices depths 2-8 itself)
#     bench-rows  the scaled bench of chain b=3 and b=5 against [2,1,1,1] and [2,2,1], each tree
#             injected and as batch rows (--batch-levels), no mlx-lm or confidence rows
#     deep    the scaled bench of deep chains (blocks 7, 9, 11) against deep spines (depth 5-8,
#             two children per spine node), 11 repeats, no mlx-lm or confidence rows
#     ab      benchmarks.ab_mlx_lm --gate: treespec's chain against mlx-lm's at blocks 3 and 5,
#             gated as every decode call is (study mode), 9 repeats
#     setup   benchmarks.host_cost on the thin 64x32 pair: a chain round's host work and a decode
#             call's set-up against mlx-lm's, this host's speed at host work
# cuDNN attention is off unless MLX_CUDA_USE_CUDNN_SDPA is set (README: why).
#   OUT=DIR STEPS="costs:150 ab:200" bash benchmarks/device/scaled_costs_and_bench.sh
set -u
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  echo "usage: OUT=DIR [DIMS=4096x32] [STEPS='step:seconds ...'] bash $0"
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
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

benchmark() {  # name, seconds, module, arguments...: python -m benchmarks.MODULE, its record in $d
  local name=$1 limit=$2 module=$3
  shift 3
  run "$name" "$limit" python3 -m "benchmarks.$module" --out "$d" --name "$name-$dims" "$@"
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
  costs) benchmark costs "$limit" verify_cost --dims "$dims" --repeats 7 ;;
  levels) benchmark draft-levels "$limit" draft_cost --dims "$dims" --repeats 7 ;;
  commits) benchmark commit-costs "$limit" commit_cost --dims "$dims" --repeats 9 --by-hand ;;
  curve) run curve "$limit" python3 -m treespec.auto.costcurve --dims "$dims" --dtypes bfloat16 \
    --Ts 1,3,5,7,9,11,13,15,17 ;;
  census) benchmark census "$limit" round_census --dims "$dims" --start-commits ;;
  census-rows) benchmark census-rows "$limit" round_census --dims "$dims" \
    --configs "chain:5 branching:2,1,1,1 rows:2,1,1,1" ;;
  census-nographs) MLX_USE_CUDA_GRAPHS=0 benchmark census-nographs "$limit" round_census \
    --dims "$dims" --start-commits ;;
  census-graphcache) MLX_CUDA_GRAPH_CACHE_SIZE=4000 benchmark census-graphcache "$limit" \
    round_census --dims "$dims" --start-commits ;;
  bench) bench bench "$limit" --blocks 3,5,9 \
    "--trees=$(spine 4) $(spine 5) $(spine 7) 2,1,1,1" ;;
  bench-rows) bench bench-rows "$limit" --blocks 3,5 --no-mlx-lm --no-confidence --no-auto \
    --batch-levels "--trees=2,1,1,1 2,2,1" ;;
  deep) bench deep "$limit" --blocks 7,9,11 --no-mlx-lm --no-confidence --repeats 11 \
    "--trees=$(spine 5) $(spine 6) $(spine 7) $(spine 8)" ;;
  ab) benchmark ab "$limit" ab_mlx_lm --pair scaled --dims "$dims" --blocks 3,5 --max-tokens 48 \
    --repeats 9 --gate ;;
  setup) benchmark setup "$limit" host_cost --pair thin --dims 64x32 --sections round,setup ;;
  *) echo "unknown step $name (costs levels commits curve census census-rows census-nographs" \
    "census-graphcache bench bench-rows deep ab setup)"; exit 2 ;;
  esac
done
