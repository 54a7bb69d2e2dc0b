"""flashscale.ops.attention: scaled dot-product attention in flash-attn's (B, S, H, D) layout.

First implementation: the plain-PyTorch reference on every device. The kernel issues put the Triton
FlashAttention kernels under this same signature.
"""

from __future__ import annotations

import torch

from flashscale.reference.attention import attention_ref


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """q (B, Sq, H, D), k/v (B, Sk, Hkv, D) -> (B, Sq, H, D). Causal is aligned bottom-right."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (batch, seqlen, heads, head_dim); got {q.dim()}, {k.dim()}, {v.dim()}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"q heads ({q.shape[2]}) must be a multiple of k/v heads ({k.shape[2]})")
    return attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, upcast=q.dtype != torch.float64)
