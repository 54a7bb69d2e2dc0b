#!/usr/bin/env bash
# Nsight Compute profiles of our GPU kernels (one call each, benchmarks/ncu_targets.py), read back as text.
#
#   device run:  OUT=$OUT bash benchmarks/ncu_device.sh [TARGET ...]     # default: all, in priority order
#
# The H200 machine runs under Firecracker, where ncu reads the hardware counters (../.library/device/KINDS.md);
# --clock-control none leaves the clocks alone (METHOD.md). For each target: the full section set, then the
# details page, the raw metrics (csv) and the per-SASS-instruction source page (csv: stall samples an
# instruction), all packed into $OUT/ncu_text.tar.gz. What each page holds: docs/profiling.md.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ncu_out}
W=/tmp/ncu_work
mkdir -p "$OUT" "$W"
PY=${PYTHON:-python3}
NCU=${NCU:-ncu}
LIMIT=${NCU_LIMIT:-150}   # seconds a target (compile + tune + profile)
targets=("$@")
[ ${#targets[@]} = 0 ] && targets=(bwd_d128 bwd_d256 fp8_d128 dec_8192 fwd_d128 bwd_d128_c gemm_1024)
{ $NCU --version; $NCU --help | grep -E -A3 -- "--page|--print-source|--print-details"; } > "$W/ncu_help.txt" 2>&1
t_all=$(date +%s)
for t in "${targets[@]}"; do
  t0=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$LIMIT" $NCU --profile-from-start off --clock-control none --set full \
    --import-source no -f -o "$W/$t" "$PY" benchmarks/ncu_targets.py "$t" > "$W/$t.log" 2>&1
  rc=$?
  echo "== $t: exit $rc after $(( $(date +%s) - t0 )) s"
  tail -n 4 "$W/$t.log"
  if [ -f "$W/$t.ncu-rep" ]; then
    $NCU -i "$W/$t.ncu-rep" --page details --print-details all > "$W/$t.details.txt" 2>&1 \
      || $NCU -i "$W/$t.ncu-rep" --page details > "$W/$t.details.txt" 2>&1
    $NCU -i "$W/$t.ncu-rep" --page raw --csv > "$W/$t.raw.csv" 2>&1
    $NCU -i "$W/$t.ncu-rep" --page source --csv --print-source sass > "$W/$t.sass.csv" 2>&1
    ls -la "$W/$t".* | awk '{print "   ", $5, $9}'
  fi
  [ $(( $(date +%s) - t_all )) -gt 420 ] && { echo "time budget spent; not profiled: after $t"; break; }
done
tar -C "$W" -czf "$OUT/ncu_text.tar.gz" --exclude='*.ncu-rep' .
ls -la "$OUT"
