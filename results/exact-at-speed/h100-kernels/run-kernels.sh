#!/usr/bin/env bash
# Issue 43 on CUDA: the row kernels (identity, cost, tests), then the bench flat/rows/kernels.
set -u
cd .device/tree
export PYTHONPATH=.:${PYTHONPATH:-}
export MLX_ENABLE_TF32=0 MLX_CUDA_USE_CUDNN_SDPA=0
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
case "$1" in
probe)
  timeout ${2:-200} python3 results/exact-at-speed/kernel_probe.py --repeats 5 > $OUT/kernel-probe.jsonl 2> $OUT/kernel-probe.err
  echo "probe rc $?" >> $OUT/kernel-probe.err; tail -5 $OUT/kernel-probe.err
  python3 - $OUT/kernel-probe.jsonl <<'PY'
import json, sys
bad = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["kind"] in ("quantized", "dense"):
        if r["kernel_identical"] < r["rows"]:
            bad += 1
            if bad < 12: print("DIFF", r)
    elif r["kind"] == "cost":
        print("cost", r["bits"], r["k"], r["n"], r["rows"], {k: round(v, 4) for k, v in r["ms"].items()})
    else:
        print(r)
print("rows differing in", bad, "configurations")
PY
  timeout ${3:-150} python3 -m pytest suites/verify/test_row_kernels.py -q -p no:cacheprovider -n 4 > $OUT/row-kernels-tests.txt 2>&1
  echo "tests rc $?" >> $OUT/row-kernels-tests.txt; grep -E "passed|failed|FAIL|Error" $OUT/row-kernels-tests.txt | tail -12 ;;
bench)
  timeout ${2:-540} python3 -m treespec bench --scaled 4096x32 --bits 4 --alpha 0.02 --verify flat,rows,kernels --allow-inexact \
    --blocks 3,5 --trees "2,1 -1,0,0,1" --no-mlx-lm --no-confidence --no-auto \
    --repeats 3 --max-tokens 48 --prompts 2 --max-seconds $(( ${2:-540} - 60 )) --json > $OUT/bench-kernels.json 2> $OUT/bench-kernels.log
  echo "bench rc $?" >> $OUT/bench-kernels.log; tail -30 $OUT/bench-kernels.log ;;
esac
