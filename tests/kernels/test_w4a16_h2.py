"""The packed 16-bit W4A16 unpack (kernels/w4a16_h2.py): its PTX text, executed by the module's emulator, gives
(q - z) * s rounded once to bf16 / fp16 for every code q, zero point z and positive float16 scale s, from the
nibbles PackedW4 puts in each pair; and the emulator itself is checked on the instructions it knows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashscale.kernels import w4a16_h2 as h2


def _all_scales() -> np.ndarray:
    """Every positive finite float16 (subnormals included)."""
    bits = np.arange(1, 0x7C00, dtype=np.uint16)
    return bits.view(np.float16)


def _reference_bits(q: np.ndarray, z: np.ndarray, s: np.ndarray, ty: str) -> np.ndarray:
    exact = (q.astype(np.float64) - z) * s.astype(np.float64)  # <= 4 + 11 bits: exact in float32 too
    t = torch.from_numpy(exact.astype(np.float32))
    t = t.to(torch.bfloat16) if ty == "bf16" else t.to(torch.float16)
    return t.view(torch.int16).numpy().view(np.uint16)


def _word(nibbles: np.ndarray) -> np.ndarray:
    """(..., 8) nibbles -> uint32 words, nibble j at bits 4j."""
    return (nibbles.astype(np.uint64) << (4 * np.arange(8, dtype=np.uint64))).sum(-1).astype(np.uint32)


@pytest.mark.parametrize("ty", ["bf16", "fp16"])
def test_every_code_zero_and_scale_is_exact(ty):
    s = _all_scales()
    q = np.arange(16)
    z = np.arange(17)
    S, Q, Z = (a.ravel() for a in np.meshgrid(s, q, z, indexing="ij"))  # 8.6 M weights
    rng = np.random.default_rng(0)
    m = 1
    nib = rng.integers(0, 16, size=(S.size, 8))
    nib[:, 2 * m] = Q  # the pair's low weight (k0 = 0) ...
    nib[:, 2 * m + 1] = 15 - Q  # ... and its high one (k0 = 1)
    w = _word(nib)
    regs = {"$1": w, "$2": w, "$3": w >> 4, "$4": w >> 4, **h2.pair_constants(S, Z, ty)}
    out = h2.emulate(h2.pair_asm(m, ty), regs, ty)
    np.testing.assert_array_equal(out & 0xFFFF, _reference_bits(Q, Z, S, ty))
    np.testing.assert_array_equal(out >> 16, _reference_bits(15 - Q, Z, S, ty))


@pytest.mark.parametrize("ty", ["bf16", "fp16"])
@pytest.mark.parametrize("m", range(4))
def test_each_pair_takes_the_low_and_high_nibble_of_its_byte(ty, m):
    """Pair m of a word is nibbles (2m, 2m + 1): PackedW4's k0 = 0, 1 of one A-fragment register."""
    rng = np.random.default_rng(m)
    n = 200_000
    nib = rng.integers(0, 16, size=(n, 8))
    z = rng.integers(0, 17, size=n)
    s = rng.choice(_all_scales(), size=n)
    w = _word(nib)
    regs = {"$1": w, "$2": w, "$3": w >> 4, "$4": w >> 4, **h2.pair_constants(s, z, ty)}
    out = h2.emulate(h2.pair_asm(m, ty), regs, ty)
    np.testing.assert_array_equal(out & 0xFFFF, _reference_bits(nib[:, 2 * m], z, s, ty))
    np.testing.assert_array_equal(out >> 16, _reference_bits(nib[:, 2 * m + 1], z, s, ty))


def test_rounding_split_scale_needs_its_low_part():
    """Without S_LO (w = d * bf16(s)) the bf16 result differs for some weights: the split is what makes it exact."""
    s = _all_scales()[::7]
    q, z = np.full(s.size, 15), np.zeros(s.size)
    w = _word(np.full((s.size, 8), 15))
    regs = {"$1": w, "$2": w, "$3": w >> 4, "$4": w >> 4, **h2.pair_constants(s, z, "bf16")}
    regs["$7"] = np.zeros_like(regs["$7"])  # S_LO = 0
    out = h2.emulate(h2.pair_asm(0, "bf16"), regs, "bf16")
    assert (out & 0xFFFF != _reference_bits(q, z, s, "bf16")).sum() > 100


def test_emulator_instructions():
    a = np.array([0x76543210], dtype=np.uint32)
    b = np.array([0xFEDCBA98], dtype=np.uint32)
    assert h2._prmt(a, b, 0x7531)[0] == 0xFEBA7632  # bytes 1, 3, 5, 7
    assert h2._prmt(a, b, 0x0400)[0] == 0x10981010
    with pytest.raises(ValueError, match="unknown instruction"):
        h2.emulate("{\nadd.u32 $0, $1, 1;\n}", {"$1": a}, "bf16")
    with pytest.raises(ValueError, match="not a float32 exactly"):
        h2._round16(np.array([1 + 2.0 ** -40]), "bf16")
    with pytest.raises(ValueError, match="'bf16' or 'fp16'"):
        h2.pair_asm(0, "fp32")
    with pytest.raises(ValueError, match="m=4"):
        h2.pair_asm(4, "bf16")
    assert h2.constraints("bf16").count("r") == 11 and h2.constraints("fp16").count("r") == 9
