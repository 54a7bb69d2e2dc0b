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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashscale.kernels.attention_common import LOG2E, block_range, dropout_keep, scores_log2, seq_bounds, visible
from flashscale.kernels.attention_tune import (BwdConfig, FwdConfig, bench_ms, cdiv, dummy_i32, launch_with_fallback, plan,
                                               pow2)
from flashscale.kernels.launch import launch


@triton.jit
def _bwd_preprocess(O, DO, DLSE, DELTA, CU_Q, stride_ob, stride_os, stride_oh, stride_db, stride_ds, stride_dh,
                    stride_lb, stride_lh, stride_gb, stride_gh, H, seqlen_q, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_DLSE: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    start_q, len_q, _, _ = seq_bounds(CU_Q, CU_Q, b, seqlen_q, seqlen_q, IS_VARLEN)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < len_q) & (offs_d[None, :] < HEAD_DIM)
    b64 = b.to(tl.int64)
    o = tl.load(O + b64 * stride_ob + (start_q + rows)[:, None] * stride_os + h * stride_oh + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + b64 * stride_db + (start_q + rows)[:, None] * stride_ds + h * stride_dh + offs_d[None, :],
                 mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    if HAS_DLSE:  # d lse_i / d s_ij = P_ij, which folds into delta: dS = P * (dP - (delta - dlse))
        delta -= tl.load(DLSE + b64 * stride_gb + h * stride_gh + start_q + rows, mask=rows < len_q, other=0.0)
    tl.store(DELTA + b64 * stride_lb + h * stride_lh + start_q + rows, delta, mask=rows < len_q)


@triton.jit
def _load_rows(ptr, rows, offs_d, stride, len_rows, HEAD_DIM: tl.constexpr, CHECK_ROWS: tl.constexpr,
               PAD_D: tl.constexpr):
    ptrs = ptr + rows[:, None] * stride + offs_d[None, :]
    if CHECK_ROWS:
        return tl.load(ptrs, mask=(rows[:, None] < len_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if PAD_D:
        return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return tl.load(ptrs)


@triton.jit
def _row_stats(LSE, DELTA, rows, len_q, CHECK_ROWS: tl.constexpr):
    """LSE in log2 units (+inf for empty or out-of-range rows, so their P is exactly 0) and delta."""
    if CHECK_ROWS:
        lse = tl.load(LSE + rows, mask=rows < len_q, other=float("inf"))
        delta = tl.load(DELTA + rows, mask=rows < len_q, other=0.0)
    else:
        lse = tl.load(LSE + rows)
        delta = tl.load(DELTA + rows)
    lse = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    return lse, delta


@triton.jit
def _dkdv_inner(dk, dv, k, v, k_s, q_base, do_base, lse_base, delta_base, dq_base, stride_qs, stride_dos, stride_dqs,
                start, end, n0, cols, offs_m, offs_d, offs_ds, len_q, len_k, off, sm_scale, qk_scale, softcap2, slope2,
                window_left, window_right, seed, rng_base, pitch4, dropout_p, HEAD_DIM: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, PAD_D: tl.constexpr,
                ATOMIC_DQ: tl.constexpr, PRECISION: tl.constexpr, D_SPLIT: tl.constexpr):
    """One stretch of query blocks for the key block of dk/dv. With D_SPLIT > 1 this program owns the head-dim
    slice offs_ds of dK, dV (and of its dQ atomics): S and dP still take the whole head dim (q, do, k, v), the
    three products into the slice take q_s, do_s, k_s."""
    for start_m in range(start, end, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + offs_m
        q = _load_rows(q_base, rows, offs_d, stride_qs, len_q, HEAD_DIM, MASKED, PAD_D)
        do = _load_rows(do_base, rows, offs_d, stride_dos, len_q, HEAD_DIM, MASKED, PAD_D)
        if D_SPLIT > 1:  # this program's slice of the head dim (the same rows again: L1/L2 hits)
            q_s = _load_rows(q_base, rows, offs_ds, stride_qs, len_q, HEAD_DIM, MASKED, True)
            do_s = _load_rows(do_base, rows, offs_ds, stride_dos, len_q, HEAD_DIM, MASKED, True)
        else:
            q_s = q
            do_s = do
        lse2, delta = _row_stats(lse_base, delta_base, rows, len_q, MASKED)
        qkT = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BN, BM): keys along rows
        sT, tT = scores_log2(qkT, rows[None, :], cols[:, None], off, qk_scale, softcap2, slope2, HAS_SOFTCAP,
                             HAS_ALIBI)
        pT = tl.exp2(sT - lse2[None, :])
        if MASKED:
            vis = visible(rows[None, :], cols[:, None], len_k, off, window_left, window_right, HAS_LEFT, HAS_RIGHT)
            pT = tl.where(vis, pT, 0.0)
        dpT = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BN, BM)
        if HAS_DROPOUT:
            # drawn query-major like the forward, then turned to this (keys, queries) tile
            keep = tl.trans(dropout_keep(seed, rng_base, start_m, n0, pitch4, dropout_p, BLOCK_M, BLOCK_N))
            inv_keep = 1.0 / (1.0 - dropout_p)
            pdT = tl.where(keep, pT * inv_keep, 0.0)
            dpT = tl.where(keep, dpT * inv_keep, 0.0)
        else:
            pdT = pT
        dv = tl.dot(pdT.to(do.dtype), do_s, dv, input_precision=PRECISION)
        dsT = pT * (dpT - delta[None, :])
        if HAS_SOFTCAP:
            dsT = dsT * (1.0 - tT * tT)
        dsT_lp = dsT.to(q.dtype)
        dk = tl.dot(dsT_lp, q_s, dk, input_precision=PRECISION)
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(dsT_lp), k_s, input_precision=PRECISION) * sm_scale  # (BM, BD / D_SPLIT)
            tl.atomic_add(dq_base + rows[:, None] * stride_dqs + offs_ds[None, :], dq,
                          mask=(rows[:, None] < len_q) & (offs_ds[None, :] < HEAD_DIM), sem="relaxed")
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ, CU_Q, CU_K, ALIBI,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
    stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh, stride_ab, stride_ah,
    H, GROUP, seqlen_q, seqlen_k, sm_scale, softcap, window_left, window_right, dropout_p, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr, PRECISION: tl.constexpr,
    D_SPLIT: tl.constexpr,
):
    pid_n = tl.program_id(0) // D_SPLIT
    d_slice = tl.program_id(0) % D_SPLIT
    bhk = tl.program_id(1)
    HKV = H // GROUP
    b = bhk // HKV
    hk = bhk % HKV
    start_q, len_q, start_k, len_k = seq_bounds(CU_Q, CU_K, b, seqlen_q, seqlen_k, IS_VARLEN)
    n0 = pid_n * BLOCK_N
    if n0 >= len_k:
        return
    off = len_k - len_q
    b64 = b.to(tl.int64)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    BLOCK_DS: tl.constexpr = BLOCK_D // D_SPLIT  # the head-dim slice of dK/dV this program owns
    offs_ds = d_slice * BLOCK_DS + tl.arange(0, BLOCK_DS)
    kv_mask = (cols[:, None] < len_k) & (offs_d[None, :] < HEAD_DIM)
    k_ptrs = K + b64 * stride_kb + (start_k + cols)[:, None] * stride_ks + hk * stride_kh + offs_d[None, :]
    v_ptrs = V + b64 * stride_vb + (start_k + cols)[:, None] * stride_vs + hk * stride_vh + offs_d[None, :]
    k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
    v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    ds_mask = (cols[:, None] < len_k) & (offs_ds[None, :] < HEAD_DIM)
    if D_SPLIT > 1:
        k_s = tl.load(K + b64 * stride_kb + (start_k + cols)[:, None] * stride_ks + hk * stride_kh + offs_ds[None, :],
                      mask=ds_mask, other=0.0)
    else:
        k_s = k
    dk = tl.zeros([BLOCK_N, BLOCK_DS], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DS], dtype=tl.float32)
    if HAS_SOFTCAP:
        qk_scale = sm_scale / softcap
        softcap2 = softcap * LOG2E
    else:
        qk_scale = sm_scale * LOG2E
        softcap2 = 0.0
    pitch4 = (seqlen_k + 3) // 4  # dropout: Philox counters per row, as the forward
    # Query blocks that see this key block: the forward's question transposed (see block_range).
    lo, hi, full_lo, full_hi = block_range(n0, len_k, len_q, -off, window_right, window_left, BLOCK_N, BLOCK_M,
                                           HAS_RIGHT, HAS_LEFT)
    for g in range(GROUP):
        h = hk * GROUP + g
        q_base = Q + b64 * stride_qb + start_q * stride_qs + h * stride_qh
        do_base = DO + b64 * stride_dob + start_q * stride_dos + h * stride_doh
        dq_base = DQ + b64 * stride_dqb + start_q * stride_dqs + h * stride_dqh
        lse_base = LSE + b64 * stride_lb + h * stride_lh + start_q
        delta_base = DELTA + b64 * stride_lb + h * stride_lh + start_q
        slope2 = 0.0
        if HAS_ALIBI:
            slope2 = tl.load(ALIBI + b * stride_ab + h * stride_ah) * LOG2E
        rng_base = 0
        if HAS_DROPOUT:
            rng_base = (b64 * H + h) * seqlen_q * pitch4
        dk, dv = _dkdv_inner(dk, dv, k, v, k_s, q_base, do_base, lse_base, delta_base, dq_base, stride_qs, stride_dos,
                             stride_dqs, full_lo, full_hi, n0, cols, offs_m, offs_d, offs_ds, len_q, len_k, off, sm_scale,
                             qk_scale, softcap2, slope2, window_left, window_right, seed, rng_base, pitch4,
                             dropout_p, HEAD_DIM, BLOCK_M, BLOCK_N, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI,
                             HAS_DROPOUT, PAD_D, ATOMIC_DQ, PRECISION, D_SPLIT)
        dk, dv = _dkdv_inner(dk, dv, k, v, k_s, q_base, do_base, lse_base, delta_base, dq_base, stride_qs, stride_dos,
                             stride_dqs, lo, full_lo, n0, cols, offs_m, offs_d, offs_ds, len_q, len_k, off, sm_scale, qk_scale,
                             softcap2, slope2, window_left, window_right, seed, rng_base, pitch4, dropout_p,
                             HEAD_DIM, BLOCK_M, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                             PAD_D, ATOMIC_DQ, PRECISION, D_SPLIT)
        dk, dv = _dkdv_inner(dk, dv, k, v, k_s, q_base, do_base, lse_base, delta_base, dq_base, stride_qs, stride_dos,
                             stride_dqs, full_hi, hi, n0, cols, offs_m, offs_d, offs_ds, len_q, len_k, off, sm_scale, qk_scale,
                             softcap2, slope2, window_left, window_right, seed, rng_base, pitch4, dropout_p,
                             HEAD_DIM, BLOCK_M, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                             PAD_D, ATOMIC_DQ, PRECISION, D_SPLIT)
    dk = dk * sm_scale
    tl.store(DK + b64 * stride_dkb + (start_k + cols)[:, None] * stride_dks + hk * stride_dkh + offs_ds[None, :],
             dk.to(DK.dtype.element_ty), mask=ds_mask)
    tl.store(DV + b64 * stride_dvb + (start_k + cols)[:, None] * stride_dvs + hk * stride_dvh + offs_ds[None, :],
             dv.to(DV.dtype.element_ty), mask=ds_mask)


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, ALIBI,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh, stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh, stride_ab,
    stride_ah, H, GROUP, seqlen_q, seqlen_k, sm_scale, softcap, window_left, window_right, dropout_p, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
):
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
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_rows(Q + b64 * stride_qb + start_q * stride_qs + h * stride_qh, rows, offs_d, stride_qs, len_q,
                   HEAD_DIM, True, PAD_D)
    do = _load_rows(DO + b64 * stride_dob + start_q * stride_dos + h * stride_doh, rows, offs_d, stride_dos, len_q,
                    HEAD_DIM, True, PAD_D)
    lse2, delta = _row_stats(LSE + b64 * stride_lb + h * stride_lh + start_q,
                             DELTA + b64 * stride_lb + h * stride_lh + start_q, rows, len_q, True)
    k_base = K + b64 * stride_kb + start_k * stride_ks + hk * stride_kh
    v_base = V + b64 * stride_vb + start_k * stride_vs + hk * stride_vh
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
    pitch4 = (seqlen_k + 3) // 4
    if HAS_DROPOUT:
        rng_base = bh.to(tl.int64) * seqlen_q * pitch4
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, hi, full_lo, full_hi = block_range(m0, len_q, len_k, off, window_left, window_right, BLOCK_M, BLOCK_N,
                                           HAS_LEFT, HAS_RIGHT)
    # One loop over [lo, hi): the mask is chosen per block (the edge blocks are few), keeping one copy of
    # the loop body; the summation order is fixed, so dQ is bitwise reproducible.
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = _load_rows(k_base, cols, offs_d, stride_ks, len_k, HEAD_DIM, True, PAD_D)
        v = _load_rows(v_base, cols, offs_d, stride_vs, len_k, HEAD_DIM, True, PAD_D)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s, t = scores_log2(qk, rows[:, None], cols[None, :], off, qk_scale, softcap2, slope2, HAS_SOFTCAP,
                           HAS_ALIBI)
        p = tl.exp2(s - lse2[:, None])
        if (start_n < full_lo) | (start_n >= full_hi):
            vis = visible(rows[:, None], cols[None, :], len_k, off, window_left, window_right, HAS_LEFT, HAS_RIGHT)
            p = tl.where(vis, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, rng_base, m0, start_n, pitch4, dropout_p, BLOCK_M, BLOCK_N)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    dq = dq * sm_scale
    tl.store(DQ + b64 * stride_dqb + (start_q + rows)[:, None] * stride_dqs + h * stride_dqh + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=(rows[:, None] < len_q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _scale_cast_kernel(X, Y, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0)
    tl.store(Y + offs, (x * scale).to(Y.dtype.element_ty), mask=mask)


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
