"""W4A16 matrix-vector kernel (one token, M = 1): y (N,) = x (K,) @ W (K, N) on the CUDA cores.

At M = 1 the work is one multiply-add per weight, so the unpacking decides the speed: per 8 weights
(one word) 3 shifts, 8 LOP3 and 8 FFMA, and the group scale and zero point are applied once per
step to partial sums instead of to every weight:
    sum_k x_k (q_k - z) s = S_p * sum_k x_k f_k - C_p * sum_k x_k      (f_k = 1 + q_k 2^(p-23))
per row, per window p (w4a16_common.py), with both sums kept per thread and per step (BK inputs,
inside one group: the launcher asks G % BK == 0 or a single group).

Layout: the same PackedW4 words as the tensor-core kernel, a step's tile (KT, NB, 32, 4) with KT
first so warps split the rows (NB) and the K direction stays inside a thread (the sums over KT and
the 4 words of a 16-byte load are register adds). Lanes 4g..4g+3 share rows 16nb+g and 16nb+8+g and
sum across those 4 lanes once at the end. Split-K (grid axis 1) fills the machine and finishes in the
same launch: per-element atomics (store_or_reduce) or, with SLICES, plain stores of each split's
partials to its own workspace slice and one ticket a program (the last split sums the slices in order).
PREFETCH (1 or 2): how many steps of packed words are in flight ahead of the one being computed.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashscale.kernels.pdl import l2_prefetch_rows, pdl_enter
from flashscale.kernels.w4a16_common import (group_consts, last_split, nibble_float, reset_ticket, store_or_reduce,
                                             sum_partials, word_shifts, write_partial)
from flashscale.kernels.w4a16_decode import (_dec_item, _dec_layout, _dec_range, _dec_store, _dec_tile, _dec_w, _dec_x,
                                             _next_item, _xor_all, w4a16_decode_kernel)

# The tensor-core decode kernel (M <= 16) and its stream-K helpers live in w4a16_decode.py (also the PROBE=1
# checksum _xor_all); these names stay importable from here (w4a16_launch, w4a16_aot, w4a16_ring_kernel, w4a16_gring).
__all__ = [
    "_dec_item", "_dec_layout", "_dec_range", "_dec_store", "_dec_tile", "_dec_w", "_dec_x", "_next_item",
    "w4a16_decode_kernel", "w4a16_gemv_kernel",
]


@triton.jit
def _x_at(x_ptr, perm_ptr, offs, K, HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr):
    if HAS_PERM:
        offs = tl.load(perm_ptr + offs, mask=offs < K, other=0)
    if EVEN_K:
        v = tl.load(x_ptr + offs)
    else:
        v = tl.load(x_ptr + offs, mask=offs < K, other=0.0)
    return v.to(tl.float32)


@triton.jit
def _x_words(x_ptr, perm_ptr, base, K, HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr):
    """(1, 32) input offsets of word i = 0 -> (1, 32, 4) float32 inputs at base + 16 i, and their sum
    (1, 32). Loaded as (1, 32) rows (one per lane, the same in every warp) and joined in registers:
    the layout Triton gives a (1, 32) load is the tile's with the rows broadcast, so nothing converts."""
    a0 = _x_at(x_ptr, perm_ptr, base, K, HAS_PERM, EVEN_K)
    a1 = _x_at(x_ptr, perm_ptr, base + 16, K, HAS_PERM, EVEN_K)
    a2 = _x_at(x_ptr, perm_ptr, base + 32, K, HAS_PERM, EVEN_K)
    a3 = _x_at(x_ptr, perm_ptr, base + 48, K, HAS_PERM, EVEN_K)
    return tl.reshape(tl.join(tl.join(a0, a2), tl.join(a1, a3)), [1, 32, 4]), (a0 + a1) + (a2 + a3)


@triton.jit
def _step_words(pk_ptr, pk_off, k0, k_pad, kt_first, nb_in, valid, UNMASKED: tl.constexpr):
    """(NB, KT, 128) packed words of the step starting at input k0. Masked words are left undefined:
    any word unpacks to finite floats, and they meet zero inputs (K tail) or unstored rows (N tail)."""
    off = pk_off + (k0 // 64) * 128
    if UNMASKED:
        return tl.load(pk_ptr + off)
    return tl.load(pk_ptr + off, mask=nb_in & (k0 + kt_first < k_pad) & valid)


@triton.jit
def _frag_column(x_ptr, perm_ptr, p, x_lane, kf, K, MAGIC, q16a, q12a, q16b, q12b, xs16, xs12,
                 HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr, ACC: tl.constexpr):
    """One 64-wide fragment column (inputs kf..kf+63) of NB fragments, words p (NB, 32, 4): partial
    sums per nibble window and row half, (NB, 32, 4); ACC adds them to the given ones."""
    x00, s00 = _x_words(x_ptr, perm_ptr, kf + x_lane, K, HAS_PERM, EVEN_K)  # (1, 32, 4): k3 = 0, k0 = 0
    x01, s01 = _x_words(x_ptr, perm_ptr, kf + x_lane + 1, K, HAS_PERM, EVEN_K)
    x10, s10 = _x_words(x_ptr, perm_ptr, kf + x_lane + 8, K, HAS_PERM, EVEN_K)
    x11, s11 = _x_words(x_ptr, perm_ptr, kf + x_lane + 9, K, HAS_PERM, EVEN_K)
    r16, l8, r8 = word_shifts(p)
    # nibble j = 4*k3 + 2*n3 + k0; even j in the 16-window, odd j in the 12-window
    if ACC:
        q16a = tl.fma(nibble_float(r16, MAGIC, False), x00, q16a)  # j = 0
        q12a = tl.fma(nibble_float(l8, MAGIC, True), x01, q12a)  # j = 1
        q16b = tl.fma(nibble_float(l8, MAGIC, False), x00, q16b)  # j = 2
        q12b = tl.fma(nibble_float(p, MAGIC, True), x01, q12b)  # j = 3
        xs16 = xs16 + (s00 + s10)  # (1, 32): the inputs each partial multiplied
        xs12 = xs12 + (s01 + s11)
    else:
        q16a = nibble_float(r16, MAGIC, False) * x00
        q12a = nibble_float(l8, MAGIC, True) * x01
        q16b = nibble_float(l8, MAGIC, False) * x00
        q12b = nibble_float(p, MAGIC, True) * x01
        xs16 = s00 + s10
        xs12 = s01 + s11
    q16a = tl.fma(nibble_float(p, MAGIC, False), x10, q16a)  # j = 4
    q12a = tl.fma(nibble_float(r8, MAGIC, True), x11, q12a)  # j = 5
    q16b = tl.fma(nibble_float(r8, MAGIC, False), x10, q16b)  # j = 6
    q12b = tl.fma(nibble_float(r16, MAGIC, True), x11, q12b)  # j = 7
    return q16a, q12a, q16b, q12b, xs16, xs12


@triton.jit(do_not_specialize=["SPLIT_K"])
def w4a16_gemv_kernel(
    x_ptr, pk_ptr, sz_ptr, perm_ptr, y_ptr, bias_ptr, ws_ptr, cnt_ptr,
    N, K, stride_pn, stride_sg, MAGIC, SPLIT_K,
    G: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BN: tl.constexpr, KT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    PREFETCH: tl.constexpr = 1, SLICES: tl.constexpr = False, PROBE: tl.constexpr = 0, PDL: tl.constexpr = False,
    L2PF: tl.constexpr = False,
):
    """PROBE (benchmarks/w4a16_probe.py): 1 the same loads with no dequantization (a checksum of the
    words per program, in ws), 2 no split-K reduction (each split writes its slice and stops).
    PDL: programmatic dependent launch (kernels.pdl): wait for the previous kernel before any memory access;
    L2PF: first ask for this program's packed words to be brought into L2."""
    NB: tl.constexpr = BN // 16
    BK: tl.constexpr = KT * 64
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    k_pad = tl.cdiv(K, 64) * 64
    n_iter = tl.cdiv(k_pad, BK)
    it0 = pid_k * n_iter // SPLIT_K
    it1 = (pid_k + 1) * n_iter // SPLIT_K
    if PDL and L2PF:  # words [it0 BK / 64 * 128, it1 ...) of each of the tile's fragment rows, in the row
        l2_prefetch_rows(pk_ptr, pid_n * NB, stride_pn, it0 * KT * 128,
                         tl.minimum(it1 * KT * 128, (k_pad // 64) * 128), tl.cdiv(N, 16), True, NB)
    pdl_enter(PDL)

    nb = tl.arange(0, NB)
    # (NB, KT, 128) words of one step: 128 contiguous words per fragment, so each load is 16 bytes a
    # thread and 512 bytes a warp; shaped so Triton's coalescing puts warps on NB and KT in registers
    pk_off = ((pid_n * NB + nb) * stride_pn)[:, None, None] + tl.arange(0, KT)[None, :, None] * 128 \
        + tl.arange(0, 128)[None, None, :]
    nb_in = ((pid_n * NB + nb) * 16 < tl.cdiv(N, 16) * 16)[:, None, None]
    kt_first = tl.arange(0, KT)[None, :, None] * 64  # (1, KT, 1)
    lane = tl.arange(0, 32)
    row = pid_n * BN + nb[:, None] * 16 + (lane // 4)[None, :]  # (NB, 32): rows of n3 = 0
    row_in = row < tl.cdiv(N, 16) * 16  # sz and the packed words are padded to 16 rows
    # sz pairs (row g, row g + 8) of a fragment are adjacent: one 8-byte load per lane, split in two.
    # Loaded as (32, NB, 2), lanes first, and permuted after: Triton's coalescing then gives the load
    # the tile's own layout (lanes on `lane`, warps on NB), so nothing converts in the loop.
    sz_off = pid_n * BN + (lane // 4)[:, None, None] * 2 + nb[None, :, None] * 16 + tl.arange(0, 2)[None, None, :]
    sz_in = tl.permute(row_in, [1, 0])[:, :, None]  # (32, NB, 1)
    x_lane = (2 * (lane % 4))[None, :]  # (1, 32): input of nibble (k3 = 0, k0 = 0) of word 0 of a lane

    acc_a = tl.zeros([NB, 32], dtype=tl.float32)  # rows 16nb + g, one partial per lane
    acc_b = tl.zeros([NB, 32], dtype=tl.float32)  # rows 16nb + 8 + g
    chk = tl.zeros([NB, KT, 128], dtype=tl.int32)
    # register ring: the next PREFETCH steps' words are in flight while this step computes (Triton
    # pipelines loads only into MMAs; without this each step would wait a full HBM latency). One step
    # ahead keeps 8 KB a 128-thread program in flight; two keep 16 KB (Little's law at 4.8 TB/s and
    # ~700 ns wants ~25-40 KB an SM, so two steps reach it with 2-3 programs an SM)
    p_next = _step_words(pk_ptr, pk_off, it0 * BK, k_pad, kt_first, nb_in, it0 < it1, False)
    if PREFETCH == 2:
        p_next2 = _step_words(pk_ptr, pk_off, it0 * BK + BK, k_pad, kt_first, nb_in, it0 + 1 < it1, False)
    for it in range(it0, it1):
        k0 = it * BK
        p_cur = p_next
        if PREFETCH == 2:
            p_next = p_next2
            p_next2 = _step_words(pk_ptr, pk_off, k0 + 2 * BK, k_pad, kt_first, nb_in, it + 2 < it1, False)
        else:
            p_next = _step_words(pk_ptr, pk_off, k0 + BK, k_pad, kt_first, nb_in, it + 1 < it1, False)
        if PROBE == 1:
            szp = tl.load(sz_ptr + tl.minimum(k0 // G, K // G - 1) * stride_sg + sz_off, mask=sz_in, other=0)
            chk ^= p_cur ^ tl.max(tl.max(tl.max(szp, 2), 1), 0) * (N < 0)  # sz kept alive by a runtime zero
        else:
            p_cur = tl.reshape(p_cur, [NB, KT, 32, 4])
            # per-element partial sums over the step (FFMA chains), reduced over the 4 words once a step.
            # Initialized by the first fragment column (not tl.zeros) so they take the tile's layout.
            if KT == 1:
                q16a, q12a, q16b, q12b, xs16, xs12 = _frag_column(
                    x_ptr, perm_ptr, tl.reshape(p_cur, [NB, 32, 4]), x_lane, k0, K, MAGIC,
                    None, None, None, None, None, None, HAS_PERM, EVEN_K, False)
            else:
                p0, p1 = tl.split(tl.permute(p_cur, [0, 2, 3, 1]))  # KT == 2
                q16a, q12a, q16b, q12b, xs16, xs12 = _frag_column(
                    x_ptr, perm_ptr, p0, x_lane, k0, K, MAGIC, None, None, None, None, None, None, HAS_PERM, EVEN_K,
                    False)
                q16a, q12a, q16b, q12b, xs16, xs12 = _frag_column(
                    x_ptr, perm_ptr, p1, x_lane, k0 + 64, K, MAGIC, q16a, q12a, q16b, q12b, xs16, xs12, HAS_PERM,
                    EVEN_K, True)
            gidx = tl.minimum(k0 // G, K // G - 1)
            if EVEN_N:
                szp = tl.load(sz_ptr + gidx * stride_sg + sz_off)  # (32, NB, 2)
            else:
                szp = tl.load(sz_ptr + gidx * stride_sg + sz_off, mask=sz_in, other=0)
            sza, szb = tl.split(tl.permute(szp, [1, 0, 2]))  # (NB, 32) each
            s12a, c12a, s16a, c16a = group_consts(sza)
            s12b, c12b, s16b, c16b = group_consts(szb)
            acc_a += s16a * tl.sum(q16a, axis=2) - c16a * xs16 + s12a * tl.sum(q12a, axis=2) - c12a * xs12
            acc_b += s16b * tl.sum(q16b, axis=2) - c16b * xs16 + s12b * tl.sum(q12b, axis=2) - c12b * xs12

    if PROBE == 1:
        tl.store(ws_ptr + pid_n * SPLIT_K + pid_k, _xor_all(chk, NB * KT * 128).to(tl.float32, bitcast=True))
    else:
        # lanes 4g..4g+3 hold parts of the same rows
        ya = tl.sum(tl.reshape(acc_a, [NB, 8, 4]), axis=2)  # (NB, 8)
        yb = tl.sum(tl.reshape(acc_b, [NB, 8, 4]), axis=2)
        offs_a = pid_n * BN + tl.arange(0, NB)[:, None] * 16 + tl.arange(0, 8)[None, :]  # (NB, 8)
        offs_b = offs_a + 8
        bias_a = 0.0
        bias_b = 0.0
        if HAS_BIAS:
            bias_a = tl.load(bias_ptr + offs_a, mask=offs_a < N, other=0.0).to(tl.float32)
            bias_b = tl.load(bias_ptr + offs_b, mask=offs_b < N, other=0.0).to(tl.float32)
        if SLICES:
            if SPLIT_K > 1:
                # per-split slices of the workspace (ws_ptr is the slice buffer here), one ticket a program
                write_partial(ya, ws_ptr, offs_a, offs_a < N, N)
                write_partial(yb, ws_ptr, offs_b, offs_b < N, N)
                if PROBE == 0:
                    if last_split(cnt_ptr, pid_n, SPLIT_K):
                        ya = sum_partials(ws_ptr, offs_a, offs_a < N, N, SPLIT_K)
                        yb = sum_partials(ws_ptr, offs_b, offs_b < N, N, SPLIT_K)
                        if HAS_BIAS:
                            ya += bias_a
                            yb += bias_b
                        tl.store(y_ptr + offs_a, ya.to(y_ptr.dtype.element_ty), mask=offs_a < N)
                        tl.store(y_ptr + offs_b, yb.to(y_ptr.dtype.element_ty), mask=offs_b < N)
                        reset_ticket(cnt_ptr, pid_n)
            else:
                if HAS_BIAS:
                    ya += bias_a
                    yb += bias_b
                tl.store(y_ptr + offs_a, ya.to(y_ptr.dtype.element_ty), mask=offs_a < N)
                tl.store(y_ptr + offs_b, yb.to(y_ptr.dtype.element_ty), mask=offs_b < N)
        else:
            store_or_reduce(ya, y_ptr + offs_a, offs_a, offs_a < N, bias_a, ws_ptr, cnt_ptr, SPLIT_K, HAS_BIAS)
            store_or_reduce(yb, y_ptr + offs_b, offs_b, offs_b < N, bias_b, ws_ptr, cnt_ptr, SPLIT_K, HAS_BIAS)
