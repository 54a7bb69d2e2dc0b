"""The software exp2 of the FP8 FA3-style kernel (FA3Fp8Config.exp2_fma: part of P = 2^x on the FMA pipe instead of
MUFU.EX2, FlashAttention-4's trick), replayed in float32 by attention_fa3_fp8.exp2_fma_emulated (the kernel helper
_exp2_fma op by op), against torch.exp2 over the inputs the kernel sees: x = S * scale - m + 8 <= 8, down to very
negative scores and the masked -inf. The GPU test (test_attention_fa3_fp8_gpu.py) checks the compiled helper
against this replay bit for bit; the compile test counts the MUFU.EX2 it saves.

Bound: relative error <= EXP2_FMA_REL_ERR (1.02e-4) where 2^x is a normal float (x >= -126); for x in (-127, -126)
a value within 2^-126 of 2^x (the exponent add lands in the denormal range); exactly +0 for x <= -127 and -inf;
never negative or NaN. P is rounded to e4m3 (3 mantissa bits, relative spacing 1/8 .. 1/16) right after.
"""

from __future__ import annotations

import math

import pytest
import torch

fp8 = pytest.importorskip("flashscale.kernels.attention_fa3_fp8")


def _inputs() -> torch.Tensor:
    dense = torch.linspace(-130.0, 8.0, 2_000_001, dtype=torch.float64).float()
    # the split's edges: integers and half-integers (round to nearest, ties to even) and their float32 neighbours
    k = torch.arange(-130, 9, dtype=torch.float32)
    edges = torch.cat([k, k + 0.5, k - 0.5])
    edges = torch.cat([edges, torch.nextafter(edges, torch.full_like(edges, math.inf)),
                       torch.nextafter(edges, torch.full_like(edges, -math.inf))])
    g = torch.Generator().manual_seed(0)
    rand = torch.rand(1_000_000, generator=g) * 138.0 - 130.0
    small = torch.randn(200_000, generator=g) * 1e-3  # around 2^0: f near 0, where the polynomial is pinned to 1
    x = torch.cat([dense, edges, rand, small, torch.tensor([8.0, 0.0, -0.0, -126.0, -127.0, -127.5, -128.0])])
    return x[(x >= -130.0) & (x <= 8.0)]


def test_exp2_fma_matches_exp2_within_the_stated_bound():
    x = _inputs()
    got = fp8.exp2_fma_emulated(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert torch.isfinite(got).all() and (got >= 0).all()
    want = torch.exp2(x.double())
    normal = x >= -126.0
    rel = ((got.double() - want) / want)[normal].abs()
    assert rel.max().item() <= fp8.EXP2_FMA_REL_ERR, rel.max().item()
    assert rel.max().item() >= 0.5 * fp8.EXP2_FMA_REL_ERR  # the bound is tight, not a typo
    tiny = ~normal
    assert ((got.double() - want)[tiny].abs() <= 2.0 ** -126).all()
    assert (got[x <= -127.0] == 0).all()
    # exact where the polynomial is pinned: integer x in the normal range gives the power of two itself
    ints = torch.arange(-126, 9, dtype=torch.float32)
    assert torch.equal(fp8.exp2_fma_emulated(ints), torch.exp2(ints))


def test_exp2_fma_masked_entries_give_zero():
    x = torch.tensor([-math.inf, -1e30, -3.0e38, -1e6, -2.0 ** 22, -200.0, -127.0])
    got = fp8.exp2_fma_emulated(x)
    assert torch.equal(got, torch.zeros_like(x)) and not torch.signbit(got).any()


def test_exp2_fma_keeps_the_e4m3_rounding_of_p():
    # what the kernel does with it: P = exp2(x) in (0, 2^8] rounded to e4m3. The software exp2 moves a rounding only
    # where 2^x lies within ~1e-4 (relative) of an e4m3 rounding boundary, and then by one e4m3 step
    x = torch.linspace(-20.0, 8.0, 1_000_001, dtype=torch.float64).float()
    ref = torch.exp2(x).to(torch.float8_e4m3fn).view(torch.uint8).int()
    got = fp8.exp2_fma_emulated(x).to(torch.float8_e4m3fn).view(torch.uint8).int()
    diff = got != ref
    assert diff.float().mean().item() < 2e-3, diff.float().mean().item()
    assert ((got - ref).abs() <= 1).all()  # positive e4m3 codes are monotonic: one step at most, subnormals too


def test_exp2_fma_constants_are_float32_exact():
    # the Gluon helper uses these as fp32 immediates: the replay must see the very same values
    for c in (*fp8.EXP2_FMA_POLY, fp8.EXP2_FMA_CLAMP, fp8.EXP2_FMA_ROUND):
        assert torch.tensor(c, dtype=torch.float32).item() == c
    assert fp8.EXP2_FMA_ROUND == 1.5 * 2 ** 23
