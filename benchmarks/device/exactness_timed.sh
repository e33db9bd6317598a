#!/usr/bin/env bash
# The exactness suite on a CUDA machine with MLX's CUDA backend installed (README.md, "On the
# H200"), from the repository root, timed test by test (benchmarks/device/timing_plugin.py);
# what it writes goes to $OUT/$NAME: tests.tsv, pytest.log, verdicts.json, verdict-summary.md
# (python -m benchmarks.verdict_summary), outcome.txt, gpu.txt.
#   OUT (required), NAME (run), WORKERS (8), LIMIT (seconds before SIGINT, 540),
#   SELECT_FILE (node ids to run instead of all)
#   OUT=DIR NAME=RUN MLX_PTX_CACHE_DIR=/tmp/empty bash benchmarks/device/exactness_timed.sh
set -u
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  echo "usage: OUT=DIR [NAME=RUN WORKERS=8 LIMIT=540 SELECT_FILE=F] bash $0"
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
NAME=${NAME:-run}; d=${OUT:?set OUT}/$NAME; mkdir -p "$d"
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TIMING_TSV=$d/tests.tsv
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
  python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
  echo "MLX_PTX_CACHE_DIR=${MLX_PTX_CACHE_DIR:-default}, files there at the start: $(ls "${MLX_PTX_CACHE_DIR:-/tmp/mlx}" 2>/dev/null | wc -l)"
} > "$d/gpu.txt" 2>&1
start=$(date +%s.%N)
timeout -s INT "${LIMIT:-540}" python3 -m pytest -m exactness -n "${WORKERS:-8}" \
  -p benchmarks.device.timing_plugin -p no:cacheprovider -q -rfE \
  --verdict-json "$d/verdicts.json" > "$d/pytest.log" 2>&1
rc=$?
end=$(date +%s.%N)
{ echo "rc=$rc wall=$(python3 -c "print(round($end - $start, 1))") s: pytest -m exactness -n ${WORKERS:-8} (timeout -s INT ${LIMIT:-540}), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  tail -3 "$d/pytest.log"; echo "tests reported: $(grep -vc '^#' "$d/tests.tsv")"; } > "$d/outcome.txt"
python3 -m benchmarks.verdict_summary "$d/verdicts.json" > "$d/verdict-summary.md" 2>&1
cat "$d/outcome.txt"; grep -E "^(FAILED|ERROR)" "$d/pytest.log" | head -20
