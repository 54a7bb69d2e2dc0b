#!/usr/bin/env bash
# The GPU work written offline and not yet run on an H200, in three device calls of < 10 minutes each
# (one `run` per step, back to back; each step's commands have their own timeouts so one hang costs only
# its share). Outputs go to $OUT (at most 8 files come back from a call: logs are joined into one per step).
#
#   device run:  bash benchmarks/gpu_pending.sh tests        # ~8 min: correctness of the offline kernels
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh probe   # ~8 min: W4A16 ring decode rows, varlen attention
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh sweep   # ~9 min: FA3 backward ws sweep, W4A16 wgmma GEMM
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh fp8     # ~3 min, if time is left: the FP8 pp_tree config
#
# tests: the warp-specialized FA3 backward (tests/kernels/test_attention_fa3_bwd_gpu.py: every TUNING_CONFIGS
#        entry, ws included, and ws == plain kernel), the Gluon W4A16 GEMM (test_w4a16_wgmma_gpu.py), the rest of
#        the FP8 attention GPU file (cut by the budget on 2026-12-02).
# probe: benchmarks/w4a16_probe.py r-dec rows beside the current decode kernel, the copy and bf16 (docs/w4a16_decode.md
#        "Round 5"), then benchmarks/attention_varlen.py (FA3 varlen under auto vs FA2 vs SDPA padded).
# sweep: benchmarks/attention_fa3_bwd_sweep.py at d128/d64 (ws rows beside the plain ones and cuDNN), then
#        benchmarks/w4a16.py with the wgmma rows at M 64..4096 (docs/w4a16_gemm.md).
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
    step fa3_bwd_ws 250 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention_fa3_bwd_gpu.py -x
    step w4a16_wgmma 200 "$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_w4a16_wgmma_gpu.py -x
    step fa3_fp8 110 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention_fa3_fp8_gpu.py -k "not exp2 and not late" ;;
  probe)
    step w4a16_ring 330 "$PY" benchmarks/w4a16_probe.py --kinds r-dec,dec,e-copy,bf16 \
      --shapes 8192x8192,4096x4096,8192x28672 --budget 100 --out "$OUT"
    step attention_varlen 220 "$PY" benchmarks/attention_varlen.py --out "$OUT" ;;
  sweep)
    step fa3_bwd_sweep 330 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 128,64 --budget 280 \
      --out "$OUT/attention-fa3-bwd-sweep-ws-h200.json"
    step w4a16_wgmma_bench 230 "$PY" benchmarks/w4a16.py --impls flashscale,bf16,flashscale-wgmma \
      --ms 64,256,1024,4096 --quick --out "$OUT" ;;
  fp8)  # docs/attention_fp8.md "SASS audit": the tree row max beside pp (its GPU tests are in `tests`)
    step fp8_tree 240 "$PY" benchmarks/attention_fa3_fp8_sweep.py --hdims 128 --seqlens 8192,16384 \
      --variants pp,pp_tree,pp_late --out "$OUT/attention-fa3-fp8-tree-h200.json" ;;
  *)
    echo "usage: [OUT=DIR] bash benchmarks/gpu_pending.sh tests|probe|sweep|fp8" >&2
    exit 2 ;;
esac
