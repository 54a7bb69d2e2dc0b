#!/usr/bin/env bash
# The GPU work pending after session 18 (2026-12-02). `tests` and `e2e` ran that session (tests: 36 + 5 + 54
# passed; e2e: 21 passed with gguf on the path, generate_w4a16.py 1.74x), issue 6's calls too (docs/quant_quality.md),
# and `refresh` twice - which found the backward dispatch bug (docs/attention_fa3.md, session 18). One `run` per
# step, back to back; each step's commands have their own timeouts so one hang costs only its share. Outputs go
# to $OUT (at most 8 files come back from a call: logs are joined into one per step).
#
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh tests     # ~3 min: the fixed backward dispatch on the GPU
#                                                                  # (auto_fa3, FA2's dQ-kernel rule, d256 rule)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh refresh   # ~7 min: the attention grid through the fixed
#                                                                  # dispatch, FA2 configs seeded from the committed
#                                                                  # results (2026-11-29's tuning), so only the
#                                                                  # dispatch differs from results/attention-h200.json;
#                                                                  # then benchmarks/w4a16.py (the tuner's 2nd round)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh e2e       # ~3 min: the PDL decode step (kernels.pdl:
#                                                                  # its GPU tests, then generate_w4a16.py's
#                                                                  # plain / +pdl / +pdl+l2 rows; docs/w4a16_decode.md
#                                                                  # round 6 has the prediction)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh host      # ~1 min: host vs device time of the short
#                                                                  # attention cells whose forward varied 1.8x
#                                                                  # between runs (docs/attention_fa3.md)
#
# refresh: copy $OUT/attention-h200.json and w4a16-h200.json over benchmarks/results/ (attention's backward rows are
#          auto's now: drop the relabelling note) and rerun make_tables.py.
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
    step dispatch 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu -x tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "auto or ws_matches"
    step fa2 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu -x -n 6 tests/kernels/test_attention_gpu.py
    step api 120 "$PY" -m pytest -q -p no:cacheprovider -x tests/kernels/test_attention_api.py ;;
  refresh)
    mkdir -p /tmp/seedcache
    "$PY" -c "import json; json.dump(json.load(open('benchmarks/results/attention-h200.json'))['configs'], open('/tmp/seedcache/attention_configs.json', 'w'))"
    export FLASHSCALE_CACHE_DIR=/tmp/seedcache
    step attention 240 "$PY" benchmarks/attention.py --deterministic --out "$OUT"
    step w4a16 240 "$PY" benchmarks/w4a16.py --out "$OUT" ;;  # the tuner's second round: 4096x4096 at M 2-16
  e2e)
    step decode_tests 150 "$PY" -m pytest -q -p no:cacheprovider -x tests/test_infer_decode.py tests/kernels/test_pdl.py
    step generate 300 "$PY" benchmarks/generate_w4a16.py --out "$OUT" ;;
  host)
    step host 120 "$PY" benchmarks/attention_host.py --out "$OUT" ;;
  *)
    echo "usage: [OUT=DIR] bash benchmarks/gpu_pending.sh tests|refresh|e2e|host" >&2
    exit 2 ;;
esac
