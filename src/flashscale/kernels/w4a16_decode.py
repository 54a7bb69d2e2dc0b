"""W4A16 decode on the tensor cores (M <= 16): w4a16_decode_kernel, stream-K over one persistent wave on
w4a16_common's mma.sync path (nibble pairs -> 16-bit pairs; the design: docs/w4a16_decode.md
"w4a16_decode_kernel"), and its stream-K helpers (_dec_layout, _dec_w, _dec_x, _dec_item, _dec_tile, _dec_store,
_next_item, _dec_range), which w4a16_ring_kernel and w4a16_gring share.

Apart from the CUDA-core M = 1 GEMV (w4a16_gemv.py, which re-exports these names) since that file passed 500 lines:
a different kernel on different units. Also the PROBE=1 checksum (_xor_all) that both kernels use.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashscale.kernels.pdl import l2_prefetch_rows, pdl_enter
from flashscale.kernels.w4a16_common import (D_UNIT_F16, OFF_BF16, OFF_F16, b_pairs, last_split, mma_column,
                                             reset_ticket, x_sums)


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _xor_all(v, NUMEL: tl.constexpr):
    """XOR of every element (PROBE=1 checksums: no overflow anywhere, the interpreter included)."""
    return tl.reduce(tl.reshape(v, [NUMEL]), 0, _xor)


# ---- decode on the tensor cores, stream-K (M <= 16): w4a16_common's mma.sync path, one persistent wave

@triton.jit
def _x_word(base, off, kl, K, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(base + off)
    return tl.load(base + off, mask=2 * (kl + off) < K, other=0)


@triton.jit
def _stack4(a0, a1, a2, a3):
    """four (FB, 32) -> (FB, 32, 4) [.., i] = a_i, in registers (FB 1, or a warp's own in w4a16_strip_kernel)."""
    return tl.reshape(tl.join(tl.join(a0, a2), tl.join(a1, a3)), [a0.shape[0], 32, 4])


@triton.jit
def _x_pairs(x_ptr, stride_xm, kw, lane, M, K, tok0, EVEN_K: tl.constexpr):
    """(1, 32, 4, 2) int32 x words of one 64-wide column for tokens tok0 + lane // 4: [.., i, 0] =
    (x[16i + 2t], x[16i + 2t + 1]), [.., i, 1] = (x[16i + 2t + 8], ..) (t = lane % 4); kw: the column's
    first x word (K index / 2). Loaded as (1, 32) rows (one per lane, not vectorized) and joined in
    registers, so they take the layout of the fragment tiles they meet. Lanes of tokens >= M read token
    M - 1: a B column only reaches the same D column (a token never stored), so no mask and no zeros.
    K tails (not EVEN_K) are masked to zero: the padded codes dequantize to -z, not 0."""
    tok = tl.minimum(tok0 + lane // 4, M - 1)
    kl = kw + lane % 4  # (1, 32)
    base = x_ptr + tok * stride_xm + kl
    lo = _stack4(_x_word(base, 0, kl, K, EVEN_K), _x_word(base, 8, kl, K, EVEN_K), _x_word(base, 16, kl, K, EVEN_K),
                 _x_word(base, 24, kl, K, EVEN_K))
    hi = _stack4(_x_word(base, 4, kl, K, EVEN_K), _x_word(base, 12, kl, K, EVEN_K), _x_word(base, 20, kl, K, EVEN_K),
                 _x_word(base, 28, kl, K, EVEN_K))
    return tl.join(lo, hi)


@triton.jit
def _dec_x(x_ptr, stride_xm, ks, lane, M, K, BK: tl.constexpr, KT: tl.constexpr, TWO: tl.constexpr,
           EVEN_K: tl.constexpr):
    """x words of step ks: (1, 32, 4, 2, TB, KT) (TB token blocks of 8, KT columns); ks (W, 1) (a step a warp,
    w4a16_strip_kernel) -> (W, 32, 4, 2, TB, KT)."""
    kw = ks * (BK // 2)
    xa = _x_pairs(x_ptr, stride_xm, kw, lane, M, K, 0, EVEN_K)
    if TWO:
        xa = tl.join(xa, _x_pairs(x_ptr, stride_xm, kw, lane, M, K, 8, EVEN_K))
    else:
        xa = xa[:, :, :, :, None]
    if KT == 2:
        xb = _x_pairs(x_ptr, stride_xm, kw + 32, lane, M, K, 0, EVEN_K)
        if TWO:
            xb = tl.join(xb, _x_pairs(x_ptr, stride_xm, kw + 32, lane, M, K, 8, EVEN_K))
        else:
            xb = xb[:, :, :, :, None]
        xs = tl.join(xa, xb)
    else:
        xs = xa[:, :, :, :, :, None]
    return xs


@triton.jit
def _dec_w(pk_ptr, sz_ptr, tile, ks, w_off, sz_off, nb, kt_first, k_pad, n_frag, K, stride_pn, stride_sg,
           NB: tl.constexpr, BK: tl.constexpr, G: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """Packed words (NB, KT, 128) and scale/zero words (32, NB, 2) of item (tile, ks). Unmasked on even
    shapes (the caller clamps prefetches past its range to its last item: an L2 hit, no zero-filling)."""
    k0 = ks * BK
    wp = pk_ptr + tile * NB * stride_pn + (k0 // 64) * 128 + w_off
    sp = sz_ptr + tl.minimum(k0 // G, K // G - 1) * stride_sg + tile * (NB * 16) + sz_off
    if EVEN_K and EVEN_N:
        words = tl.load(wp)
        szw = tl.load(sp)
    else:
        fr_ok = tile * NB + nb < n_frag  # fragment rows past ceil16(N) (the last tile)
        words = tl.load(wp, mask=fr_ok[:, None, None] & (k0 + kt_first < k_pad), other=0)
        szw = tl.load(sp, mask=fr_ok[None, :, None], other=0)
    return words, szw


@triton.jit
def _next_item(tile, ks, S):
    ks = ks + 1
    wrap = ks == S
    return tile + wrap, tl.where(wrap, 0, ks)


@triton.jit
def _dec_store(out, y_ptr, bias_ptr, rows, toks, M, N, stride_ym, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        out += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + toks * stride_ym + rows, out.to(y_ptr.dtype.element_ty), mask=(rows < N) & (toks < M))


@triton.jit
def _b_of(xq, ASM: tl.constexpr, PAIRED: tl.constexpr):
    """(FB, 32, 4, 2) -> (b0, b1): the two halves as they are (PAIRED), or b_pairs of the x words."""
    q0, q1 = tl.split(xq)
    if not PAIRED:
        q0, q1 = b_pairs(q0, q1, ASM)
    return q0, q1


@triton.jit
def _dec_b(xk, TWO: tl.constexpr, ASM: tl.constexpr, PAIRED: tl.constexpr = False):
    """(FB, 32, 4, 2, TB) x words of a column (FB 1 here, a warp's own in w4a16_strip_kernel) -> B registers
    (b0, b1) of tokens 0-7 and (bb0, bb1) of 8-15. PAIRED: xk already holds the B registers (w4a16_strip's x in
    the B order), only split, no b_pairs."""
    if TWO:
        xa, xb = tl.split(xk)
        b0, b1 = _b_of(xa, ASM, PAIRED)
        bb0, bb1 = _b_of(xb, ASM, PAIRED)
    else:
        b0, b1 = _b_of(tl.reshape(xk, [xk.shape[0], 32, 4, 2]), ASM, PAIRED)
        bb0 = b0
        bb1 = b1
    return b0, b1, bb0, bb1


@triton.jit
def _dec_range(U, K, N):
    """Program pid of P takes the stream-K items [u0, u1) of U; K padded to 64, N's fragment rows (the scalars of
    _dec_layout, also w4a16_gring's)."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    return pid, P, pid * U // P, (pid + 1) * U // P, tl.cdiv(K, 64) * 64, tl.cdiv(N, 16)


@triton.jit
def _dec_layout(U, K, N, stride_pn, NB: tl.constexpr, KT: tl.constexpr):
    """A stream-K decode program's coordinates (the decode kernel's and w4a16_ring's): program pid of P takes
    items [u0, u1); (NB, KT, 128) word offsets of an item, 16 bytes a thread, laid out so warps split NB (see
    the GEMV in w4a16_gemv.py); the scale/zero words of rows g, g + 8 (adjacent), loaded lanes first and permuted (the
    GEMV's trick)."""
    pid, P, u0, u1, k_pad, n_frag = _dec_range(U, K, N)
    nb = tl.arange(0, NB)
    lane = tl.arange(0, 32)
    w_off = (nb * stride_pn)[:, None, None] + tl.arange(0, KT)[None, :, None] * 128 + tl.arange(0, 128)[None, None, :]
    kt_first = tl.arange(0, KT)[None, :, None] * 64
    sz_off = (lane // 4)[:, None, None] * 2 + nb[None, :, None] * 16 + tl.arange(0, 2)[None, None, :]
    return pid, P, u0, u1, k_pad, n_frag, nb, w_off, kt_first, sz_off, lane[None, :]


@triton.jit
def _dec_scales(sz, BF16: tl.constexpr):
    """sz words (s * 2^11 | z) -> (sd, zs): the multiplier of the MMA sum D (s * 2^11, / D_UNIT in fp16) and the
    zero-point term's (OFF + z) s * 2^11, z by a float magic (2^23 + z is exact)."""
    s = (sz & -32).to(tl.float32, bitcast=True)  # s * 2^11
    zf = ((sz & 31) | 0x4B000000).to(tl.float32, bitcast=True)  # 2^23 + z, exact
    if BF16:
        return s, (zf - (8388608.0 - OFF_BF16)) * s
    return s * (1.0 / D_UNIT_F16), (zf - (8388608.0 - OFF_F16)) * s


@triton.jit
def _dec_item(acc, accb, w, sz, xw, NB: tl.constexpr, KT: tl.constexpr, TWO: tl.constexpr, BF16: tl.constexpr,
          ASM: tl.constexpr):
    """acc (+ accb for tokens 8..15) += s * 2^11 (D / D_UNIT - (OFF + z) sum(x)) of one item: w its packed words
    (NB * KT * 128 int32), sz (32, NB, 2) its scale/zero words, xw its x words. The MMA summed D_UNIT (OFF + q) x,
    so y += s / D_UNIT * D - (OFF + z) s * sum(x); z by a float magic. The decode kernel's and w4a16_ring's."""
    szw = tl.permute(sz, [1, 0, 2])  # (NB, 32, 2): rows g, g + 8 of each fragment row
    sd, zs = _dec_scales(szw, BF16)
    s4 = tl.reshape(tl.join(sd, sd), [NB, 32, 4])  # c = 2 (row half) + token parity
    zs4 = tl.reshape(tl.join(zs, zs), [NB, 32, 4])
    w4 = tl.reshape(w, [NB, KT, 32, 4])
    if KT == 2:
        w0, w1 = tl.split(tl.permute(w4, [0, 2, 3, 1]))
        x0, x1 = tl.split(xw)
    else:
        w0 = tl.reshape(w4, [NB, 32, 4])
        x0 = tl.reshape(xw, [1, 32, 4, 2, 1 + TWO])
    b0, b1, bb0, bb1 = _dec_b(x0, TWO, ASM)
    d, db = mma_column(w0, b0, b1, bb0, bb1, None, None, BF16, TWO, True, ASM)
    xs = x_sums(b0, b1, None, BF16, True, ASM)
    if TWO:
        xsb = x_sums(bb0, bb1, None, BF16, True, ASM)
    if KT == 2:
        b0, b1, bb0, bb1 = _dec_b(x1, TWO, ASM)
        d, db = mma_column(w1, b0, b1, bb0, bb1, d, db, BF16, TWO, False, ASM)
        xs = x_sums(b0, b1, xs, BF16, False, ASM)
        if TWO:
            xsb = x_sums(bb0, bb1, xsb, BF16, False, ASM)
    acc = tl.fma(s4, d, acc) - zs4 * xs
    if TWO:
        accb = tl.fma(s4, db, accb) - zs4 * xsb
    return acc, accb


@triton.jit
def _dec_tile(tile, P, S, U, NB: tl.constexpr, BN: tl.constexpr):
    """A tile's accumulator geometry and contributors: rows and tokens (NB, 32, 4) of the mma C layout, each
    element's offset in a workspace slot, and the first and last program with items of the tile (stream-K)."""
    nb = tl.arange(0, NB)[:, None, None]
    lane = tl.arange(0, 32)[None, :, None]
    c4 = tl.arange(0, 4)[None, None, :]
    rows = tile * BN + nb * 16 + lane // 4 + 8 * (c4 // 2)
    toks = 2 * (lane % 4) + c4 % 2
    e_off = nb * 128 + lane * 4 + c4
    pf = ((tile * S + 1) * P - 1) // U
    pl = ((tile * S + S) * P - 1) // U
    return rows, toks, e_off, pf, pl


@triton.jit
def _dec_flush(acc, accb, tile, pid, P, S, U, CMAX, y_ptr, bias_ptr, ws_ptr, cnt_ptr, M, N, stride_ym,
               NB: tl.constexpr, BN: tl.constexpr, TWO: tl.constexpr, HAS_BIAS: tl.constexpr, PROBE: tl.constexpr):
    """End of this program's part of `tile`: store it (sole contributor) or put it in the tile's
    workspace slot and, if this is the last contributor, sum the slots in order and store."""
    SLOT: tl.constexpr = NB * 128 * (1 + TWO)
    rows, toks, e_off, pf, pl = _dec_tile(tile, P, S, U, NB, BN)
    direct = pf == pl
    if PROBE == 2:
        direct = pf < 0  # every partial to the workspace, no reduction
    if direct:
        _dec_store(acc * (1.0 / 2048), y_ptr, bias_ptr, rows, toks, M, N, stride_ym, HAS_BIAS)
        if TWO:
            _dec_store(accb * (1.0 / 2048), y_ptr, bias_ptr, rows, toks + 8, M, N, stride_ym, HAS_BIAS)
    else:
        wsp = ws_ptr + (tile * CMAX + pid - pf).to(tl.int64) * SLOT + e_off
        tl.store(wsp, acc, mask=toks < M)
        if TWO:
            tl.store(wsp + NB * 128, accb, mask=toks + 8 < M)
        if PROBE == 0:
            if last_split(cnt_ptr, tile, pl - pf + 1):
                wsp = ws_ptr + (tile * CMAX).to(tl.int64) * SLOT + e_off
                tot = tl.load(wsp, mask=toks < M, other=0.0, cache_modifier=".cg")
                for c in range(1, pl - pf + 1):
                    tot += tl.load(wsp + c * SLOT, mask=toks < M, other=0.0, cache_modifier=".cg")
                _dec_store(tot * (1.0 / 2048), y_ptr, bias_ptr, rows, toks, M, N, stride_ym, HAS_BIAS)
                if TWO:
                    tot = tl.load(wsp + NB * 128, mask=toks + 8 < M, other=0.0, cache_modifier=".cg")
                    for c in range(1, pl - pf + 1):
                        tot += tl.load(wsp + c * SLOT + NB * 128, mask=toks + 8 < M, other=0.0, cache_modifier=".cg")
                    _dec_store(tot * (1.0 / 2048), y_ptr, bias_ptr, rows, toks + 8, M, N, stride_ym, HAS_BIAS)
                reset_ticket(cnt_ptr, tile)


@triton.jit(do_not_specialize=["M", "S", "U", "CMAX"])
def w4a16_decode_kernel(
    x_ptr, pk_ptr, sz_ptr, y_ptr, bias_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_ym, stride_pn, stride_sg, S, U, CMAX,
    G: tl.constexpr, HAS_BIAS: tl.constexpr, BF16: tl.constexpr, BN: tl.constexpr, KT: tl.constexpr,
    BM: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, PREFETCH: tl.constexpr = 1,
    ASM: tl.constexpr = True, PROBE: tl.constexpr = 0, PDL: tl.constexpr = False, L2PF: tl.constexpr = False,
):
    """y (M <= 16, N) = x @ W on the tensor cores, stream-K: U = tiles x S work items (BN rows x BK
    inputs, BK inside one group), program p of P takes items [p U / P, (p + 1) U / P) in tile-major
    order, so every program streams one contiguous range (a persistent grid of one wave, no tail) and
    flushes a partial tile at each tile end it meets (_dec_flush). x_ptr: x as int32 words (pairs of
    16-bit values), stride_xm in words. Accumulators: (NB, 32, 4) per token block, lane 4g + t holding
    rows 16 nb + g (+ 8) and tokens 2t, 2t + 1 (the mma C layout), times s * 2^11 (w4a16_pack's sz).
    PROBE (benchmarks/w4a16_probe.py): 1 loads only (XORs the packed words), 2 no split-K reduction.
    PDL: programmatic dependent launch (kernels.pdl): wait for the previous kernel before any memory access;
    L2PF: first ask for this program's packed words to be brought into L2 (its first tile's part and, when the
    range crosses tiles, its last tile's; a middle tile, rare at decode shapes, is not prefetched)."""
    NB: tl.constexpr = BN // 16
    BK: tl.constexpr = KT * 64
    TWO: tl.constexpr = BM == 16
    pid, P, u0, u1, k_pad, n_frag, nb, w_off, kt_first, sz_off, lane1 = _dec_layout(U, K, N, stride_pn, NB, KT)
    if PDL and L2PF:
        t_a = u0 // S
        t_b = (u1 - 1) // S
        w_max = (k_pad // 64) * 128
        ks_a = u0 - t_a * S
        end_a = tl.where(t_b == t_a, u1 - t_a * S, S)
        l2_prefetch_rows(pk_ptr, t_a * NB, stride_pn, ks_a * KT * 128, tl.minimum(end_a * KT * 128, w_max), n_frag,
                         True, NB)
        l2_prefetch_rows(pk_ptr, t_b * NB, stride_pn, 0, tl.minimum((u1 - t_b * S) * KT * 128, w_max), n_frag,
                         t_b > t_a, NB)
    pdl_enter(PDL)

    # item coordinates kept incrementally (no division in the loop): (tile, ks) computed now, (tile_p,
    # ks_p) the next one to load; loads past the range re-read the last item (in L2) instead of masking
    tile = u0 // S
    ks = u0 - tile * S
    tile_l = (u1 - 1) // S
    ks_l = u1 - 1 - tile_l * S
    # register ring: PREFETCH items of packed and scale words in flight ahead, x one item ahead
    wn, sn = _dec_w(pk_ptr, sz_ptr, tile, ks, w_off, sz_off, nb, kt_first, k_pad, n_frag, K, stride_pn, stride_sg,
                    NB, BK, G, EVEN_K, EVEN_N)
    tile_p, ks_p = _next_item(tile, ks, S)
    if PREFETCH == 2:
        ok = u0 + 1 < u1
        wn2, sn2 = _dec_w(pk_ptr, sz_ptr, tl.where(ok, tile_p, tile_l), tl.where(ok, ks_p, ks_l), w_off, sz_off, nb,
                          kt_first, k_pad, n_frag, K, stride_pn, stride_sg, NB, BK, G, EVEN_K, EVEN_N)
        tile_p, ks_p = _next_item(tile_p, ks_p, S)
    xn = _dec_x(x_ptr, stride_xm, ks, lane1, M, K, BK, KT, TWO, EVEN_K)
    acc = tl.zeros([NB, 32, 4], dtype=tl.float32)
    accb = tl.zeros([NB, 32, 4], dtype=tl.float32)
    chk = tl.zeros([NB, KT, 128], dtype=tl.int32)
    for u in range(u0, u1):
        wc = wn
        sc = sn
        ok = u + PREFETCH < u1
        tile_q = tl.where(ok, tile_p, tile_l)
        ks_q = tl.where(ok, ks_p, ks_l)
        if PREFETCH == 2:
            wn = wn2
            sn = sn2
            wn2, sn2 = _dec_w(pk_ptr, sz_ptr, tile_q, ks_q, w_off, sz_off, nb, kt_first, k_pad, n_frag, K, stride_pn,
                              stride_sg, NB, BK, G, EVEN_K, EVEN_N)
        else:
            wn, sn = _dec_w(pk_ptr, sz_ptr, tile_q, ks_q, w_off, sz_off, nb, kt_first, k_pad, n_frag, K, stride_pn,
                            stride_sg, NB, BK, G, EVEN_K, EVEN_N)
        tile_p, ks_p = _next_item(tile_p, ks_p, S)
        xc = xn
        ks_x = ks + 1
        xn = _dec_x(x_ptr, stride_xm, tl.where(ks_x == S, 0, ks_x), lane1, M, K, BK, KT, TWO, EVEN_K)
        if PROBE == 1:
            # the same loads, a trivial reduce; scale and x words kept alive by a runtime zero
            alive = tl.max(tl.max(tl.max(sc, 2), 1), 0) ^ tl.max(tl.reshape(xc, [256 * (1 + TWO) * KT]), 0)
            chk ^= wc ^ alive * (M < 0)
        else:
            acc, accb = _dec_item(acc, accb, wc, sc, xc, NB, KT, TWO, BF16, ASM)
            if (ks == S - 1) | (u == u1 - 1):  # the end of this program's part of the tile
                _dec_flush(acc, accb, tile, pid, P, S, U, CMAX, y_ptr, bias_ptr, ws_ptr, cnt_ptr, M, N, stride_ym,
                           NB, BN, TWO, HAS_BIAS, PROBE)
                acc = tl.zeros([NB, 32, 4], dtype=tl.float32)
                accb = tl.zeros([NB, 32, 4], dtype=tl.float32)
        tile, ks = _next_item(tile, ks, S)
    if PROBE == 1:
        tl.store(ws_ptr + pid, _xor_all(chk, NB * KT * 128).to(tl.float32, bitcast=True))
