"""FlashAttention-2 backward in Triton: dQ, dK, dV from dO, recomputing P from the saved LSE.

    delta_i = rowsum(dO_i * O_i) - dLSE_i                   (preprocess; dLSE only when lse is used)
    P = exp(S - LSE)      dV = P_drop^T dO      dP = dO V^T (dropped like P)
    dS = P * (dP - delta) [* (1 - tanh^2) with softcap]     dK = scale dS^T Q      dQ = scale dS K

No S x S matrix is ever stored. The dK/dV kernel runs one program per (K/V block, batch, K/V head): K and
V tiles and the dK, dV accumulators stay on chip while it walks the query blocks of every query head of
its GQA group, so dK/dV are summed over the group in a fixed order, without atomics or K/V copies.
dQ either
  - accumulates in the same kernel with fp32 atomics into a (.., H, D) buffer (fast; FA2's choice;
    the order of the additions varies run to run, so dQ may differ in the last bits), or
  - comes from its own kernel, one program per query block, walking the key blocks (deterministic=True:
    bitwise-identical gradients run to run, at the price of recomputing QK^T and dO V^T).
Dropout masks are regenerated from (seed, offset) exactly as the forward drew them.

Files: attention_bwd_kernels.py (the Triton kernels); this module launches them (bwd_delta, attention_bwd,
scale_cast) and re-exports the kernels' names, which benchmarks/attention_resources.py patches here.
"""

from __future__ import annotations

import torch

from flashscale.kernels.attention_bwd_kernels import (_attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel, _bwd_preprocess,
                                                      _scale_cast_kernel)
from flashscale.kernels.attention_tune import (BwdConfig, FwdConfig, bench_ms, cdiv, dummy_i32, launch_with_fallback,
                                               plan, pow2)
from flashscale.kernels.launch import launch

# Names other modules, tests and benchmarks import or patch here (the kernels since the split into
# attention_bwd_kernels: the launchers below read them from this module's globals).
__all__ = [
    "_attn_bwd_dkdv_kernel", "_attn_bwd_dq_kernel", "_bwd_preprocess", "_scale_cast_kernel", "attention_bwd",
    "bwd_delta", "scale_cast",
]


def scale_cast(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """(x * scale).to(dtype) in one pass (read float32, write 16-bit; the same bits as torch's two ops): the
    Hopper backward's float32 dQ buffer to dq. torch's two passes moved 2.3x the bytes (~60 us a d128 1k call).
    A backward launch (kernels.launch, cached while launch.BWD_ENABLED)."""
    if not x.is_contiguous():
        raise ValueError("scale_cast: x must be contiguous")
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    n = x.numel()
    if n:
        launch(_scale_cast_kernel, (cdiv(n, 4096), ), (x, y, n, float(scale)), {"BLOCK": 4096, "num_warps": 8},
               "scale_cast", bwd=True)
    return y


def _strides3(t: torch.Tensor, varlen: bool):
    """(batch, seq, head) strides; varlen tensors (T, H, D) have no batch stride."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def bwd_delta(out, dout, lse, dlse=None, *, cu_seqlens_q=None, max_seqlen_q=0) -> torch.Tensor:
    """The backward's pre-pass: delta = rowsum(dO * O) - dLSE in float32, shaped like lse ((B, H, Sq) or varlen
    (H, Tq)), in one read of O and dO (no float32 copies of them). out/dout as q's layout with a unit head-dim
    stride, dlse like lse with a unit row stride (or None). Shared by FA2's and the Hopper backward; a backward
    launch (kernels.launch, cached while launch.BWD_ENABLED)."""
    varlen = cu_seqlens_q is not None
    if varlen:
        B, (_, H, D), sq = cu_seqlens_q.numel() - 1, out.shape, max_seqlen_q
        slb, slh = 0, lse.stride(0)
    else:
        B, sq, H, D = out.shape
        slb, slh = lse.stride(0), lse.stride(1)
    delta = torch.empty_like(lse)
    if B == 0 or H == 0 or sq == 0:
        return delta
    g = dlse if dlse is not None else lse
    sgb, sgh = (0, g.stride(0)) if varlen else (g.stride(0), g.stride(1))
    pre_m = 16 if sq <= 16 else 64
    args = (out, dout, g, delta, cu_seqlens_q if varlen else dummy_i32(out.device), *_strides3(out, varlen),
            *_strides3(dout, varlen), slb, slh, sgb, sgh, H, sq)
    constexprs = dict(HEAD_DIM=D, BLOCK_D=max(pow2(D), 16), BLOCK_M=pre_m, IS_VARLEN=varlen, HAS_DLSE=dlse is not None,
                      num_warps=4)
    launch(_bwd_preprocess, (cdiv(sq, pre_m), B * H), args, constexprs,
           ("bwd_delta", D, pre_m, varlen, dlse is not None), bwd=True)
    return delta


def attention_bwd(dout, q, k, v, out, lse, dq, dk, dv, *, dlse=None, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=0, max_seqlen_k=0, softmax_scale, window=(-1, -1), softcap=0.0, alibi_slopes=None,
                  dropout_p=0.0, seed=0, deterministic=False, config: BwdConfig | None = None,
                  dq_config: FwdConfig | None = None):
    """Fill dq (like q), dk/dv (like k/v). Shapes as attention_fwd; lse as it returned. Inputs pre-validated."""
    varlen = cu_seqlens_q is not None
    if varlen:
        B, (_, H, D), Hkv = cu_seqlens_q.numel() - 1, q.shape, k.shape[1]
        sq, sk = max_seqlen_q, max_seqlen_k
        slb, slh = 0, lse.stride(0)
    else:
        B, sq, H, D = q.shape
        sk, Hkv = k.shape[1], k.shape[2]
        slb, slh = lse.stride(0), lse.stride(1)
    if B == 0 or H == 0 or (sq == 0 and sk == 0):
        return dq, dk, dv
    if sq == 0 or sk == 0:  # nothing attends: every gradient is zero
        dq.zero_(), dk.zero_(), dv.zero_()
        return dq, dk, dv
    left, right = window
    BD = max(pow2(D), 16)
    dummy = dummy_i32(q.device)
    cu_q = cu_seqlens_q if varlen else dummy
    cu_k = cu_seqlens_k if varlen else dummy
    alibi = alibi_slopes if alibi_slopes is not None else lse
    if alibi_slopes is not None:
        sab, sah = (0, alibi_slopes.stride(0)) if alibi_slopes.dim() == 1 else alibi_slopes.stride()
    else:
        sab = sah = 0
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    flags = dict(IS_VARLEN=varlen, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, HAS_SOFTCAP=softcap > 0,
                 HAS_ALIBI=alibi_slopes is not None, HAS_DROPOUT=dropout_p > 0, PRECISION=precision)
    scalars = (H, H // Hkv, sq, sk, float(softmax_scale), float(softcap), int(left), int(right), float(dropout_p),
               int(seed))

    delta = bwd_delta(out, dout, lse, dlse, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=sq)

    # fp32 inputs accumulate dQ atomics straight into dq when it is contiguous; else an fp32 buffer.
    atomic = not deterministic
    if atomic:
        dq_acc = dq if (dq.dtype == torch.float32 and dq.is_contiguous()) else torch.empty(
            dq.shape, dtype=torch.float32, device=dq.device)
    else:
        dq_acc = dq

    def launch_dkdv(cfg: BwdConfig):
        if atomic:
            dq_acc.zero_()
        _attn_bwd_dkdv_kernel[(cdiv(sk, cfg.block_n) * cfg.d_split, B * Hkv)](
            q, k, v, dout, lse, delta, dk, dv, dq_acc, cu_q, cu_k, alibi,
            *_strides3(q, varlen), *_strides3(k, varlen), *_strides3(v, varlen), *_strides3(dout, varlen),
            *_strides3(dk, varlen), *_strides3(dv, varlen), *_strides3(dq_acc, varlen), slb, slh, sab, sah,
            *scalars, HEAD_DIM=D, BLOCK_D=BD, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ATOMIC_DQ=atomic, **flags,
            D_SPLIT=cfg.d_split, num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    if config is None:
        config, candidates = plan("bwd", q, head_dim=D, seqlen_q=sq, seqlen_k=sk, causal=right == 0,
                                  bench=lambda cfg: bench_ms(lambda: launch_dkdv(cfg)))
        launch_with_fallback(launch_dkdv, config, candidates)
    else:
        launch_dkdv(config)
    if atomic:
        if dq_acc is not dq:
            dq.copy_(dq_acc)
        return dq, dk, dv

    def launch_dq(cfg: FwdConfig):
        _attn_bwd_dq_kernel[(cdiv(sq, cfg.block_m), B * H)](
            q, k, v, dout, lse, delta, dq, cu_q, cu_k, alibi,
            *_strides3(q, varlen), *_strides3(k, varlen), *_strides3(v, varlen), *_strides3(dout, varlen),
            *_strides3(dq, varlen), slb, slh, sab, sah, *scalars,
            HEAD_DIM=D, BLOCK_D=BD, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **flags,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    if dq_config is None:
        dq_config, candidates = plan("dq", q, head_dim=D, seqlen_q=sq, seqlen_k=sk, causal=right == 0,
                                     bench=lambda cfg: bench_ms(lambda: launch_dq(cfg)))
        launch_with_fallback(launch_dq, dq_config, candidates)
    else:
        launch_dq(dq_config)
    return dq, dk, dv
