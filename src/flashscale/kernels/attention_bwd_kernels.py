"""The Triton kernels of the FA2 backward (attention_bwd.py, where the math, the launchers and the names callers
import are): the delta pre-pass (_bwd_preprocess), the dK/dV kernel with its optional dQ atomics (_attn_bwd_dkdv_kernel
over _dkdv_inner), the deterministic dQ kernel (_attn_bwd_dq_kernel), their row loads and row statistics, and the
float32-to-16-bit scale-and-cast (_scale_cast_kernel). Apart from the launchers so that the JIT code and its
globals sit in one module; the launchers read these names from attention_bwd's globals, where
benchmarks/attention_resources.py swaps them for its capturing wrappers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashscale.kernels.attention_common import LOG2E, block_range, dropout_keep, scores_log2, seq_bounds, visible


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
