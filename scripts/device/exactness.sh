#!/usr/bin/env bash
# The exactness suite on a CUDA machine with MLX's CUDA backend installed (../../README.md, "On the
# H200"), from the repository root, timed test by test; what it writes goes to $OUT/$NAME:
# tests.tsv, pytest.log, verdicts.json, verdict-summary.md, outcome.txt, gpu.txt.
#   NAME (run), WORKERS (8), LIMIT (seconds before SIGINT, 540), SELECT_FILE (node ids to run)
set -u
NAME=${NAME:-run}; d=${OUT:?set OUT}/$NAME; mkdir -p "$d"
export PYTHONPATH=.:scripts/device:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TIMING_TSV=$d/tests.tsv
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
  python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
  echo "MLX_PTX_CACHE_DIR=${MLX_PTX_CACHE_DIR:-default}, files there at the start: $(ls "${MLX_PTX_CACHE_DIR:-/tmp/mlx}" 2>/dev/null | wc -l)"
} > "$d/gpu.txt" 2>&1
start=$(date +%s.%N)
timeout -s INT "${LIMIT:-540}" python3 -m pytest -m exactness -n "${WORKERS:-8}" -p timing_plugin \
  -p no:cacheprovider -q -rfE --verdict-json "$d/verdicts.json" > "$d/pytest.log" 2>&1
rc=$?
end=$(date +%s.%N)
{ echo "rc=$rc wall=$(python3 -c "print(round($end - $start, 1))") s: pytest -m exactness -n ${WORKERS:-8} (timeout -s INT ${LIMIT:-540})"
  tail -3 "$d/pytest.log"; echo "tests reported: $(grep -vc '^#' "$d/tests.tsv")"; } > "$d/outcome.txt"
python3 scripts/verdict_summary.py "$d/verdicts.json" > "$d/verdict-summary.md" 2>&1
cat "$d/outcome.txt"; grep -E "^(FAILED|ERROR)" "$d/pytest.log" | head -20
