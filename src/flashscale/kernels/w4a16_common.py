"""Pieces shared by the W4A16 kernels: nibble -> float without a conversion instruction, the group
constants, the split-K epilogues (per-element atomics, or per-split slices with one ticket per tile),
and their workspaces.

Nibble to float ("magic number"): OR-ing a nibble into the mantissa of 1.0f gives 1 + q * 2^(p-23) for
a nibble at bits p..p+3, with no int->float conversion (I2F runs at a quarter of the FMA rate). Two
windows are used, p = 12 and p = 16, so one shift brings two nibbles of a word into place (raw word:
nibbles 3, 4; << 8: 1, 2; >> 8: 5, 6; rotate 16: 7, 0) and each nibble then costs one LOP3
((s & mask) | magic, with magic in a register so ptxas fuses the two: it passes as a kernel argument).
Then w = (q - z) * s is one FMA: f * S_p - C_p with S_12 = s * 2^11, C_12 = S_12 + z*s,
S_16 = s * 2^7, C_16 = S_16 + z*s. Every one of these is exact in float32 (s has 11 significant bits,
z <= 16: S_p, C_p and f * S_p fit in 24 bits), so w is exactly (q - z) * s before the single rounding to
the 16-bit MMA operand, as the reference computes it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAGIC_ONE = 0x3F800000  # float32 1.0: the exponent the nibbles are OR-ed under


@triton.jit
def nibble_float(s, MAGIC, LOW: tl.constexpr):
    """int32 s -> float32 1 + q/2^11 (q at bits 12..15, LOW) or 1 + q/2^7 (q at bits 16..19)."""
    if LOW:
        return ((s & 0xF000) | MAGIC).to(tl.float32, bitcast=True)
    else:
        return ((s & 0xF0000) | MAGIC).to(tl.float32, bitcast=True)


@triton.jit
def word_shifts(p):
    """int32 words -> (rot16, <<8, >>8) views: each brings two more nibbles into the windows."""
    pu = p.to(tl.uint32, bitcast=True)
    r16 = ((pu << 16) | (pu >> 16)).to(tl.int32, bitcast=True)  # one SHF.L.W (funnel shift)
    l8 = p << 8
    r8 = (pu >> 8).to(tl.int32, bitcast=True)
    return r16, l8, r8


@triton.jit
def group_consts(sz):
    """sz words (float32 bits of s*2^11 | zero) -> S_12, C_12, S_16, C_16 (module docstring)."""
    s12 = (sz & -32).to(tl.float32, bitcast=True)
    zs = (sz & 31).to(tl.float32) * s12  # z * s * 2^11, exact
    c12 = zs * (1.0 / 2048.0) + s12
    s16 = s12 * 0.0625
    c16 = s12 * -0.9375 + c12
    return s12, c12, s16, c16


@triton.jit
def store_or_reduce(acc, y_ptrs, ws_off, mask, bias, ws_ptr, cnt_ptr, SPLIT_K, HAS_BIAS: tl.constexpr):
    """Write an fp32 tile (+ bias) to y, or, under split-K, add it into the fp32 workspace: the split
    that arrives last for an element (its own per-element ticket) writes y and puts workspace and
    ticket back to zero, so one launch does it all and the next call finds a clean workspace."""
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc = acc + bias
        tl.store(y_ptrs, acc.to(y_ptrs.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(ws_ptr + ws_off, acc, mask=mask, sem="relaxed")
        # acq_rel: our add is visible before the ticket; the last one sees every earlier add
        ticket = tl.atomic_add(cnt_ptr + ws_off, tl.full(acc.shape, 1, tl.int32), mask=mask, sem="acq_rel")
        last = mask & (ticket == SPLIT_K - 1)
        tot = tl.load(ws_ptr + ws_off, mask=last, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            tot = tot + bias
        tl.store(y_ptrs, tot.to(y_ptrs.dtype.element_ty), mask=last)
        tl.store(ws_ptr + ws_off, tl.zeros(acc.shape, tl.float32), mask=last)
        tl.store(cnt_ptr + ws_off, tl.zeros(acc.shape, tl.int32), mask=last)


@triton.jit
def write_partial(acc, ws_ptr, ws_off, mask, SLICE):
    """Split-K by slices, step 1: this split's fp32 partial tile goes to its own workspace slice
    (pid_k * SLICE + offset) with plain coalesced stores: no per-element atomics."""
    tl.store(ws_ptr + tl.program_id(1).to(tl.int64) * SLICE + ws_off, acc, mask=mask)


@triton.jit
def last_split(cnt_ptr, tile, SPLIT_K):
    """Split-K by slices, step 2: one ticket per output tile (one atomic a program, not one an element).
    The barrier orders every thread's partial stores before the release of the one thread that takes
    the ticket; the split that draws SPLIT_K - 1 sums the slices and puts the ticket back to 0."""
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    return ticket == SPLIT_K - 1


@triton.jit
def sum_partials(ws_ptr, ws_off, mask, SLICE, SPLIT_K):
    """Split-K by slices, step 3 (last split only): the slices summed in split order (deterministic,
    whatever order the splits finished in), read through L2 (.cg: the L1 may hold a stale line)."""
    tot = tl.load(ws_ptr + ws_off, mask=mask, other=0.0, cache_modifier=".cg")
    for s in range(1, SPLIT_K):
        tot += tl.load(ws_ptr + s * SLICE + ws_off, mask=mask, other=0.0, cache_modifier=".cg")
    return tot


@triton.jit
def reset_ticket(cnt_ptr, tile):
    tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


_WORKSPACE: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
_SLICES: dict[torch.device, torch.Tensor] = {}


def split_k_slices(device: torch.device, numel: int) -> torch.Tensor:
    """fp32 buffer of >= numel for split-K by slices (splits x M x N partials). Every split overwrites
    its slice before the last one reads it, so the contents never need clearing; tickets live in
    split_k_workspace's int32 buffer (left at zero like the per-element ones)."""
    device = torch.device(device)
    buf = _SLICES.get(device)
    if buf is None or buf.numel() < numel:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the W4A16 split-K slice buffer must grow to {numel} elements inside CUDA-graph "
                               "capture; run each shape once before capturing")
        buf = torch.empty(max(numel, 1 << 16), dtype=torch.float32, device=device)
        _SLICES[device] = buf
    return buf


def split_k_workspace(device: torch.device, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 partial sums, int32 tickets), zero, at least `numel` long, one pair per device.

    The kernels leave both at zero after every call. Calls on one device must not overlap in time
    (one stream), and the first call of a size should happen outside CUDA-graph capture.
    """
    device = torch.device(device)
    ws = _WORKSPACE.get(device)
    if ws is None or ws[0].numel() < numel:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # zeros made inside a capture are not zero until the graph replays: fail loudly instead
            raise RuntimeError(f"the W4A16 split-K workspace must grow to {numel} elements inside CUDA-graph "
                               "capture; run each shape once before capturing")
        size = max(numel, 1 << 16)
        ws = (torch.zeros(size, dtype=torch.float32, device=device), torch.zeros(size, dtype=torch.int32, device=device))
        _WORKSPACE[device] = ws
    return ws


# ---- tensor-core decode (w4a16_decode.w4a16_decode_kernel): nibble pairs -> 16-bit pairs -> mma.sync
#
# A PackedW4 word is lane L's share of one 16x16 A fragment of mma.m16n8k16 (w4a16_pack): nibble
# j = 4*k3 + 2*n3 + k0 is W[row g + 8 n3][k 2t + k0 + 8 k3] (g = L // 4, t = L % 4). A LOP3 with a
# mask and a 16-bit "magic" exponent turns two nibbles (same bits of each half) into a pair of 16-bit
# floats with no conversion instruction, exactly: bf16 takes bits 0-3 (128 + q: its 7-bit mantissa
# has no room higher), fp16 bits 4-7 (1024 + 16 q = 16 (64 + q): a 64, not 1024, offset to cancel).
# Three shifts bring the other nibbles there, so the pairs come out as (nibble 0, 4), (1, 5), (2, 6),
# (3, 7): same row, k and k + 8. mma.sync takes a register pair as columns (2t, 2t + 1), so the kernel relabels K
# inside each 16-wide chunk (kappa 2t + e <-> k 2t + 8e, kappa 2t + 8 + e <-> k 2t + 1 + 8e) and feeds x
# in the same order: B pairs (x[2t], x[2t+8]) and (x[2t+1], x[2t+9]), one PRMT each from two x words.
# The zero point never meets a weight: the MMA sums D_UNIT (OFF + q) x exactly in fp32 and the kernel
# takes (OFF + z) * sum(x) off once per item and row, sum(x) coming from one more MMA with A = 1 per
# chunk (shared by every fragment). Per word (8 weights): 3 shifts + 4 LOP3 + 1 HMMA = 1 instruction a
# weight. The cancellation costs log2(OFF / |q - z|) <= 7 (bf16) / 6 (fp16) of fp32's 24 bits (the
# reference rounds every weight to 16 bits), and the group scale is applied in fp32 once per item and
# row: no weight is rounded.

OFF_BF16 = tl.constexpr(128.0)  # bf16 magic 0x4300 | q = 128 + q
OFF_F16 = tl.constexpr(64.0)  # fp16 magic 0x6400 | q << 4 = 1024 + 16 q = 16 (64 + q)
D_UNIT_F16 = tl.constexpr(16.0)  # the MMA's fp16 sums are 16x: the kernel scales them by 1/16


def _mma_asm_text(bf16: bool, two: bool, first: bool) -> str:
    """PTX for one (fragment, lane) of a 64-wide column: 4 words (16-k chunks) -> 4 chained mma.sync
    (x2 with `two`: tokens 8..15 as a second n = 8 block). Operands: outputs $0..3 (and $4..7) fp32
    D, then inputs: words, B registers (b0, b1; then b0, b1 of the second block), C (absent when
    `first`: C = 0)."""
    n_out = 8 if two else 4
    ops = iter(range(n_out, 200))
    w = [next(ops) for _ in range(4)]
    b = [[next(ops) for _ in range(4)] for _ in range(4 if two else 2)]
    c = [] if first else [next(ops) for _ in range(n_out)]
    ty = "bf16" if bf16 else "f16"
    lines = ["{", ".reg .b32 fsa<4>, fsh<3>;"]
    for o in range(n_out):
        lines.append(f"mov.f32 ${o}, 0f00000000;" if first else f"mov.f32 ${o}, ${c[o]};")
    for i in range(4):
        if bf16:  # (w >> s & 0x000F000F) | 128.0: nibbles 0,4 / 1,5 (row g, k 2t+1, 2t+9) / 2,6 (row g+8) / 3,7
            lines += [f"shr.u32 fsh0, ${w[i]}, 4;", f"shr.u32 fsh1, ${w[i]}, 8;", f"shr.u32 fsh2, ${w[i]}, 12;",
                      f"lop3.b32 fsa0, ${w[i]}, 0x000F000F, 0x43004300, 0xEA;",
                      "lop3.b32 fsa2, fsh0, 0x000F000F, 0x43004300, 0xEA;",
                      "lop3.b32 fsa1, fsh1, 0x000F000F, 0x43004300, 0xEA;",
                      "lop3.b32 fsa3, fsh2, 0x000F000F, 0x43004300, 0xEA;"]
        else:  # the same pairs at bits 4-7 / 20-23: (w << 4, w, w >> 4, w >> 8) & 0x00F000F0 | 1024.0
            lines += [f"shl.b32 fsh0, ${w[i]}, 4;", f"shr.u32 fsh1, ${w[i]}, 4;", f"shr.u32 fsh2, ${w[i]}, 8;",
                      "lop3.b32 fsa0, fsh0, 0x00F000F0, 0x64006400, 0xEA;",
                      f"lop3.b32 fsa2, ${w[i]}, 0x00F000F0, 0x64006400, 0xEA;",
                      "lop3.b32 fsa1, fsh1, 0x00F000F0, 0x64006400, 0xEA;",
                      "lop3.b32 fsa3, fsh2, 0x00F000F0, 0x64006400, 0xEA;"]
        for blk in range(2 if two else 1):
            d = ",".join(f"${4 * blk + r}" for r in range(4))
            lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{{d}}}, {{fsa0,fsa1,fsa2,fsa3}}, "
                         f"{{${b[2 * blk][i]},${b[2 * blk + 1][i]}}}, {{{d}}};")
    lines.append("}")
    return "\n".join(lines)


def _xsum_asm_text(bf16: bool, first: bool) -> str:
    """PTX: per lane, 4 chunks of B registers -> D += ones @ B, i.e. c0/c2 += sum of x over the chunks
    for token 2t, c1/c3 for token 2t + 1. Operands: $0..3 D, $4..7 b0, $8..11 b1, $12..15 C."""
    ty = "bf16" if bf16 else "f16"
    one = "0x3F803F80" if bf16 else "0x3C003C00"
    lines = ["{", ".reg .b32 fso;", f"mov.b32 fso, {one};"]
    for o in range(4):
        lines.append(f"mov.f32 ${o}, 0f00000000;" if first else f"mov.f32 ${o}, ${12 + o};")
    for i in range(4):
        lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{$0,$1,$2,$3}}, {{fso,fso,fso,fso}}, "
                     f"{{${4 + i},${8 + i}}}, {{$0,$1,$2,$3}};")
    lines.append("}")
    return "\n".join(lines)


def _constraints(n_out: int, n_int: int, n_f32: int) -> str:
    return ",".join(["=f"] * n_out + ["r"] * n_int + ["f"] * n_f32)


_ASM_F16 = tl.constexpr(_mma_asm_text(False, False, False))
_ASM_F16_1 = tl.constexpr(_mma_asm_text(False, False, True))
_ASM_F16_T = tl.constexpr(_mma_asm_text(False, True, False))
_ASM_F16_T1 = tl.constexpr(_mma_asm_text(False, True, True))
_ASM_BF16 = tl.constexpr(_mma_asm_text(True, False, False))
_ASM_BF16_1 = tl.constexpr(_mma_asm_text(True, False, True))
_ASM_BF16_T = tl.constexpr(_mma_asm_text(True, True, False))
_ASM_BF16_T1 = tl.constexpr(_mma_asm_text(True, True, True))
_XS_F16 = tl.constexpr(_xsum_asm_text(False, False))
_XS_F16_1 = tl.constexpr(_xsum_asm_text(False, True))
_XS_BF16 = tl.constexpr(_xsum_asm_text(True, False))
_XS_BF16_1 = tl.constexpr(_xsum_asm_text(True, True))
_CON = tl.constexpr(_constraints(4, 12, 4))
_CON_1 = tl.constexpr(_constraints(4, 12, 0))
_CON_T = tl.constexpr(_constraints(8, 20, 8))
_CON_T1 = tl.constexpr(_constraints(8, 20, 0))
_CON_X = tl.constexpr(_constraints(4, 8, 4))
_CON_X1 = tl.constexpr(_constraints(4, 8, 0))


@triton.jit
def b_pairs(p0, p1, ASM: tl.constexpr):
    """x words p0 = (x[2t], x[2t+1]), p1 = (x[2t+8], x[2t+9]) -> the B registers (x[2t], x[2t+8]),
    (x[2t+1], x[2t+9]) of the relabelled K order (two PRMT)."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise("prmt.b32 $0, $2, $3, 0x5410;\nprmt.b32 $1, $2, $3, 0x7632;",
                                           "=r,=r,r,r", [p0, p1], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        lo = (p0 & 0xFFFF) | (p1 << 16)
        hi = ((p0 >> 16) & 0xFFFF) | (p1 & -65536)
    return lo, hi


@triton.jit
def _halves_f32(b, BF16: tl.constexpr):
    """int32 holding two 16-bit floats -> (..., 2) float32 [low, high] (emulation only)."""
    if BF16:
        lo = (b << 16).to(tl.float32, bitcast=True)
        hi = (b & -65536).to(tl.float32, bitcast=True)
    else:
        lo = (b & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = ((b >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return tl.join(lo, hi)


@triton.jit
def _b_matrix(b0, b1, BF16: tl.constexpr):
    """(FB, 32, 4) B registers -> (FB, 4, 16, 8) B_i[kappa][n] by mma.sync's fragment layout (b0: rows
    2t + e, b1: rows 2t + 8 + e, column g), emulation only. FB = 1 (one x for every fragment) or one B a fragment
    (w4a16_strip: each warp its own K range)."""
    FB: tl.constexpr = b0.shape[0]
    bf = tl.reshape(_halves_f32(tl.join(b0, b1), BF16), [FB, 8, 4, 4, 2, 2])  # (f, g = n, t, i, kh, e)
    return tl.reshape(tl.permute(bf, [0, 3, 4, 2, 5, 1]), [FB, 4, 16, 8])


@triton.jit
def _d_lanes(d, F: tl.constexpr):
    """(F, 16, 8) D[r][n] -> (F, 32, 4) per lane 4g + t: c0/c1 = D[g][2t + e], c2/c3 = D[g + 8][2t + e]."""
    return tl.reshape(tl.permute(tl.reshape(d, [F, 2, 8, 4, 2]), [0, 2, 3, 1, 4]), [F, 32, 4])


@triton.jit
def _mma_emulated(w, b0, b1, c, BF16: tl.constexpr, FIRST: tl.constexpr):
    """What the asm computes, lane by lane, from the same registers (interpreter): the pairs the LOP3s
    build, then mma.sync's documented fragment semantics (A: a0 rows g cols 2t+e, a1 rows g+8, a2/a3
    cols + 8; B: b0 rows 2t+e col g, b1 rows 2t+8+e; D: c0/c1 row g cols 2t+e, c2/c3 row g+8).
    w (F, 32, 4) words, b0/b1 (1 or F, 32, 4), c (F, 32, 4) -> (F, 32, 4) fp32."""
    F: tl.constexpr = w.shape[0]
    nib = (w[:, :, :, None] >> (tl.arange(0, 8) * 4)[None, None, None, :]) & 15  # n = 4 k3 + 2 n3 + k0
    nib = tl.permute(tl.reshape(nib, [F, 32, 4, 2, 2, 2]), [0, 1, 2, 5, 4, 3])  # (F, lane, i, kh=k0, rh=n3, e=k3)
    if BF16:
        a = nib.to(tl.float32) + OFF_BF16  # 0x4300 | q
    else:
        a = nib.to(tl.float32) * D_UNIT_F16 + OFF_F16 * D_UNIT_F16  # 0x6400 | q << 4
    a = tl.permute(tl.reshape(a, [F, 8, 4, 4, 2, 2, 2]), [0, 3, 5, 1, 4, 2, 6])  # (F, i, rh, g, kh, t, e)
    a = tl.reshape(a, [F, 4, 16, 16])  # A_i[8 rh + g][kappa = 8 kh + 2 t + e]
    bm = _b_matrix(b0, b1, BF16)
    d = _d_lanes(tl.sum(tl.sum(a[:, :, :, :, None] * bm[:, :, None, :, :], axis=3), axis=1), F)
    if not FIRST:
        d = c + d
    return d


@triton.jit
def mma_column(w, b0, b1, b0b, b1b, c, cb, BF16: tl.constexpr, TWO: tl.constexpr, FIRST: tl.constexpr,
               ASM: tl.constexpr):
    """One 64-wide column of F fragments: D (+)= D_UNIT (OFF + q) @ x for tokens 0..7 (c) and, with TWO,
    8..15 (cb). w (F, 32, 4) int32 words, b* (1, 32, 4) B registers; returns (d, db) (db = d without TWO)."""
    if ASM:
        if TWO:
            if FIRST:
                d, db = tl.inline_asm_elementwise(_ASM_BF16_T1 if BF16 else _ASM_F16_T1, _CON_T1,
                                                  [w, b0, b1, b0b, b1b], dtype=(tl.float32, tl.float32),
                                                  is_pure=True, pack=4)
            else:
                d, db = tl.inline_asm_elementwise(_ASM_BF16_T if BF16 else _ASM_F16_T, _CON_T,
                                                  [w, b0, b1, b0b, b1b, c, cb], dtype=(tl.float32, tl.float32),
                                                  is_pure=True, pack=4)
        else:
            if FIRST:
                d = tl.inline_asm_elementwise(_ASM_BF16_1 if BF16 else _ASM_F16_1, _CON_1, [w, b0, b1],
                                              dtype=tl.float32, is_pure=True, pack=4)
            else:
                d = tl.inline_asm_elementwise(_ASM_BF16 if BF16 else _ASM_F16, _CON, [w, b0, b1, c],
                                              dtype=tl.float32, is_pure=True, pack=4)
            db = d
    else:
        d = _mma_emulated(w, b0, b1, c, BF16, FIRST)
        db = d
        if TWO:
            db = _mma_emulated(w, b0b, b1b, cb, BF16, FIRST)
    return d, db


@triton.jit
def x_sums(b0, b1, c, BF16: tl.constexpr, FIRST: tl.constexpr, ASM: tl.constexpr):
    """(FB, 32, 4) B registers of a column -> (FB, 32, 4) fp32 (+)= sum of x over the column for the
    token of each C slot (c0/c2: 2t, c1/c3: 2t + 1), by an MMA with A = 1."""
    if ASM:
        if FIRST:
            d = tl.inline_asm_elementwise(_XS_BF16_1 if BF16 else _XS_F16_1, _CON_X1, [b0, b1], dtype=tl.float32,
                                          is_pure=True, pack=4)
        else:
            d = tl.inline_asm_elementwise(_XS_BF16 if BF16 else _XS_F16, _CON_X, [b0, b1, c], dtype=tl.float32,
                                          is_pure=True, pack=4)
    else:
        FB: tl.constexpr = b0.shape[0]
        xs = tl.sum(tl.sum(_b_matrix(b0, b1, BF16), axis=2), axis=1)  # (FB, 8) per token
        xs = tl.reshape(tl.broadcast_to(xs[:, None, :], [FB, 16, 8]), [FB, 16, 8])
        d = _d_lanes(xs, FB)
        if not FIRST:
            d = c + d
    return d
