#!/usr/bin/env bash
# One device call for the FP8 attention work (issue 5): GPU tests, accuracy experiment, speed grid.
#   OUT=/some/dir bash benchmarks/attention_fp8_device.sh [extra speed-benchmark args, e.g. --tune]
# The speed grid runs untuned (one tile per group: the tests have compiled it already); --tune times
# every tile candidate and needs ~4 compiles more per group.
# Each stage runs under `timeout` and logs into $OUT, so a partial run still reports (total < 9 min).
set -u
OUT=${OUT:-/tmp/attention-fp8-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} FLASHSCALE_CACHE_DIR="$OUT"
PY=${PYTHON:-python3}
T_TESTS=${T_TESTS:-130}
T_ACC=${T_ACC:-45}
T_BENCH=${T_BENCH:-230}  # 130 + 2 x 45 + 230 = 450 s at most

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "$OUT/gpu.txt" 2>&1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
start=$(date +%s)

XDIST=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 6")  # parallel compiles where pytest-xdist exists
timeout "$T_TESTS" "$PY" -m pytest -q -m gpu tests/kernels/test_attention_fp8_gpu.py $XDIST -p no:cacheprovider -rfE \
  --durations=10 > "$OUT/gpu_tests.log" 2>&1
echo "pytest exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/gpu_tests.log"

# the accuracy experiment at the CPU run's shape, then at a longer sequence
timeout "$T_ACC" "$PY" benchmarks/attention_fp8_accuracy.py --out "$OUT" > "$OUT/accuracy.log" 2>&1
echo "accuracy exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/accuracy.log"
mkdir -p "$OUT/s8k"
timeout "$T_ACC" "$PY" benchmarks/attention_fp8_accuracy.py --batch 1 --seqlen 8192 --heads 8 --out "$OUT/s8k" \
  > "$OUT/accuracy_s8k.log" 2>&1
echo "accuracy s8k exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/accuracy_s8k.log"

timeout "$T_BENCH" "$PY" benchmarks/attention_fp8.py --out "$OUT" "$@" > "$OUT/bench.log" 2>&1
echo "benchmark exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/bench.log"

tail -n 25 "$OUT/gpu_tests.log"
tail -n 10 "$OUT/accuracy.log" "$OUT/accuracy_s8k.log"
tail -n 45 "$OUT/bench.log"
