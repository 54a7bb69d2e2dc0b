#!/usr/bin/env bash
# One device call for the attention work: the GPU tests, then the FlashAttention benchmark grid.
#   OUT=/some/dir bash benchmarks/attention_device.sh [extra benchmark args]
# Stage 1 runs the GPU tests (pytest-xdist, compiling in parallel) while other processes compile the
# benchmark's kernels into Triton's on-disk cache; stage 2 times with nothing else on the GPU.
# Every stage has a time limit, and every log lands in $OUT, so a partial run still reports.
set -u
OUT=${OUT:-/tmp/attention-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} FLASHSCALE_CACHE_DIR="$OUT"
PY=${PYTHON:-python3}
T_TESTS=${T_TESTS:-125}
T_BENCH=${T_BENCH:-150}
BENCH_ARGS=("--tune" "--deterministic" "$@")

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "$OUT/gpu.txt" 2>&1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"

start=$(date +%s)
timeout "$T_TESTS" "$PY" benchmarks/attention.py --precompile-only --jobs 8 "${BENCH_ARGS[@]}" \
  > "$OUT/precompile.log" 2>&1 &
pre=$!
timeout "$T_TESTS" "$PY" -m pytest -q -m gpu tests/kernels/test_attention_gpu.py -n 6 -p no:cacheprovider \
  -rfE --durations=10 > "$OUT/gpu_tests.log" 2>&1
echo "pytest exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/gpu_tests.log"
wait $pre
echo "precompile exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/precompile.log"

timeout "$T_BENCH" "$PY" benchmarks/attention.py --out "$OUT" "${BENCH_ARGS[@]}" > "$OUT/bench.log" 2>&1
echo "benchmark exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/bench.log"

tail -n 25 "$OUT/gpu_tests.log"
tail -n 4 "$OUT/precompile.log"
tail -n 90 "$OUT/bench.log"
