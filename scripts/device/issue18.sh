#!/usr/bin/env bash
# Issue 18's H200 measurements in one device call, from the repository root, once MLX's CUDA
# backend is installed (../../README.md, "On the H200"; ../../../shared/device/README.md): the
# tree round's costs piece by piece (with the drafting rounds' host graph building), one
# drafting level alone, the verify cost curve to 17 tokens, and the scaled bench whose auto
# also prices the spines of depth 2-8 from its own texts. Each record goes to $OUT/<name>.txt,
# its command on the first line and its exit status on the last; each step has its own time
# limit so that the whole fits one 600 s call:
#   DIMS (4096x32), LIMITS ("150 80 60 280": costs, levels, curve, bench seconds)
# cuDNN attention is off unless MLX_CUDA_USE_CUDNN_SDPA is set (README: why).
set -u
d=${OUT:?set OUT}
dims=${DIMS:-4096x32}
read -r l_costs l_levels l_curve l_bench <<< "${LIMITS:-150 80 60 280}"
export MLX_CUDA_USE_CUDNN_SDPA=${MLX_CUDA_USE_CUDNN_SDPA:-0} PYTHONUNBUFFERED=1
export PYTHONPATH=.:${PYTHONPATH:-}

run() {  # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  { echo "\$ $* (limit ${limit} s, git $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    timeout -s INT "$limit" "$@"
    echo "rc=$?"; } > "$d/$name.txt" 2>&1
  tail -1 "$d/$name.txt" | sed "s/^/$name: /"
}

run "costs-$dims" "$l_costs" python3 scripts/tree_verify_costs.py --dims "$dims" --repeats 7
run "draft-levels-$dims" "$l_levels" python3 scripts/draft_level_costs.py --dims "$dims" --repeats 7
run "curve-$dims" "$l_curve" python3 -m treespec.costcurve --dims "$dims" --dtypes bfloat16 \
  --Ts 1,3,5,7,9,11,13,15,17
# Spines of depth 4, 5 and 7 named (parent lists), [2,1,1,1]; auto prices depths 2-8 itself.
run "bench-$dims" "$l_bench" python3 -m treespec bench --scaled "$dims" --alpha 0.02 \
  --allow-inexact --repeats 7 --max-tokens 48 --prompts 2 --blocks 3,5,9 \
  "--trees=-1,0,0,1,1,3,3,5,5 -1,0,0,1,1,3,3,5,5,7,7 -1,0,0,1,1,3,3,5,5,7,7,9,9,11,11 2,1,1,1" \
  --max-seconds $((l_bench - 20))
