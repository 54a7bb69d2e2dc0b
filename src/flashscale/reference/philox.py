"""Triton's `tl.rand(seed, offset)` (Philox4x32-10) re-implemented in plain PyTorch, bit for bit.

The attention kernels draw their dropout mask with `tl.rand(seed, offset)`; the reference draws the same
numbers here, so the CPU path and the oracle apply exactly the kernel's mask. Unsigned 32-bit arithmetic
is emulated in int64 (torch has no uint32 math): products are split into 16-bit halves so nothing
overflows 63 bits.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_ROUND_A = 0xD2511F53
_ROUND_B = 0xCD9E8D57
_KEY_A = 0x9E3779B9
_KEY_B = 0xBB67AE85
# Triton's uint_to_uniform_float for 32-bit sources: the largest scale with MAX_INT * scale < 1.0.
_UNIFORM_SCALE = 4.6566127342e-10


def _mul_hi_lo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of the 64-bit product a * b for a a uint32 constant, b uint32 values in int64."""
    b_lo, b_hi = b & 0xFFFF, b >> 16
    p_lo = a * b_lo  # < 2**48
    p_hi = a * b_hi  # < 2**48
    hi = (p_hi + (p_lo >> 16)) >> 16
    lo = (((p_hi & 0xFFFF) << 16) + p_lo) & _MASK32
    return hi, lo


def philox_uint32x4(seed: int, offset: torch.Tensor, n_rounds: int = 10) -> tuple[torch.Tensor, ...]:
    """The four output words of Philox4x32 for counters (offset_lo, offset_hi, 0, 0), key (seed_lo, seed_hi).

    Matches `tl.randint4x(seed, offset)` for an int64 `offset` (words in [0, 2**32), held in int64).
    """
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64); got {seed}")
    offset = offset.to(torch.int64)
    c0 = offset & _MASK32
    c1 = (offset >> 32) & _MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for _ in range(n_rounds):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _MASK32, (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def uint32_to_uniform(x: torch.Tensor) -> torch.Tensor:
    """Triton's uint_to_uniform_float for 32-bit words: float32 in [0, 1)."""
    x = torch.where(x >= 2**31, x - 2**32, x)  # bitcast to int32
    x = torch.where(x < 0, -x - 1, x).to(torch.int32)
    return x.to(torch.float32) * torch.tensor(_UNIFORM_SCALE, dtype=torch.float32)


def philox_uniform(seed: int, offset: torch.Tensor) -> torch.Tensor:
    """`tl.rand(seed, offset)`: float32 uniforms in [0, 1), bit-identical to Triton's."""
    return uint32_to_uniform(philox_uint32x4(seed, offset)[0])


def philox_uniform4(seed: int, counter: torch.Tensor) -> torch.Tensor:
    """`tl.rand4x(seed, counter)` as one tensor (..., 4): the four uniforms each counter yields."""
    return torch.stack([uint32_to_uniform(w) for w in philox_uint32x4(seed, counter)], dim=-1)
