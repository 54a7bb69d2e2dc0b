# Sourced by quant_quality_device.sh and quant_quality_125m.sh: one quant_quality.py process per config on the
# one GPU (a ~130M model leaves it mostly idle, so the configs take about the time of the longest), merged.
#
#   quant_quality_parallel OUT NAME "4:128 3:128" SECONDS [quant_quality.py arguments ...]
#   quant_quality_parallel OUT NAME "4:128/rtn,gptq 4:128/awq,awq_duo" SECONDS ...  # a process per item, each
#                                                           # with its own --methods (else quant_quality's default)
#
# Each process gets its share of the cores (OMP_NUM_THREADS): with torch's default of one thread per core
# each, four processes on 16 cores ran the CPU-side steps ~100x slower (RTN 0.5 -> 94 s, 2026-12-02).
# Parts go to OUT/parts; their logs are joined into OUT/quant_quality.log, their rows merged into OUT/NAME.json
# (+ .png), and the parts removed once merged (a device call brings back at most 8 files). Returns the
# processes' last non-zero exit status (124: one ran out of SECONDS; its rows so far are still merged).
quant_quality_parallel() {
  local out=$1 name=$2 cfgs=$3 limit=$4 c cfg meth n pid rc=0 i=0 pids=()
  shift 4
  local threads=$(( $(nproc) / $(echo $cfgs | wc -w) ))
  [ "$threads" -ge 1 ] || threads=1
  mkdir -p "$out/parts"
  for c in $cfgs; do
    cfg=${c%%/*}; meth=()
    [ "$cfg" != "$c" ] && meth=(--methods "${c#*/}")
    i=$((i + 1)); n=$name-$(echo "$cfg" | tr ':-' '_m')-$i
    OMP_NUM_THREADS=$threads timeout --signal=TERM --kill-after=10 "$limit" "${PY:-python3}" \
      benchmarks/quant_quality.py "$@" "${meth[@]}" --configs "$cfg" --name "$n" --out "$out/parts" \
      > "$out/parts/$n.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  for n in "$out"/parts/*.log; do echo "== $n"; cat "$n"; done > "$out/quant_quality.log"
  rm -f "$out"/parts/*.log "$out"/parts/*.png
  "${PY:-python3}" benchmarks/quant_quality.py --merge "$out"/parts/*.json --out "$out" --name "$name" \
    && rm -rf "$out/parts"
  return $rc
}
