"""One launch of one of our GPU kernels inside a cudaProfilerStart/Stop range, for Nsight Compute.

    ncu --profile-from-start off --set full -o REPORT python3 benchmarks/ncu_targets.py TARGET

Everything before the range (allocation, compilation, autotuning, a warm-up launch) is outside it, so ncu sees
exactly the kernels of the one measured call (and lists the helpers, e.g. the backward's delta pre-pass, by
name). Targets (bf16; the shapes of the benchmark grids' long cells):

  bwd_d128     attention_fa3_bwd, default config (warp-specialized), B 1, S 8192, H 16, D 128, non-causal
  bwd_d128_c   the same, causal
  bwd_d128_tma the same as bwd_d128 with the TMA reduce-add dQ writer (TUNING_CONFIGS[128]["n128_m64_ws_tma"])
  bwd_d256     attention_fa3_bwd, default config (warp-specialized, dQ in four pieces), B 1, S 8192, H 8,
               D 256, non-causal
  fwd_d128     attention_fa3_fwd, default config, B 1, S 16384, H 16, D 128, non-causal
  fp8_d128     attention_fa3_fp8_fwd, default config, inputs quantized beforehand, B 1, S 16384, H 16, D 128
  dec_8192     w4a16_linear at M 1, K = N = 8192, group 128 (the decode kernel the tuner picks)
  gemm_1024    w4a16_linear at M 1024, K 4096, N 14336 (the GEMM the tuner picks)
  gemm_64      w4a16_linear at M 64, K 8192, N 28672 (the tuner's pick; issue 7's point 2 cell furthest below its
               roofline bound: 89.5 us against bf16's 119, docs/w4a16_gemm.md)
  ring_28672   the ring decode kernel (w4a16_ring, bn256 ring2 atomic, 2 programs an SM: the tuner's M = 1 pick on
               most Llama shapes since session 29) at M 1, K 8192, N 28672 (117 MB: HBM-bound even after ncu's
               cache flush; docs/w4a16_decode.md Round 8: it streams at 0.72x the copy there)
  ring_8192    the same at K = N = 8192
"""

from __future__ import annotations

import sys

import torch


def _attn(S, H, D, gen):
    q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    return q, k, v


# w4a16_linear targets: (M, K, N), the kernel the tuner picks there
LINEAR_TARGETS = {"dec_8192": (1, 8192, 8192), "gemm_1024": (1024, 4096, 14336), "gemm_64": (64, 8192, 28672)}


def build(target: str):
    """A no-argument callable that launches the target once (compiled and tuned already after one call)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    if target.startswith("bwd_"):
        from flashscale.kernels.attention_fa3 import attention_fa3_fwd
        from flashscale.kernels.attention_fa3_bwd import attention_fa3_bwd

        from flashscale.kernels.attention_fa3_bwd import TUNING_CONFIGS

        D = 256 if target == "bwd_d256" else 128
        causal = target.endswith("_c")
        cfg = TUNING_CONFIGS[128]["n128_m64_ws_tma"] if target.endswith("_tma") else None
        q, k, v = _attn(8192, 8 if D == 256 else 16, D, gen)
        o, lse = attention_fa3_fwd(q, k, v, causal=causal)
        do = torch.randn_like(o)
        return lambda: attention_fa3_bwd(do, q, k, v, o, lse, causal=causal, config=cfg)
    if target == "fwd_d128":
        from flashscale.kernels.attention_fa3 import attention_fa3_fwd

        q, k, v = _attn(16384, 16, 128, gen)
        return lambda: attention_fa3_fwd(q, k, v)
    if target == "fp8_d128":
        from flashscale.kernels import attention_fa3_fp8 as fp8
        from flashscale.ops import quantize_fp8

        cfg = fp8.default_config(128)
        q, k, v = _attn(16384, 16, 128, gen)
        x = quantize_fp8(q, k, v, block_n=max(128, cfg.block_n), v_key_perm=cfg.v_perm)
        return lambda: fp8.attention_fa3_fp8_fwd(*x.args(), block_n=max(128, cfg.block_n), config=cfg,
                                                 v_key_perm=x.v_key_perm)
    if target in LINEAR_TARGETS:
        sys.path.insert(0, "benchmarks")
        from w4a16 import random_packed

        from flashscale.ops.w4a16 import w4a16_linear

        m, k, n = LINEAR_TARGETS[target]
        p = random_packed(k, n, 128, gen)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        return lambda: w4a16_linear(x, p)
    if target in ("ring_28672", "ring_8192"):
        sys.path.insert(0, "benchmarks")
        from w4a16 import random_packed

        from flashscale.kernels.w4a16_ring import RingConfig, w4a16_ring

        n = 28672 if target == "ring_28672" else 8192
        p = random_packed(8192, n, 128, gen)
        x = torch.randn(1, 8192, device="cuda", dtype=torch.bfloat16, generator=gen)
        cfg = RingConfig(bn=256, kt=2, num_warps=4, ring=2, per_sm=2, atomic=True)
        return lambda: w4a16_ring(x, p, config=cfg)
    raise SystemExit(f"target {target!r}: one of bwd_d128, bwd_d128_c, bwd_d128_tma, bwd_d256, fwd_d128, fp8_d128, "
                     "dec_8192, gemm_1024, gemm_64, ring_28672, ring_8192")


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    fn = build(sys.argv[1])
    for _ in range(3):  # compile, tune, warm
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{sys.argv[1]}: profiled one call")


if __name__ == "__main__":
    main()
