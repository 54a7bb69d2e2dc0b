"""The Gluon kernel of the shared-memory ring W4A16 decode (w4a16_gring_kernel) and its helpers (_issue, _read,
_item, _flush_block), under the Gluon import guard (HAS_GLUON). What it computes, why, and the launcher:
w4a16_gring.py; its configs: w4a16_gring_config.py. Apart from them so that the JIT code and its globals sit in
one module.

Per program (stream-K as w4a16_ring: program p of P takes items [p U / P, (p + 1) U / P), tile-major; an item is
BN output rows x 64 KT inputs inside one group):
  * every thread issues cp.async copies of item g + STAGES - 1 (its own 16-byte fragment words, its rows' scale/zero
    words, the x words of its lane) into ring slot (g - 1) % STAGES, one commit group an item, then reads item g:
    STAGES - 1 items a program in flight in shared memory while the registers hold one;
  * one wait_group + one CTA barrier an item: after them every thread's copies of item g have landed and every
    thread is done with item g - 1, whose slot the new copies reuse (x words are copied by every warp: the barrier
    makes the duplicate writes harmless);
  * the math is w4a16_common's tensor-core decode, unchanged (its triton.jit helpers are called from here): per
    packed word 3 shifts + 4 LOP3 + one mma.sync m16n8k16, the zero point and the scale once per item and row;
  * split-K flush where programs share a tile: per-element tickets (each thread red.adds its elements into a zeroed
    fp32 tile, ATOMIC, or stores them to its contributor's slot, then takes each element's acq_rel ticket; the
    last arrival of an element reads the total, or sums the slots in contributor order: deterministic), writes y
    and zeroes the element's workspace and ticket. No shared memory, no barrier in the flush.
Layout L3 of every (NB, 32, 4) tensor: warps over fragment rows (R = NB / num_warps a thread), lane = the mma lane,
the 4 words of a 16-byte load in a thread's registers (the asm's pack of 4): BlockedLayout([R, 1, 4], [1, 32, 1],
[num_warps, 1, 1]); x and its sums are (1, 32, 4) in the same layout (broadcast over the rows).
"""

from __future__ import annotations

from flashscale.kernels.w4a16_common import b_pairs, mma_column, x_sums
from flashscale.kernels.w4a16_gemv import _dec_range, _next_item

try:  # Gluon is experimental: absent from older Tritons
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

    HAS_GLUON = True
except ImportError:  # pragma: no cover
    HAS_GLUON = False


if HAS_GLUON:

    @gluon.jit
    def _issue(w_s, sz_s, x_s, slot, pk_ptr, sz_ptr, x_ptr, tile, ks, ok, r3, nb3, lane3, j3, M, K, stride_xm,
               stride_pn, stride_sg, k_pad, n_frag, L3: gl.constexpr, NB: gl.constexpr, KT: gl.constexpr,
               G: gl.constexpr, TB: gl.constexpr, EVEN_K: gl.constexpr, EVEN_N: gl.constexpr):
        """cp.async copies of item (tile, ks) into ring slot `slot`, one copy a buffer (Triton's barrier analysis
        puts a CTA barrier between two copies into one buffer); ok False: every copy masked off."""
        k0 = ks * (64 * KT)
        kt3 = r3 // NB  # rows r of a slot's (KT NB, 32, 4) words: column kt = r // NB, fragment row r % NB
        fr = tile * NB + r3 % NB
        wp = pk_ptr + fr * stride_pn + (k0 // 64 + kt3) * 128 + lane3 * 4 + j3
        if EVEN_K and EVEN_N:
            cp.async_copy_global_to_shared(w_s.index(slot), wp, mask=ok)
        else:
            wm = (fr < n_frag) & (k0 + 64 * kt3 < k_pad) & (lane3 >= 0) & (j3 >= 0) & ok
            cp.async_copy_global_to_shared(w_s.index(slot), wp, mask=wm)
        # scale/zero words of rows g (c 0, 1) and g + 8 (c 2, 3): adjacent in PackedW4's sz (2 g, 2 g + 1)
        frs = tile * NB + nb3  # (NB, 1, 1)
        sp = sz_ptr + gl.minimum(k0 // G, K // G - 1) * stride_sg + frs * 16 + 2 * (lane3 // 4) + j3 // 2
        if EVEN_N:
            cp.async_copy_global_to_shared(sz_s.index(slot), sp, mask=ok)
        else:
            cp.async_copy_global_to_shared(sz_s.index(slot), sp, mask=(frs < n_frag) & (lane3 >= 0) & (j3 >= 0) & ok)
        # x words, row r = (kt TB + tb) 2 + q of the slot's (2 KT TB, 32, 4): lane 4 g + t, chunk i holds
        # (x[16 i + 2 t], x[.. + 1]) (+ 8 for the half q = 1) of token 8 tb + g (tokens >= M read M - 1: a B column
        # only reaches its own D column, which is never stored); K tails zero (padded codes dequantize to -z)
        xr = gl.arange(0, 2 * KT * TB, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))[:, None, None]
        q = xr % 2
        tb = (xr // 2) % TB
        kt = xr // (2 * TB)
        tok = gl.minimum(8 * tb + lane3 // 4, M - 1)
        kl = ks * (32 * KT) + 32 * kt + lane3 % 4 + 8 * j3 + 4 * q  # (2 KT TB, 32, 4)
        if EVEN_K:
            cp.async_copy_global_to_shared(x_s.index(slot), x_ptr + tok * stride_xm + kl, mask=ok)
        else:
            cp.async_copy_global_to_shared(x_s.index(slot), x_ptr + tok * stride_xm + kl, mask=(2 * kl < K) & ok)

    @gluon.jit
    def _read(w_s, sz_s, x_s, slot, L3: gl.constexpr, NB: gl.constexpr, KT: gl.constexpr, TB: gl.constexpr):
        """The item in `slot` into registers: scale/zero words (NB, 32, 4), the words of column 0 and 1 (NB, 32, 4;
        column 1 = column 0 when KT = 1) and the x rows (1, 32, 4) of column 0 / 1, token block 0 / 1, half 0 / 1."""
        ws = w_s.index(slot)
        xv = x_s.index(slot)
        szw = sz_s.index(slot).load(L3)
        w0 = ws.slice(0, NB, dim=0).load(L3)
        w1 = w0
        if KT == 2:
            w1 = ws.slice(NB, NB, dim=0).load(L3)
        x000 = xv.slice(0, 1, dim=0).load(L3)
        x001 = xv.slice(1, 1, dim=0).load(L3)
        x010 = x000
        x011 = x001
        if TB == 2:
            x010 = xv.slice(2, 1, dim=0).load(L3)
            x011 = xv.slice(3, 1, dim=0).load(L3)
        x100 = x000
        x101 = x001
        x110 = x010
        x111 = x011
        if KT == 2:
            x100 = xv.slice(2 * TB, 1, dim=0).load(L3)
            x101 = xv.slice(2 * TB + 1, 1, dim=0).load(L3)
            if TB == 2:
                x110 = xv.slice(6, 1, dim=0).load(L3)
                x111 = xv.slice(7, 1, dim=0).load(L3)
        return szw, w0, w1, x000, x001, x010, x011, x100, x101, x110, x111

    @gluon.jit
    def _item(acc, accb, szw, w0, w1, x000, x001, x010, x011, x100, x101, x110, x111, KT: gl.constexpr,
              TB: gl.constexpr, BF16: gl.constexpr):
        """acc (+ accb: tokens 8..15) += s 2^11 (D / D_UNIT - (OFF + z) sum(x)) of one item (_read's registers)."""
        s = (szw & -32).to(gl.float32, bitcast=True)  # s * 2^11
        zf = ((szw & 31) | 0x4B000000).to(gl.float32, bitcast=True)  # 2^23 + z, exact
        if BF16:
            zs = (zf - (8388608.0 - 128.0)) * s  # OFF_BF16
            sd = s
        else:
            zs = (zf - (8388608.0 - 64.0)) * s  # OFF_F16; the fp16 MMA sums are D_UNIT = 16x
            sd = s * (1.0 / 16.0)
        b0, b1 = b_pairs(x000, x001, True)
        bb0, bb1 = b_pairs(x010, x011, True)  # (= b0, b1 when TB = 1; unused there)
        d, db = mma_column(w0, b0, b1, bb0, bb1, None, None, BF16, TB == 2, True, True)
        xs = x_sums(b0, b1, None, BF16, True, True)
        xsb = xs
        if TB == 2:
            xsb = x_sums(bb0, bb1, None, BF16, True, True)
        if KT == 2:
            b0, b1 = b_pairs(x100, x101, True)
            bb0, bb1 = b_pairs(x110, x111, True)
            d, db = mma_column(w1, b0, b1, bb0, bb1, d, db, BF16, TB == 2, False, True)
            xs = x_sums(b0, b1, xs, BF16, False, True)
            if TB == 2:
                xsb = x_sums(bb0, bb1, xsb, BF16, False, True)
        acc = gl.fma(sd, d, acc) - zs * xs
        if TB == 2:
            accb = gl.fma(sd, db, accb) - zs * xsb
        return acc, accb

    @gluon.jit
    def _flush_block(acc, tile, pid, pf, nc, rows, toks, e_off, ws_ptr, cnt_ptr, y_ptr, bias_ptr, M, N, stride_ym,
                     SLOT: gl.constexpr, CM: gl.constexpr, HAS_BIAS: gl.constexpr, ATOMIC: gl.constexpr):
        """One token block's partial (NB, 32, 4): stored (sole contributor, nc == 1) or reduced element by element
        (module docstring)."""
        live = (toks < M) & (rows < N)
        if nc == 1:
            out = acc * (1.0 / 2048)
            if HAS_BIAS:
                out += gl.load(bias_ptr + rows, mask=live, other=0.0).to(gl.float32)
            gl.store(y_ptr + toks * stride_ym + rows, out.to(y_ptr.dtype.element_ty), mask=live)
        else:
            cp_ = cnt_ptr + (tile * SLOT).to(gl.int64) + e_off
            if ATOMIC:
                tp = ws_ptr + (tile * SLOT).to(gl.int64) + e_off
                gl.atomic_add(tp, acc, mask=live, sem="relaxed", scope="gpu")
            else:
                tp = ws_ptr + (tile * CM).to(gl.int64) * SLOT + e_off
                gl.store(tp + (pid - pf) * SLOT, acc, mask=live, cache_modifier=".cg")
            ticket = gl.atomic_add(cp_, e_off * 0 + 1, mask=live, sem="acq_rel", scope="gpu")
            last = live & (ticket == nc - 1)
            tot = gl.load(tp, mask=last, other=0.0, cache_modifier=".cg")
            if ATOMIC:
                gl.store(tp, gl.zeros_like(tot), mask=last)
            else:
                for c in gl.static_range(1, CM):  # a fixed left fold in contributor order; absent terms add 0
                    tot = tot + gl.load(tp + c * SLOT, mask=last & (c < nc), other=0.0, cache_modifier=".cg")
            gl.store(cp_, gl.zeros_like(ticket), mask=last)
            out = tot * (1.0 / 2048)
            if HAS_BIAS:
                out += gl.load(bias_ptr + rows, mask=last, other=0.0).to(gl.float32)
            gl.store(y_ptr + toks * stride_ym + rows, out.to(y_ptr.dtype.element_ty), mask=last)

    @gluon.jit(do_not_specialize=["M", "S", "U"])
    def w4a16_gring_kernel(
        x_ptr, pk_ptr, sz_ptr, y_ptr, bias_ptr, ws_ptr, cnt_ptr,
        M, N, K, stride_xm, stride_ym, stride_pn, stride_sg, S, U,
        G: gl.constexpr, HAS_BIAS: gl.constexpr, BF16: gl.constexpr, BN: gl.constexpr, KT: gl.constexpr,
        TB: gl.constexpr, STAGES: gl.constexpr, CM: gl.constexpr, ATOMIC: gl.constexpr, EVEN_K: gl.constexpr,
        EVEN_N: gl.constexpr, num_warps: gl.constexpr,
    ):
        """x_ptr: x as int32 words (pairs of 16-bit inputs); pk_ptr / sz_ptr: PackedW4 qweight / sz; S items a
        tile, U items; CM >= the contributors of any tile (the deterministic flush's slots a tile)."""
        NB: gl.constexpr = BN // 16
        SLOT: gl.constexpr = NB * 128 * TB
        L3: gl.constexpr = gl.BlockedLayout([NB // num_warps, 1, 4], [1, 32, 1], [num_warps, 1, 1], [2, 1, 0])
        SH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])  # a slot (rank 3), row-major
        w_s = gl.allocate_shared_memory(gl.int32, [STAGES, KT * NB, 32, 4], SH)
        sz_s = gl.allocate_shared_memory(gl.int32, [STAGES, NB, 32, 4], SH)
        x_s = gl.allocate_shared_memory(gl.int32, [STAGES, 2 * KT * TB, 32, 4], SH)
        nb3 = gl.arange(0, NB, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))[:, None, None]
        r3 = gl.arange(0, KT * NB, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))[:, None, None]
        lane3 = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))[None, :, None]
        j3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]
        pid, P, u0, u1, k_pad, n_frag = _dec_range(U, K, N)
        tile = u0 // S  # the item computed next
        ks = u0 - tile * S
        tile_p = tile  # the item copied next
        ks_p = ks
        for st in gl.static_range(STAGES - 1):
            _issue(w_s, sz_s, x_s, st, pk_ptr, sz_ptr, x_ptr, tile_p, ks_p, u0 + st < u1, r3, nb3, lane3, j3, M, K,
                   stride_xm, stride_pn, stride_sg, k_pad, n_frag, L3, NB, KT, G, TB, EVEN_K, EVEN_N)
            cp.commit_group()
            tile_p, ks_p = _next_item(tile_p, ks_p, S)
        acc = gl.zeros([NB, 32, 4], gl.float32, L3)
        accb = gl.zeros([NB, 32, 4], gl.float32, L3)
        rows0 = nb3 * 16 + lane3 // 4 + 8 * (j3 // 2)
        toks0 = 2 * (lane3 % 4) + j3 % 2
        e_off = nb3 * 128 + lane3 * 4 + j3
        for g in range(u0, u1):
            i = g - u0
            cp.wait_group(STAGES - 2)  # this thread's copies of item g have landed
            gl.thread_barrier()  # everyone's have, and everyone is done with item g - 1's slot
            szw, w0, w1, x000, x001, x010, x011, x100, x101, x110, x111 = _read(w_s, sz_s, x_s, i % STAGES, L3, NB, KT,
                                                                                TB)
            _issue(w_s, sz_s, x_s, (i + STAGES - 1) % STAGES, pk_ptr, sz_ptr, x_ptr, tile_p, ks_p,
                   g + STAGES - 1 < u1, r3, nb3, lane3, j3, M, K, stride_xm, stride_pn, stride_sg, k_pad, n_frag, L3,
                   NB, KT, G, TB, EVEN_K, EVEN_N)
            cp.commit_group()
            tile_p, ks_p = _next_item(tile_p, ks_p, S)
            acc, accb = _item(acc, accb, szw, w0, w1, x000, x001, x010, x011, x100, x101, x110, x111, KT, TB, BF16)
            if (ks == S - 1) | (g == u1 - 1):  # the end of this program's part of the tile
                pf = ((tile * S + 1) * P - 1) // U
                pl = ((tile * S + S) * P - 1) // U
                rows = tile * BN + rows0
                _flush_block(acc, tile, pid, pf, pl - pf + 1, rows, toks0, e_off, ws_ptr, cnt_ptr, y_ptr, bias_ptr,
                             M, N, stride_ym, SLOT, CM, HAS_BIAS, ATOMIC)
                if TB == 2:
                    _flush_block(accb, tile, pid, pf, pl - pf + 1, rows, toks0 + 8, e_off + NB * 128, ws_ptr,
                                 cnt_ptr, y_ptr, bias_ptr, M, N, stride_ym, SLOT, CM, HAS_BIAS, ATOMIC)
                acc = gl.zeros([NB, 32, 4], gl.float32, L3)
                accb = gl.zeros([NB, 32, 4], gl.float32, L3)
            tile, ks = _next_item(tile, ks, S)
        cp.wait_group(0)
