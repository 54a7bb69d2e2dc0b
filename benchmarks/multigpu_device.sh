#!/usr/bin/env bash
# On a multi-GPU device machine: benchmarks/multigpu.py at world size 1 and the machine's GPU count.
#   OUT=$OUT bash benchmarks/multigpu_device.sh [parts...]    (parts: parity scaling bubble; default all)
# Part files and logs land in $OUT; merge them with `python benchmarks/multigpu.py --merge DIR --kind K`.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:?set OUT}
N=$(nvidia-smi -L | wc -l)
PARTS=${*:-parity scaling bubble}
env | grep -E '^NCCL_' | sort > "$OUT/nccl-env.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
for W in $(printf "1\n%s\n" "$N" | sort -un); do
  P=$PARTS
  [ "$W" = 1 ] && P=$(echo "$PARTS" | tr ' ' '\n' | grep -x scaling | tr '\n' ' ')
  [ -z "$P" ] && continue
  echo "== world $W: $P"
  timeout ${MG_TIMEOUT:-500} torchrun --standalone --nproc-per-node "$W" benchmarks/multigpu.py --tmp "$OUT" --parts $P \
    2>&1 | grep -v "^W.*OMP_NUM_THREADS\|^\*\*\*" | tee "$OUT/world-$W-${P// /-}.log"
done
