"""The strip decode kernel's Triton code (w4a16_strip.py launches it; docs/w4a16_decode.md "Round 14").

Why: the register ring (w4a16_ring_kernel) streams at the HBM rate inside its loop, yet a call at 8192^2 and M = 1
takes ~16 us against ~9.7 us for the same bytes loaded alone. Its trace (round 9) puts the difference at the ends of
its programs: a split-K fold across programs (red.add, CTA barrier, acq_rel ticket, the last contributor's re-read:
~1.5-2.8 us after a program's last item) and a tail of programs that end late. This kernel has no split across
programs at all: a program owns R fragment rows (16 R outputs) over the whole of K, and its warps split K instead.
The only reduction is the warps' partial sums, once, through shared memory at the end; the output is stored
directly (no workspace, no ticket, no atomics, the same bits on every call).

Work: program p takes fragment rows p R .. p R + R - 1 (rows past ceil(N / 16) masked). K is cut into sub-items of
KT 64-wide fragment columns (BK = 64 KT inputs, inside one group); iteration t hands sub-item t W + w to warp w, so
the program's W warps read W KT 512-byte fragments of each row back to back (one contiguous run of the row a step).
T = ceil(S / W) iterations for S sub-items; the last iteration's warps past S read x as zero (their words clamped:
any word times zero inputs adds nothing, scale and zero point included).

Loop: the register ring of w4a16_ring_kernel (RING slots, each the complete inputs of one iteration: packed words,
scale/zero words, x words; rotated by position, no register moves; refills past T re-read the last iteration, an L1
/ L2 hit, and are never computed). The math is the decode kernels' (w4a16_common "tensor-core decode": 3 shifts +
4 LOP3 + 1 HMMA a word, zero point and scale once per sub-item and row in fp32), with x per warp: B registers
(W, 32, 4) instead of one x broadcast over fragment rows.

Shapes (per program): words (W, R, KT, 128) int32 (W first: Triton's coalescing gives the warps the first
non-contiguous axis; 128 words = 32 lanes x 16 bytes, one 512-byte fragment a warp instruction); scale/zero words
(W, R, 32, 2); x words (W, 32, 4, 2, TB, KT); accumulators (W, R, 32, 4) fp32 per token block in the mma C layout
(lane 4g + t: rows 16 r + g (+ 8), tokens 2t, 2t + 1), times s * 2^11 (w4a16_pack's sz words hold s * 2^11 | z),
summed over W at the end.

XP (x in the B order, w4a16_strip.x_perm_words): x's words arrive as the mma's B register pairs {b0, b1}, 16 bytes
a lane, so a column and token block is two LDG.128 instead of eight 4-byte loads and eight PRMT (b_pairs).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from flashscale.kernels.w4a16_common import mma_column, x_sums
from flashscale.kernels.w4a16_decode import _dec_b, _dec_scales, _dec_store, _dec_x


@triton.jit
def _slot(pk_ptr, sz_ptr, x_ptr, t, T, S, F, row_w, fr_ok, sz_row, kt, wi, lane, M, K, stride_xm, stride_sg,
          W: tl.constexpr, KT: tl.constexpr, G: tl.constexpr, TWO: tl.constexpr, EVEN: tl.constexpr,
          EVEN_N: tl.constexpr, XP: tl.constexpr):
    """Every input of iteration t (past T: iteration T - 1 again): words (W, R, KT, 128), scale/zero words
    (W, R, 32, 2), x words (W, 32, 4, 2, TB, KT)."""
    words, szw = _slot_w(pk_ptr, sz_ptr, t, T, S, F, row_w, fr_ok, sz_row, kt, wi, K, stride_sg, W, KT, G, EVEN,
                         EVEN_N)
    return words, szw, _slot_x(x_ptr, t, T, S, F, wi, lane, M, K, stride_xm, W, KT, TWO, EVEN, XP)


@triton.jit
def _slot_w(pk_ptr, sz_ptr, t, T, S, F, row_w, fr_ok, sz_row, kt, wi, K, stride_sg, W: tl.constexpr,
            KT: tl.constexpr, G: tl.constexpr, EVEN: tl.constexpr, EVEN_N: tl.constexpr):
    """The weight inputs of iteration t: words (W, R, KT, 128) and scale/zero words (W, R, 32, 2)."""
    BK: tl.constexpr = 64 * KT
    j = tl.minimum(tl.minimum(t, T - 1) * W + wi, S - 1)  # (W,) the warps' sub-items
    # the sub-item's base, then the column's constant offset: so the KT loads share one address (an immediate
    # offset each; (j KT + kt) 128 gave each its own 64-bit address, ~10 instructions a slot in the xperm loop)
    wp = (pk_ptr + row_w + (j * (KT * 128))[:, None, None, None]) + (kt * 128)[None, None, :, None]
    if EVEN and EVEN_N:
        words = tl.load(wp)
    else:
        fr = j[:, None, None, None] * KT + kt[None, None, :, None]  # (W, 1, KT, 1) fragment column
        words = tl.load(wp, mask=fr_ok & (fr < F), other=0)
    grp = tl.minimum(j * BK // G, K // G - 1)
    sp = sz_ptr + (grp * stride_sg)[None, :, None, None] + sz_row  # (32, W, R, 2): lanes first, so that Triton's
    if EVEN_N:  # coalescing gives the lanes the 32 axis and the warps W (the words' layout), then permuted
        szw = tl.load(sp)
    else:
        szw = tl.load(sp, mask=tl.permute(fr_ok, [0, 2, 1, 3]), other=0)
    return words, tl.permute(szw, [1, 2, 0, 3])


@triton.jit
def _slot_x(x_ptr, t, T, S, F, wi, lane, M, K, stride_xm, W: tl.constexpr, KT: tl.constexpr, TWO: tl.constexpr,
            EVEN: tl.constexpr, XP: tl.constexpr):
    """x of iteration t: (W, 32, 4, 2, TB, KT) x words (B registers with XP)."""
    j = tl.minimum(t, T - 1) * W + wi
    ks = tl.minimum(j, S - 1)  # x of the warps' sub-items; a warp with none left (not EVEN only) reads past K: zeros
    if not EVEN:
        ks = tl.where(j < S, ks, S)
    if XP:
        xs = _xp_x(x_ptr, stride_xm, ks, F, M, W, KT, TWO, EVEN)  # stride_xm: a token block's words
    else:
        xs = _dec_x(x_ptr, stride_xm, ks[:, None], lane, M, K, 64 * KT, KT, TWO, EVEN)
    return xs


@triton.jit
def _fence(y_ptr, M):
    """A store that never happens (M <= 16) but may alias the loads before it, so ptxas keeps them before it."""
    tl.store(y_ptr, (M * 0).to(y_ptr.dtype.element_ty), mask=M > 65536)


@triton.jit
def _xp_x(x_ptr, stride_tb, ks, F, M, W: tl.constexpr, KT: tl.constexpr, TWO: tl.constexpr, EVEN: tl.constexpr):
    """_dec_x's (W, 32, 4, 2, TB, KT), but B registers, not x words (_item skips b_pairs), from x in the B order
    (x_perm_words: a column's 8 tokens as (2, 32, 2, 2) words [h, 4 g + t, ii, b] = B register b of 16-k chunk
    2 h + ii of lane 4 g + t). One load of (W, TB, KT, 2, 128) words, 16 contiguous bytes a lane as the packed words
    are (two LDG.128 a column and token block, each the register pairs {b0, b1} of two chunks, as mma.sync takes
    them: no PRMT, no moves), then a reshape and permute (no data movement). Token rows past M are the pre-pass's
    zeros; at M <= 8 they are not read: a lane of token g >= M reads token M - 1's words (the same addresses as
    that lane, so at M = 1 a warp fetches 1/8 of the block; a B column only reaches its own D column, never
    stored: _x_pairs's rule). Columns past the last (not EVEN: idle warps, K's last sub-item) load zeros."""
    TB: tl.constexpr = 1 + TWO
    tb = (tl.arange(0, TB) * stride_tb)[None, :, None, None, None]
    base = x_ptr + (ks * (KT * 256))[:, None, None, None, None] + tb
    # the column and half offsets added last, as constants: one address for a slot's x (immediate offsets), not KT
    wl = tl.arange(0, 128)  # word 4 (4 g + t) + q of a half
    if not TWO:  # g clamped to the last token (at M 9-16 the first block is whole; clamping the second cost 12
        wl = 16 * tl.minimum(wl // 16, M - 1) + wl % 16  # loop instructions and the fence's hold: sm_90 census)
    ptr = (base + wl[None, None, None, None, :]) + (tl.arange(0, KT) * 256)[None, None, :, None, None] \
        + (tl.arange(0, 2) * 128)[None, None, None, :, None]
    if EVEN:
        v = tl.load(ptr)
    else:
        c = ks[:, None, None, None, None] * KT + tl.arange(0, KT)[None, None, :, None, None]  # (W, 1, KT, 1, 1)
        v = tl.load(ptr, mask=c < F, other=0)
    v = tl.permute(tl.reshape(v, [W, TB, KT, 2, 32, 2, 2]), [0, 4, 3, 5, 6, 1, 2])  # (W, 32, h, ii, b, TB, KT)
    return tl.reshape(v, [W, 32, 4, 2, TB, KT])


@triton.jit
def _column(w, b0, b1, bb0, bb1, d, db, W: tl.constexpr, R: tl.constexpr, BF16: tl.constexpr, TWO: tl.constexpr,
            FIRST: tl.constexpr, ASM: tl.constexpr):
    """mma_column over (W, R) fragments, x per warp (b* (W, 32, 4), the same for the R rows). The inline PTX takes
    the 4-D operands as they are (elementwise, broadcast over R); the emulation wants (F, 32, 4) with one B a
    fragment, so it flattens (interpreter only)."""
    if ASM:
        d, db = mma_column(w, b0[:, None], b1[:, None], bb0[:, None], bb1[:, None], d, db, BF16, TWO, FIRST, ASM)
    else:
        F: tl.constexpr = W * R
        wf = tl.reshape(w, [F, 32, 4])
        c = None
        cb = None
        if not FIRST:
            c = tl.reshape(d, [F, 32, 4])
            cb = tl.reshape(db, [F, 32, 4])
        d, db = mma_column(wf, _per_frag(b0, W, R), _per_frag(b1, W, R), _per_frag(bb0, W, R), _per_frag(bb1, W, R),
                           c, cb, BF16, TWO, FIRST, ASM)
        d = tl.reshape(d, [W, R, 32, 4])
        db = tl.reshape(db, [W, R, 32, 4])
    return d, db


@triton.jit
def _per_frag(b, W: tl.constexpr, R: tl.constexpr):
    return tl.reshape(tl.broadcast_to(b[:, None], [W, R, 32, 4]), [W * R, 32, 4])


@triton.jit
def _item(acc, accb, w, sz, xw, W: tl.constexpr, R: tl.constexpr, KT: tl.constexpr, TWO: tl.constexpr,
          BF16: tl.constexpr, ASM: tl.constexpr, XP: tl.constexpr):
    """acc (+ accb) += s * 2^11 (D / D_UNIT - (OFF + z) sum(x)) of one iteration (w4a16_decode._dec_item with x a
    warp): w (W, R, KT, 128) words, sz (W, R, 32, 2) scale/zero words, xw (W, 32, 4, 2, TB, KT) x words."""
    sd, zs = _dec_scales(sz, BF16)  # rows g, g + 8
    s4 = tl.reshape(tl.join(sd, sd), [W, R, 32, 4])  # c = 2 (row half) + token parity
    zs4 = tl.reshape(tl.join(zs, zs), [W, R, 32, 4])
    w5 = tl.permute(tl.reshape(w, [W, R, KT, 32, 4]), [0, 1, 3, 4, 2])  # (W, R, 32, 4, KT)
    if KT == 2:
        w0, w1 = tl.split(w5)
        x0, x1 = tl.split(xw)
    else:
        w0 = tl.reshape(w5, [W, R, 32, 4])
        x0 = tl.reshape(xw, [W, 32, 4, 2, 1 + TWO])
    b0, b1, bb0, bb1 = _dec_b(x0, TWO, ASM, XP)
    d, db = _column(w0, b0, b1, bb0, bb1, None, None, W, R, BF16, TWO, True, ASM)
    xs = x_sums(b0, b1, None, BF16, True, ASM)
    if TWO:
        xsb = x_sums(bb0, bb1, None, BF16, True, ASM)
    if KT == 2:
        b0, b1, bb0, bb1 = _dec_b(x1, TWO, ASM, XP)
        d, db = _column(w1, b0, b1, bb0, bb1, d, db, W, R, BF16, TWO, False, ASM)
        xs = x_sums(b0, b1, xs, BF16, False, ASM)
        if TWO:
            xsb = x_sums(bb0, bb1, xsb, BF16, False, ASM)
    acc = tl.fma(s4, d, acc) - zs4 * xs[:, None]
    if TWO:
        accb = tl.fma(s4, db, accb) - zs4 * xsb[:, None]
    return acc, accb


@triton.jit(do_not_specialize=["M"])
def w4a16_strip_kernel(
    x_ptr, pk_ptr, sz_ptr, y_ptr, bias_ptr,
    M, N, K, stride_xm, stride_ym, stride_pn, stride_sg,
    G: tl.constexpr, HAS_BIAS: tl.constexpr, BF16: tl.constexpr, R: tl.constexpr, KT: tl.constexpr,
    W: tl.constexpr, BM: tl.constexpr, RING: tl.constexpr, EVEN: tl.constexpr, EVEN_N: tl.constexpr,
    ASM: tl.constexpr, XP: tl.constexpr = False, PDL: tl.constexpr = False, FENCE: tl.constexpr = False,
):
    """y (M <= 16, N) = x @ W + bias for program p's 16 R output rows (module docstring). x_ptr: x as int32 words
    (pairs of 16-bit inputs), stride_xm in words; pk_ptr / sz_ptr: PackedW4 qweight (N_pad/16, K_pad/64, 32, 4) /
    sz (NG, N_pad). EVEN: K a multiple of 64 KT W (no K tail, every warp's sub-items in range); EVEN_N: ceil(N / 16)
    a multiple of R. W: the warps splitting K (the launch's num_warps). PDL: launched as the programmatic dependent
    of the kernel that wrote x (x_perm_kernel): the ring's weight loads are issued first, x's after the wait.
    FENCE: a predicated-off store after the first slot's refill (and the second's at ring 3), so that ptxas issues
    that refill there (between the items) instead of after the last item's math, where it had no cover
    (docs/w4a16_decode.md round 14e)."""
    TWO: tl.constexpr = BM == 16
    pid = tl.program_id(0)
    F = tl.cdiv(K, 64)  # fragment columns of a row
    S = tl.cdiv(F, KT)  # sub-items of a row
    T = tl.cdiv(S, W)  # iterations
    n_frag = tl.cdiv(N, 16)
    ri = tl.arange(0, R)
    wi = tl.arange(0, W)
    kt = tl.arange(0, KT)
    lane = tl.arange(0, 32)[None, :]
    frow = pid * R + ri  # (R,) fragment rows
    fr_ok = (frow < n_frag)[None, :, None, None]  # (1, R, 1, 1)
    row_w = (tl.minimum(frow, n_frag - 1) * stride_pn)[None, :, None, None] + tl.arange(0, 128)[None, None, None, :]
    sz_row = (tl.arange(0, 32) // 4)[:, None, None, None] * 2 + (frow * 16)[None, None, :, None] \
        + tl.arange(0, 2)[None, None, None, :]  # (32, 1, R, 2): rows g, g + 8 of each fragment row, adjacent

    wa, sa = _slot_w(pk_ptr, sz_ptr, 0, T, S, F, row_w, fr_ok, sz_row, kt, wi, K, stride_sg, W, KT, G, EVEN, EVEN_N)
    if RING >= 2:
        wb, sb = _slot_w(pk_ptr, sz_ptr, 1, T, S, F, row_w, fr_ok, sz_row, kt, wi, K, stride_sg, W, KT, G, EVEN,
                         EVEN_N)
    if RING >= 3:
        wc, sc = _slot_w(pk_ptr, sz_ptr, 2, T, S, F, row_w, fr_ok, sz_row, kt, wi, K, stride_sg, W, KT, G, EVEN,
                         EVEN_N)
    if PDL:  # the weights' first loads are in flight while the gather ends; x after it
        gdc_wait()
    xa = _slot_x(x_ptr, 0, T, S, F, wi, lane, M, K, stride_xm, W, KT, TWO, EVEN, XP)
    if RING >= 2:
        xb = _slot_x(x_ptr, 1, T, S, F, wi, lane, M, K, stride_xm, W, KT, TWO, EVEN, XP)
    if RING >= 3:
        xc = _slot_x(x_ptr, 2, T, S, F, wi, lane, M, K, stride_xm, W, KT, TWO, EVEN, XP)
    acc = tl.zeros([W, R, 32, 4], dtype=tl.float32)
    accb = tl.zeros([W, R, 32, 4], dtype=tl.float32)
    for t in range(0, T, RING):
        acc, accb = _item(acc, accb, wa, sa, xa, W, R, KT, TWO, BF16, ASM, XP)
        wa, sa, xa = _slot(pk_ptr, sz_ptr, x_ptr, t + RING, T, S, F, row_w, fr_ok, sz_row, kt, wi, lane, M, K,
                           stride_xm, stride_sg, W, KT, G, TWO, EVEN, EVEN_N, XP)
        if FENCE:
            _fence(y_ptr, M)
        if RING >= 2:
            if t + 1 < T:
                acc, accb = _item(acc, accb, wb, sb, xb, W, R, KT, TWO, BF16, ASM, XP)
            wb, sb, xb = _slot(pk_ptr, sz_ptr, x_ptr, t + RING + 1, T, S, F, row_w, fr_ok, sz_row, kt, wi, lane,
                               M, K, stride_xm, stride_sg, W, KT, G, TWO, EVEN, EVEN_N, XP)
            if FENCE and RING >= 3:  # the second slot's refill too, before the third item
                _fence(y_ptr, M)
        if RING >= 3:
            if t + 2 < T:
                acc, accb = _item(acc, accb, wc, sc, xc, W, R, KT, TWO, BF16, ASM, XP)
            wc, sc, xc = _slot(pk_ptr, sz_ptr, x_ptr, t + RING + 2, T, S, F, row_w, fr_ok, sz_row, kt, wi, lane,
                               M, K, stride_xm, stride_sg, W, KT, G, TWO, EVEN, EVEN_N, XP)

    # the warps' partial sums, once (shared memory), then y directly: rows 16 frow + g (+ 8), tokens 2t (+ 1)
    c4 = tl.arange(0, 4)[None, None, :]
    lane3 = tl.arange(0, 32)[None, :, None]
    rows = (frow * 16)[:, None, None] + lane3 // 4 + 8 * (c4 // 2)
    toks = 2 * (lane3 % 4) + c4 % 2
    _dec_store(tl.sum(acc, axis=0) * (1.0 / 2048), y_ptr, bias_ptr, rows, toks, M, N, stride_ym, HAS_BIAS)
    if TWO:
        _dec_store(tl.sum(accb, axis=0) * (1.0 / 2048), y_ptr, bias_ptr, rows, toks + 8, M, N, stride_ym, HAS_BIAS)


@triton.jit
def x_perm_kernel(x_ptr, perm_ptr, out_ptr, M, K, stride_xm, COLS, HAS_PERM: tl.constexpr,
                  TRIGGER: tl.constexpr = False):
    """x (M, K) as int16 -> x in the B order (w4a16_strip.x_perm_words, whose torch reference is
    x_perm_words_reference): program p writes the 256 words of token block p // COLS and column p % COLS, word
    [h, 4 g + t, ii, b] = (x[8 tb + g, k], x[8 tb + g, k + 8]) with k = 64 col + 16 (2 h + ii) + 2 t + b, through the
    act-order permutation (input k of the product is x's perm[k]); tokens past M and inputs past K are zeros.
    TRIGGER: let the strip kernel launched after it as its programmatic dependent (PDL) start now (it waits for this
    grid's writes before it reads x)."""
    if TRIGGER:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    tb = pid // COLS
    col = pid % COLS
    w = tl.arange(0, 256)
    lane = (w // 4) % 32
    k = col * 64 + 16 * (2 * (w // 128) + (w // 2) % 2) + 2 * (lane % 4) + w % 2
    tok = tb * 8 + lane // 4
    ok_lo = (tok < M) & (k < K)
    ok_hi = (tok < M) & (k + 8 < K)
    k_lo = k
    k_hi = k + 8
    if HAS_PERM:
        k_lo = tl.load(perm_ptr + k_lo, mask=ok_lo, other=0)
        k_hi = tl.load(perm_ptr + k_hi, mask=ok_hi, other=0)
    lo = tl.load(x_ptr + tok * stride_xm + k_lo, mask=ok_lo, other=0).to(tl.int32) & 0xFFFF
    hi = tl.load(x_ptr + tok * stride_xm + k_hi, mask=ok_hi, other=0).to(tl.int32)
    tl.store(out_ptr + pid * 256 + w, lo | (hi << 16))

