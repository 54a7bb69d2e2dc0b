#!/usr/bin/env bash
# NEXT (H200 only): h200s52 (~9.5 min) = fp8h50 + issue 7's point 3 with the default tuner, which since session 52
# times the vec_y twins from M = 65 (w4h52: that half alone); then gpuall52 (every gpu-marked test, on either card).
# Session 52 got no machine (ten failed starts of the H200 kind, three of the H100's).
# Session 53 got one H100 after eight failed starts: any53 ran gpuall52 there (every gpu-marked test at b11a07e:
# 696 passed, 1 skipped; the two GGUF test modules failed to collect without the gguf package and now skip). On an
# H200, any53 runs h200s52 (any53s: w4h52 alone, for little device time).
# Before session 52: vyh50 = vygrid40 (issue 7's M >= 1024 misses, 0.84x / 0.90x, went to 0.92x / 0.96x with
# vec_y in the probe: the twins through the tuner on the H200), fp8h50 = the FP8 grid (`attention_fp8.py --rounds
# 3`: session 39's H100 sweep ran the D 256 default at 1238 TFLOP/s at 16k, the H200 grid of session 36 at 1097,
# issue 5 asks 1150: the card or the run?), h2grid39.
# Session 51 got one H100 late: the strip GPU tests with the xstage configs (9 passed) and their M = 1 sweep
# (docs/w4a16_decode.md round 14i measured: 20-33 % slower, removed; results/w4a16-strip-xs-h100.json).
# Session 50 ran s50 and s50b on an H100 (docs/w4a16_decode.md round 14h measured: the L2 bulk prefetch slower at
# every cell, removed; results/w4a16-strip-l2-h100.json).
# Session 49 ran on an H100: s48 (sweep + 9 strip GPU tests), m16s48b, the M 1 / 4 / 8 strip sweep on six shapes,
# the W4A16 + quant GPU tests (11 + 22), generate_w4a16.py (3.07x), s49 (x in the B order among the M 2-8 candidates:
# tuned M 1-8 rows + 20 GPU tests); then on an H200: grid48, m16h47 and `--ms 64` (results/w4a16-h200.json M 1-64
# rows re-measured), a short M = 1 strip sweep (docs/w4a16_decode.md round 14g).
# Session 48 got no machine (eleven tries). Session 47 ran xp46 (H100; docs/w4a16_decode.md round 14c measured),
# m16s47 and m16s47b (H100; round 14d).
# Session 46 ran strip45 on an H100 (20 GPU tests passed; results/w4a16-strip-h100.json, the M 1-8 rows of
# results/w4a16-h100.json) and ncu of the strip kernel at 8192^2 (docs/w4a16_decode.md round 14b: issue-bound).
# Session 45 ran the strip kernel's GPU tests and its side-by-side rows on an H100. Session 43 ran vygrid40 and the
# default grid from M 256 on an H100 (docs/w4a16_gemm.md), the lazy-rescale sweep (reverted, docs/attention_fa3.md)
# and every `-m gpu` test (687 passed). Session 42 ran fix41 and fix42 (H100).
# A results file that comes back gets a "note" before it is committed.
#
# GPU steps of sessions 18-29 (2026-12-02/03), kept runnable. Session 28 ran `s28` (docs27's, fa3f28's and fp8n28's
# tests, then their sweeps), `s28b`, `s28c`, `gputests` and `s28d`; its device time ran out before the FP8 grid
# could be re-run with the final pre-pass rule (auto_chunk: V^T in pieces past 128 x 128 values, Q/K whole up to
# 128 x 256) and before test_prepass_in_pieces's rewrite (reference-based at D 256 x 256 rows)
# ran. Session 29 ran s29, s29b, s29c and three direct calls (the tuner trace, the W4A16 grid, generate). Next session:
# `ring30` (ncu of the ring decode kernel, the M = 1 pick now), then the open performance points (#4 forward at D 256,
# #5 D 128, #7 decode). One `run` per step, back to back; each step's commands
# have their own timeouts so one hang costs only its share. Outputs go to $OUT (at most 8 files come back).
#
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s29       # ~5 min: the Gluon decode kernel's GPU tests, the
#                                                                  # W4A16 probe's q-dec / g-dec / r-dec rows (Round 8)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s29b      # ~4 min: the pre-pass GPU tests, the FP8 grid
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s29c      # ~6 min: wgmma from M = 2: GPU tests, W4A16 M 2-16
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s30       # ~6 min: W4A16 GPU tests, ncu of the ring kernel
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh l2r30     # ~5 min: ring + L2 prefetch configs, r-dec probe
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh trace30   # ~2 min: ring kernel timelines (w4a16_ring_trace.py)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh acc30     # ~6 min: accumulate=True decode: tests, e2e rows
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh pdl30     # ~4 min: accumulate + PDL ring: tests, e2e rows
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh pro31     # ~9 min: prologue + trigger (+ the head): tests, e2e rows
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh glue32    # ~10 min: step glue kernels + XAttn: tests, e2e rows
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh trace32   # ~6 min: the decode step's timeline, e2e rows
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh trace32b  # ~3 min: the timeline, late starters, variants
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh final32   # ~10 min: e2e rows (+tuned), GPU tests, trace
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh h2s38     # ~9.5 min: the packed 16-bit W4A16 unpack and the
#                                                                  # 128-feature consumer: GPU tests, M = 64 probe
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh h2s38b    # ~7 min: the same probe at M = 256
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh dec38     # ~9 min: 16-token tiles, 2-3 blocks an SM, M 1 / 16
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh fix41     # ~5-8 min: the repeat script case by case, memcheck, x8
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh fix41b    # ~4 min: the fix-up GPU tests
#   device run:  OUT=$OUT FIX42_DIAG=snap bash benchmarks/gpu_pending.sh fix42  # ~3 min (ran, s42): cases 7-9, tests
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh strip45   # ~7 min: dispatch + strip GPU tests, M 1-8 grid
#                                                                  # (ran s46, H100)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh xp46      # ~5 min: strip with x in the B order: tests, M 1/16
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh m16s47    # ~7 min: xperm strip + PDL: tests, M 1/16 sweep
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh m16s47b   # ~5 min: the tuned M = 16 grid, merged
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh m16h47    # ~3 min: the M = 16 grid if the GPU is an H200
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s48       # ~8 min: strip GPU tests, the M 1 / 16 sweep
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s50       # ~7 min: L2 bulk prefetch sweep M 1 / 8, tests
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s50b      # ~4 min: the M = 16 strip sweep
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s49       # ~7 min: the tuned M 1-8 grid, merged; W4A16 tests
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh grid48    # ~7 min: the M 1-8 grid if the GPU is an H200
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh m16s48b   # ~7 min: the tuned M 1 / 16 grid, merged
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh grid47    # ~5 min: grid42 if the GPU is an H200, else nothing
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh grid42    # ~5 min, H200: the M = 16 / 64 rows re-measured
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh vy40      # ~5 min (ran, s40): vec_y GPU tests, the probe's A/B
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh vygrid40  # ~6 min: the W4A16 grid with the vec_y twins
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh att39     # ~9.5 min: FP8 o_direct, d128c38, fp8c38
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh att39b    # ~6 min: the W4A16 M = 256 probe
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh d128c38   # ~8 min: 3 consumers at D 128, 64-key blocks:
#                                                                  # GPU tests, the sweep beside the D 128 defaults;
#                                                                  # the L2 -> SM read rate (l2_bandwidth.py)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh fp8c38    # ~6 min: FP8 D 128 with 3 consumers: tests, sweep
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh h2grid38  # ~7 min: the W4A16 grid, the tuner given the twins
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh m64s37    # ~5 min: every 64-token W4A16 tile at M = 64, ncu of
#                                                                  # the M = 64 pick and of the FP8 D 128 default
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh kron36    # ~1 min: the pre-pass's kron method (ran, s37)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh pre36     # ~6 min: FP8 GPU files, the FP8 grid (pre-pass rule)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh suite35   # ~9.5 min: the whole suite on the GPU (grep FAILED)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh late34    # ~9.5 min: e2e rows +lateN, timelines, GPU tests
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh dyn33     # ~12 min (ran over 10): DYN tests, e2e +dyn, trace
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh ring30    # ~8 min: ncu of the ring decode kernel (unrun),
#                                                                  # the probe's r-dec rows on all six shapes
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh tests     # ~3 min: backward dispatch GPU tests, FA2's
#                                                                  # GPU tests, the attention API file
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh refresh   # ~4 min: the attention grid (FA2 configs seeded
#                                                                  # from results/attention-h200.json), w4a16.py
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh e2e       # ~2 min: decode step tests, generate_w4a16.py
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh host      # ~1 min: host vs device time of short attention
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh decode    # ~5 min: attention host profile, decode and
#                                                                  # tuner GPU tests, generate_w4a16.py, w4a16.py
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh attn19    # ~4 min: host profile/timing, fa3 + fp8 + API
#                                                                  # GPU tests, the attention grid
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh gemm20    # ~4 min: W4A16 GEMM configs at K 4096 x N 14336,
#                                                                  # the W4A16 grid, GEMM GPU tests (session 20)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh gemm21    # ~8 min: stream-K and tuner GPU tests, the grid
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh bwd22     # ~8 min: backward GPU tests (every config, the
#                                                                  # TMA dQ ones included), ws/tma sweep, ncu of tma
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh attn22    # ~6 min: backward API/rule GPU tests, the grid
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh bwd22b    # ~4 min: D 256 ws backward (dQ pieces): tests, sweep
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh l2        # ~9 min: the forwards' head-grouped tile order:
#                                                                  # GPU tests, FA3 and FP8 sweeps, grouped vs flat
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh l2b       # ~6 min: persistent programs in snake order:
#                                                                  # GPU tests, the sweeps of every persistent variant
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh attn23    # ~9 min: FA3 + API + backward-rule GPU tests, the
#                                                                  # attention grid, the FP8 grid (new forward defaults)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh d64c      # ~5 min: backward GPU tests + short sweeps (one-pass
#                                                                  # dQ cast), D 64 forward configs for short sequences
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh attn23b   # ~3 min: FA3 default-path GPU tests, the grid
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh rot23     # ~3 min: backward q_rotate tests and sweep (NCU=1:
#                                                                  # also ncu of the D 256 backward default)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh next24    # ~6 min: GPU tests, then sweeps, of D 256's
#                                                                  # eight-piece backward and the dynamic scheduler
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s24       # ~8 min: default-path + API GPU tests, host
#                                                                  # profile, the attention grid (dynamic defaults)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh gputests  # ~8 min: every gpu-marked test (+ the API file)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh grid24    # ~8 min: the grid (short cells in 3 rounds),
#                                                                  # the W4A16 tuner's timing at K 4096 x N 14336
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh host24    # ~8 min: FA3 GPU tests, host time, grid (ran)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh next25    # ~3 min: the launch cache + D 256's SS backward (tests,
#                                                                  # sweep; ran session 25)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh next25b   # ~1 min: the forward's fold_scale variants (tests,
#                                                                  # sweep against their twins; ran session 25)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh grid25    # ~6 min: the new defaults' GPU tests, the grid
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh bwd25     # ~1 min: D 256 backward, dO single-buffered: tests, sweep
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh bwd25b    # ~3 min: D 64 / 128 backward, more dQ slots: tests, sweep
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh last25    # ~7 min: grid25 then bwd25b
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh fb25      # ~3 min: FA2 GPU tests, the grid's fwd_bwd pass
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh bwd26     # ~1 min: D 64 backward at 128 x 128 (ran)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh bwd26b    # ~5 min: the backward's early LSE / one end
#                                                                  # barrier: tests, sweep; the 512 cells on fa3
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh grid26    # ~4 min: default-path + API GPU tests, the grid
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh grid26b   # ~4 min: the grid as session 25 ran it
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh fp8v27    # ~5 min: FP8 with V^T's keys permuted (unrun)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh diag27    # ~9 min: the backward's launch cache (tests),
#                                                                  # the d128 short cells' swings (unrun)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh fp8d27    # ~4 min: FP8 D 256 default with V^T's keys permuted
#                                                                  # + backward launch cache: GPU tests, FP8 grid
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh grid27    # ~7 min: the grid, backward launch cache on
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh fp8r27    # ~4 min: the FP8 grid in 3 rounds, host cProfile
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh docs27    # ~5 min: the Llama's document masking on the GPU
#                                                                  # (varlen kernels, compile), then fp8r27
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh fp8n28    # ~4 min: D 128 FP8 at 128 x 256, no overlap, v_perm
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh fa3f28    # ~4 min: D 256 bf16 forward, folded scale
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s28       # ~9 min: docs27's, fa3f28's, fp8n28's tests at once,
#                                                                  # then the two sweeps
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s28b      # ~8 min: doc masking + FP8 GPU tests, FP8 grid,
#                                                                  # accuracy (D 128 FP8 default: 256-key tiles)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s28c      # ~4 min: FA2 + model + trainer GPU tests, fa3 ops
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh s28d      # ~4 min: FP8 GPU tests, the FP8 grid (pieces)
#   device run:  OUT=$OUT bash benchmarks/gpu_pending.sh timing    # ~4 min: the tuner GPU tests, then _time against
#                                                                  # do_bench_cudagraph, one knob at a time (not run
#                                                                  # yet, nor _time's knob refactor: written after the
#                                                                  # session's device time was spent)
#
# refresh / attn19: copy $OUT/attention-h200.json (and w4a16-h200.json) over benchmarks/results/, give the file a
# note saying what changed, and rerun make_tables.py.
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

gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader; }
is_h200() { gpu_name | grep -q H200; }
on_h200() {  # on_h200 STEP: true on an H200, else says so (a call that got another GPU costs only its start)
  is_h200 && return 0
  echo "$1: $(gpu_name) is not an H200; nothing run"
  return 1
}
fp8_grid() {  # fp8_grid LIMIT: the FP8 grid, every cell the median of 3 rounds (issue 5's speed point)
  step fp8 "$1" "$PY" benchmarks/attention_fp8.py --rounds 3 --out "$OUT"
}
w4a16_rounds() {  # w4a16_rounds LIMIT ARGS...: benchmarks/w4a16.py ARGS (the default tuner), each cell the median of
  # 3 rounds
  step w4a16 "$1" "$PY" benchmarks/w4a16.py --rounds 3 --out "$OUT" "${@:2}"
}
w4a16_point3() { w4a16_rounds 320 --ms 1024,4096; }  # issue 7's point 3 (M 1024 / 4096)
w4a16_merged() {  # w4a16_merged LIMIT MS: benchmarks/w4a16.py --ms MS (the tuned default, bf16 beside), merged into
  # a copy of results/w4a16-<this GPU>.json ($OUT/w4a16-<gpu>-merged.json)
  local g
  g=$(is_h200 && echo h200 || echo h100)
  cp "benchmarks/results/w4a16-$g.json" "$OUT/w4a16-$g-merged.json"
  step w4a16 "$1" "$PY" benchmarks/w4a16.py --ms "$2" --out "$OUT" --merge-into "$OUT/w4a16-$g-merged.json"
}
# session 48's strip sweep: the x-words ring 2 / 3 picks beside every fence, rul10 and xperm config
STRIP48='^strip r1 kt2 w4 ring2$|fence$|maxnreg128|rul10$|r1 kt2 w4 ring[23] xp$'
# session 50's: the L2 bulk prefetch configs beside their twins (round 14h)
STRIP50='l2x|^strip r1 kt2 w4 ring2( xp)?$|^strip r1 kt2 w4 ring3 maxnreg128$|^strip r1 kt2 w8 ring2 xp fence$'

seed_attention_configs() {  # the tuned FA2 configs of results/attention-h200.json as this run's config cache
  mkdir -p /tmp/seedcache
  "$PY" -c "import json; json.dump(json.load(open('benchmarks/results/attention-h200.json'))['configs'], open('/tmp/seedcache/attention_configs.json', 'w'))"
  export FLASHSCALE_CACHE_DIR=/tmp/seedcache
}

case "${1:-}" in
  host24)  # session 24, last: the FA3 forward's launch cache (kernels.launch) and unchecked descriptors: its GPU tests
    # and the API file, the host time against the same profile before it, the grid
    step fa3_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      tests/kernels/test_launch.py tests/kernels/test_attention_fa3_bwd_gpu.py -k "not every_config"
    step api 70 "$PY" -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_attention_api.py tests/kernels/test_launch.py
    step host_profile 60 "$PY" benchmarks/attention_host.py --profile
    step host 90 "$PY" benchmarks/attention_host.py --rounds 2 --out "$OUT"
    seed_attention_configs
    step attention 220 "$PY" benchmarks/attention.py --deterministic --out "$OUT" ;;
  bwd25)  # session 25: D 256 backward with dO in one buffer (do_single) and the freed 32 KB given to dQ: GPU tests
    # of every config, then the sweep against the default (q4_ss)
    step bwd_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "every_config or (ws_matches and d256)"
    step bwd_sweep 200 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 256 --variants ws_tma_q4_ss,q2_ss_do1 \
      --seqlens 1024,2048,4096,16384 --no-sdpa --budget 190 --out "$OUT/attention-fa3-bwd-sweep-do1-h200.json" ;;
  bwd26)  # written in session 25 (not run): FA3's 128 x 128 tile for the D 64 backward (n128_m128_ws_tma): its GPU
    # tests, then the sweep against the default; run after `gputests` (which the FA2 issue's closing needs first)
    step bwd_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "every_config or (ws_matches and d64)"
    step bwd_sweep 150 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 64 \
      --variants n128_m64_ws_s3_tma,n128_m128_ws_tma --seqlens 1024,2048,4096,16384 --budget 140 \
      --out "$OUT/attention-fa3-bwd-sweep-m128-h200.json" ;;
  grid26)  # session 26, last: the new backward defaults through the default-path GPU tests and the API file, then
    # the whole grid (fwd, bwd, fwd_bwd)
    step bwd_tests 90 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "ops_attention or auto"
    step api 60 "$PY" -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_attention_api.py
    seed_attention_configs
    step attention 420 "$PY" benchmarks/attention.py --deterministic --out "$OUT" ;;
  fp8d27)  # session 27: D 256's FP8 default reads V^T's keys permuted (pp_vperm, causal too) and the pre-pass writes
    # them so (quantize_fp8(..., v_key_perm=True)); the Hopper backward's launch cache on by default. GPU tests of
    # both (FP8 files whole, the API file, the launch cache), then the FP8 grid
    step fp8_tests 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_fp8_gpu.py \
      tests/kernels/test_attention_fp8_gpu.py tests/kernels/test_attention_api.py tests/kernels/test_launch.py
    step fp8 200 "$PY" benchmarks/attention_fp8.py --out "$OUT" ;;
  s28)  # session 28: docs27's document-masking tests, fa3f28's and fp8n28's tests side by side (compile-bound), then
    # their two sweeps on a quiet GPU; one call instead of three (each start costs ~100 s of device time)
    mkdir -p /tmp/s28
    timeout 170 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 2 tests/kernels/test_attention_gpu.py \
      -k "document_masking or llama_runs or torch_compile" > /tmp/s28/docs.log 2>&1 &
    timeout 170 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 3 tests/kernels/test_attention_fa3_gpu.py \
      -k "tuning_configs and pp_fold-256" > /tmp/s28/fa3.log 2>&1 &
    timeout 170 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 6 tests/kernels/test_attention_fa3_fp8_gpu.py \
      -k "d128 and (n256 or vperm)" > /tmp/s28/fp8.log 2>&1 &
    wait
    for f in docs fa3 fp8; do echo "=== $f"; tail -n 40 /tmp/s28/$f.log; done > "$OUT/tests.log"
    grep -h -E 'passed|failed|error' /tmp/s28/*.log | tail -n 6
    step fa3_sweep 180 "$PY" benchmarks/attention_fa3_sweep.py --hdims 256 --variants pp,pp_fold --budget 150 \
      --out "$OUT/attention-fa3-sweep-fold256-h200.json"
    step fp8_sweep 180 "$PY" benchmarks/attention_fa3_fp8_sweep.py --hdims 128 --seqlens 4096,8192,16384 \
      --variants pp,pp_n256_serial,pp_n256_serial_vperm --budget 150 \
      --out "$OUT/attention-fa3-fp8-sweep-n256-h200.json" ;;
  s28b)  # session 28, after s28: the document-masking test again (its fa3 case had no document long enough for the
    # Hopper varlen rule), the FP8 GPU files whole (D 128's default now 256-key tiles on 256-row K/V blocks,
    # V^T's keys permuted), then the FP8 grid in 3 rounds and the accuracy experiment
    mkdir -p /tmp/s28b
    timeout 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 2 --show-capture=no --tb=short \
      tests/kernels/test_attention_gpu.py -k "document_masking" > /tmp/s28b/docs.log 2>&1 &
    timeout 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_attention_fa3_fp8_gpu.py tests/kernels/test_attention_fp8_gpu.py > /tmp/s28b/fp8.log 2>&1 &
    wait
    for f in docs fp8; do echo "=== $f"; grep -v -E '^(DEBUG|INFO) ' /tmp/s28b/$f.log | tail -n 60; done \
      > "$OUT/tests.log"
    grep -h -E '(passed|failed|error)( |$)' /tmp/s28b/*.log | tail -n 4
    fp8_grid 260
    step accuracy 60 "$PY" benchmarks/attention_fp8_accuracy.py --out "$OUT" ;;
  s28c)  # session 28, after s28b: ops.attention decides fa3 without reading a data pointer (torch.compile traced into
    # the alignment check and broke the graph 7 times in the document-masking test); misaligned inputs are copied by
    # the op. The FA2 GPU file whole, the fa3 ops/varlen tests, the model and trainer GPU tests.
    mkdir -p /tmp/s28c
    timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4 --show-capture=no --tb=short \
      tests/kernels/test_attention_gpu.py tests/test_model.py tests/test_trainer.py > /tmp/s28c/fa2.log 2>&1 &
    timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4 --show-capture=no --tb=short \
      tests/kernels/test_attention_fa3_gpu.py -k "ops_attention or varlen" > /tmp/s28c/fa3.log 2>&1 &
    wait
    for f in fa2 fa3; do echo "=== $f"; grep -v -E '^(DEBUG|INFO) ' /tmp/s28c/$f.log | tail -n 60; done \
      > "$OUT/tests.log"
    grep -h -E '(passed|failed|error)( |$)' /tmp/s28c/*.log | tail -n 4 ;;
  s28d|s29b)  # session 28, last, and s29b (session 29: the same steps on the final auto_chunk rule and the rewritten
    # test_prepass_in_pieces): the pre-pass in pieces (whole 128-row blocks spilled 188 B at D 128, 256-row blocks
    # ~1 KB; s28b's grid had D 128's pre-pass at 0.84 ms on 256-row blocks against 0.27 on 128): the FP8 GPU files
    # whole, then the FP8 grid (its pre-pass rows: pieces against whole blocks)
    step fp8_tests 130 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_attention_fa3_fp8_gpu.py tests/kernels/test_attention_fp8_gpu.py
    fp8_grid 180 ;;
  s29c)  # session 29, after s29: the wgmma GEMM's 16-token tiles join the autotune from M = 2 (its g-dec rows beat
    # the decode kernels at M = 16 on 8192^2 / 4096^2): the wgmma + W4A16 GPU files, then the W4A16 grid at M 2-16
    # (one tuned bucket; merge its rows into results/w4a16-h200.json, the bf16 rows of the same run with them)
    step w4a16_tests 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4 --show-capture=no --tb=short \
      tests/kernels/test_w4a16_wgmma_gpu.py tests/kernels/test_w4a16.py
    step w4a16 300 "$PY" benchmarks/w4a16.py --ms 2,4,8,16 --out "$OUT" ;;
  s30)  # session 30: the W4A16 GPU tests not re-run since the ring joined the dispatch, then ncu of the ring kernel
    step w4_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_w4a16.py tests/kernels/test_w4a16_ring.py tests/test_qlinear.py
    NCU_LIMIT=120 step ncu 260 bash benchmarks/ncu_device.sh ring_28672 ring_8192 ;;
  l2r30)  # session 30: the ring kernel's refills from L2 (RingConfig.l2_ahead: prefetch.global.L2 items past the ring)
    step probe 300 "$PY" benchmarks/w4a16_probe.py --kinds r-dec,e-copy,bf16 --configs atomic \
      --shapes 8192x8192,8192x28672,4096x4096,28672x8192 --budget 270 --out "$OUT" ;;
  trace30)  # session 30: per-program timelines of the ring decode kernel at M = 1 (where the ~5 us fixed a call goes)
    step trace 240 "$PY" benchmarks/w4a16_ring_trace.py --out "$OUT" ;;
  acc30)  # session 30: StaticDecoder(accumulate=True) (GEMVs red.add into fp32 layer outputs): GPU tests, e2e rows
    step dec_tests 200 "$PY" -m pytest -q -p no:cacheprovider -n 4 --show-capture=no --tb=short \
      tests/test_infer_decode.py tests/test_qlinear.py
    step e2e 330 "$PY" benchmarks/generate_w4a16.py --no-pdl --out "$OUT" ;;
  pdl30)  # session 30: accumulate + PDL (the ring kernel's weight loads before its griddepcontrol.wait): tests, e2e
    step dec_tests 200 "$PY" -m pytest -q -p no:cacheprovider -n 4 --show-capture=no --tb=short \
      tests/test_infer_decode.py tests/test_qlinear.py tests/test_generate.py tests/kernels/test_pdl.py
    step e2e 330 "$PY" benchmarks/generate_w4a16.py --no-pdl --out "$OUT" ;;
  trace32)  # session 32: the decode step's timeline (decode_step_trace.py), then the e2e rows again (XAttn off)
    step trace 200 "$PY" benchmarks/decode_step_trace.py --out "$OUT"
    step e2e 420 "$PY" benchmarks/generate_w4a16.py --no-pdl --out "$OUT" ;;
  h2s38)  # session 38 (written without a GPU; compile-checked spill-free, the asm text proven exact on the CPU by
    # tests/kernels/test_w4a16_h2.py): the packed 16-bit unpack (WgmmaConfig(h2=True), kernels/w4a16_h2.py: 9 ALU-pipe
    # instructions a word instead of 11 + 4 F2FP) and one consumer of 128 features (features=128: half the x bytes
    # a feature of bm64-bn64's, the M = 64 pick at 8192^2 at 6.5 TB/s L2 -> SM) and two one-consumer blocks an SM
    # (ctas=2). Their GPU tests first (h2 bitwise the fp32 unpack's output on every candidate of the M 64 / 256
    # buckets and the large-M pick; f128 / x2 bitwise the one-block 64-feature consumer's), then at M = 64 every
    # candidate, the f128 / x2 configs and all their h2 twins
    step h2_tests 170 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_w4a16_wgmma_gpu.py -k "h2 or 128_features"
    step probe 380 "$PY" benchmarks/w4a16_gemm_probe.py --shapes 8192x28672,8192x8192,4096x14336 --ms 64 \
      --candidates all --extra f128,h2 --out "$OUT"
    cp "$OUT/w4a16-gemm-probe-h200.json" "$OUT/w4a16-gemm-probe-h2-m64-h200.json" 2>/dev/null ;;
  h2s38b)  # after h2s38: the same at M = 256 (two shapes; M >= 1024's h2 twins are h2grid38's)
    step probe 540 "$PY" benchmarks/w4a16_gemm_probe.py --shapes 8192x28672,8192x8192 --ms 256 \
      --candidates all --extra f128,h2 --out "$OUT"
    cp "$OUT/w4a16-gemm-probe-h200.json" "$OUT/w4a16-gemm-probe-h2-m256-h200.json" 2>/dev/null ;;
  dec38)  # session 38 (compile-checked): the 16-token wgmma tile in two / three blocks an SM (and h2) against the
    # candidates at M = 1 and 16: issue 7's point 1 asks <= 10.4 us at 8192^2 for every M <= 16 (the ring: 15.9 at
    # M = 1; M = 16: 23.3 wgmma, 24.7 decode kernels; --auto times w4a16_linear's own pick in the same run). GPU
    # tests of those configs first
    step dec_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_w4a16_wgmma_gpu.py -k "128_features"
    step probe 400 "$PY" benchmarks/w4a16_gemm_probe.py --shapes 8192x8192,8192x28672,4096x4096 --ms 1,16 \
      --candidates all --extra dec,h2 --auto --out "$OUT"
    cp "$OUT/w4a16-gemm-probe-h200.json" "$OUT/w4a16-gemm-probe-dec-h200.json" 2>/dev/null ;;
  att39)  # session 39: d128c38 and fp8c38 in one start (machines came rarely), with the FP8 o_direct configs (a third
    # K/V stage once the output leaves from registers), most likely gain first: the GPU tests of all of them in one
    # pytest, FP8 D 256 o_direct (issue 5: 1097 of 1150), FP8 D 128 (three consumers, s3 twin of the default), bf16
    # D 128 three consumers beside the dense rule's defaults
    step tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_attention_fa3_gpu.py tests/kernels/test_attention_fa3_fp8_gpu.py \
      -k "pp3_m192_n64 or pp3c_m192_serial or _od"
    step fp8_256 135 "$PY" benchmarks/attention_fa3_fp8_sweep.py --hdims 256 --seqlens 2048,16384 --budget 120 \
      --compile-budget 50 --variants pp_vperm,pp_vperm_od,pp_vperm_s3_od \
      --out "$OUT/attention-fa3-fp8-sweep-od256-h200.json"
    step fp8_128 135 "$PY" benchmarks/attention_fa3_fp8_sweep.py --hdims 128 --seqlens 8192,16384 --budget 120 \
      --compile-budget 50 --variants pp_n256_serial_vperm,pp_n256_serial_vperm_s3_od,pp3c_m192_serial_vperm,pp3c_m192_serial \
      --out "$OUT/attention-fa3-fp8-sweep-pp3c-h200.json"
    step fa3_128 150 "$PY" benchmarks/attention_fa3_sweep.py --hdims 128 --seqlens 2048,16384 --budget 135 \
      --compile-budget 50 --variants pp_persist_fold,pp_persist_dyn_fold,pp3_m192_n64_fold,pp3_m192_n64_persist_dyn_fold \
      --out "$OUT/attention-fa3-sweep-pp3d128-h200.json" ;;
  vy40)  # session 40: y by 16-byte stores (WgmmaConfig.vec_y; the accumulator's layout stores 2-byte elements, half
    # of each sector): the bitwise GPU tests, then the probe's A/B at the K = 4096 cells issue 7's point 3 misses
    step vy_tests 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_w4a16_wgmma_gpu.py -k "vec_y or dispatch_candidates or (test_candidates and bm256)"
    step probe 330 "$PY" benchmarks/w4a16_gemm_probe.py --shapes 4096x14336,4096x4096,8192x8192 --ms 1024,4096,256 \
      --candidates big --extra vy --out "$OUT"
    for f in "$OUT"/w4a16-gemm-probe-*.json; do mv "$f" "${f/probe-/probe-vy-}"; done ;;
  fix41)  # session 40's open item: forced split-K / stream-K fix-ups that mismatched (and, in a diagnosis run, hung
    # or gave wrong sums) on an H100. Each case of w4a16_fixup_repeat.py in its own process (a hang costs 40 s and
    # shows where), those two again with FIXUP_FENCE, compute-sanitizer's memcheck on them, then the two as 8
    # processes at once (each killed after 45 s: session 40's background processes outlived their step's timeout)
    step repeat1 280 bash -c "for c in 0 3 6 4 1 2 5; do timeout -k 5 35 $PY benchmarks/w4a16_fixup_repeat.py \$c 0 8 \
      || echo \"case \$c: exit \$?\"; done; for c in 0 3; do echo fence:; FLASHSCALE_W4A16_FIXUP_FENCE=1 \
      timeout -k 5 35 $PY benchmarks/w4a16_fixup_repeat.py \$c 0 8; done"
    step memcheck 110 bash -c "for c in 3 0; do timeout -k 5 50 compute-sanitizer --tool memcheck --print-limit 10 \
      $PY benchmarks/w4a16_fixup_repeat.py \$c 0 1; done"
    step repeat8 100 bash -c "for c in 3 0; do for w in 0 1 2 3 4 5 6 7; do timeout -k 5 45 $PY \
      benchmarks/w4a16_fixup_repeat.py \$c \$w 4 & done; wait; done" ;;
  fix42)  # fix41's answer: only ctas = 2 with a split was wrong. Cases 7-9 of w4a16_fixup_repeat.py (ctas = 2 without
    # a split; ctas = 2's register cap at one block an SM; the cap at two blocks an SM) and case 0 again, run from
    # $FIX42_DIAG (a tree where a forced split of ctas = 2 still launches: the fix refuses it), then the fix-up GPU
    # tests of this tree (ctas > 1 never splits)
    step diag42 130 bash -c "cd ${FIX42_DIAG:-.} && export PYTHONPATH=\$PWD/src && for c in 7 8 9 0; do \
      timeout -k 5 35 $PY benchmarks/w4a16_fixup_repeat.py \$c 0 8 || echo \"case \$c: exit \$?\"; done"
    step fix_tests 220 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4 --show-capture=no --tb=short \
      tests/kernels/test_w4a16_wgmma_gpu.py -k "fixups_repeat or stream_k_tail or step_parity_and_split or \
      persistent_equals or two_blocks_an_sm or plan_split" ;;
  strip45)  # the strip kernel in the M = 1 / M <= 8 autotune candidates (session 45): the dispatch and strip GPU
    # tests, then the M 1-8 grid with every strip config beside the tuned default (which now includes five of them);
    # its flashscale and bf16 rows then go into results/w4a16-<gpu>.json by hand (merge_results), the strip rows not
    step tests 200 "$PY" -m pytest -q -p no:cacheprovider -x -m gpu tests/kernels/test_w4a16.py \
      tests/kernels/test_w4a16_strip.py
    step w4a16 380 "$PY" benchmarks/w4a16.py --impls flashscale,flashscale-strip,bf16 --ms 1,2,4,8 --out "$OUT" ;;
  xp46)  # the strip kernel with x in the B order (session 46, round 14c): its GPU tests, then every strip config at
    # M 1 / 16 on two shapes with the pre-pass (flashscale-strip) and with x handed over (flashscale-strip-xgiven),
    # bf16 beside
    step tests 80 "$PY" -m pytest -q -p no:cacheprovider -x -m gpu -n 8 tests/kernels/test_w4a16_strip.py
    step w4a16 170 "$PY" benchmarks/w4a16.py --impls flashscale-strip,bf16 --ms 1,16 \
      --shapes 4096x4096,8192x8192 --out "$OUT" ;;
  m16s47)  # the strip kernel with x in the B order among the M <= 16 bucket's candidates, its gather's kernel as a PDL
    # dependent (session 47): the dispatch and strip GPU tests, then every strip config at M 1 / 16 on two shapes
    # (with the gather and PDL, x handed over)
    step tests 200 "$PY" -m pytest -q -p no:cacheprovider -x -m gpu -n 4 tests/kernels/test_w4a16.py \
      tests/kernels/test_w4a16_strip.py
    step sweep 240 "$PY" benchmarks/w4a16.py --impls flashscale-strip,bf16 --ms 1,16 \
      --shapes 4096x4096,8192x8192 --out "$OUT" ;;
  m16s47b)  # the M = 16 grid of the tuned default, merged into a copy of results/w4a16-<gpu>.json
    w4a16_merged 300 16 ;;
  s48)  # session 48: the strip kernel's xperm addresses from one base, x's absent-token lanes reading the last
    # token, fenced and eight-warp xperm configs: the sweep at M 1 / 16 on two shapes (every config checked against
    # float64 first), then the strip GPU tests (last: a call cut short still brings the sweep back)
    gpu_name
    step sweep 240 "$PY" benchmarks/w4a16.py --impls flashscale-strip,bf16 --ms 1,16 \
      --shapes 4096x4096,8192x8192 --strip-match "$STRIP48" --out "$OUT"
    step tests 100 "$PY" -m pytest -q -p no:cacheprovider -x -m gpu -n 8 tests/kernels/test_w4a16_strip.py ;;
  fp8h50)  # H200 only: the FP8 grid (every cell the median of 3 rounds) on the card issue 5's targets are for
    on_h200 fp8h50 && fp8_grid 240 ;;
  h200s52)  # fp8h50, then issue 7's point 3 (M 1024 / 4096) with the default tuner, which times the vec_y twins
    # from M = 65 since session 52 (vyh50's question), in one start (machines come rarely); each W4A16 cell the median
    # of 3 interleaved rounds, the grid written after every shape (a call cut short keeps those)
    on_h200 h200s52 && fp8_grid 230 && w4a16_point3 ;;
  any53)  # whichever card came (session 53): h200s52 on an H200, else gpuall52 (every gpu test)
    if is_h200; then bash "$0" h200s52; else bash "$0" gpuall52; fi ;;
  any53s)  # any53 for little device time (~330 s): w4h52 on an H200, else the W4A16 and FP8 attention GPU tests
    if is_h200; then bash "$0" w4h52; else
      step gpu_w4_fp8 320 "$PY" -m pytest -p no:cacheprovider -m gpu -n 12 -v --tb=line -rfs \
        tests/kernels/test_w4a16.py tests/kernels/test_w4a16_strip.py tests/kernels/test_w4a16_wgmma_gpu.py \
        tests/kernels/test_attention_fa3_fp8_gpu.py
    fi ;;
  miss53)  # ~150 s of device time: issue 7's worst point-3 cell (K 4096 x N 14336, M 1024, 0.84x) with the default
    # tuner (vec_y twins from M 65), 3 rounds, on an H200 only
    on_h200 miss53 && w4a16_rounds 140 --ms 1024 --shapes 4096x14336 ;;
  w4h52)  # h200s52's second half alone (what device time was left): issue 7's point 3 with the default tuner
    on_h200 w4h52 && w4a16_point3 ;;
  h100s52)  # the vec_y twins in the default tuner from M = 65 (session 52) on an H100, where session 43 measured
    # both tuners: the W4A16 dispatch / wgmma GPU tests, then M 256 / 1024 / 4096, each cell the median of 3 rounds
    step tests 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_w4a16.py \
      tests/kernels/test_w4a16_wgmma_gpu.py
    w4a16_rounds 330 --ms 256,1024,4096 ;;
  gpuall52)  # every test marked gpu in the whole suite on main (session 52: the notes' GPU evidence; -v so that a
    # step cut short still lists what ended)
    step gpu_all 560 "$PY" -m pytest -p no:cacheprovider -m gpu -n 12 -v --tb=line -rfs tests ;;
  vyh50)  # vygrid40 on an H200 only
    on_h200 vyh50 && FLASHSCALE_W4A16_WGMMA=vy step w4a16 330 "$PY" benchmarks/w4a16.py --ms 256,1024,4096 --out "$OUT" ;;
  s50)  # round 14h: the strip kernel's L2 bulk prefetch (l2x configs) beside its twins at M 1 / 8 on three shapes (x
    # handed over too), then the strip GPU tests (last: a call cut short still brings the sweep back)
    gpu_name
    step sweep 260 "$PY" benchmarks/w4a16.py --impls flashscale-strip,bf16 --ms 1,8 \
      --shapes 4096x4096,8192x8192,28672x8192 --strip-match "$STRIP50" --out "$OUT"
    step tests 150 "$PY" -m pytest -q -p no:cacheprovider -x -m gpu -n 8 tests/kernels/test_w4a16_strip.py ;;
  s50b)  # the M = 16 strip sweep on the N 4096 shapes and 8192^2: x in the B order at four and eight warps, with the
    # L2 prefetch, rul10 and the fence (gather included, and x handed over)
    gpu_name
    step sweep16 200 "$PY" benchmarks/w4a16.py --impls flashscale-strip,bf16 --ms 16 \
      --shapes 14336x4096,4096x14336,8192x8192 --strip-match 'r1 kt2 w[48] ring2 xp( fence| rul10| l2x8)?$' --out "$OUT" ;;
  s49)  # session 49: x in the B order among the M 2-8 strip candidates: the tuned M 1-8 rows merged into a copy of
    # results/w4a16-<gpu>.json, then the W4A16 dispatch and strip GPU tests
    gpu_name
    w4a16_merged 330 1,2,4,8
    step tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_w4a16_strip.py \
      tests/kernels/test_w4a16.py ;;
  s48q)  # s48 cut to what a few minutes hold: the sweep at M = 1 on 8192^2 only
    gpu_name
    step sweep 170 "$PY" benchmarks/w4a16.py --impls flashscale-strip,bf16 --ms 1 --shapes 8192x8192 \
      --strip-match "$STRIP48" --out "$OUT" ;;
  grid48)  # H200 only: the M 1-8 rows of results/w4a16-h200.json (they predate the strip kernel) with the tuner's
    # candidates of today, merged into a copy of the file
    on_h200 grid48 && w4a16_merged 420 1,2,4,8 ;;
  m16s48b)  # the tuned M = 1 / 16 rows (after s48's winners join the candidates), merged into a copy of
    # results/w4a16-<gpu>.json
    w4a16_merged 420 1,16 ;;
  m16h47)  # m16s47b on an H200 only (the M = 16 rows of results/w4a16-h200.json with the xperm strip candidate)
    on_h200 m16h47 && w4a16_merged 200 16 ;;
  grid47)  # grid42 on an H200 only
    on_h200 grid47 && w4a16_merged 330 16,64 ;;
  grid42)  # the five M = 16 / 64 rows of results/w4a16-h200.json timed with ctas = 2 under the automatic split (now
    # refused, session 42) re-measured: the M = 16 and 64 grid, merged into the results (H200 only: the file's GPU)
    if is_h200; then
      cp benchmarks/results/w4a16-h200.json "$OUT/w4a16-h200-merged.json"
      step w4a16 330 "$PY" benchmarks/w4a16.py --ms 16,64 --out "$OUT" --merge-into "$OUT/w4a16-h200-merged.json"
    else  # another GPU: its own rows only (and bf16 beside them), nothing merged into the H200 file
      step w4a16 330 "$PY" benchmarks/w4a16.py --ms 16,64 --out "$OUT"
    fi ;;
  fix41b)  # the fix-up GPU tests
    step sk_tests 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4 --show-capture=no --tb=short \
      tests/kernels/test_w4a16_wgmma_gpu.py -k "stream_k_tail or step_parity_and_split or persistent_equals" ;;
  vygrid40)  # the W4A16 grid from M = 256 with the tuner timing each config beside its vec_y twin (tuned: vec_y)
    FLASHSCALE_W4A16_WGMMA=vy step w4a16 330 "$PY" benchmarks/w4a16.py --ms 256,1024,4096 --out "$OUT" ;;
  h2grid39)  # the W4A16 grid from M = 128 with the tuner timing each wgmma config beside its h2 twin (session 39's
    # M = 256 probe: h2 +4-6 % on the bm128 tiles); the tuned table says where a twin won (h2: true)
    FLASHSCALE_W4A16_WGMMA=h2 step w4a16 320 "$PY" benchmarks/w4a16.py --ms 128,256,1024,4096 --out "$OUT" ;;
  att39b)  # the W4A16 M = 256 probe (h2s38b's, shortened), if device time is left
    step probe 330 "$PY" benchmarks/w4a16_gemm_probe.py --shapes 8192x28672,8192x8192 --ms 256 \
      --candidates all --extra f128,h2 --out "$OUT"
    cp "$OUT/w4a16-gemm-probe-h200.json" "$OUT/w4a16-gemm-probe-h2-m256-h200.json" 2>/dev/null ;;
  d128c38)  # session 38 (compile-checked, not run): three consumers at D 128 with 64-key blocks (TUNING_CONFIGS[128]
    # pp3_m192_n64 / _fold), never timed (the "next step" of session 20's notes): their GPU tests, then the sweep beside
    # pp and the defaults of the dense rule (pp_persist_fold full, pp_persist_dyn_fold causal) at 2k / 8k / 16k
    step fa3_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4 --show-capture=no --tb=short \
      tests/kernels/test_attention_fa3_gpu.py -k "pp3_m192_n64"
    step fa3_sweep 240 "$PY" benchmarks/attention_fa3_sweep.py --hdims 128 --seqlens 2048,8192,16384 --budget 220 \
      --variants pp,pp_persist_fold,pp_persist_dyn_fold,pp3_m192_n64,pp3_m192_n64_fold,pp3_m192_n64_persist_dyn_fold \
      --out "$OUT/attention-fa3-sweep-pp3d128-h200.json"
    # and the L2 -> SM read rate (benchmarks/l2_bandwidth.py): is the 64-token W4A16 tile's 6.5 TB/s of x the limit?
    step l2 90 "$PY" benchmarks/l2_bandwidth.py --out "$OUT" ;;
  fp8c38)  # session 38 (compile-checked, not run): FP8 D 128 with three consumers (TUNING_CONFIGS[128] pp3c_m192_serial
    # and _vperm, 192 x 128 without overlap): their GPU tests, then the sweep beside the default at 8k / 16k
    step fp8_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4 --show-capture=no --tb=short \
      tests/kernels/test_attention_fa3_fp8_gpu.py -k "pp3c_m192_serial"
    step fp8_sweep 200 "$PY" benchmarks/attention_fa3_fp8_sweep.py --hdims 128 --seqlens 8192,16384 --budget 180 \
      --variants pp_n256_serial_vperm,pp3c_m192_serial_vperm,pp3c_m192_serial \
      --out "$OUT/attention-fa3-fp8-sweep-pp3c-h200.json" ;;
  cand38)  # session 38, after the probes: the GPU tests of the three two-block configs that joined CANDIDATES (and the
    # dispatch), then the grid at M 16 / 32 / 64 merged into results/w4a16-h200.json (its note to extend)
    step cand_tests 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_w4a16_wgmma_gpu.py -k "(test_candidates and (x2 or f128)) or auto_and_forced or dispatch"
    cp benchmarks/results/w4a16-h200.json "$OUT/w4a16-h200-merged.json"
    step w4a16 330 "$PY" benchmarks/w4a16.py --ms 16,32,64 --out "$OUT" --merge-into "$OUT/w4a16-h200-merged.json" ;;
  h2grid38)  # after h2s38 passed: the W4A16 grid from M = 32 with the tuner timing every wgmma config beside its
    # h2 twin (FLASHSCALE_W4A16_WGMMA=h2); the file's tuned table says where a twin won (h2: true)
    FLASHSCALE_W4A16_WGMMA=h2 step w4a16 400 "$PY" benchmarks/w4a16.py --ms 32,64,128,256,1024,4096 --out "$OUT" ;;
  m64s37)  # ran in session 37 (results/w4a16-gemm-probe-m64-h200.json, docs/w4a16_gemm.md session 37): issue 7's
    # point 2 cells sit at 24-51 % of their roofline bound: every
    # 64-token tile at M = 64 on the two largest-gap shapes with its L2 -> SM rate, then ncu of the tuner's M = 64
    # pick (8192 x 28672) and of the FP8 D 128 default (128 x 256 serial, V^T permuted: never profiled)
    step probe 200 "$PY" benchmarks/w4a16_gemm_probe.py --shapes 8192x28672,8192x8192 --ms 64 --candidates all \
      --extra small --out "$OUT"
    NCU_LIMIT=120 step ncu 270 bash benchmarks/ncu_device.sh gemm_64 fp8_d128 ;;
  kron36)  # ran in session 37 (18 GPU tests passed; kron slower at every config: D 128 Q/K 100 / 102 us against
    # 54 / 61, D 256 92 against 81; results/fp8-prepass-kron-h200.json): the pre-pass's opt-in method "kron"
    # (H_D = H_(D/16) (x) H_16, 64 FLOPs a value instead of 2 D; written in session 36 after the device time was
    # spent, compile-checked spill-free): its GPU tests, then the sweep of its configs beside the mma defaults
    # (Q / K: D 128 53.6 / 61.3 us, D 256 81 us each; the cast 32 us)
    step fp8_tests 130 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_attention_fp8_gpu.py -k "prepass"
    step sweep 200 "$PY" benchmarks/fp8_prepass_sweep.py --hdims 128 256 --methods kron --budget 150 --out "$OUT" ;;
  pre36)  # session 36: the pre-pass's measured rule (auto_warps / auto_hmat, V^T pieces from 8192 values, the signs and
    # the signed matrix made once a device): the FP8 GPU files whole, then the FP8 grid (its prepass / e2e rows)
    step fp8_tests 130 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_attention_fa3_fp8_gpu.py tests/kernels/test_attention_fp8_gpu.py
    fp8_grid 200 ;;
  suite35)  # the whole test suite on the GPU without the interpreter; -v output goes to the log as tests end, so a
    # step timeout still leaves the list. Ran in session 36: 1444 of 1469 tests ended in the 560 s (1292 passed, 96
    # skipped, 56 failed: interpreter tests that our ops refused with their own messages, which the conftest rule did
    # not match; now kernels.interpreter.NeedsInterpreter, and those 56 skip). The 25 left: test_gguf and
    # test_cli_convert_generate need the gguf package (not on the device), the rest passed in a second call.
    step suite 560 "$PY" -m pytest -p no:cacheprovider -n 14 -v --tb=line -rfs tests ;;
  late34)  # session 34: uneven static shares (RingConfig.late: the programs placed last on an SM take fewer items):
    # the e2e rows with them pinned and tuned in the step, the timeline's per-third ends, the decode/PDL GPU tests
    T=+pdl+acc+pro+trig+head+glue
    step e2e 270 "$PY" benchmarks/generate_w4a16.py --no-pdl --out "$OUT" --only "$T,$T+late6,$T+late7,$T+late6s2,$T+tuned"
    step trace 140 "$PY" benchmarks/decode_step_trace.py --out "$OUT" --variants default,late6,late6s2
    step dec_tests 150 "$PY" -m pytest -q -p no:cacheprovider -n 6 --show-capture=no --tb=short \
      tests/test_infer_decode.py tests/kernels/test_pdl.py ;;
  dyn33)  # next session: the DYN ring build (items from a counter a launch: the tails, docs/w4a16_decode.md round 11)
    # in the decode step: its GPU tests, the e2e rows (+dyn, +dyn+tuned), the timeline with and without it
    step dec_tests 260 "$PY" -m pytest -q -p no:cacheprovider -n 4 --show-capture=no --tb=short \
      tests/test_infer_decode.py tests/test_qlinear.py tests/test_generate.py tests/kernels/test_pdl.py
    step e2e 320 "$PY" benchmarks/generate_w4a16.py --no-pdl --out "$OUT"
    step trace 150 "$PY" benchmarks/decode_step_trace.py --out "$OUT" --variants default,dyn ;;
  final32)  # session 32's code (glue kernels, XNorm preload, splits rule, tune_in_step): e2e rows, GPU tests, trace
    step e2e 300 "$PY" benchmarks/generate_w4a16.py --no-pdl --out "$OUT"
    step dec_tests 260 "$PY" -m pytest -q -p no:cacheprovider -n 4 --show-capture=no --tb=short \
      tests/test_infer_decode.py tests/test_qlinear.py tests/test_generate.py tests/kernels/test_pdl.py
    step trace 100 "$PY" benchmarks/decode_step_trace.py --out "$OUT" --variants default ;;
  trace32b)  # session 32: the timeline again with late starters and the last tenth's figures, attention tiles 32/16
    step trace 240 "$PY" benchmarks/decode_step_trace.py --out "$OUT" --variants default,bt16,s4 ;;
  glue32)  # session 32: the step's own first/last kernels (embedding + zeroed sums; argmax + pos), the attention's
    # split combine in the o GEMV (XAttn): decode/QuantLinear/generate/PDL GPU tests, then the e2e rows
    step dec_tests 300 "$PY" -m pytest -q -p no:cacheprovider -n 4 --show-capture=no --tb=short \
      tests/test_infer_decode.py tests/test_qlinear.py tests/test_generate.py tests/kernels/test_pdl.py
    step e2e 420 "$PY" benchmarks/generate_w4a16.py --no-pdl --out "$OUT" ;;
  pro31)  # session 31: the norms and SiLU * up inside the ring GEMVs (w4a16_prologue), the ring's early trigger:
    # decode/QuantLinear/generate/PDL GPU tests, then the e2e rows (+pdl+acc, +trig, +pro, +pro+trig)
    step dec_tests 300 "$PY" -m pytest -q -p no:cacheprovider -n 4 --show-capture=no --tb=short \
      tests/test_infer_decode.py tests/test_qlinear.py tests/test_generate.py tests/kernels/test_pdl.py
    step e2e 280 "$PY" benchmarks/generate_w4a16.py --no-pdl --out "$OUT" ;;
  attn30)  # session 30: the decode attention's position/RoPE/first cached tile before its PDL wait: tests, e2e
    step dec_tests 200 "$PY" -m pytest -q -p no:cacheprovider -n 4 --show-capture=no --tb=short \
      tests/test_infer_decode.py tests/test_generate.py
    step e2e 330 "$PY" benchmarks/generate_w4a16.py --no-pdl --out "$OUT" ;;
  ring30)  # next session: Nsight Compute on the ring decode kernel (the M = 1 pick since session 29), then the probe's
    # r-dec rows on all six shapes (round 8 measured three)
    NCU_LIMIT=120 step ncu 260 bash benchmarks/ncu_device.sh ring_28672 ring_8192
    step probe 200 "$PY" benchmarks/w4a16_probe.py --kinds r-dec,e-copy,bf16 --budget 170 --out "$OUT" ;;
  s29)  # session 29: the Gluon decode kernel's GPU tests (kernels/w4a16_gring.py), then the W4A16 probe's q-dec rows
    # (it), g-dec rows (the Gluon wgmma GEMM at M 1 / 16) and r-dec rows (the register ring) (docs/w4a16_decode.md
    # "Round 8")
    step gring_tests 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 --show-capture=no --tb=short \
      tests/kernels/test_w4a16_gring.py
    step probe 260 "$PY" benchmarks/w4a16_probe.py --kinds q-dec,g-dec,r-dec,e-copy,bf16 \
      --shapes 8192x8192,4096x4096,8192x28672 --budget 230 --out "$OUT" ;;
  fa3f28)  # written in session 27: the D 256 forward with the folded softmax scale (pp_fold; spill-free), tests + sweep
    step fa3_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      -k "tuning_configs and pp_fold-256"
    step fa3_sweep 200 "$PY" benchmarks/attention_fa3_sweep.py --hdims 256 --variants pp,pp_fold --budget 180 \
      --out "$OUT/attention-fa3-sweep-fold256-h200.json" ;;
  fp8n28)  # written in session 27, after docs27: D 128 FP8 at 256-key tiles without overlap, V^T's keys permuted
    # (FA3's D 128 FP8 tile is 128 x 224): its GPU tests (test_variants runs every TUNING config), then the sweep
    step fp8_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_fp8_gpu.py \
      -k "d128 and (n256 or vperm)"
    step fp8_sweep 200 "$PY" benchmarks/attention_fa3_fp8_sweep.py --hdims 128 --seqlens 4096,8192,16384 \
      --variants pp,pp_n256_serial,pp_n256_serial_vperm --out "$OUT/attention-fa3-fp8-sweep-n256-h200.json" ;;
  docs27)  # session 27: the Llama's document masking through the varlen kernels (FA2 and the Hopper varlen forward,
    # torch.compile fullgraph), then fp8r27
    step docs_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 2 tests/kernels/test_attention_gpu.py \
      -k "document_masking or llama_runs or torch_compile"
    fp8_grid 240
    step host_profile 60 "$PY" benchmarks/attention_host.py --profile ;;
  fp8r27)  # session 27, last: the FP8 grid with every cell the median of 3 rounds (its rates moved ~10 % between runs),
    # then where the forward's host time goes now (cProfile; the d128 causal 512 cells still host-bound at times)
    fp8_grid 330
    step host_profile 120 "$PY" benchmarks/attention_host.py --profile ;;
  grid27)  # session 27: the grid with the backward's launch cache on (fwd / bwd with the deterministic rows, then
    # fwd_bwd alone), as grid26b
    seed_attention_configs
    step attention 270 "$PY" benchmarks/attention.py --deterministic --passes fwd,bwd --out "$OUT"
    mkdir -p "$OUT/fb"
    step fwd_bwd 170 "$PY" benchmarks/attention.py --passes fwd_bwd --out "$OUT/fb" ;;
  diag27)  # next (written in session 26): why our d128 512 / 1k cells swung 1.5-2x between rounds of grid26 / grid26b
    # (cuDNN's within 1 %; the same cells with FLASHSCALE_FA3=1 and --seqlens 512 alone were fast). First the
    # backward's launches through kernels.launch (FLASHSCALE_LAUNCH_CACHE_BWD=1, written in session 26, not yet run):
    # its GPU tests. Then host against device time of the backward, cache off and on; the d128 short cells six ways
    # (as the grid with --deterministic, again, without the deterministic rows, with fa3 forced, without the 512
    # cell, with the backward's cache on); the backward kernel alone. Every step's log beside the tar.
    step bwd_cache_tests 150 env FLASHSCALE_LAUNCH_CACHE_BWD=1 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 \
      tests/kernels/test_attention_fa3_bwd_gpu.py tests/kernels/test_launch.py tests/kernels/test_attention_api.py
    mkdir -p "$OUT/off" "$OUT/on"
    step host_bwd 120 "$PY" benchmarks/attention_host.py --bwd --out "$OUT/off"
    step host_bwd_cache 120 env FLASHSCALE_LAUNCH_CACHE_BWD=1 "$PY" benchmarks/attention_host.py --bwd --out "$OUT/on"
    seed_attention_configs
    # (no512: the 1k / 2k cells without the 512 one before them, which runs fa3 since session 26)
    for v in det det2 nodet forced no512 cache; do
      mkdir -p "$OUT/$v"
      extra=$([ "${v#det}" != "$v" ] || [ $v = cache ] && echo --deterministic)
      lens=$([ $v = no512 ] && echo 1024 2048 || echo 512 1024 2048)
      ([ $v = forced ] && export FLASHSCALE_FA3=1; [ $v = cache ] && export FLASHSCALE_LAUNCH_CACHE_BWD=1
       step "$v/g128" 90 "$PY" benchmarks/attention.py --hdims 128 --seqlens $lens --passes fwd,bwd $extra \
         --out "$OUT/$v")
    done
    # and the kernel alone (no autograd) at the same cells, after all that
    mkdir -p "$OUT/sweep"
    step sweep/bwd_sweep 90 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 128 --variants 'n128_m64_ws_tma$' \
      --seqlens 512,1024,2048 --budget 60 --out "$OUT/sweep/attention-fa3-bwd-sweep-diag-h200.json"
    (cd "$OUT" && tar czf diag27.tar.gz off on det det2 nodet forced no512 cache sweep && \
      rm -rf off on det det2 nodet forced no512 cache sweep) ;;  # 8 files come back
  fp8v27)  # next (written in session 26, not run): the FP8 forward with V^T's keys permuted (v_perm: P reaches the FP8
    # A operand by two PRMT a register pair, no shuffles): its GPU test, then the sweep against the default
    step fp8_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_fp8_gpu.py \
      tests/kernels/test_attention_fp8_gpu.py -k "v_perm or variants or mufu or prepass"
    step fp8_sweep 200 "$PY" benchmarks/attention_fa3_fp8_sweep.py --hdims 128,256 --seqlens 2048,8192,16384 \
      --variants pp,pp_vperm --out "$OUT/attention-fa3-fp8-sweep-vperm-h200.json" ;;
  grid26b)  # session 26: grid26's short cells of our rows swung 2-3x between rounds (cuDNN's within 1 %) and its
    # fwd_bwd cells, timed beside the deterministic rows for the first time, were 10-40 % under session 25's: the
    # grid again as session 25 ran it, fwd / bwd with the deterministic rows, then fwd_bwd alone
    seed_attention_configs
    step attention 250 "$PY" benchmarks/attention.py --deterministic --passes fwd,bwd --out "$OUT"
    mkdir -p "$OUT/fb"
    step fwd_bwd 150 "$PY" benchmarks/attention.py --passes fwd_bwd --out "$OUT/fb" ;;
  bwd26b)  # session 26, second call: the backward's early LSE load (D 128) and one end-of-step barrier (D 64 / 128):
    # GPU tests, then the sweep; the grid's 512 cells with the fa3 forward and backward forced (FLASHSCALE_FA3=1:
    # since the launch cache the 512 cells may no longer be host-bound), anchors beside
    step bwd_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "every_config or (ws_matches and (d64 or d128)) or ops_attention or auto"
    step bwd_sweep 120 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 128,64 \
      --variants n128_m64_ws_tma,n128_m128_ws_tma --seqlens 1024,2048,4096,16384 --budget 110 \
      --out "$OUT/attention-fa3-bwd-sweep-1b-h200.json"
    seed_attention_configs
    mkdir -p "$OUT/fa3_512"
    FLASHSCALE_FA3=1 step fa3_512 120 "$PY" benchmarks/attention.py --seqlens 512 --out "$OUT/fa3_512" ;;
  fb25)  # session 25, the last minutes: the FA2 issue's GPU file on main, then the grid's forward + backward pass
    # (timed as one call; benchmarks/attention.py --passes), merged into results/attention-h200.json with a note
    step gpu_attention 65 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/kernels/test_attention_gpu.py
    seed_attention_configs
    mkdir -p "$OUT/fb"
    step fwd_bwd 130 "$PY" benchmarks/attention.py --passes fwd_bwd --out "$OUT/fb" ;;
  last25)  # session 25, last (two machine refusals left one start): grid25 (the D 256 backward's new default), then
    # bwd25b (more dQ slots at D 64 / 128)
    bash "$0" grid25
    bash "$0" bwd25b
    rm -f "$OUT/attention-fa3-bwd-sweep-dq-slots-h200.png" ;;  # 8 files come back (--replot draws it here)
  bwd25b)  # session 25: more dQ slots at D 64 / 128 (after D 256's do1_d3): GPU tests, then the sweep
    step bwd_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "every_config or (ws_matches and (d64 or d128)) or ops_attention or auto"
    step bwd_sweep 200 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 64,128 \
      --variants n128_m64_ws_s3_tma,n128_m64_ws_tma --seqlens 1024,2048,4096,16384 --no-sdpa --budget 190 \
      --out "$OUT/attention-fa3-bwd-sweep-dq-slots-h200.json" ;;
  grid25)  # session 25, after next25 / next25b: the new defaults (fold_scale rows, D 256's SS backward, the launch
    # cache on) through their GPU tests and the API file, then the grid
    step fa3_tests 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      tests/kernels/test_launch.py tests/kernels/test_attention_fa3_bwd_gpu.py -k "not every_config"
    step api 70 "$PY" -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_attention_api.py
    seed_attention_configs
    step attention 260 "$PY" benchmarks/attention.py --deterministic --out "$OUT" ;;
  next25)  # next session's first call (written in session 24, not run): the launch cache's first GPU run (its tests,
    # then the FA3 and API tests with it on everywhere, the host time off and on)
    # and D 256's backward with P^T / dS^T read by wgmma from shared memory (n64_m64_ws_tma_q4_ss): tests, then sweeps
    step fa3_tests 90 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      tests/kernels/test_launch.py
    step bwd_tests 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "every_config or ws_matches"
    FLASHSCALE_LAUNCH_CACHE=1 step fa3_tests_on 90 "$PY" -m pytest -q -p no:cacheprovider -n 8 \
      tests/kernels/test_attention_fa3_gpu.py tests/kernels/test_attention_api.py
    mkdir -p "$OUT/off" "$OUT/on"
    FLASHSCALE_LAUNCH_CACHE=0 step host_off 40 "$PY" benchmarks/attention_host.py --rounds 2 --out "$OUT/off"
    FLASHSCALE_LAUNCH_CACHE=1 step host_on 40 "$PY" benchmarks/attention_host.py --rounds 2 --out "$OUT/on"
    step bwd_sweep 120 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 256 --variants ws_tma_q4,q4_ss \
      --seqlens 1024,4096,16384 --no-sdpa --budget 110 --out "$OUT/attention-fa3-bwd-sweep-ss-h200.json" ;;
  next25b)  # the next session's second call: the forward's folded softmax scale (fold_scale variants, compile-
    # checked in session 24): their GPU tests (tuning_configs), then the sweep against their unfolded twins
    step fold_tests 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      -k "fold"
    step sweep 200 "$PY" benchmarks/attention_fa3_sweep.py --seqlens 1024,2048,4096,16384 --budget 190 \
      --variants \
      pp_persist,pp_persist_fold,pp_persist_dyn,pp_persist_dyn_fold,pp3_m192_persist_dyn,pp3_m192_persist_dyn_fold,\
pp3_m192_persist,pp3_m192_persist_fold,pp3_m192,pp3_m192_fold \
      --compile-budget 60 --out "$OUT/attention-fa3-sweep-fold-h200.json" ;;
  gputests)  # every test marked gpu, attention files first (session 24: the closing notes' GPU evidence on main)
    step gpu_attention 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_gpu.py \
      tests/kernels/test_attention_fa3_gpu.py tests/kernels/test_attention_fa3_bwd_gpu.py \
      tests/kernels/test_attention_fa3_fp8_gpu.py tests/kernels/test_attention_fp8_gpu.py
    step api 70 "$PY" -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_attention_api.py
    step gpu_rest 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/kernels/test_w4a16.py \
      tests/kernels/test_w4a16_wgmma_gpu.py tests/test_qlinear.py tests/test_infer_decode.py tests/test_gptq_gpu.py \
      tests/parallel/test_parallel_gpu.py tests/kernels/test_pdl.py ;;
  grid24)  # session 24: the grid with its short cells in three rounds (median), then the W4A16 tuner's timing
    seed_attention_configs
    step attention 260 "$PY" benchmarks/attention.py --deterministic --out "$OUT"
    step timing 240 "$PY" benchmarks/w4a16_tune_timing.py --cells 4096x14336x1024 ;;
  s24)  # session 24, second: the dynamic scheduler's defaults (d128 causal, d64 full) through ops.attention: the
    # default-path GPU tests and the API file, where the forward's host time goes (cProfile), the grid
    step fa3_tests 100 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      -k "matches_reference and not variants"
    step api 70 "$PY" -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_attention_api.py
    step host_profile 60 "$PY" benchmarks/attention_host.py --profile
    seed_attention_configs
    step attention 260 "$PY" benchmarks/attention.py --deterministic --out "$OUT" ;;
  next24)  # next (written in session 23, not run): D 256's eight-piece backward and the forward's dynamic scheduler, tests
    # first (neither has run on a GPU), then one sweep each
    step bwd_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "every_config or q8"
    step fwd_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      -k "dyn or persistent_many or head_grouped"
    step bwd_sweep 120 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 256 --variants ws_tma_q4,q8_d2 \
      --seqlens 1024,4096,16384 --no-sdpa --budget 110 --out "$OUT/attention-fa3-bwd-sweep-q8-h200.json"
    step sweep 150 "$PY" benchmarks/attention_fa3_sweep.py --seqlens 1024,2048,4096,8192,16384 --budget 140 \
      --variants pp,pp_persist,pp_persist_dyn,pp3_m192,pp3_m192_persist,pp3_m192_persist_dyn \
      --compile-budget 60 --out "$OUT/attention-fa3-sweep-dyn-h200.json" ;;
  rot23)  # session 23, after the grid: the backward's rotated query loop (q_rotate), tests, sweep; ncu of D 256
    # (run 2026-12-03: no gain, q_rotate removed since; the _rot variants select nothing now)
    step bwd_tests 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "rot or every_config"
    step bwd_sweep 100 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 256,128 --variants ws_tma_q4,ws_tma \
      --seqlens 1024,4096,16384 --no-sdpa --budget 90 --out "$OUT/attention-fa3-bwd-sweep-rot-h200.json"
    if [ "${NCU:-0}" = 1 ]; then  # (not run in session 23: its device time ran short)
      NCU_LIMIT=90 OUT=/tmp/ncu23 bash benchmarks/ncu_device.sh bwd_d256 > "$OUT/ncu.log" 2>&1
      cp /tmp/ncu23/ncu_text.tar.gz "$OUT/ncu_bwd_d256.tar.gz" 2>/dev/null; tail -n 5 "$OUT/ncu.log"
    fi ;;
  attn23b)  # session 23, last: the grid after the one-pass dQ cast and D 64 causal's three consumers from 2k
    step fa3_tests 90 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      -k "matches_reference and not variants"
    seed_attention_configs
    step attention 240 "$PY" benchmarks/attention.py --deterministic --out "$OUT" ;;
  d64c)  # session 23, fourth: the backward's one-pass dQ cast (tests, d128/d64 short sweeps), D 64's short-sequence configs
    step bwd_tests 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_bwd_gpu.py \
      tests/kernels/test_attention_fa3_gpu.py -k "bwd_gpu or (tuning_configs and (s4 or n64) and not varlen)"
    step bwd_sweep 90 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 128,64 --variants ws_tma,ws_s3_tma \
      --seqlens 1024,2048,4096 --no-sdpa --budget 80 --out "$OUT/attention-fa3-bwd-sweep-cast-h200.json"
    step sweep 120 "$PY" benchmarks/attention_fa3_sweep.py --hdims 64 --seqlens 1024,2048,4096,8192 --budget 110 \
      --variants pp_persist,pp3_m192,pp3_m192_persist,pp_persist_s4,pp_n64_s6_persist,pp_m256_n64,pp_m256_n64_persist \
      --compile-budget 50 --out "$OUT/attention-fa3-sweep-d64-h200.json" ;;
  attn23)  # session 23, third: the forwards' new defaults (head-grouped order, SEQLEN_CONFIGS, D 64 auto from 1k)
    # through ops.attention: the FA3 GPU tests, the backward rule tests left from session 22, the grid, FP8's grid
    step fa3_tests 130 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      tests/kernels/test_attention_fa3_bwd_gpu.py -k "not bwd_gpu or auto or dlse"
    step api 60 "$PY" -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_attention_api.py
    seed_attention_configs
    step attention 240 "$PY" benchmarks/attention.py --deterministic --out "$OUT"
    step fp8 150 "$PY" benchmarks/attention_fp8.py --out "$OUT" ;;
  l2b)  # session 23, second: the persistent grid's snake order (every persistent variant), then the sweeps again
    step fa3_tests 170 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      -k "persist or head_grouped or varlen_matches"
    step fp8_tests 90 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_fp8_gpu.py \
      -k "persist or head_grouped"
    step sweep 150 "$PY" benchmarks/attention_fa3_sweep.py \
      --variants pp,pp_persist,pp_s3_persist,pp3_m192,pp3_m192_persist --seqlens 1024,2048,4096,8192,16384 \
      --budget 140 --compile-budget 60 --out "$OUT/attention-fa3-sweep-snake-h200.json"
    step fp8_sweep 100 "$PY" benchmarks/attention_fa3_fp8_sweep.py --variants pp,pp_persist,pp_n64_s3 \
      --hdims 128,256 --seqlens 1024,2048,4096,16384 --budget 90 --compile-budget 40 \
      --out "$OUT/attention-fa3-fp8-sweep-snake-h200.json" ;;
  l2)  # session 23: the FA3 / FP8 forwards' head-grouped tile order (l2_groups) against the flat one (pp_flat)
    step fa3_tests 170 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/kernels/test_attention_fa3_gpu.py \
      -k "head_grouped or persistent_many or (matches_reference and not variants) or (tuning_configs and flat)"
    step fp8_tests 90 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/kernels/test_attention_fa3_fp8_gpu.py \
      -k "head_grouped or kernel_matches or flat"
    step sweep 190 "$PY" benchmarks/attention_fa3_sweep.py --variants pp,pp_flat,pp_persist,pp3_m192,pp3_m192_flat \
      --seqlens 1024,2048,4096,8192,16384 --budget 180 --compile-budget 70 --out "$OUT/attention-fa3-sweep-l2-h200.json"
    step fp8_sweep 110 "$PY" benchmarks/attention_fa3_fp8_sweep.py --variants pp,pp_flat,pp_n64_s3 \
      --seqlens 1024,2048,4096,16384 --budget 100 --compile-budget 45 --out "$OUT/attention-fa3-fp8-sweep-l2-h200.json" ;;
  attn22b)  # session 22, last: D 256's new default (ws, four dQ pieces) through ops.attention: tests, the d256 grid
    step bwd_api_tests 100 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "auto or (dlse and 256)"
    seed_attention_configs
    step attention 120 "$PY" benchmarks/attention.py --deterministic --hdims 256 --out "$OUT" ;;
  bwd22b)  # session 22: the ws backward at D 256 (four 64-column dQ pieces through one 16 KB slot), d128 pieces
    step bwd_tests 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "every_config or (ws_matches and (q4 or q2))"
    step bwd_sweep 240 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 256,128 --variants split,q4,ws_tma,ws_s3_tma \
      --seqlens 1024,2048,4096,8192,16384 --no-sdpa --budget 200 --out "$OUT/attention-fa3-bwd-sweep-q4-h200.json" ;;
  attn22)  # session 22: the new backward defaults (TMA dQ at 64/128, dQ in two pieces at 256) and the auto rule
    step bwd_api_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "auto or dlse or ws_matches"
    seed_attention_configs
    step attention 280 "$PY" benchmarks/attention.py --deterministic --out "$OUT" ;;
  bwd22)  # session 22: the backward's dQ by TMA reduce-add (ncu showed the red.v4 writer holding the MMA warps)
    # and the single-partition kernel's dQ by red.v4 after a lane-pair shuffle (red_quad, measured slower, since
    # removed: "quad" selects nothing now)
    step bwd_tests 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "every_config or (ws_matches and tma)"
    step bwd_sweep 240 "$PY" benchmarks/attention_fa3_bwd_sweep.py --hdims 128,64,256 --variants ws,quad,n64_m64 --seqlens 1024,2048,4096,8192,16384 \
      --no-sdpa --budget 200 --out "$OUT/attention-fa3-bwd-sweep-tma-h200.json"
    NCU_LIMIT=80 OUT=/tmp/ncu22 bash benchmarks/ncu_device.sh bwd_d128_tma > "$OUT/ncu.log" 2>&1
    cp /tmp/ncu22/ncu_text.tar.gz "$OUT/ncu_bwd_tma.tar.gz" 2>/dev/null; tail -n 5 "$OUT/ncu.log" ;;
  tests)
    step dispatch 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu -x tests/kernels/test_attention_fa3_bwd_gpu.py \
      -k "auto or ws_matches"
    step fa2 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu -x -n 6 tests/kernels/test_attention_gpu.py
    step api 120 "$PY" -m pytest -q -p no:cacheprovider -x tests/kernels/test_attention_api.py ;;
  refresh)
    seed_attention_configs
    step attention 240 "$PY" benchmarks/attention.py --deterministic --out "$OUT"
    step w4a16 240 "$PY" benchmarks/w4a16.py --out "$OUT" ;;  # the tuner's second round: 4096x4096 at M 2-16
  e2e)
    step decode_tests 150 "$PY" -m pytest -q -p no:cacheprovider -x tests/test_infer_decode.py tests/kernels/test_pdl.py
    step generate 300 "$PY" benchmarks/generate_w4a16.py --out "$OUT" ;;
  host)
    step host 120 "$PY" benchmarks/attention_host.py --out "$OUT" ;;
  decode)  # session 19: split-context decode attention, the tuner's graph timing, the attention host profile
    step profile 120 "$PY" benchmarks/attention_host.py --profile
    step decode_tests 150 "$PY" -m pytest -q -p no:cacheprovider -x tests/test_infer_decode.py tests/kernels/test_pdl.py \
      tests/kernels/test_attention_api.py
    step tune_tests 120 "$PY" -m pytest -q -p no:cacheprovider -x -m gpu tests/kernels/test_w4a16.py tests/test_qlinear.py \
      "tests/kernels/test_w4a16_wgmma_gpu.py::test_w4a16_matmul_auto_and_forced_wgmma"
    step generate 200 "$PY" benchmarks/generate_w4a16.py --out "$OUT"
    step w4a16 240 "$PY" benchmarks/w4a16.py --out "$OUT" ;;
  attn19)  # session 19: the attention launch path's host time (cached layouts/capability), then the grid
    step profile 90 "$PY" benchmarks/attention_host.py --profile
    step host 90 "$PY" benchmarks/attention_host.py --out "$OUT"
    step attn_tests 150 "$PY" -m pytest -q -p no:cacheprovider -x tests/kernels/test_attention_fa3_gpu.py \
      tests/kernels/test_attention_fp8_gpu.py tests/kernels/test_attention_api.py -k "ops_attention or fp8 or api or paths"
    seed_attention_configs
    step attention 200 "$PY" benchmarks/attention.py --deterministic --out "$OUT" ;;
  gemm20)  # session 20: the W4A16 GEMM's bm256 x bn128 candidates and M > 2048 bucket, per config then the grid
    # (the GEMM GPU tests last: run them first when only the tests are wanted)
    step probe 240 "$PY" benchmarks/w4a16_gemm_probe.py --shapes 4096x14336,4096x4096 --ms 4096,1024 --candidates none \
      --out "$OUT"
    step w4a16 300 "$PY" benchmarks/w4a16.py --out "$OUT"
    step gemm_tests 200 "$PY" -m pytest -q -p no:cacheprovider -x -m gpu tests/kernels/test_w4a16.py tests/test_qlinear.py \
      tests/kernels/test_w4a16_wgmma_gpu.py -k "auto_and_forced or pingpong or persistent or large_tiles or (candidates and bm256)" ;;
  gemm21)  # session 21: the stream-K tail of the persistent GEMM, the tuner's interleaved retiming; tests first
    step sk_tests 240 "$PY" -m pytest -q -p no:cacheprovider -x -m gpu tests/kernels/test_w4a16_wgmma_gpu.py \
      -k "stream_k or (candidates and (persist or bm256-bn128-bk128)) or large_tiles or persistent" -n 4
    step tune_tests 100 "$PY" -m pytest -q -p no:cacheprovider -x -m gpu tests/kernels/test_w4a16.py tests/test_qlinear.py
    step probe 90 "$PY" benchmarks/w4a16_gemm_probe.py --shapes 4096x14336 --ms 1024 --candidates none --out "$OUT"
    step w4a16 330 "$PY" benchmarks/w4a16.py --out "$OUT" ;;
  timing)  # next: which difference between the tuner's _time and do_bench_cudagraph moves the GEMM timings
    step tune_tests 100 "$PY" -m pytest -q -p no:cacheprovider -x -m gpu tests/kernels/test_w4a16.py tests/test_qlinear.py
    step timing 240 "$PY" benchmarks/w4a16_tune_timing.py --cells 4096x14336x1024,8192x8192x4096 ;;
  *)
    echo "usage: [OUT=DIR] bash benchmarks/gpu_pending.sh tests|refresh|e2e|host|decode|attn19|gemm20|gemm21|timing" >&2
    exit 2 ;;
esac
