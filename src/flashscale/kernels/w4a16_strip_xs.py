"""x staged in shared memory by each strip program (StripConfig.xstage; docs/w4a16_decode.md "Round 14i").

Why: at M <= 8 the strip kernel reads x either as natural words (8 LDG.32 and 8 PRMT a column and lane, every
iteration) or in the MMA's B order from a gather pre-pass (2 LDG.128, but one more launch: ~1.5 us at 8192^2 M = 1,
10 % of the call). A program needs only its M tokens' B registers: M K 2 bytes (16 KB at K 8192, M = 1). Here each
program builds them itself in shared memory once, behind one barrier while its first ring loads are in flight, and
the loop reads them with one LDS.128 a lane, half-column and iteration: no gather launch, no x in the register ring.

Plain Triton cannot allocate shared memory, so the buffer is a static `.shared` array declared by inline PTX (the
declaration is emitted once: an asm with no tensor operand is a scalar) and addressed by its name; every access is
asm too (st.shared.v2 / ld.shared.v4 on 32-bit shared addresses). Static shared memory is capped at 48 KB a block
(the launch adds Triton's own dynamic allocation), hence `xs_max_bytes`: the launcher refuses what does not fit.

Layout: token m at byte m TS (TS = 128 NCOL + 64: two tokens' 64-byte half-lines on different banks), column c at
128 c, then the B order of w4a16_strip.x_perm_words without the token axis: word [h, t, ii, b] (2, 4, 2, 2) is B
register b of 16-k chunk 2 h + ii of the lanes 4 g + t, i.e. inputs (16 (2 h + ii) + 2 t + b, + 8) of the column.
From x's natural words (n holds inputs 2n, 2n + 1): chunk j = 2 h + ii, lane t takes words A = 32 c + 8 j + t and
B = A + 4; b = 0 is their low halves (prmt 0x5410), b = 1 their high halves (prmt 0x7632): w4a16_common.b_pairs.

The interpreter runs no inline PTX: there (WS > 0) the buffer is a slice of a global workspace, WS int32 words a
program, written and read at the same offsets with plain stores and loads, so the CPU tests check the layout.
"""

from __future__ import annotations

import triton
import triton.language as tl

XS_BLOCK_BYTES = 49152  # static + dynamic shared memory a block may take without the opt-in attribute (48 KB)
XS_ALIGN = 4096  # buffer sizes in steps of 4 KB (a compile each)


def xs_max_bytes(num_warps: int, rows: int) -> int:
    """The largest buffer a config may declare: 48 KB less Triton's own dynamic allocation, the warps' final sum
    (512 bytes a warp and fragment row: 2 KB at four warps and one row, the sm_90 census checks it)."""
    return XS_BLOCK_BYTES - 512 * num_warps * rows


def xs_token_stride(ncol: int) -> int:
    """Bytes a token takes in the buffer for ncol 64-wide columns (64 bytes of padding: see the module docstring)."""
    return 128 * ncol + 64


def xs_bytes(m: int, ncol: int) -> int:
    """The buffer's declared size for M tokens and ncol columns (rounded up to XS_ALIGN: few distinct compiles)."""
    return triton.cdiv(m * xs_token_stride(ncol), XS_ALIGN) * XS_ALIGN


def xs_decl(nbytes: int) -> str:
    """PTX declaring the buffer and returning its shared address (the kernel's XDECL constexpr)."""
    return f".shared .align 16 .b8 fs_xs[{nbytes}];\nmov.u32 $0, fs_xs;"


@triton.jit
def xs_base(XDECL: tl.constexpr, ws_ptr, WS: tl.constexpr):
    """The buffer: with XDECL (sm_90) its 32-bit shared address (declares it: call once a kernel); without (the
    interpreter, no inline PTX) program p's slice of the global workspace ws_ptr (WS words a program) as a pointer."""
    if WS:
        return ws_ptr + tl.program_id(0).to(tl.int64) * WS
    return tl.inline_asm_elementwise(XDECL, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def xs_stage(base, x_ptr, stride_xm, M, K, NCOL, TS, W: tl.constexpr, WS: tl.constexpr):
    """Write tokens 0..M-1's B registers of columns 0..NCOL-1 (inputs past K: zeros) from x's natural int32 words
    (M, K / 2) into the buffer, 8 W columns a round (4 word pairs a thread), then a CTA barrier."""
    CC: tl.constexpr = 8 * W
    c = tl.arange(0, CC)[:, None, None]
    j = tl.arange(0, 4)[None, :, None]
    t = tl.arange(0, 4)[None, None, :]
    off = c * 128 + (j // 2) * 64 + t * 16 + (j % 2) * 8  # (CC, 4, 4) bytes of the pair (b = 0, 1)
    wa = c * 32 + j * 8 + t  # natural word A of the pair; B = A + 4
    kw = K // 2
    for m in range(0, M):
        for c0 in range(0, NCOL, CC):
            na = wa + c0 * 32
            ok = c < NCOL - c0
            a = tl.load(x_ptr + m * stride_xm + na, mask=ok & (na < kw), other=0)
            b = tl.load(x_ptr + m * stride_xm + na + 4, mask=ok & (na + 4 < kw), other=0)
            o = m * TS + c0 * 128 + off
            if WS:  # the same words through global memory (b_pairs' emulation)
                wp = base + o // 4
                tl.store(wp, (a & 0xFFFF) | (b << 16), mask=ok)
                tl.store(wp + 1, ((a >> 16) & 0xFFFF) | (b & -65536), mask=ok)
            else:
                tl.inline_asm_elementwise(
                    "{ .reg .b32 lo, hi; prmt.b32 lo, $2, $3, 0x5410; prmt.b32 hi, $2, $3, 0x7632;"
                    " @$4 st.shared.v2.b32 [$1], {lo, hi}; mov.u32 $0, 0; }",
                    "=r,r,r,r,b", [base + o, a, b, ok], dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def xs_b(base, t, T, S, wi, M, TS, W: tl.constexpr, KT: tl.constexpr, EVEN: tl.constexpr, WS: tl.constexpr):
    """Iteration t's B registers (W, 32, 4, 2, 1, KT) (w4a16_strip_kernel._xp_x's shape and order) from the buffer:
    one LDS.128 a lane, half-column h and column (words [ii, b]); lanes of tokens g >= M read token M - 1's (the
    same address as that token's lanes: a broadcast; a B column reaches only its own D column, never stored); a warp
    with no sub-item left (not EVEN) reads column S KT..: zeros staged."""
    j = tl.minimum(t, T - 1) * W + wi
    ks = tl.minimum(j, S - 1)
    if not EVEN:
        ks = tl.where(j < S, ks, S)
    lane = tl.arange(0, 32)
    tok = tl.minimum(lane // 4, M - 1)
    o = (ks * (KT * 128))[:, None, None, None] + (tok * TS + (lane % 4) * 16)[None, :, None, None] \
        + (tl.arange(0, 2) * 64)[None, None, :, None] + (tl.arange(0, KT) * 128)[None, None, None, :]  # (W, 32, h, KT)
    if WS:
        v = tl.load(base + o[:, :, :, :, None] // 4 + tl.arange(0, 4)[None, None, None, None, :])
        v = tl.reshape(v, [W, 32, 2, KT, 2, 2])  # (W, 32, h, KT, ii, b)
    else:
        v0, v1, v2, v3 = tl.inline_asm_elementwise(
            "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", [base + o],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=1)
        v = tl.join(tl.join(v0, v2), tl.join(v1, v3))  # (W, 32, h, KT, ii, b): join stacks on a new last axis
    v = tl.permute(v, [0, 1, 2, 4, 5, 3])  # (W, 32, h, ii, b, KT)
    return tl.reshape(v, [W, 32, 4, 2, 1, KT])
