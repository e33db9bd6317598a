# ran on the H100 as: source .device/mlx-cuda.sh install && bash .device/pos42.sh 380 (this file was .device/pos42.sh; the probe .device/pos42.py is same_width_probe.py here)
#!/usr/bin/env bash
# Issue 42 (census position rows) on CUDA: the census with its position rows, and whether the
# same-width reference's consultation of them keeps the half-precision proofs.
set -u
export PYTHONPATH=.:${PYTHONPATH:-}
export MLX_ENABLE_TF32=0
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
s=$(date +%s)
timeout -s INT 150 python3 .device/pos42.py > $OUT/same_width.txt 2>&1
echo "rc $? in $(( $(date +%s) - s )) s" >> $OUT/same_width.txt
s=$(date +%s)
timeout -s INT ${1:-380} python3 -m treespec census > $OUT/census.txt 2>&1
echo "rc $? in $(( $(date +%s) - s )) s" >> $OUT/census.txt
tail -5 $OUT/census.txt; cat $OUT/same_width.txt
