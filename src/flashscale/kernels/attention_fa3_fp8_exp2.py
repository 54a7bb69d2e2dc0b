"""The FP8 FA3 forward's software exp2 on the FMA pipe (FA3Fp8Config.exp2_fma, FlashAttention-4's trick): its
constants, the Gluon helper _exp2_fma the softmax calls, and exp2_fma_emulated, its float32 replay for tests on
any device (tests/kernels/test_attention_fa3_fp8_exp2.py). Separate so that the CPU replay and the kernel helper
share one set of constants in one short file.

It is also where the Gluon modules of this kernel (attention_fa3_fp8_*.py) probe the installed Triton: HAS_GLUON,
imported by the others, is True when every Gluon name they use imports and gl has warp_specialize.
"""

from __future__ import annotations

import torch

try:  # Gluon is experimental: absent from older Tritons, and its API moves between releases
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = hasattr(gl, "warp_specialize")
    # imported only for the probe (the kernel modules and the launcher import these names themselves)
    del triton, fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait, TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False

# Software exp2 on the FMA pipe (FA3Fp8Config.exp2_fma; FlashAttention-4's exp2 emulation, written here with
# round-to-nearest so it needs no directed-rounding add): x = max(x, -127); t = x + 1.5 * 2^23 holds j = round(x)
# in its low mantissa bits (exact for |x| < 2^22); f = x - (t - 1.5 * 2^23) in [-0.5, 0.5] (exact);
# 2^f ~ 1 + f (c1 + f (c2 + f c3)) (3 FFMA, Horner); 2^x = bits(2^f) + (bits(t) << 23) as integers (the shift
# keeps j's low 9 bits: bits(1.5 * 2^23) << 23 == 0 mod 2^32). Coefficients: minimax of the relative error on
# [-0.5, 0.5] with the constant term pinned to 1 (so that x <= -127, masked -inf included, gives exactly +0:
# bits(1.0) + (-127 << 23) == 0). Relative error <= 1.02e-4 for x in [-126, 8] (1.013e-4 the polynomial, the rest
# fp32 rounding; tests/kernels/test_attention_fa3_fp8_exp2.py); for x in (-127, -126) a denormal-range value
# within 2^-126 of 2^x, for x <= -127 exactly 0; never negative, never NaN. P is rounded to e4m3 (relative
# spacing 2^-4..2^-3) afterwards: 1e-4 moves an e4m3 rounding of P for ~0.03 % of the elements it touches, by one
# step (in the CPU emulation the output moves by ~3 % of the FP8 error at exp2_fma=3).
EXP2_FMA_CLAMP = -127.0
EXP2_FMA_ROUND = 12582912.0  # 1.5 * 2^23
EXP2_FMA_POLY = (0.6932829022407532, 0.2422110140323639, 0.05500895157456398)  # c1, c2, c3 (float32 values)
EXP2_FMA_REL_ERR = 1.02e-4


def exp2_fma_emulated(x: torch.Tensor) -> torch.Tensor:
    """The kernel's software exp2 (_exp2_fma) replayed op by op in float32 with torch (CPU or GPU): the same
    clamp, round-to-nearest split, Horner polynomial (fma as one float64 multiply-add rounded once to float32: the
    float32 product is exact in float64, so this differs from a fused float32 fma only by a rare double rounding)
    and integer exponent add. For tests and error studies; the kernel's result is this up to that double rounding."""
    x = torch.clamp_min(x.float(), EXP2_FMA_CLAMP)  # -inf -> -127 (NaN never occurs: scores are finite or -inf)
    t = x + EXP2_FMA_ROUND
    f = x - (t - EXP2_FMA_ROUND)

    def fma(a, b, c):
        return (a.double() * b.double() + c).float()

    c1, c2, c3 = EXP2_FMA_POLY
    p = fma(fma(fma(f, torch.full_like(f, c3), c2), f, c1), f, 1.0)
    bits = p.view(torch.int32) + (t.view(torch.int32) << 23)  # int32 arithmetic wraps, as the GPU's
    return bits.view(torch.float32)


if HAS_GLUON:
    _E2_CLAMP = gl.constexpr(EXP2_FMA_CLAMP)
    _E2_ROUND = gl.constexpr(EXP2_FMA_ROUND)
    _E2_C1 = gl.constexpr(EXP2_FMA_POLY[0])
    _E2_C2 = gl.constexpr(EXP2_FMA_POLY[1])
    _E2_C3 = gl.constexpr(EXP2_FMA_POLY[2])

    @gluon.jit
    def _exp2_fma(x):
        """2^x (fp32, x <= 8 here; valid below 128) without MUFU: FMNMX, 3 FADD, 3 FFMA and an integer
        shift-add (module constants EXP2_FMA_*, replayed by exp2_fma_emulated). x <= -127 (-inf) gives +0."""
        x = gl.maximum(x, _E2_CLAMP)
        t = x + _E2_ROUND  # round(x) in the low mantissa bits (round to nearest, |x| < 2^22)
        f = x - (t - _E2_ROUND)  # in [-0.5, 0.5], exact
        p = gl.fma(gl.fma(gl.fma(f, _E2_C3, _E2_C2), f, _E2_C1), f, 1.0)  # 2^f, relative error <= 1.02e-4
        bits = p.to(gl.int32, bitcast=True) + (t.to(gl.int32, bitcast=True) << 23)  # exponent += round(x)
        return bits.to(gl.float32, bitcast=True)
