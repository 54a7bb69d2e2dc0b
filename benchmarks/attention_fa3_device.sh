#!/usr/bin/env bash
# One device call for the FA3-style Gluon forward (src/flashscale/kernels/attention_fa3.py, issue #4):
#   OUT=/some/dir bash benchmarks/attention_fa3_device.sh
# 1. the GPU tests (tests/kernels/test_attention_fa3_gpu.py);
# 2. forward TFLOP/s on the FlashAttention grid (bf16, batch * seqlen = 16384, heads * hdim = 2048,
#    seqlen 512 .. 16384, hdim 64/128/256, causal and not) of fa3, our Triton FA2 (flashscale.ops.attention,
#    untuned defaults) and torch SDPA's cuDNN and flash backends, all in the same process.
#    FLOPs 4 * B * S^2 * H * D, halved when causal. triton.testing.do_bench medians; each q/k/v is
#    64 MiB (> the 60 MB L2), so no input rotation is needed;
# 3. the machine code: registers and spills of the loaded kernels (the driver's count), HGMMA / TMA (UTMALDG)
#    / local-memory (LDL/STL: spills) instruction counts from cuobjdump -sass, ptxas -v.
# Writes at most 6 files to $OUT: gpu.txt, fa3_tests.log, sass.txt, bench.log, fa3_bench.json, done.txt.
# Every stage has a time limit (about 6 minutes in all), so a partial run still reports.
set -u
OUT=${OUT:-/tmp/fa3-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
PY=${PYTHON:-python3}
T_TESTS=${T_TESTS:-120}
T_SASS=${T_SASS:-75}
T_BENCH=${T_BENCH:-150}
start=$(date +%s)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  > "$OUT/gpu.txt" 2>&1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt" 2>&1

# -- 1. tests ------------------------------------------------------------------------------------------
timeout "$T_TESTS" "$PY" -m pytest -q -m gpu tests/kernels/test_attention_fa3_gpu.py -p no:cacheprovider -rfEs \
  --durations=8 > "$OUT/fa3_tests.log" 2>&1
echo "pytest exit: $? after $(( $(date +%s) - start ))s" >> "$OUT/fa3_tests.log"

# -- 2. benchmark --------------------------------------------------------------------------------------
timeout "$T_BENCH" "$PY" - "$OUT" > "$OUT/bench.log" 2>&1 <<'PYEOF'
import json, math, sys, datetime
import torch, triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashscale.kernels.attention_fa3 import attention_fa3_fwd, DEFAULT_CONFIGS
from flashscale.ops import attention

out_dir = sys.argv[1]
TOKENS, HIDDEN = 16384, 2048
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
IMPLS = ["fa3", "fa2", "sdpa_cudnn", "sdpa_flash"]
rows = []


def sdpa(backend):
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    def f(q, k, v, causal):
        with sdpa_kernel([be]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return f


print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
print(f"{'d':>4} {'causal':>6} {'seqlen':>6} " + " ".join(f"{i:>11}" for i in IMPLS) + "   fa3/cudnn  max|fa3-flash|")
with torch.no_grad():
    for d in (64, 128, 256):
        for causal in (False, True):
            for S in SEQLENS:
                B, H = TOKENS // S, HIDDEN // d
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(B, S, H, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, D) views for SDPA
                fns = {"fa3": lambda: attention_fa3_fwd(q, k, v, causal=causal),
                       "fa2": lambda: attention(q, k, v, causal=causal),
                       "sdpa_cudnn": lambda: sdpa("cudnn")(qt, kt, vt, causal),
                       "sdpa_flash": lambda: sdpa("flash")(qt, kt, vt, causal)}
                flops = 4.0 * B * S * S * H * d / (2 if causal else 1)
                tf, outs = {}, {}
                for name, fn in fns.items():
                    try:
                        o = fn()
                        outs[name] = o[0] if isinstance(o, tuple) else o
                        ms = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
                        tf[name] = flops / ms * 1e-9
                    except Exception as e:  # a backend that does not take this shape: recorded, not fatal
                        tf[name] = None
                        print(f"  {name} d={d} S={S} causal={causal}: {type(e).__name__}: {str(e)[:160]}")
                diff = None
                if "fa3" in outs and "sdpa_flash" in outs:
                    diff = (outs["fa3"].float() - outs["sdpa_flash"].transpose(1, 2).float()).abs().max().item()
                ratio = tf["fa3"] / tf["sdpa_cudnn"] if tf.get("fa3") and tf.get("sdpa_cudnn") else None
                rows.append(dict(hdim=d, causal=causal, seqlen=S, batch=B, heads=H, tflops=tf, fa3_vs_cudnn=ratio,
                                 max_abs_diff_vs_flash=diff, config=str(DEFAULT_CONFIGS[d])))
                cells = " ".join(f"{tf[i]:>11.1f}" if tf.get(i) else f"{'-':>11}" for i in IMPLS)
                r = f"{ratio:>10.3f}" if ratio else f"{'-':>10}"
                print(f"{d:>4} {str(causal):>6} {S:>6} {cells} {r}  {diff if diff is None else f'{diff:.2e}'}")
                del q, k, v, qt, kt, vt, outs
                with open(f"{out_dir}/fa3_bench.json", "w") as f:  # rewritten each row: a timeout keeps the rest
                    json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                                   triton=triton.__version__, date=datetime.datetime.now().isoformat(),
                                   flops="4*B*S^2*H*D (/2 causal)", rows=rows), f, indent=1)
PYEOF
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
