"""Pieces shared by the attention forward and backward kernels: scores, masks, dropout, loop bounds.

Every kernel works in the log2 domain: scores are multiplied by log2(e) once (folded into the softmax
scale), so the softmax uses exp2, the hardware's native exponential (FlashAttention-2, section 3.1).
The LSE handed to users is natural-log; kernels convert at the edges.

Positions: a query row i sees key column j at "diagonal offset" off = seqlen_k - seqlen_q (bottom-right
alignment, as flash-attn). Windows are (left, right) with -1 = unbounded; causal is right = 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def tanh_f32(x):
    # exp2-based, because libdevice.tanh has no interpreter implementation (triton 3.6); (1 - e) / (1 + e)
    # with e = exp(-2|x|) never overflows and is accurate to a few ulp of 1, which is what the softmax sees.
    e = tl.exp2(-2.0 * 1.4426950408889634 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def scores_log2(qk, rows, cols, off, qk_scale, softcap2, slope2, HAS_SOFTCAP: tl.constexpr,
                HAS_ALIBI: tl.constexpr):
    """Raw q.k products -> scores in log2 units, and tanh(.) (needed by the softcap backward).

    Without softcap qk_scale = scale * log2(e); with softcap qk_scale = scale / softcap and
    softcap2 = softcap * log2(e). slope2 = ALiBi slope * log2(e). rows/cols broadcast against qk.
    """
    if HAS_SOFTCAP:
        t = tanh_f32(qk * qk_scale)
        s = t * softcap2
    else:
        t = qk
        s = qk * qk_scale
    if HAS_ALIBI:
        s = s - slope2 * tl.abs(rows + off - cols).to(tl.float32)
    return s, t


@triton.jit
def visible(rows, cols, seqlen_k, off, window_left, window_right, HAS_LEFT: tl.constexpr,
            HAS_RIGHT: tl.constexpr):
    """Which (row, col) pairs may attend: key in range and inside the (left, right) band."""
    vis = cols < seqlen_k
    if HAS_RIGHT:
        vis = vis & (cols <= rows + off + window_right)
    if HAS_LEFT:
        vis = vis & (cols >= rows + off - window_left)
    return vis


@triton.jit
def dropout_keep(seed, base, row0, col0, pitch4, dropout_p, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """(BLOCK_R, BLOCK_C) keep-mask of rows row0.., columns col0.. (col0 a multiple of 4).

    One Philox counter, base + row * pitch4 + col // 4 (int64: no wrap-around on long sequences), yields
    four uniforms, for columns 4c .. 4c + 3: a quarter of the Philox rounds and registers of one counter
    per element (that variant spilled ~800 B a thread at 128 x 128 tiles under ptxas).
    """
    rows = row0 + tl.arange(0, BLOCK_R)
    quads = col0 // 4 + tl.arange(0, BLOCK_C // 4)
    counter = base + rows[:, None].to(tl.int64) * pitch4 + quads[None, :]
    u0, u1, u2, u3 = tl.rand4x(seed, counter)
    # join stacks on a new last axis, so join(join(u0, u2), join(u1, u3))[.., c, i, j] is word 2i + j of
    # counter c, and the row-major reshape puts word w of counter c at column 4c + w
    u = tl.join(tl.join(u0, u2), tl.join(u1, u3))
    return tl.reshape(u, [BLOCK_R, BLOCK_C]) >= dropout_p


@triton.jit
def block_range(r0, rows_len, cols_len, off, window_left, window_right, BLOCK_R: tl.constexpr,
                BLOCK_C: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Column blocks that rows [r0, r0 + BLOCK_R) must visit, as four BLOCK_C-aligned bounds.

    Visit [lo, hi) in steps of BLOCK_C; blocks starting in [full_lo, full_hi) are visible for every row
    and column (inside the band and in bounds) and run without a mask; the rest ([lo, full_lo) and
    [full_hi, hi)) are masked. Blocks outside the band (above the causal diagonal, outside the window)
    are never visited. The backward's "query blocks for a key block" is the same question transposed:
    call it with rows and columns swapped, off negated and the two window sides exchanged.
    All divisions see non-negative numbers (Triton's // truncates like C).
    """
    r_last = tl.minimum(r0 + BLOCK_R, rows_len) - 1
    lo = 0
    hi = cols_len
    if HAS_LEFT:
        lo = tl.maximum(r0 + off - window_left, 0)
    if HAS_RIGHT:
        hi = tl.minimum(hi, tl.maximum(r_last + off + window_right + 1, 0))
    lo = (lo // BLOCK_C) * BLOCK_C
    hi_aligned = tl.cdiv(hi, BLOCK_C) * BLOCK_C
    full_lo = lo
    if HAS_LEFT:  # the last row has the strictest left edge
        full_lo = tl.maximum(lo, tl.cdiv(tl.maximum(r_last + off - window_left, 0), BLOCK_C) * BLOCK_C)
    full_hi = (cols_len // BLOCK_C) * BLOCK_C
    if HAS_RIGHT:  # the first row has the strictest right edge
        full_hi = tl.minimum(full_hi, (tl.maximum(r0 + off + window_right + 1, 0) // BLOCK_C) * BLOCK_C)
    full_lo = tl.minimum(full_lo, hi_aligned)
    full_hi = tl.maximum(tl.minimum(full_hi, hi_aligned), full_lo)
    return lo, hi, full_lo, full_hi


@triton.jit
def seq_bounds(CU_Q, CU_K, b, seqlen_q, seqlen_k, IS_VARLEN: tl.constexpr):
    """(start_q, len_q, start_k, len_k) of batch b: packed offsets for varlen, (0, S) for dense."""
    if IS_VARLEN:
        sq32 = tl.load(CU_Q + b)
        len_q = tl.load(CU_Q + b + 1) - sq32
        sk32 = tl.load(CU_K + b)
        len_k = tl.load(CU_K + b + 1) - sk32
        start_q = sq32.to(tl.int64)  # token offsets into packed tensors can pass 2**31 elements
        start_k = sk32.to(tl.int64)
    else:
        start_q = 0
        len_q = seqlen_q
        start_k = 0
        len_k = seqlen_k
    return start_q, len_q, start_k, len_k
