"""FlashAttention-2 forward in Triton: out = softmax(scores) @ V and the row log-sum-exp.

Grid: (query blocks, batch * heads), so a long sequence with a small batch still fills the GPU. Each
program keeps its (BLOCK_M, D) query tile on chip and streams K/V tiles: online softmax in exp2 with the
scale folded in, the accumulator divided by the row sum only once at the end (FA2's fewer non-matmul
FLOPs). Only blocks that intersect the causal/window band are visited, and only the band's edge blocks
(and the ragged last block) pay for a mask. GQA/MQA: the K/V head is h // group, by index, never a copy.

On Hopper K/V tiles come through TMA (per-program device-side tensor descriptors whose bounds are this
sequence's, so out-of-range rows and the padded head dim read as zeros); elsewhere, and under the
interpreter when asked, through masked pointer loads.

Shapes: B batch, S sequence, H query heads, G = H // Hkv, D head dim, BD = D padded to a power of 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashscale.kernels.attention_common import (LOG2E, block_range, dropout_keep, scores_log2, seq_bounds,
                                                 visible)
from flashscale.kernels.attention_tune import FwdConfig, bench_ms, cdiv, dummy_i32, launch_with_fallback, plan, pow2, tma_ok


@triton.jit
def _load_tile(ptr, desc, start, seqlen, stride, offs_r, offs_d, HEAD_DIM: tl.constexpr,
               USE_TMA: tl.constexpr, CHECK_ROWS: tl.constexpr, PAD_D: tl.constexpr):
    """(BLOCK, BD) rows [start, start + BLOCK) of a (seqlen, D) matrix; out-of-range reads are 0."""
    if USE_TMA:
        return desc.load([start, 0])
    ptrs = ptr + (start + offs_r)[:, None] * stride + offs_d[None, :]
    if CHECK_ROWS:
        return tl.load(ptrs, mask=((start + offs_r)[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if PAD_D:
        return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return tl.load(ptrs)


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, K, V, desc_k, desc_v, stride_ks, stride_vs, start, end, offs_m, offs_n,
               offs_d, seqlen_k, off, qk_scale, softcap2, slope2, window_left, window_right, seed, rng_base,
               row0, pitch4, dropout_p, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, PAD_D: tl.constexpr, USE_TMA: tl.constexpr,
               WARP_SPEC: tl.constexpr, PRECISION: tl.constexpr):
    for start_n in tl.range(start, end, BLOCK_N, warp_specialize=WARP_SPEC):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = _load_tile(K, desc_k, start_n, seqlen_k, stride_ks, offs_n, offs_d, HEAD_DIM, USE_TMA, MASKED, PAD_D)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BM, BN) fp32
        s, _ = scores_log2(qk, offs_m[:, None], cols[None, :], off, qk_scale, softcap2, slope2, HAS_SOFTCAP,
                           HAS_ALIBI)
        if MASKED:
            vis = visible(offs_m[:, None], cols[None, :], seqlen_k, off, window_left, window_right, HAS_LEFT,
                          HAS_RIGHT)
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # a row with nothing visible yet keeps m = -inf; subtract 0 there instead (no -inf - -inf NaN)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = m_new
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if HAS_DROPOUT:  # the normalizer l keeps every entry; only the P @ V product drops
            keep = dropout_keep(seed, rng_base, row0, start_n, pitch4, dropout_p, BLOCK_M, BLOCK_N)
            p = tl.where(keep, p, 0.0)
        v = _load_tile(V, desc_v, start_n, seqlen_k, stride_vs, offs_n, offs_d, HEAD_DIM, USE_TMA, MASKED, PAD_D)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE, CU_Q, CU_K, ALIBI,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ab, stride_ah,
    H, GROUP, seqlen_q, seqlen_k, sm_scale, softcap, window_left, window_right, dropout_p, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, USE_TMA: tl.constexpr, WARP_SPEC: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Heaviest query blocks first: under a causal mask the last blocks see the most keys, and launching
    # them early keeps the tail of the grid short.
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    start_q, len_q, start_k, len_k = seq_bounds(CU_Q, CU_K, b, seqlen_q, seqlen_k, IS_VARLEN)
    m0 = start_m * BLOCK_M
    if m0 >= len_q:
        return
    off = len_k - len_q
    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + start_q * stride_qs + h.to(tl.int64) * stride_qh
    k_base = K + b64 * stride_kb + start_k * stride_ks + hk.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + start_k * stride_vs + hk.to(tl.int64) * stride_vh
    o_base = O + b64 * stride_ob + start_q * stride_os + h.to(tl.int64) * stride_oh
    lse_base = LSE + b64 * stride_lb + h.to(tl.int64) * stride_lh + start_q
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    if USE_TMA:
        # bounds = this sequence's, so TMA zero-fills past its end; >= 1 row keeps an empty sequence's
        # descriptor well-formed (it is never read: no key block is visited)
        rows_k = tl.maximum(len_k, 1)
        desc_k = tl.make_tensor_descriptor(k_base, shape=[rows_k, HEAD_DIM], strides=[stride_ks, 1],
                                           block_shape=[BLOCK_N, BLOCK_D])
        desc_v = tl.make_tensor_descriptor(v_base, shape=[rows_k, HEAD_DIM], strides=[stride_vs, 1],
                                           block_shape=[BLOCK_N, BLOCK_D])
    else:
        desc_k = k_base
        desc_v = v_base

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=(offs_m[:, None] < len_q) & (offs_d[None, :] < HEAD_DIM), other=0.0)

    if HAS_SOFTCAP:
        qk_scale = sm_scale / softcap
        softcap2 = softcap * LOG2E
    else:
        qk_scale = sm_scale * LOG2E
        softcap2 = 0.0
    slope2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(ALIBI + b * stride_ab + h * stride_ah) * LOG2E
    rng_base = 0
    pitch4 = (seqlen_k + 3) // 4  # Philox counters per row: seqlen_k is the (max) pitch, as the reference
    if HAS_DROPOUT:
        rng_base = bh.to(tl.int64) * seqlen_q * pitch4
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, hi, full_lo, full_hi = block_range(m0, len_q, len_k, off, window_left, window_right, BLOCK_M, BLOCK_N,
                                           HAS_LEFT, HAS_RIGHT)
    # The unmasked middle first: it is the long stretch, and the masked edges then need no special case for
    # "first block" (their rows may be fully masked; the inner loop guards that).
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, stride_ks, stride_vs, full_lo,
                               full_hi, offs_m, offs_n, offs_d, len_k, off, qk_scale, softcap2, slope2,
                               window_left, window_right, seed, rng_base, m0, pitch4, dropout_p, HEAD_DIM,
                               BLOCK_M, BLOCK_N, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, PAD_D,
                               USE_TMA, WARP_SPEC, PRECISION)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, stride_ks, stride_vs, lo, full_lo,
                               offs_m, offs_n, offs_d, len_k, off, qk_scale, softcap2, slope2, window_left,
                               window_right, seed, rng_base, m0, pitch4, dropout_p, HEAD_DIM, BLOCK_M, BLOCK_N, True,
                               HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, PAD_D, USE_TMA, False,
                               PRECISION)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, stride_ks, stride_vs, full_hi, hi,
                               offs_m, offs_n, offs_d, len_k, off, qk_scale, softcap2, slope2, window_left,
                               window_right, seed, rng_base, m0, pitch4, dropout_p, HEAD_DIM, BLOCK_M, BLOCK_N, True,
                               HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, PAD_D, USE_TMA, False,
                               PRECISION)

    # Epilogue: one division by l per row. Empty rows (l = 0) give 0 output and lse = -inf.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    if HAS_DROPOUT:
        out = out * (1.0 / (1.0 - dropout_p))
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    row_ok = offs_m < len_q
    tl.store(lse_base + offs_m, lse, mask=row_ok)
    tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


def _tma_allocator(size: int, alignment: int, stream):
    # Device-side tensor descriptors live in a small global scratch buffer Triton asks us for.
    return torch.empty(size, device="cuda", dtype=torch.int8)


def attention_fwd(q, k, v, out, lse, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                  softmax_scale, window=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=0,
                  config: FwdConfig | None = None):
    """Launch the forward. Inputs are validated by flashscale.ops.attention; this only computes.

    dense: q (B, Sq, H, D), k/v (B, Sk, Hkv, D), out like q, lse (B, H, Sq) fp32.
    varlen: q (Tq, H, D), k/v (Tk, Hkv, D), out like q, lse (H, Tq) fp32, cu_seqlens (B+1,) int32.
    Any strides with a unit last dim. `config` overrides the tuned block sizes (tests use it).
    """
    varlen = cu_seqlens_q is not None
    if varlen:
        B, H, D = cu_seqlens_q.numel() - 1, q.shape[1], q.shape[2]
        Hkv = k.shape[1]
        sq, sk = max_seqlen_q, max_seqlen_k
        sqb = skb = svb = sob = slb = 0
        (sqs, sqh), (sks, skh), (svs, svh), (sos, soh) = (t.stride()[:2] for t in (q, k, v, out))
        slh = lse.stride(0)
    else:
        B, sq, H, D = q.shape
        sk, Hkv = k.shape[1], k.shape[2]
        (sqb, sqs, sqh), (skb, sks, skh), (svb, svs, svh), (sob, sos, soh) = (t.stride()[:3] for t in (q, k, v, out))
        slb, slh = lse.stride(0), lse.stride(1)
    if B == 0 or sq == 0 or H == 0:
        return out, lse
    left, right = window
    if alibi_slopes is not None:
        sab, sah = (0, alibi_slopes.stride(0)) if alibi_slopes.dim() == 1 else alibi_slopes.stride()
    else:
        sab = sah = 0
    dummy = dummy_i32(q.device)

    def launch(cfg: FwdConfig):
        use_tma = cfg.tma and tma_ok(q, k, v)
        if use_tma and q.is_cuda:
            triton.set_allocator(_tma_allocator)
        grid = (cdiv(sq, cfg.block_m), B * H)
        _attn_fwd_kernel[grid](
            q, k, v, out, lse,
            cu_seqlens_q if varlen else dummy, cu_seqlens_k if varlen else dummy,
            alibi_slopes if alibi_slopes is not None else lse,
            sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh, slb, slh, sab, sah,
            H, H // Hkv, sq, sk, float(softmax_scale), float(softcap), int(left), int(right), float(dropout_p),
            int(seed),
            HEAD_DIM=D, BLOCK_D=max(pow2(D), 16), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            IS_VARLEN=varlen, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, HAS_SOFTCAP=softcap > 0,
            HAS_ALIBI=alibi_slopes is not None, HAS_DROPOUT=dropout_p > 0, USE_TMA=use_tma,
            WARP_SPEC=cfg.warp_specialize and use_tma, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )

    if config is not None:  # explicit (tests, tuning tools): exactly this one
        launch(config)
        return out, lse
    config, candidates = plan("fwd", q, head_dim=D, seqlen_q=sq, seqlen_k=sk, causal=right == 0,
                              dropout=dropout_p > 0, bench=lambda cfg: bench_ms(lambda: launch(cfg)))
    launch_with_fallback(launch, config, candidates)
    return out, lse
