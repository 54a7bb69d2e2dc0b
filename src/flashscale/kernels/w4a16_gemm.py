"""W4A16 tensor-core kernel: y (M, N) = x (M, K) @ W (K, N), W 4-bit in the PackedW4 layout.

Swap AB: the kernel computes y^T tile (BN, BM) = W^T tile (BN, BK) @ x^T tile (BK, BM), so the
dequantized weights are the MMA's A operand, which Hopper's wgmma (and mma.sync) take from registers:
the packed words land, one 16-byte load per thread, directly in the A-fragment registers (the PackedW4
layout is that fragment), are dequantized there, and never touch shared or global memory as 16-bit
values. x^T is the B operand, loaded through shared memory by Triton's pipeliner. Small M (decode)
pads the token dimension to BM = 16, which the MMA's n dimension allows.

Split-K (grid axis 1) spreads K over programs when N/BN tiles cannot fill the machine (decode);
the same launch finishes the sum, by per-element atomics (store_or_reduce) or, with SLICES, by
per-split workspace slices and one ticket a tile (w4a16_common). Tile order over (n, m) is grouped
so GROUP n-tiles share a sweep over the m-tiles (their weights stay in L2 at prefill sizes).

Shapes: x (M, K) row-major (a gather through perm under act-order), packed (N_pad/16, K_pad/64, 32, 4),
sz (NG, N_pad), y (M, N).
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashscale.kernels.w4a16_common import (group_consts, last_split, nibble_float, reset_ticket, store_or_reduce,
                                             sum_partials, word_shifts, write_partial)


@triton.jit
def _dq(f, S, C, DT: tl.constexpr):
    return (f * S - C).to(DT)


@triton.jit(do_not_specialize=["M", "SPLIT_K"])
def w4a16_gemm_kernel(
    x_ptr, pk_ptr, sz_ptr, perm_ptr, y_ptr, bias_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_ym, stride_pn, stride_sg, MAGIC, SPLIT_K,
    G: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, SLICES: tl.constexpr = False,
):
    DT: tl.constexpr = y_ptr.dtype.element_ty
    NB: tl.constexpr = BN // 16  # 16-row fragments per tile
    KT: tl.constexpr = BK // 64  # 64-wide fragment columns per K step
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_n = tl.cdiv(N, BN)
    num_m = tl.cdiv(M, BM)
    width = GROUP * num_m
    first_n = (pid // width) * GROUP
    gsz = tl.minimum(num_n - first_n, GROUP)
    pid_n = first_n + (pid % width) % gsz
    pid_m = (pid % width) // gsz

    k_pad = tl.cdiv(K, 64) * 64
    n_iter = tl.cdiv(k_pad, BK)
    it0 = pid_k * n_iter // SPLIT_K
    it1 = (pid_k + 1) * n_iter // SPLIT_K

    nb = tl.arange(0, NB)
    kt = tl.arange(0, KT)
    lane = tl.arange(0, 32)
    ii = tl.arange(0, 4)
    # (NB, KT, 32, 4) word offsets of one K step; 128 words per (fragment row, fragment column)
    pk_off = ((pid_n * NB + nb) * stride_pn)[:, None, None, None] + kt[None, :, None, None] * 128 \
        + lane[None, None, :, None] * 4 + ii[None, None, None, :]
    row = pid_n * BN + nb[:, None, None, None] * 16 + (lane // 4)[None, None, :, None]  # (NB, 1, 32, 1), n3 = 0
    row_ok = row < tl.cdiv(N, 16) * 16
    sz_col = pid_n * BN + nb[:, None, None, None] * 16 + (lane // 4)[None, None, :, None] * 2  # rows g, g+8 adjacent

    offs_m = pid_m * BM + tl.arange(0, BM)
    m_ok = offs_m[None, :] < M
    offs_kk = tl.arange(0, BK)
    x_base = x_ptr + offs_m[None, :] * stride_xm

    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for it in range(it0, it1):
        k0 = it * BK
        if EVEN_K and EVEN_N:
            p = tl.load(pk_ptr + pk_off + (k0 // 64) * 128)
        else:
            kmask = (k0 + kt * 64 < k_pad)[None, :, None, None]
            p = tl.load(pk_ptr + pk_off + (k0 // 64) * 128, mask=kmask & row_ok, other=0)
        # the group of every K position of the step: one per step when G >= BK
        if G >= BK:
            gidx = k0 // G
        elif G >= 64:
            gidx = ((k0 + kt * 64) // G)[None, :, None, None]
        else:
            gidx = ((k0 + kt[:, None] * 64 + ii[None, :] * 16) // G)[None, :, None, :]
        gidx = tl.minimum(gidx, K // G - 1)  # K tail of a whole-row group
        if EVEN_N:
            sza = tl.load(sz_ptr + gidx * stride_sg + sz_col)  # rows n3 = 0
            szb = tl.load(sz_ptr + gidx * stride_sg + sz_col + 1)  # rows n3 = 1
        else:
            sza = tl.load(sz_ptr + gidx * stride_sg + sz_col, mask=row_ok, other=0)
            szb = tl.load(sz_ptr + gidx * stride_sg + sz_col + 1, mask=row_ok, other=0)
        s12a, c12a, s16a, c16a = group_consts(sza)
        s12b, c12b, s16b, c16b = group_consts(szb)
        r16, l8, r8 = word_shifts(p)
        # nibble j = 4*k3 + 2*n3 + k0: even j in the 16-window, odd j in the 12-window
        w0 = _dq(nibble_float(r16, MAGIC, False), s16a, c16a, DT)
        w1 = _dq(nibble_float(l8, MAGIC, True), s12a, c12a, DT)
        w2 = _dq(nibble_float(l8, MAGIC, False), s16b, c16b, DT)
        w3 = _dq(nibble_float(p, MAGIC, True), s12b, c12b, DT)
        w4 = _dq(nibble_float(p, MAGIC, False), s16a, c16a, DT)
        w5 = _dq(nibble_float(r8, MAGIC, True), s12a, c12a, DT)
        w6 = _dq(nibble_float(r8, MAGIC, False), s16b, c16b, DT)
        w7 = _dq(nibble_float(r16, MAGIC, True), s12b, c12b, DT)
        # register-only reshuffle into the (BN, BK) tile: the joins stack nibbles in registers and
        # the permute/reshape relabel them; the layout equals the MMA's A fragment, no data moves
        e = tl.join(tl.join(tl.join(w0, w1), tl.join(w2, w3)), tl.join(tl.join(w4, w5), tl.join(w6, w7)))
        e = tl.reshape(e, [NB, KT, 8, 4, 4, 2, 2, 2])  # nb, kt, g, t, i, k0, n3, k3
        e = tl.permute(e, [0, 6, 2, 1, 4, 7, 3, 5])  # nb, n3, g, kt, i, k3, t, k0
        a = tl.reshape(e, [BN, BK])  # row 16nb + 8n3 + g, column 64kt + 16i + 8k3 + 2t + k0
        offs_k = k0 + offs_kk
        if HAS_PERM:
            kk = tl.load(perm_ptr + offs_k, mask=offs_k < K, other=0)
        else:
            kk = offs_k
        xt = tl.load(x_base + kk[:, None], mask=m_ok & (offs_k[:, None] < K), other=0.0)  # (BK, BM)
        acc = tl.dot(a, xt, acc)

    offs_n = pid_n * BN + tl.arange(0, BN)
    mask = (offs_n[:, None] < N) & m_ok
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
    y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
    ws_off = offs_m[None, :] * N + offs_n[:, None]
    if SLICES:
        if SPLIT_K > 1:
            # per-split slices (ws_ptr is the slice buffer here, M*N a slice), one ticket a tile
            write_partial(acc, ws_ptr, ws_off, mask, M * N)
            if last_split(cnt_ptr, pid, SPLIT_K):
                tot = sum_partials(ws_ptr, ws_off, mask, M * N, SPLIT_K)
                if HAS_BIAS:
                    tot += bias
                tl.store(y_ptrs, tot.to(DT), mask=mask)
                reset_ticket(cnt_ptr, pid)
        else:
            if HAS_BIAS:
                acc += bias
            tl.store(y_ptrs, acc.to(DT), mask=mask)
    else:
        store_or_reduce(acc, y_ptrs, ws_off, mask, bias, ws_ptr, cnt_ptr, SPLIT_K, HAS_BIAS)
