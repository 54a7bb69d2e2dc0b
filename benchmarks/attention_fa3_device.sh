#!/usr/bin/env bash
# One device call for the FA3-style Gluon forward (src/flashscale/kernels/attention_fa3.py, issue #4):
#   OUT=/some/dir bash benchmarks/attention_fa3_device.sh
# 1. the GPU tests (tests/kernels/test_attention_fa3_gpu.py);
# 2. benchmarks/attention.py --fa3: the FlashAttention grid (bf16, batch * seqlen = 16384, heads * hdim =
#    2048, seqlen 512 .. 16384, hdim 64/128/256, causal and not) with the fa3 forward beside our FA2 and
#    torch SDPA's cuDNN and flash backends -> attention-<gpu>.json/.png;
# 3. the machine code: registers and spills of the loaded kernels (the driver's count), HGMMA / TMA (UTMALDG)
#    / local-memory (LDL/STL: spills) instruction counts from cuobjdump -sass, ptxas -v.
# Writes at most 7 files to $OUT: gpu.txt, fa3_tests.log, sass.txt, bench.log, attention-<gpu>.json/.png, done.txt.
# Every stage has a time limit (about 7 minutes in all), so a partial run still reports.
set -u
OUT=${OUT:-/tmp/fa3-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
PY=${PYTHON:-python3}
T_TESTS=${T_TESTS:-120}
T_SASS=${T_SASS:-75}
T_BENCH=${T_BENCH:-240}  # the whole grid, fwd and bwd, FA2 compiles included
start=$(date +%s)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "$OUT/gpu.txt" 2>&1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt" 2>&1

# -- 1. tests ------------------------------------------------------------------------------------------
timeout "$T_TESTS" "$PY" -m pytest -q -m gpu tests/kernels/test_attention_fa3_gpu.py -p no:cacheprovider -rfEs \
  --durations=8 > "$OUT/fa3_tests.log" 2>&1
echo "pytest exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/fa3_tests.log"

# -- 2. benchmark --------------------------------------------------------------------------------------
# benchmarks/attention.py's grid and checks with the fa3 forward as one more impl (flat rows, as the
# committed attention-<gpu>.json); FA2 untuned (first candidates) to leave the time to fa3
timeout "$T_BENCH" "$PY" benchmarks/attention.py --fa3 --out "$OUT" > "$OUT/bench.log" 2>&1
echo "benchmark exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/bench.log"
# -- 3. machine code (last: the timings matter more if time runs out) ---------------------------------
timeout "$T_SASS" "$PY" - > "$OUT/sass.txt" 2>&1 <<'PYEOF'
import re
from dataclasses import replace
import torch
from flashscale.kernels import attention_fa3 as fa3
from flashscale.kernels.aot import ptxas_stats, sass as sass_of
for d in fa3.HEAD_DIMS:
    for causal in (False, True):
        for overlap in (True, False):
            cfg = replace(fa3.DEFAULT_CONFIGS[d], overlap=overlap)
            k = fa3.compile_sm90(d, causal, config=cfg)
            k._init_handles()  # load on the GPU: the driver's register and spill counts
            st = ptxas_stats(k.asm["ptx"])
            sass = sass_of(k.asm["cubin"])
            pats = {"HGMMA": r"HGMMA", "UTMALDG": r"UTMALDG", "UTMASTG": r"UTMASTG", "LDL": r"\bLDL",
                    "STL": r"\bSTL", "SETMAXREG": r"SETMAXREG|USETMAXREG", "MUFU.EX2": r"MUFU\.EX2"}
            counts = " ".join(f"{name}={len(re.findall(pat, sass))}" for name, pat in pats.items())
            print(f"d={d} causal={causal} overlap={overlap} {cfg} smem={k.metadata.shared} "
                  f"n_regs={k.n_regs} n_spills={k.n_spills} ptxas_regs={st['registers']} "
                  f"spill_st={st['spill_stores']} spill_ld={st['spill_loads']} {counts}")
            if d == 128 and causal and overlap:
                hg = [l.strip() for l in sass.splitlines() if "HGMMA" in l or "WARPGROUP" in l]
                print("  d128 causal overlap, HGMMA/WARPGROUP lines:\n    " + "\n    ".join(hg[:40]))
PYEOF
echo "sass exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/sass.txt"

echo "total $(( $(date +%s) - start ))s" > "$OUT/done.txt"

tail -n 30 "$OUT/fa3_tests.log"
grep -v "^    " "$OUT/sass.txt" | tail -n 14
tail -n 45 "$OUT/bench.log"
