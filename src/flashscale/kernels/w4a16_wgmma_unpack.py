"""The W4A16 wgmma GEMM's dequantization in registers (Gluon helpers of the consumers' main loops): a ring slot's
packed words and scale/zero words to registers (_load_slot), then to this consumer's A tile in the wgmma operand
layout (_unpack, with _nib, _pair, _consts: w4a16_common's fp32 magic-number unpack; _unpack_h2, with _h2_consts,
_h2_pair, _dup16 and the gl.constexpr asm globals _H2_*: w4a16_h2.py's packed 16-bit unpack). Apart from the main
loops (w4a16_wgmma_kernel.py): register arithmetic only, no barriers, no memory but the slot's shared memory.

It is also where the Gluon modules of this kernel (w4a16_wgmma_*.py) probe the installed Triton: HAS_GLUON, imported by
the others, is True when every Gluon name they use imports and gl has warp_specialize.
"""

from __future__ import annotations

from flashscale.kernels import w4a16_h2 as h2

try:  # Gluon is experimental: absent from older Tritons
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = hasattr(gl, "warp_specialize")
    # imported only for the probe (the kernel modules and the launcher import these names themselves)
    del triton, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait, TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False

if HAS_GLUON:

    # module globals a kernel reads must be constexpr
    _H2_B0, _H2_B1, _H2_B2, _H2_B3 = (gl.constexpr(h2.pair_asm(m, "bf16")) for m in range(4))
    _H2_F0, _H2_F1, _H2_F2, _H2_F3 = (gl.constexpr(h2.pair_asm(m, "fp16")) for m in range(4))
    _H2_CON_B = gl.constexpr(h2.constraints("bf16"))
    _H2_CON_F = gl.constexpr(h2.constraints("fp16"))

    @gluon.jit
    def _nib(s, MAGIC, LOW: gl.constexpr):
        """int32 -> float32 1 + q/2^11 (q at bits 12..15, LOW) or 1 + q/2^7 (bits 16..19): one LOP3."""
        if LOW:
            return ((s & 0xF000) | MAGIC).to(gl.float32, bitcast=True)
        else:
            return ((s & 0xF0000) | MAGIC).to(gl.float32, bitcast=True)

    @gluon.jit
    def _pair(lo, hi, DT: gl.constexpr):
        """Two fp32 weights (k0 = 0, 1) -> one packed pair (cvt.rn.bf16x2.f32 / f16x2)."""
        return gl.join(lo, hi).to(DT)

    @gluon.jit
    def _consts(sz):
        """sz words (float32 bits of s*2^11 | zero) -> S_12, C_12, S_16, C_16 (w4a16_common.group_consts)."""
        s12 = (sz & -32).to(gl.float32, bitcast=True)
        c12 = (sz & 31).to(gl.float32) * s12 * (1.0 / 2048.0) + s12
        return s12, c12, s12 * 0.0625, s12 * -0.9375 + c12

    @gluon.jit
    def _load_slot(w_slot, sz_slot, c: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr, num_warps: gl.constexpr,
                   NBF: gl.constexpr):
        """Slot -> consumer c's packed words and scale/zero words in registers (LDS.128 / LDS.64), NBF fragments of
        16 features (4: 64 features; 8: 128, warp w holding fragments w and w + 4, the wgmma's row blocks).
        words (NBF, KT, 8, 4, 4) = (fragment row nb, column kt, g, t, step i); nibble j = 4 k3 + 2 n3 + k0
        of word (nb, kt, g, t, i) is W^T[16 nb + 8 n3 + g, 64 kt + 16 i + 8 k3 + 2 t + k0]."""
        KT: gl.constexpr = BK // 64
        ld: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])
        p = w_slot.slice(c * NBF, NBF, dim=0).load(ld)  # (NBF, KT, 128): one LDS.128 a thread a fragment
        l5: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 4], [1, 1, 8, 4, 1], [num_warps, 1, 1, 1, 1], [4, 3, 2, 1, 0])
        p = gl.convert_layout(gl.reshape(p, [NBF, KT, 8, 4, 4]), l5)  # the same registers, named (nb, kt, g, t, i)
        # scale/zero words of the 16 NBF rows: column 16 nb + 2 g + n3 (rows 8 n3 + g), SZR groups a step
        sl: gl.constexpr = gl.BlockedLayout([1, 1, 1, 2], [1, 1, 8, 4], [1, num_warps, 1, 1], [3, 2, 1, 0])
        szw = sz_slot.reshape([SZR, sz_slot.shape[1] // 16, 8, 2]).slice(c * NBF, NBF, dim=1).load(sl)
        return p, szw

    @gluon.jit
    def _unpack(p, szw, MAGIC, H2: gl.constexpr, DT: gl.constexpr, a_layout: gl.constexpr, BK: gl.constexpr,
                num_warps: gl.constexpr):
        """Registers only: words + scale/zero words -> this consumer's A tile (16 NBF, BK) in the wgmma operand
        layout."""
        l5: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 4], [1, 1, 8, 4, 1], [num_warps, 1, 1, 1, 1], [4, 3, 2, 1, 0])
        sza, szb = gl.split(szw)  # (SZR, 4, 8): rows n3 = 0 / 1
        l3: gl.constexpr = gl.SliceLayout(3, gl.SliceLayout(4, l5))  # (nb, kt, g), broadcast over t and i
        sza = gl.expand_dims(gl.expand_dims(gl.convert_layout(gl.permute(sza, [1, 0, 2]), l3), 3), 4)
        szb = gl.expand_dims(gl.expand_dims(gl.convert_layout(gl.permute(szb, [1, 0, 2]), l3), 3), 4)
        pu = p.to(gl.uint32, bitcast=True)
        if H2:  # packed 16-bit pairs (w4a16_h2.py): 1 SHF, then PRMT, LOP3 and 2-3 packed FMA-pipe ops a pair
            return _unpack_h2(p, pu, sza, szb, DT, a_layout, BK)
        s12a, c12a, s16a, c16a = _consts(sza)
        s12b, c12b, s16b, c16b = _consts(szb)
        r16 = ((pu << 16) | (pu >> 16)).to(gl.int32, bitcast=True)
        l8 = p << 8
        r8 = (pu >> 8).to(gl.int32, bitcast=True)
        # fp32 pairs (k0 = 0, 1) joined first, then one cvt.rn.bf16x2 a pair: each packed register is already an
        # A-fragment register (no PRMT), so keeping the 16-bit values alive keeps the wgmma's operand registers
        w0 = _pair(_nib(r16, MAGIC, False) * s16a - c16a, _nib(l8, MAGIC, True) * s12a - c12a, DT)  # nibbles 0, 1
        w1 = _pair(_nib(l8, MAGIC, False) * s16b - c16b, _nib(p, MAGIC, True) * s12b - c12b, DT)  # 2, 3
        w2 = _pair(_nib(p, MAGIC, False) * s16a - c16a, _nib(r8, MAGIC, True) * s12a - c12a, DT)  # 4, 5
        w3 = _pair(_nib(r8, MAGIC, False) * s16b - c16b, _nib(r16, MAGIC, True) * s12b - c12b, DT)  # 6, 7
        e = gl.join(gl.join(w0, w1), gl.join(w2, w3))  # (nb, kt, g, t, i, k0, n3, k3) -> reorder below
        e = gl.permute(e, [0, 6, 2, 1, 4, 7, 3, 5])  # (nb, n3, g, kt, i, k3, t, k0)
        return gl.convert_layout(gl.reshape(e, [p.shape[0] * 16, BK]), a_layout)  # registers only: A's layout

    @gluon.jit
    def _dup16(v):
        """16-bit floats -> int32 words holding the value in both halves (an h2 pair operand)."""
        return (v.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF) * 0x10001

    @gluon.jit
    def _h2_consts(sz, like, BF16: gl.constexpr):
        """sz words (float32 bits of s*2^11 | zero) -> the h2 asm's C = BIAS + z, then S_LO, S_HI (bf16: s split
        in two bf16, the low part exact) or S, S (fp16), each as both halves of an int32, broadcast like `like`."""
        s = (sz & -32).to(gl.float32, bitcast=True) * (1.0 / 2048.0)  # s exactly (a float16 value)
        z = (sz & 31).to(gl.float32)
        if BF16:
            hi = s.to(gl.bfloat16)
            c, lo, hi = _dup16((z + 128.0).to(gl.bfloat16)), _dup16((s - hi.to(gl.float32)).to(gl.bfloat16)), _dup16(hi)
        else:
            c, lo = _dup16((z + 1024.0).to(gl.float16)), _dup16(s.to(gl.float16))
            hi = lo
        c, lo, hi = gl.broadcast(c, like)[0], gl.broadcast(lo, like)[0], gl.broadcast(hi, like)[0]
        return gl.join(c, c), gl.join(lo, lo), gl.join(hi, hi)

    @gluon.jit
    def _h2_pair(pp, shp, c, lo, hi, ASM: gl.constexpr, CON: gl.constexpr, BF16: gl.constexpr):
        if BF16:
            return gl.inline_asm_elementwise(ASM, CON, [pp, shp, c, lo, hi], dtype=gl.bfloat16, is_pure=True, pack=2)
        else:
            return gl.inline_asm_elementwise(ASM, CON, [pp, shp, c, lo], dtype=gl.float16, is_pure=True, pack=2)

    @gluon.jit
    def _unpack_h2(p, pu, sza, szb, DT: gl.constexpr, a_layout: gl.constexpr, BK: gl.constexpr):
        """_unpack with w4a16_h2's packed 16-bit arithmetic: pair m of a word (nibbles 2m, 2m + 1 = k0 0, 1) is
        one asm call with pack=2 on int32 operands whose two elements are equal (the word, word >> 4, C, S_LO,
        S_HI of its row), giving the packed A-fragment register directly: the same values as the fp32 path."""
        BF16: gl.constexpr = DT == gl.bfloat16
        sh = (pu >> 4).to(gl.int32, bitcast=True)
        pp = gl.join(p, p)
        shp = gl.join(sh, sh)
        ca, la, ha = _h2_consts(sza, p, BF16)
        cb, lb, hb = _h2_consts(szb, p, BF16)
        if BF16:
            w0 = _h2_pair(pp, shp, ca, la, ha, _H2_B0, _H2_CON_B, BF16)  # nibbles 0, 1 (row n3 = 0)
            w1 = _h2_pair(pp, shp, cb, lb, hb, _H2_B1, _H2_CON_B, BF16)  # 2, 3 (n3 = 1)
            w2 = _h2_pair(pp, shp, ca, la, ha, _H2_B2, _H2_CON_B, BF16)  # 4, 5
            w3 = _h2_pair(pp, shp, cb, lb, hb, _H2_B3, _H2_CON_B, BF16)  # 6, 7
        else:
            w0 = _h2_pair(pp, shp, ca, la, ha, _H2_F0, _H2_CON_F, BF16)
            w1 = _h2_pair(pp, shp, cb, lb, hb, _H2_F1, _H2_CON_F, BF16)
            w2 = _h2_pair(pp, shp, ca, la, ha, _H2_F2, _H2_CON_F, BF16)
            w3 = _h2_pair(pp, shp, cb, lb, hb, _H2_F3, _H2_CON_F, BF16)
        e = gl.join(gl.join(w0, w1), gl.join(w2, w3))  # as _unpack's
        e = gl.permute(e, [0, 6, 2, 1, 4, 7, 3, 5])
        return gl.convert_layout(gl.reshape(e, [p.shape[0] * 16, BK]), a_layout)
