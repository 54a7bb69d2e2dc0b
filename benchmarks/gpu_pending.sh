#!/usr/bin/env bash
# The GPU work pending after 2026-12-02 (the previous list - ws backward, wgmma GEMM, ring decode, varlen, FP8
# tree - ran that day: docs/attention_fa3.md, w4a16_gemm.md, w4a16_decode.md, attention_fp8.md). One `run` per
# step, back to back; each step's commands have their own timeouts so one hang costs only its share. Outputs go
# to $OUT (at most 8 files come back from a call: logs are joined into one per step).
#
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh tests     # ~5 min: the new dispatch paths on the GPU
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh refresh   # ~10 min: the README's attention and W4A16 tables
#                                                                  # with the new defaults (ws backward, wgmma in
#                                                                  # the W4A16 autotune)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh e2e       # ~6 min: StaticDecoder (infer/decode.py, now the
#                                                                  # library's) on the GPU: its tests, CUDA-graph
#                                                                  # capture included, then generate_w4a16.py
#
# tests:   the auto backward rule (d128 non-causal >= 8k, d64 >= 16k: FA3_BWD_AUTO_MIN_SEQLEN_Q), the wgmma configs
#          in w4a16_matmul's autotune (auto / kernel="wgmma" / a WgmmaConfig, act-order + bias), QuantLinear's
#          end-to-end logits (now through whichever GEMM the tuner keeps), the varlen auto rule and the API tests.
# refresh: benchmarks/attention.py (the FA papers' grid; backward through the new dispatch) and benchmarks/w4a16.py
#          (all six shapes, default dispatch) into $OUT; copy them over benchmarks/results/attention-h200.json and
#          w4a16-h200.json and rerun make_tables.py.
# Issue 6 (separate calls, docs/quant_quality.md "a third time"): SmolLM2's AWQ with clip_mode "both" on the GPU
# protocol (carry .gl/smollm2.partaa: `bash benchmarks/quant_quality_device.sh stash`; then carry .gl/smollm2.partab,
# .gl/smollm2.sha256, .whl: `OUT=$OUT PARALLEL=1 CONFIGS=4:-1,4:64 METHODS=awq_clipboth T_RUN=420 NAME=qq-clipboth
# bash benchmarks/quant_quality_device.sh run`), and a fourth 125M training (carry .cache/corpus: `OUT=$OUT
# T_TOTAL=585 T_QUANT=215 QCONFIGS="4:128/rtn,gptq,awq,gptq_act_order 4:128/awq_clipboth 3:128/rtn,gptq,gptq_act_order"
# bash benchmarks/quant_quality_125m.sh`).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_pending}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
step() {  # step NAME SECONDS command...: run with a timeout, log to $OUT/NAME.log, say how it ended
  local name=$1 secs=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$secs" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc after $(( $(date +%s) - t0 )) s (limit $secs)$([ $rc = 124 ] && echo ', TIMED OUT')"
  tail -n 15 "$OUT/$name.log"
}

case "${1:-}" in
  tests)
    # the whole backward file and test_w4a16.py's GPU tests: the review moved shared prologues into helpers
    # (same SASS instructions, reordered) after the 2026-12-02 runs
    step dispatch 330 "$PY" -m pytest -q -p no:cacheprovider -m gpu -x tests/kernels/test_attention_fa3_bwd_gpu.py \
      tests/kernels/test_w4a16_wgmma_gpu.py::test_w4a16_matmul_auto_and_forced_wgmma \
      tests/kernels/test_w4a16.py tests/test_qlinear.py
    step fa3_auto 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -x tests/kernels/test_attention_fa3_gpu.py \
      -k "ops_attention"
    step api 120 "$PY" -m pytest -q -p no:cacheprovider -x tests/kernels/test_attention_api.py \
      tests/kernels/test_w4a16_wgmma_gpu.py::test_dispatch_candidates_and_tuned_table_round_trip ;;
  refresh)
    step attention 330 "$PY" benchmarks/attention.py --out "$OUT"
    step w4a16 250 "$PY" benchmarks/w4a16.py --out "$OUT" ;;
  e2e)
    step decode_tests 150 "$PY" -m pytest -q -p no:cacheprovider -x tests/test_infer_decode.py \
      tests/test_generate.py tests/test_cli_convert_generate.py -k "not smollm2"
    step generate 400 "$PY" benchmarks/generate_w4a16.py --out "$OUT" ;;
  *)
    echo "usage: [OUT=DIR] bash benchmarks/gpu_pending.sh tests|refresh|e2e" >&2
    exit 2 ;;
esac
