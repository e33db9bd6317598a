#!/bin/bash
# 16 runs of repro2 (chain vs classic, both prompts, orders ab/ba alternating), one shared gate memo dir
# persisting across runs, as ~/.cache/treespec does.
cd /work/main
export TREESPEC_CACHE_DIR=/tmp/ts45/memo_repeat
unset RANK1_CACHE
for i in $(seq 1 16); do
  o=ab; [ $((i % 2)) -eq 0 ] && o=ba
  timeout 300 .venv/bin/mlx.launch -n 2 --backend ring --python .venv/bin/python /tmp/ts45/repro2.py $o 2>/tmp/ts45/repeat_err_$i.log | sed "s/^/run $i: /"
  echo "run $i rc=${PIPESTATUS[0]}"
done
