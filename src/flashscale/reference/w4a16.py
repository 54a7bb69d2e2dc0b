"""Plain-PyTorch W4A16: dequantize the packed 4-bit weight, then matmul. The kernels' test oracle and
the CPU path of flashscale.ops.w4a16_linear.

(q - z) is an integer in [-16, 15] and s a float16 value, so (q - z) * s is exact in float32: the
dequantized weight is the same to the bit however a kernel computes it before rounding to 16 bits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashscale.kernels.w4a16_pack import PackedW4, unpack_w4


def dequantize_w4(p: PackedW4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """PackedW4 -> W (K, N) in the original input-feature order, exact in float32, then cast to dtype."""
    codes, zeros, scales, g_idx = unpack_w4(p)
    g = g_idx.long()
    w = (codes.float() - zeros.float()[g]) * scales.float()[g]  # (K, N)
    return w.to(dtype)


def w4a16_linear_ref(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None, *,
                     compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x (..., K) -> (..., N) = x @ W + bias, W dequantized to compute_dtype (default x.dtype).

    compute_dtype=x.dtype mirrors the kernels (16-bit operands, then the product); float32 or float64
    gives the oracle. The result has x's dtype.
    """
    cd = compute_dtype or x.dtype
    w = dequantize_w4(p, torch.float32).to(cd)
    y = F.linear(x.to(cd), w.t(), None if bias is None else bias.to(cd))
    return y.to(x.dtype)
