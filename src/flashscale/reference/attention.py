"""Reference attention in plain PyTorch (the oracle for the Triton kernels and the CPU path).

Layout (flash-attn's): q (B, Sq, H, D), k/v (B, Sk, Hkv, D) with H % Hkv == 0 (GQA/MQA).
Causal masking is aligned bottom-right when Sq != Sk (query i sees keys j <= i + Sk - Sq), as flash-attn.
"""

from __future__ import annotations

import math

import torch


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    upcast: bool = True,
):
    """Returns out (B, Sq, H, D) [and lse (B, H, Sq) in float32]. Rows with no visible key give zeros."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    group = H // Hkv
    k = k.repeat_interleave(group, dim=2)  # (B, Sk, H, D)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale  # (B, H, Sq, Sk)
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, H, Sq)
    p = torch.exp(s - lse[..., None])
    p = torch.nan_to_num(p, nan=0.0)  # fully masked rows: exp(-inf - -inf)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v).to(dtype)
    if return_lse:
        return out, lse.float()
    return out
