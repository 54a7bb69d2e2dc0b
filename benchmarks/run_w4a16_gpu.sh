#!/usr/bin/env bash
# The W4A16 GPU session in one call (about 5-6 minutes on an H200: run with timeout_s >= 390): kernel
# benchmark, end-to-end decode, GPU tests.
# Usage (repo root, a CUDA machine): OUT=/some/dir bash benchmarks/run_w4a16_gpu.sh
# Each stage has its own time limit so a slow one cannot starve the others; full logs go to $OUT,
# short tails to stdout.
set -u
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } >"$OUT/env.txt" 2>&1
timeout 220 python3 benchmarks/w4a16.py --out "$OUT" >"$OUT/bench.log" 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 ))s"
timeout 75 python3 benchmarks/generate_w4a16.py --out "$OUT" >"$OUT/generate.log" 2>&1; echo "generate rc=$? $(( $(date +%s) - t0 ))s"
timeout 75 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_w4a16.py tests/test_qlinear.py \
  >"$OUT/pytest.log" 2>&1; echo "pytest rc=$? $(( $(date +%s) - t0 ))s"
cat "$OUT/env.txt"
tail -n 75 "$OUT/bench.log"
tail -n 9 "$OUT/generate.log"
tail -n 14 "$OUT/pytest.log"
