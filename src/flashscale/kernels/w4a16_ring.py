"""W4A16 decode (M <= 16) on a register ring of items rotated by position (docs/w4a16_decode.md "Round 5").

y (M, N) = x (M, K) @ dequant(W) (K, N) (+ bias) for a PackedW4 weight (w4a16_pack.py): w4a16_ring(), and three
configs (w4a16._RING_CANDIDATES) are autotune candidates of w4a16_matmul's M = 1 and M <= 8 buckets since session 29
(on the H200 it wins at M = 1 on most Llama shapes, with the atomic fold; it loses at M = 16: docs/w4a16_decode.md).

The math is the stream-K decode kernel's (w4a16_gemv.w4a16_decode_kernel, w4a16_common "tensor-core decode"):
a packed word is one lane's share of an mma.m16n8k16 A fragment; 3 shifts + 4 LOP3 turn it into four pairs of
16-bit floats D_UNIT (OFF + q), one HMMA a word multiplies them by x, and the zero point and the group scale are
applied once per item and row in fp32: acc += s D - (OFF + z) s sum(x) (sum(x) from one more MMA with A = 1).

What is new is the loop, built from what the loads-only streams measured on the H200 (round 4: plain Triton,
16-byte loads straight to registers, 2-4 boxes of 8-16 KB in flight a program, reach a copy's rate):
  * RING slots (1..4), each the COMPLETE inputs of one item: its packed words (NB, KT, 128) int32, its
    scale/zero words (32, NB, 2) and its x words (1, 32, 4, 2, TB, KT). Slot j holds item g + j; the loop takes
    RING items an iteration (unrolled), and right after consuming slot j refills it with item g + RING + j.
    Slots rotate by position, never by register moves (a move of a register whose load is in flight waits for
    it and empties the ring), and no load is consumed in the step that issues it: while the kernel waits for
    item g, items g .. g + RING - 1 are in flight, x and scales included.
  * Stream-K over one persistent wave: U = tiles x S items (BN rows x BK = 64 KT inputs, inside one group),
    P = per_sm x SMs programs, program p takes items [p U / P, (p + 1) U / P) tile-major (one contiguous run of
    the weight per program, every SM the same bytes). per_sm is the runtime knob (the probe sweeps it up to
    what registers let reside; a high per_sm with RING 1 is the "many programs, one box each" pattern).
  * Split-K reduction where a tile is shared (contributors = the programs whose ranges meet it):
    ATOMIC False (the current decode kernel's scheme, deterministic): each contributor stores its fp32 partial
    tile to its own workspace slot (tile, contributor), takes one ticket a tile (acq_rel atomic); the last one
    sums the slots in contributor order, 4 loads in flight a round (the sum is a fixed left fold: the same bits
    on every call), adds the bias, stores y and resets the ticket. ATOMIC True: red.add of the partial into a
    zeroed fp32 tile, the same ticket; the last one reads the total, stores y and zeroes the tile (one round
    trip at the end instead of ceil(C / 4); summation order, so the last bits, vary between calls).
    A tile inside one program is stored directly.
  * Past a program's range the refills re-read its last item (an L2 hit, no masking: masked loads zero-fill
    registers); a slot whose item is past the range is skipped by a branch (never computed twice).

Shapes (per program): NB = BN / 16 fragment rows, warps split NB; TB = 1 (M <= 8) or 2 (9 <= M <= 16) token
blocks of 8; accumulators (NB, 32, 4) fp32 per token block in the mma C layout (lane 4g + t: rows 16 nb + g
(+ 8), tokens 2t, 2t + 1), times s * 2^11 (w4a16_pack's sz words hold s * 2^11 | z).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, globaltimer, smid

from flashscale.kernels.w4a16 import _device_info, _interpreting, stream_k_grid, x_words
from flashscale.kernels.w4a16_common import last_split, reset_ticket, split_k_slices, split_k_workspace
from flashscale.kernels.w4a16_gemv import _dec_item, _dec_layout, _dec_store, _dec_tile, _dec_w, _dec_x, _next_item
from flashscale.kernels.w4a16_pack import PackedW4
from flashscale.kernels.w4a16_prologue import Prologue, XAttn, XNorm, kernel_args, x_prologue

TRACE_FIELDS = ("t_start_ns", "clk_start", "clk_first", "clk_end", "clk_last_flush", "t_end_ns", "smid", "items",
                "t_wait_ns", "t_x_ns", "t_first_ns")  # t_wait: after the PDL wait; t_x: prologue done, x loads next
TRACE_STRIDE = 16  # int64 values a program in a trace buffer

REGS_PER_SM = 65536
MAX_TOKENS = 16


@dataclass(frozen=True, kw_only=True)
class RingConfig:
    bn: int = 256  # output rows per item (a multiple of 16 * ...: NB = bn / 16 fragment rows, warps split them)
    kt: int = 2  # 64-wide fragment columns per item (BK = 64 kt inside one group: G % BK == 0 or G == K)
    num_warps: int = 8
    ring: int = 2  # items in flight a program (slots rotated by position), 1..4
    per_sm: int = 2  # default programs an SM (the probe sweeps per_sm_options)
    atomic: bool = False  # split-K: False deterministic slots + ticket, True fp32 red.add + ticket
    maxnreg: int | None = None  # register cap handed to ptxas (e.g. 128: two 8-warp programs an SM)
    l2_ahead: int = 0  # items past the ring asked of L2 (prefetch.global.L2, no registers): 0 = none
    asm: bool = True  # inline PTX (mma.sync); the interpreter always runs the emulation
    late: int = 8  # eighths of an even share of items the last programs take (8: even; < 8: they start late)
    late_share: int = 1  # the last late_share / per_sm of the programs are those (the last to be placed on an SM)

    @property
    def item_bytes(self) -> int:
        return self.bn * self.kt * 32  # packed bytes of one item (bn x 64 kt weights, 4 bits)

    def loads_per_item(self) -> int:
        """16-byte packed-word loads a thread an item."""
        return self.item_bytes // (16 * 32 * self.num_warps)

    def resident(self, regs: int) -> int:
        """Programs an SM can hold (registers allocated 8 a thread at a time; 2048 threads, 32 blocks)."""
        threads = 32 * self.num_warps
        return max(1, min(REGS_PER_SM // (-(-regs // 8) * 8 * threads), 2048 // threads, 32))

    def per_sm_options(self, regs: int | None = None) -> list[int]:
        """Programs an SM worth timing: the default and up to two larger counts that still all fit at once (one
        wave: a stream-K program that waits for a second wave leaves its SM idle)."""
        fit = self.resident(regs) if regs else max(self.per_sm, 1)
        return sorted({min(self.per_sm, fit), *[p for p in (2, 3, 4, 6, 8, 10) if self.per_sm < p <= fit][-2:]})

    def in_flight_kb(self, per_sm: int) -> float:
        """KB of packed words in flight an SM by design (programs x items in flight each)."""
        return per_sm * self.ring * self.item_bytes / 1024

    @property
    def label(self) -> str:
        return (f"bn{self.bn} kt{self.kt} w{self.num_warps} ring{self.ring} ({self.item_bytes // 1024} KB)"
                + (" atomic" if self.atomic else "") + (f" maxnreg{self.maxnreg}" if self.maxnreg else "")
                + (f" l2ahead{self.l2_ahead}" if self.l2_ahead else "")
                + (f" late{self.late}/{self.late_share}" if self.late != 8 else ""))


# Candidates for the H200 probe (rows r-dec), one list a token bucket (their registers differ: x and the second
# accumulator double at 9-16 tokens). Comment: KB of packed words in flight an SM at the default per_sm, as the
# sm_90 registers let programs reside (python -m flashscale.kernels.w4a16_ring prints them). Round 4: 2-4 boxes of
# 8-16 KB an SM in flight reach the copy rate (64 KB/SM: 9.80 us at 8192^2; one program a box with ~10 resident
# 9.65 us); the tile view within 3 % of flat.
RING_CONFIGS: list[RingConfig] = [  # M <= 8
    RingConfig(bn=128, kt=2, num_warps=4, ring=2, per_sm=4),  # 8 KB items x 2 x 4/SM = 64 KB (128 regs)
    RingConfig(bn=256, kt=2, num_warps=4, ring=2, per_sm=2),  # 16 KB x 2 x 2 = 64 KB, x shared by 4 rows a thread
    RingConfig(bn=256, kt=2, num_warps=8, ring=2, per_sm=2, maxnreg=128),  # 16 KB x 2 x 2 = 64 KB
    RingConfig(bn=128, kt=2, num_warps=4, ring=4, per_sm=2),  # 8 KB x 4 x 2 = 64 KB (s-triton tile nb8 ring4)
    RingConfig(bn=128, kt=2, num_warps=4, ring=1, per_sm=6),  # one item a program, 6 resident: 48 KB
    RingConfig(bn=128, kt=2, num_warps=4, ring=2, per_sm=3, atomic=True),  # red.add reduction: 48 KB
    RingConfig(bn=256, kt=2, num_warps=4, ring=2, per_sm=2, atomic=True),  # 64 KB
    RingConfig(bn=128, kt=1, num_warps=4, ring=4, per_sm=2),  # 4 KB x 4 x 2 = 32 KB (group 64)
    # the ring's refills come from L2: items l2_ahead past it prefetched (session 30: ncu had the loop waiting on
    # its ring head 30 % of the time with ~32 KB an SM in flight during the math)
    RingConfig(bn=256, kt=2, num_warps=4, ring=2, per_sm=2, atomic=True, l2_ahead=4),  # + 2 x 64 KB in L2 flight
    RingConfig(bn=256, kt=2, num_warps=4, ring=2, per_sm=2, atomic=True, l2_ahead=8),
    RingConfig(bn=128, kt=2, num_warps=4, ring=2, per_sm=3, atomic=True, l2_ahead=8),
    RingConfig(bn=128, kt=2, num_warps=4, ring=1, per_sm=6, atomic=True, l2_ahead=8),
]
RING_CONFIGS_16: list[RingConfig] = [  # 9 <= M <= 16
    RingConfig(bn=128, kt=2, num_warps=4, ring=2, per_sm=2),  # 8 KB x 2 x 2 = 32 KB (202 regs)
    RingConfig(bn=256, kt=2, num_warps=8, ring=2, per_sm=1),  # 16 KB x 2 x 1 = 32 KB
    RingConfig(bn=128, kt=2, num_warps=4, ring=1, per_sm=3),  # 8 KB x 1 x 3 = 24 KB
    RingConfig(bn=256, kt=2, num_warps=4, ring=1, per_sm=2),  # 16 KB x 1 x 2 = 32 KB (ring 3 spills at 16 tokens)
    RingConfig(bn=128, kt=2, num_warps=4, ring=2, per_sm=2, atomic=True),  # 32 KB
    RingConfig(bn=128, kt=2, num_warps=4, ring=2, per_sm=2, atomic=True, l2_ahead=8),
]


def configs_for(m: int) -> list[RingConfig]:
    """The candidates of M's token bucket (M <= 8, 9..16)."""
    return RING_CONFIGS if m <= 8 else RING_CONFIGS_16


# ---- the kernel

@triton.jit
def _slot(pk_ptr, sz_ptr, x_ptr, v, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb, kt_first, lane1, k_pad,
          n_frag, M, K, stride_xm, stride_pn, stride_sg, NB: tl.constexpr, BK: tl.constexpr, KT: tl.constexpr,
          G: tl.constexpr, TWO: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """Every input of item v (coordinates tile_p, ks_p; past the range u1: the last item again): packed words
    (NB, KT, 128), scale/zero words (32, NB, 2), x words (1, 32, 4, 2, TB, KT)."""
    w, s = _slot_w(pk_ptr, sz_ptr, v, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb, kt_first, k_pad, n_frag, K,
                   stride_pn, stride_sg, NB, BK, G, EVEN_K, EVEN_N)
    return w, s, _slot_x(x_ptr, v, u1, ks_p, ks_l, lane1, M, K, stride_xm, BK, KT, TWO, EVEN_K)


@triton.jit
def _slot_w(pk_ptr, sz_ptr, v, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb, kt_first, k_pad, n_frag, K,
            stride_pn, stride_sg, NB: tl.constexpr, BK: tl.constexpr, G: tl.constexpr, EVEN_K: tl.constexpr,
            EVEN_N: tl.constexpr):
    """_slot's packed and scale/zero words only (the weight's: no earlier kernel writes them)."""
    ok = v < u1
    return _dec_w(pk_ptr, sz_ptr, tl.where(ok, tile_p, tile_l), tl.where(ok, ks_p, ks_l), w_off, sz_off, nb,
                  kt_first, k_pad, n_frag, K, stride_pn, stride_sg, NB, BK, G, EVEN_K, EVEN_N)


@triton.jit
def _slot_x(x_ptr, v, u1, ks_p, ks_l, lane1, M, K, stride_xm, BK: tl.constexpr, KT: tl.constexpr,
            TWO: tl.constexpr, EVEN_K: tl.constexpr):
    """_slot's x words only (written by the kernel before this one)."""
    return _dec_x(x_ptr, stride_xm, tl.where(v < u1, ks_p, ks_l), lane1, M, K, BK, KT, TWO, EVEN_K)


@triton.jit
def _l2_ahead(pk_ptr, tile, ks, ok, stride_pn, n_frag, row_words, NB: tl.constexpr, KT: tl.constexpr,
              ASM: tl.constexpr):
    """Ask L2 for item (tile, ks)'s packed words (nothing unless ok): prefetch.global.L2 of one 128-byte line a
    thread (the item's NB rows x 4 KT lines; threads past them repeat lines). No register waits on it; the item's
    own loads, a few iterations later, then find it in L2. Off under the interpreter (a hint: no result changes)."""
    if ASM:
        LINES: tl.constexpr = NB * KT * 4
        ln = tl.arange(0, LINES)
        r = tile * NB + ln // (KT * 4)
        w = ks * (KT * 128) + (ln % (KT * 4)) * 32
        on = (ok & (r < n_frag) & (w < row_words)).to(tl.int32)
        ptrs = pk_ptr + r.to(tl.int64) * stride_pn + w
        tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                                  "=r,l,r", [ptrs, on], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _sum_slots(p, mask, nc, SLOT):
    """sum of the nc slots p, p + SLOT, ... in order (a fixed left fold: deterministic), 4 loads in flight a
    round; read through L2 (.cg: the L1 may hold stale lines of another SM's slot)."""
    tot = tl.load(p, mask=mask, other=0.0, cache_modifier=".cg")
    for c in range(1, nc, 4):
        v1 = tl.load(p + c * SLOT, mask=mask, other=0.0, cache_modifier=".cg")
        v2 = tl.load(p + (c + 1) * SLOT, mask=mask & (c + 1 < nc), other=0.0, cache_modifier=".cg")
        v3 = tl.load(p + (c + 2) * SLOT, mask=mask & (c + 2 < nc), other=0.0, cache_modifier=".cg")
        v4 = tl.load(p + (c + 3) * SLOT, mask=mask & (c + 3 < nc), other=0.0, cache_modifier=".cg")
        tot = (((tot + v1) + v2) + v3) + v4  # masked-off terms add an exact 0
    return tot


@triton.jit
def _flush(acc, accb, tile, pid, P, S, U, CMAX, y_ptr, bias_ptr, ws_ptr, cnt_ptr, M, N, stride_ym,
           NB: tl.constexpr, BN: tl.constexpr, TWO: tl.constexpr, HAS_BIAS: tl.constexpr, ATOMIC: tl.constexpr,
           ADD: tl.constexpr):
    """This program's part of `tile` is done: store it (sole contributor) or reduce it (module docstring); ADD:
    red.add it into the fp32 y (w4a16_addmm_: no ticket, no last contributor, whoever reads y runs later)."""
    SLOT: tl.constexpr = NB * 128 * (1 + TWO)
    rows, toks, e_off, pf, pl = _dec_tile(tile, P, S, U, NB, BN)
    if ADD:
        yp = y_ptr + toks * stride_ym + rows
        tl.atomic_add(yp, acc * (1.0 / 2048), mask=(rows < N) & (toks < M), sem="relaxed", scope="gpu")
        if TWO:
            tl.atomic_add(yp + 8 * stride_ym, accb * (1.0 / 2048), mask=(rows < N) & (toks + 8 < M), sem="relaxed",
                          scope="gpu")
    elif pf == pl:
        _dec_store(acc * (1.0 / 2048), y_ptr, bias_ptr, rows, toks, M, N, stride_ym, HAS_BIAS)
        if TWO:
            _dec_store(accb * (1.0 / 2048), y_ptr, bias_ptr, rows, toks + 8, M, N, stride_ym, HAS_BIAS)
    else:
        nc = pl - pf + 1
        if ATOMIC:  # one zeroed fp32 tile a tile, red.add, the last contributor reads and re-zeroes it
            tp = ws_ptr + (tile * SLOT).to(tl.int64) + e_off
            tl.atomic_add(tp, acc, mask=toks < M, sem="relaxed", scope="gpu")
            if TWO:
                tl.atomic_add(tp + NB * 128, accb, mask=toks + 8 < M, sem="relaxed", scope="gpu")
        else:  # slot (tile, contributor)
            tp = ws_ptr + (tile * CMAX).to(tl.int64) * SLOT + e_off
            tl.store(tp + (pid - pf) * SLOT, acc, mask=toks < M)
            if TWO:
                tl.store(tp + (pid - pf) * SLOT + NB * 128, accb, mask=toks + 8 < M)
        if last_split(cnt_ptr, tile, nc):
            if ATOMIC:
                tot = tl.load(tp, mask=toks < M, other=0.0, cache_modifier=".cg")
                tl.store(tp, tl.zeros_like(tot), mask=toks < M)
            else:
                tot = _sum_slots(tp, toks < M, nc, SLOT)
            _dec_store(tot * (1.0 / 2048), y_ptr, bias_ptr, rows, toks, M, N, stride_ym, HAS_BIAS)
            if TWO:
                if ATOMIC:
                    tot = tl.load(tp + NB * 128, mask=toks + 8 < M, other=0.0, cache_modifier=".cg")
                    tl.store(tp + NB * 128, tl.zeros_like(tot), mask=toks + 8 < M)
                else:
                    tot = _sum_slots(tp + NB * 128, toks + 8 < M, nc, SLOT)
                _dec_store(tot * (1.0 / 2048), y_ptr, bias_ptr, rows, toks + 8, M, N, stride_ym, HAS_BIAS)
            reset_ticket(cnt_ptr, tile)


@triton.jit
def _clock(TRACE: tl.constexpr):
    """The SM's cycle counter (TRACE builds only; 0 otherwise)."""
    if TRACE:
        return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    else:
        return 0


@triton.jit
def _consume(acc, accb, w, sz, xw, u, u1, tile, ks, pid, P, S, U, CMAX, y_ptr, bias_ptr, ws_ptr, cnt_ptr, M, N,
             stride_ym, trace_ptr, NB: tl.constexpr, BN: tl.constexpr, KT: tl.constexpr, TWO: tl.constexpr,
             BF16: tl.constexpr, HAS_BIAS: tl.constexpr, ATOMIC: tl.constexpr, ASM: tl.constexpr,
             TRACE: tl.constexpr, ADD: tl.constexpr):
    """Item u (tile, ks) from its slot; at the end of this program's part of the tile, flush it (TRACE builds: the
    clock at the start of the program's last flush to trace_ptr[pid * 16 + 4])."""
    acc, accb = _dec_item(acc, accb, w, sz, xw, NB, KT, TWO, BF16, ASM)
    if (ks == S - 1) | (u == u1 - 1):
        if TRACE:
            if u == u1 - 1:
                tl.store(trace_ptr + pid * 16 + 4, _clock(TRACE))
        _flush(acc, accb, tile, pid, P, S, U, CMAX, y_ptr, bias_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, NB, BN, TWO,
               HAS_BIAS, ATOMIC, ADD)
        acc = tl.zeros_like(acc)
        accb = tl.zeros_like(accb)
    tile, ks = _next_item(tile, ks, S)
    return acc, accb, tile, ks


@triton.jit
def _late_range(pid, P, U, CUT, LATE: tl.constexpr):
    """Items [u0, u1) of program pid when programs CUT.. P-1 weigh LATE eighths and the others eight: every item once,
    in order (the cumulative weights' floors of U)."""
    total = 8 * CUT + LATE * (P - CUT)
    wa = 8 * tl.minimum(pid, CUT) + LATE * tl.maximum(pid - CUT, 0)
    wb = 8 * tl.minimum(pid + 1, CUT) + LATE * tl.maximum(pid + 1 - CUT, 0)
    return (U * wa) // total, (U * wb) // total


@triton.jit
def _dyn_next(last, nxt, ctr_ptr, P, NCH, CH: tl.constexpr):
    """DYN: the item after `last` in a program's sequence: the next one of its chunk, or at the chunk's end the first
    of chunk nxt, taking then the chunk after it from the counter (chunk ids >= NCH: none left, items >= U)."""
    v = last + 1
    if v % CH == 0:
        v = nxt * CH
        if nxt < NCH:
            nxt = tl.atomic_add(ctr_ptr, 1, sem="relaxed", scope="gpu") + P
    return v, nxt


@triton.jit(do_not_specialize=["M", "S", "U", "CMAX", "LATE_CUT"])
def w4a16_ring_kernel(
    x_ptr, pk_ptr, sz_ptr, y_ptr, bias_ptr, ws_ptr, cnt_ptr, trace_ptr,
    M, N, K, stride_xm, stride_ym, stride_pn, stride_sg, S, U, CMAX,
    xo_ptr, pa_ptr, pr_ptr, pw_ptr, po_ptr, eps, ctr_ptr, LATE_CUT,
    G: tl.constexpr, HAS_BIAS: tl.constexpr, BF16: tl.constexpr, BN: tl.constexpr, KT: tl.constexpr,
    BM: tl.constexpr, RING: tl.constexpr, ATOMIC: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    ASM: tl.constexpr, L2AHEAD: tl.constexpr = 0, TRACE: tl.constexpr = False, ADD: tl.constexpr = False,
    PDL: tl.constexpr = False, XMODE: tl.constexpr = 0, HAS_R: tl.constexpr = False, NBLK: tl.constexpr = 16,
    PCH: tl.constexpr = 128, TRIGGER: tl.constexpr = False, L2PRE: tl.constexpr = 0, PHD: tl.constexpr = 1,
    DYN: tl.constexpr = False, CH: tl.constexpr = 2, LATE: tl.constexpr = 8,
):
    """x_ptr: x as int32 words (pairs of 16-bit inputs), stride_xm in words; pk_ptr / sz_ptr: PackedW4 qweight
    (N_pad/16, K_pad/64, 32, 4) / sz (NG, N_pad); S items a tile, U items, CMAX workspace slots a tile. TRACE: each
    program writes TRACE_FIELDS (int64) to trace_ptr[pid * 16 ...] (benchmarks/w4a16_ring_trace.py). PDL (a
    programmatic dependent launch, kernels.pdl): the first RING items' packed and scale words are loaded before
    griddepcontrol.wait, everything the previous kernel may write (x, the split-K workspace and tickets, y) after
    it; the kernel triggers its dependents early only with TRIGGER (after its prologue: every program of this
    single-wave grid is resident by then, so the next grid's programs only take the SM slots this one's leave).
    XMODE 1 / 2 / 3: before its x loads each program writes the chunks of x (xo_ptr, 16-bit (M, K)) it reads, from
    w4a16_prologue's XNorm (pa res, pr r, pw weight, po res_out, eps) / XSiLU (pa gu) / XAttn (pa ws, NBLK splits,
    PHD head dim), then a CTA barrier.
    DYN (ADD mode; XMODE 0 or 1; RING <= 2 <= CH): items in chunks of CH, program p takes chunk p first and then, one
    chunk ahead, the chunk P + an atomic ticket of ctr_ptr (int32, zero before the launch), so programs that run
    slow take fewer (the static split left the step's launches a ~1.3-2.8 us tail of slow programs, docs/
    w4a16_decode.md round 11); each chunk's partial is red.added at its end. Its items can be anywhere, so an XNorm
    prologue writes the whole row of x. Measured 1.65x slower a step (round 12): not a default.
    LATE < 8 (static): programs LATE_CUT.. (the last placed on their SMs, which start up to ~3 us after the first
    ones under PDL) take LATE / 8 of the share of the others (`_late_range`)."""
    if TRACE:
        tl.store(trace_ptr + tl.program_id(0) * 16, globaltimer())
        tl.store(trace_ptr + tl.program_id(0) * 16 + 1, _clock(TRACE))
    NB: tl.constexpr = BN // 16
    BK: tl.constexpr = KT * 64
    TWO: tl.constexpr = BM == 16
    pid, P, u0, u1, k_pad, n_frag, nb, w_off, kt_first, sz_off, lane1 = _dec_layout(U, K, N, stride_pn, NB, KT)
    if DYN:  # chunk pid first (its first RING items before the wait), the rest from the counter after it
        u0 = pid * CH
        u1 = U
    elif LATE != 8:
        u0, u1 = _late_range(pid, P, U, LATE_CUT, LATE)

    tile = u0 // S  # the item consumed next
    ks = u0 - tile * S
    tile_l = (u1 - 1) // S  # the last item of the range: what loads past it re-read
    ks_l = u1 - 1 - tile_l * S
    tile_p = tile  # the item loaded next
    ks_p = ks
    # prologue: slot j <- item u0 + j; the weight's words first, then (PDL: once the previous kernel is done) x
    k0 = ks_p
    w0, s0 = _slot_w(pk_ptr, sz_ptr, u0, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb, kt_first, k_pad, n_frag,
                     K, stride_pn, stride_sg, NB, BK, G, EVEN_K, EVEN_N)
    tile_p, ks_p = _next_item(tile_p, ks_p, S)
    if RING >= 2:
        k1 = ks_p
        w1, s1 = _slot_w(pk_ptr, sz_ptr, u0 + 1, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb, kt_first, k_pad,
                         n_frag, K, stride_pn, stride_sg, NB, BK, G, EVEN_K, EVEN_N)
        tile_p, ks_p = _next_item(tile_p, ks_p, S)
    if RING >= 3:
        k2 = ks_p
        w2, s2 = _slot_w(pk_ptr, sz_ptr, u0 + 2, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb, kt_first, k_pad,
                         n_frag, K, stride_pn, stride_sg, NB, BK, G, EVEN_K, EVEN_N)
        tile_p, ks_p = _next_item(tile_p, ks_p, S)
    if RING >= 4:
        k3 = ks_p
        w3, s3 = _slot_w(pk_ptr, sz_ptr, u0 + 3, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb, kt_first, k_pad,
                         n_frag, K, stride_pn, stride_sg, NB, BK, G, EVEN_K, EVEN_N)
        tile_p, ks_p = _next_item(tile_p, ks_p, S)
    if PDL and L2PRE > 0:  # and the next L2PRE items' packed words asked of L2 (the previous kernel's tail)
        tile_q = (u0 + RING) // S
        ks_q = u0 + RING - tile_q * S
        for j in tl.static_range(L2PRE):
            _l2_ahead(pk_ptr, tile_q, ks_q, u0 + RING + j < u1, stride_pn, n_frag, (k_pad // 64) * 128, NB, KT, ASM)
            tile_q, ks_q = _next_item(tile_q, ks_q, S)
    if PDL:  # the weight's first loads are in flight while the previous kernel ends; x, workspace, y after it
        gdc_wait()
    if TRACE:
        tl.store(trace_ptr + pid * 16 + 8, globaltimer())
    if XMODE != 0:  # this program's chunks of x, from the previous kernels' outputs (w4a16_prologue)
        x_prologue(xo_ptr, pa_ptr, pr_ptr, pw_ptr, po_ptr, eps, 0 if DYN else u0, u1, S, M, K, XMODE, HAS_R, NBLK,
                   BK, PCH, PHD)
        tl.debug_barrier()  # the chunks' stores before any thread's x loads (bar.sync orders them in the CTA)
    if PDL and TRIGGER:
        gdc_launch_dependents()
    if TRACE:
        tl.store(trace_ptr + pid * 16 + 9, globaltimer())
    x0 = _slot_x(x_ptr, u0, u1, k0, ks_l, lane1, M, K, stride_xm, BK, KT, TWO, EVEN_K)
    if RING >= 2:
        x1 = _slot_x(x_ptr, u0 + 1, u1, k1, ks_l, lane1, M, K, stride_xm, BK, KT, TWO, EVEN_K)
    if RING >= 3:
        x2 = _slot_x(x_ptr, u0 + 2, u1, k2, ks_l, lane1, M, K, stride_xm, BK, KT, TWO, EVEN_K)
    if RING >= 4:
        x3 = _slot_x(x_ptr, u0 + 3, u1, k3, ks_l, lane1, M, K, stride_xm, BK, KT, TWO, EVEN_K)
    row_words = (k_pad // 64) * 128
    tile_f = (u0 + RING) // S  # the item asked of L2 next (L2AHEAD > 0)
    ks_f = u0 + RING - tile_f * S
    if L2AHEAD > 0:  # items u0 + RING .. u0 + RING + L2AHEAD - 1 to L2; each iteration then asks for RING more
        for j in tl.static_range(L2AHEAD):
            _l2_ahead(pk_ptr, tile_f, ks_f, u0 + RING + j < u1, stride_pn, n_frag, row_words, NB, KT, ASM)
            tile_f, ks_f = _next_item(tile_f, ks_f, S)
    acc = tl.zeros([NB, 32, 4], dtype=tl.float32)
    accb = tl.zeros([NB, 32, 4], dtype=tl.float32)
    u_end = u1  # the static loop's end (DYN: none, its loop is the while below)
    if DYN:
        u_end = u0
        NCH = tl.cdiv(U, CH)
        nxt = NCH  # the chunk this program takes after its current one (>= NCH: none)
        if u0 < U:
            nxt = tl.atomic_add(ctr_ptr, 1, sem="relaxed", scope="gpu") + P
        v0 = u0  # the items in the slots (>= U: none) and the last one loaded
        v1 = u0 + 1
        last = u0 + RING - 1
        while v0 < U:  # an item's partial is flushed at its tile's end or its chunk's (the range _consume ends)
            acc, accb, _, _ = _consume(acc, accb, w0, s0, x0, v0, tl.minimum((v0 // CH + 1) * CH, U), v0 // S, v0 % S,
                                       pid, P, S, U, CMAX, y_ptr, bias_ptr, ws_ptr, cnt_ptr, M, N, stride_ym,
                                       trace_ptr, NB, BN, KT, TWO, BF16, HAS_BIAS, ATOMIC, ASM, TRACE, ADD)
            if TRACE:
                if v0 == u0:
                    tl.store(trace_ptr + pid * 16 + 2, _clock(TRACE))
                    tl.store(trace_ptr + pid * 16 + 10, globaltimer())
            last, nxt = _dyn_next(last, nxt, ctr_ptr, P, NCH, CH)
            w0, s0, x0 = _slot(pk_ptr, sz_ptr, x_ptr, last, u1, last // S, last % S, tile_l, ks_l, w_off, sz_off, nb,
                               kt_first, lane1, k_pad, n_frag, M, K, stride_xm, stride_pn, stride_sg, NB, BK, KT, G,
                               TWO, EVEN_K, EVEN_N)
            v0 = last
            if RING >= 2:
                if v1 < U:
                    acc, accb, _, _ = _consume(acc, accb, w1, s1, x1, v1, tl.minimum((v1 // CH + 1) * CH, U), v1 // S,
                                               v1 % S, pid, P, S, U, CMAX, y_ptr, bias_ptr, ws_ptr, cnt_ptr, M, N,
                                               stride_ym, trace_ptr, NB, BN, KT, TWO, BF16, HAS_BIAS, ATOMIC, ASM,
                                               TRACE, ADD)
                last, nxt = _dyn_next(last, nxt, ctr_ptr, P, NCH, CH)
                w1, s1, x1 = _slot(pk_ptr, sz_ptr, x_ptr, last, u1, last // S, last % S, tile_l, ks_l, w_off, sz_off,
                                   nb, kt_first, lane1, k_pad, n_frag, M, K, stride_xm, stride_pn, stride_sg, NB, BK,
                                   KT, G, TWO, EVEN_K, EVEN_N)
                v1 = last
    for g in range(u0, u_end, RING):
        if L2AHEAD > 0:
            for j in tl.static_range(RING):
                _l2_ahead(pk_ptr, tile_f, ks_f, g + RING + L2AHEAD + j < u1, stride_pn, n_frag, row_words, NB, KT,
                          ASM)
                tile_f, ks_f = _next_item(tile_f, ks_f, S)
        # slot 0: item g (always in range), then refilled with item g + RING
        acc, accb, tile, ks = _consume(acc, accb, w0, s0, x0, g, u1, tile, ks, pid, P, S, U, CMAX, y_ptr, bias_ptr,
                                       ws_ptr, cnt_ptr, M, N, stride_ym, trace_ptr, NB, BN, KT, TWO, BF16, HAS_BIAS,
                                       ATOMIC, ASM, TRACE, ADD)
        if TRACE:
            if g == u0:
                tl.store(trace_ptr + pid * 16 + 2, _clock(TRACE))
                tl.store(trace_ptr + pid * 16 + 10, globaltimer())
        w0, s0, x0 = _slot(pk_ptr, sz_ptr, x_ptr, g + RING, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb,
                           kt_first, lane1, k_pad, n_frag, M, K, stride_xm, stride_pn, stride_sg, NB, BK, KT, G, TWO,
                           EVEN_K, EVEN_N)
        tile_p, ks_p = _next_item(tile_p, ks_p, S)
        if RING >= 2:
            if g + 1 < u1:
                acc, accb, tile, ks = _consume(acc, accb, w1, s1, x1, g + 1, u1, tile, ks, pid, P, S, U, CMAX, y_ptr,
                                               bias_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, trace_ptr, NB, BN, KT, TWO,
                                               BF16, HAS_BIAS, ATOMIC, ASM, TRACE, ADD)
            w1, s1, x1 = _slot(pk_ptr, sz_ptr, x_ptr, g + RING + 1, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb,
                               kt_first, lane1, k_pad, n_frag, M, K, stride_xm, stride_pn, stride_sg, NB, BK, KT, G,
                               TWO, EVEN_K, EVEN_N)
            tile_p, ks_p = _next_item(tile_p, ks_p, S)
        if RING >= 3:
            if g + 2 < u1:
                acc, accb, tile, ks = _consume(acc, accb, w2, s2, x2, g + 2, u1, tile, ks, pid, P, S, U, CMAX, y_ptr,
                                               bias_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, trace_ptr, NB, BN, KT, TWO,
                                               BF16, HAS_BIAS, ATOMIC, ASM, TRACE, ADD)
            w2, s2, x2 = _slot(pk_ptr, sz_ptr, x_ptr, g + RING + 2, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb,
                               kt_first, lane1, k_pad, n_frag, M, K, stride_xm, stride_pn, stride_sg, NB, BK, KT, G,
                               TWO, EVEN_K, EVEN_N)
            tile_p, ks_p = _next_item(tile_p, ks_p, S)
        if RING >= 4:
            if g + 3 < u1:
                acc, accb, tile, ks = _consume(acc, accb, w3, s3, x3, g + 3, u1, tile, ks, pid, P, S, U, CMAX, y_ptr,
                                               bias_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, trace_ptr, NB, BN, KT, TWO,
                                               BF16, HAS_BIAS, ATOMIC, ASM, TRACE, ADD)
            w3, s3, x3 = _slot(pk_ptr, sz_ptr, x_ptr, g + RING + 3, u1, tile_p, ks_p, tile_l, ks_l, w_off, sz_off, nb,
                               kt_first, lane1, k_pad, n_frag, M, K, stride_xm, stride_pn, stride_sg, NB, BK, KT, G,
                               TWO, EVEN_K, EVEN_N)
            tile_p, ks_p = _next_item(tile_p, ks_p, S)

    if TRACE:
        tp = trace_ptr + pid * 16
        tl.store(tp + 3, _clock(TRACE))
        tl.store(tp + 5, globaltimer())
        tl.store(tp + 6, smid().to(tl.int64))
        tl.store(tp + 7, (u1 - u0).to(tl.int64))


# ---- launcher

def ring_grid(k: int, n: int, cfg: RingConfig, per_sm: int, num_sms: int) -> tuple[int, int, int, int]:
    """(programs, items, items a tile S, workspace slots a tile CMAX) of a launch: the decode kernel's grid."""
    return stream_k_grid(k, n, cfg.bn, cfg.kt, per_sm, num_sms)


def check_operands(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, kt: int,
                   kernel: str = "the ring decode kernel") -> None:
    """ValueError / TypeError naming the argument for operands a stream-K decode kernel (this one, w4a16_gring) does
    not take: x (M <= 16, K) 16-bit on p's device, items of 64 kt inputs inside one group, bias (N,) in x's dtype."""
    if not isinstance(p, PackedW4):
        raise TypeError(f"p must be a PackedW4, got {type(p).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor (M, K), got {getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"x must be float16 or bfloat16, got {x.dtype}")
    m, k = x.shape
    if m > MAX_TOKENS:
        raise ValueError(f"x has M={m} rows: {kernel} takes M <= {MAX_TOKENS} (use w4a16_matmul)")
    if k != p.in_features:
        raise ValueError(f"x has K={k} columns, the weight in_features={p.in_features}")
    if x.device != p.qweight.device:
        raise ValueError(f"x is on {x.device}, the weight on {p.qweight.device}")
    if k % p.group_size:
        raise ValueError(f"group_size={p.group_size} must divide K={k}")
    if p.group_size != k and p.group_size % (64 * kt):
        raise ValueError(f"group_size={p.group_size} must be a multiple of {64 * kt} (64 kt, kt={kt}) or "
                         f"K={k} (one group): an item may not cross a group")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (p.out_features,):
            raise ValueError(f"bias must have shape ({p.out_features},), got {getattr(bias, 'shape', None)}")
        if bias.dtype != x.dtype:
            raise ValueError(f"bias must have x's dtype {x.dtype}, got {bias.dtype}")


def check_args(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, cfg: RingConfig, per_sm: int) -> None:
    """ValueError / TypeError naming the argument for anything the kernel does not take."""
    check_operands(x, p, bias, cfg.kt)
    if cfg.bn < 16 or cfg.bn & (cfg.bn - 1) or cfg.bn // 16 < 1:
        raise ValueError(f"config.bn={cfg.bn} must be a power of two >= 16")
    if cfg.kt not in (1, 2) or cfg.ring not in (1, 2, 3, 4):
        raise ValueError(f"config kt={cfg.kt} must be 1 or 2 and ring={cfg.ring} 1..4")
    if not isinstance(cfg.l2_ahead, int) or not 0 <= cfg.l2_ahead <= 16:
        raise ValueError(f"config.l2_ahead={cfg.l2_ahead!r} must be an int 0..16 (items prefetched past the ring)")
    if not isinstance(per_sm, int) or per_sm < 1:
        raise ValueError(f"per_sm={per_sm!r} must be a positive int")


def w4a16_ring(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None, *, config: RingConfig | None = None,
               per_sm: int | None = None) -> torch.Tensor:
    """x (M <= 16, K) fp16/bf16 -> y (M, N) in x's dtype = x @ dequant(W) + bias, on the ring kernel.
    config: default the first candidate of M's bucket; per_sm: programs an SM (default config.per_sm)."""
    cfg = config or configs_for(x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 2 else 1)[0]
    per_sm = cfg.per_sm if per_sm is None else per_sm
    check_args(x, p, bias, cfg, per_sm)
    y = torch.empty((x.shape[0], p.out_features), dtype=x.dtype, device=x.device)
    if x.shape[0]:
        launch(x, p, bias, y, cfg, per_sm)
    return y


def launch(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, y: torch.Tensor, cfg: RingConfig, per_sm: int,
           trace: torch.Tensor | None = None, add: bool = False, pdl: bool = False, prologue: Prologue | None = None,
           trigger: bool = False, pre_l2: int = 0, counter: torch.Tensor | None = None):
    """One launch into y (M, N) (arguments as check_args takes them, M >= 1); returns what Triton's launch returns
    (on a GPU the compiled kernel: .n_regs, .metadata.shared). trace: an int64 tensor of >= 16 x programs values
    (ring_grid) that a TRACE build of the kernel fills with TRACE_FIELDS a program (GPU only). add: y is float32
    (M, N), unit stride along N, and the launch adds x @ dequant(W) into it (red.add; no bias, no split-K fold).
    pdl: a programmatic dependent launch (kernels.pdl; ignored under the interpreter); trigger: with pdl, let the
    next kernel launch once this one's prologue is done; pre_l2: with pdl, the packed words of that many items past
    the ring are asked of L2 before the wait (prefetch.global.L2). prologue: x (contiguous, no act-order) is first
    written by the kernel's programs from a w4a16_prologue.XNorm / XSiLU / XAttn (checked by the caller:
    w4a16_prologue.check). counter (add; no prologue or an XNorm; ring <= 2): a zeroed int32 tensor of one element
    that the kernel's programs take chunks of items from (the DYN build; left non-zero: zero it before each launch).
    cfg.late < 8 (add only; not with counter): the last cfg.late_share / per_sm of the programs take late / 8 of the
    others' share of items (late_cut)."""
    m, k = x.shape
    n = p.out_features
    xw = x_words(x, p)  # (M, K / 2) words of two 16-bit inputs
    if prologue is not None and (p.perm is not None or xw.data_ptr() != x.data_ptr()):
        raise ValueError("a prologue writes x where the kernel reads it: x must be contiguous and word-aligned and "
                         "the weight without act-order")
    progs, items, steps, cmax = ring_grid(k, n, cfg, per_sm, _device_info(x.device)[1])
    chunk = min(triton.cdiv(items, progs) + 1, steps) * 64 * cfg.kt  # inputs of x a program's prologue writes
    dyn = {}
    if counter is not None:
        if not add or cfg.ring > 2 or (prologue is not None and not isinstance(prologue, XNorm)):
            raise ValueError("counter (items taken dynamically) needs add=True, a ring of <= 2 and no prologue or an "
                             f"XNorm (its programs may take any item: x must be whole); got add={add}, ring="
                             f"{cfg.ring}, prologue {type(prologue).__name__}")
        if not isinstance(counter, torch.Tensor) or counter.dtype != torch.int32 or counter.numel() < 1 \
                or counter.device != x.device:
            raise ValueError(f"counter must be an int32 tensor on {x.device} (zero before the launch), got "
                             f"{getattr(counter, 'dtype', type(counter).__name__)}")
        chunk = steps * 64 * cfg.kt  # the whole row
        dyn = dict(DYN=True, CH=dyn_chunk(items, progs, cfg.ring))
    if cfg.late != 8 and not add:
        raise ValueError(f"cfg.late={cfg.late} (uneven shares) needs add=True (the split-K fold's contributors are "
                         "the even split's)")
    cut = late_cut(progs, items, per_sm, cfg) if not dyn else progs
    if cut < progs:  # the early programs' prologue writes their larger share of x
        chunk = min(items * 8 // (8 * cut + cfg.late * (progs - cut)) + 1, steps) * 64 * cfg.kt
    bm = 8 if m <= 8 else 16
    tiles = triton.cdiv(n, cfg.bn)
    slot = cfg.bn * bm  # fp32 values of a tile: NB x 128 x token blocks
    if add:  # no fold: no workspace, no tickets (y stands in for both pointers, never read through them)
        if bias is not None or y.dtype != torch.float32 or y.stride(1) != 1:
            raise ValueError("add=True takes a float32 y with unit stride along N and no bias")
        ws = cnt = y
    else:
        if cfg.atomic:
            ws, _ = split_k_workspace(x.device, tiles * slot)  # zero, and left zero by the kernel
        else:
            ws = split_k_slices(x.device, tiles * cmax * slot)
        _, cnt = split_k_workspace(x.device, tiles)  # after: a growing workspace replaces the pair
    extra = {"maxnreg": cfg.maxnreg} if cfg.maxnreg and not _interpreting() else {}
    if trace is not None and (trace.dtype != torch.int64 or trace.numel() < TRACE_STRIDE * progs or _interpreting()):
        raise ValueError(f"trace must be an int64 tensor of >= {TRACE_STRIDE * progs} values on a GPU, got "
                         f"{trace.dtype} x {trace.numel()}")
    return w4a16_ring_kernel[(progs,)](
        xw, p.qweight, p.sz, y, bias if bias is not None else y, ws, cnt, trace if trace is not None else cnt,
        m, n, k, xw.stride(0), y.stride(0), p.qweight.stride(0), p.sz.stride(0), steps, items, cmax,
        ctr_ptr=counter if counter is not None else cnt, LATE_CUT=cut, LATE=cfg.late if cut < progs else 8, **dyn,
        **kernel_args(prologue, x), PCH=_prologue_round(prologue, chunk),
        G=p.group_size, HAS_BIAS=bias is not None, BF16=x.dtype == torch.bfloat16, BN=cfg.bn, KT=cfg.kt, BM=bm,
        RING=cfg.ring, ATOMIC=cfg.atomic, EVEN_K=k % (64 * cfg.kt) == 0, EVEN_N=p.sz.shape[1] % cfg.bn == 0,
        **({"PDL": True, "launch_pdl": True, "TRIGGER": trigger, "L2PRE": pre_l2} if pdl and not _interpreting()
           else {}),
        ASM=cfg.asm and not _interpreting(), L2AHEAD=cfg.l2_ahead, TRACE=trace is not None, ADD=add,
        num_warps=cfg.num_warps, num_stages=1, **extra,
    )


def late_cut(progs: int, items: int, per_sm: int, cfg: RingConfig) -> int:
    """The first of the programs that take cfg.late eighths of a share (progs: none, an even split): the last
    late_share / per_sm of them, if each of those still gets an item (else none)."""
    if not 1 <= cfg.late <= 8 or not 1 <= cfg.late_share <= per_sm:
        raise ValueError(f"RingConfig.late must be 1..8 and late_share 1..per_sm={per_sm}, got {cfg.late}, "
                         f"{cfg.late_share}")
    cut = progs - progs * cfg.late_share // per_sm
    if cfg.late == 8 or cut == progs or items * cfg.late // (8 * cut + cfg.late * (progs - cut)) < 1:
        return progs
    return cut


def dyn_chunk(items: int, progs: int, ring: int) -> int:
    """Items a chunk of the DYN build: about a third of a program's share (two or three chunks taken a program), at
    least the ring (a program's first RING items load before its PDL wait, inside its first chunk), at most 16."""
    return max(ring, 2, min(16, round(items / progs / 3)))


def _prologue_round(prologue: Prologue | None, chunk: int) -> int:
    """Inputs of x a prologue round writes: the program's chunk up to 2048 (XAttn: 1024 partial values a round)."""
    pch = max(128, min(triton.next_power_of_2(chunk), 2048))
    return min(pch, max(16, 1024 // prologue.splits)) if isinstance(prologue, XAttn) else pch


# ---- ahead-of-time sm_90 compiles (no GPU needed) and what the machine code says

def compile_sm90(cfg: RingConfig, *, dtype: str = "bf16", bm: int = 8, group_size: int = 128, trace: bool = False,
                 add: bool = False, pdl: bool = False, xmode: int = 0, trigger: bool = False, k: int = 4096,
                 pre_l2: int = 0, pch: int | None = None, dyn: int = 0):
    """Compile one config as a launch on an even Llama shape specializes it (K, N multiples of 256, pointers and
    strides 16-divisible, no bias): returns Triton's CompiledKernel (asm: ptx, cubin). xmode: the prologue (0 none,
    1 XNorm with r, 2 XSiLU, 3 XAttn of 8 splits, head dim 128) for K = k inputs, pch inputs a prologue round
    (default 1024, XAttn 128); dyn: the DYN build with chunks of that many items (0: static)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptrs = {"x_ptr": "*i32", "pk_ptr": "*i32", "sz_ptr": "*i32", "y_ptr": "*fp32" if add else f"*{dtype}",
            "bias_ptr": f"*{dtype}", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "trace_ptr": "*i64"}
    pro = {"xo_ptr": f"*{dtype}", "pa_ptr": "*fp32" if xmode in (2, 3) else f"*{dtype}",
           "pr_ptr": "*fp32" if xmode else f"*{dtype}", "pw_ptr": f"*{dtype}", "po_ptr": f"*{dtype}"}
    ints = ("M", "N", "K", "stride_xm", "stride_ym", "stride_pn", "stride_sg", "S", "U", "CMAX")
    late = {"LATE_CUT": "i32"}
    cx = dict(G=group_size, HAS_BIAS=False, BF16=dtype == "bf16", BN=cfg.bn, KT=cfg.kt, BM=bm, RING=cfg.ring,
              ATOMIC=cfg.atomic, EVEN_K=True, EVEN_N=True, ASM=cfg.asm, L2AHEAD=cfg.l2_ahead, TRACE=trace,
              ADD=add, PDL=pdl, XMODE=xmode, HAS_R=xmode == 1,
              NBLK={1: min(triton.next_power_of_2(k), 8192), 3: 8}.get(xmode, 16),
              PCH=pch or {0: 128, 3: 128}.get(xmode, 1024),
              TRIGGER=trigger, L2PRE=pre_l2, PHD=128 if xmode == 3 else 1, DYN=dyn > 0, CH=max(dyn, 2),
              LATE=cfg.late)
    sig = {**ptrs, **{n: "i32" for n in ints}, **pro, "eps": "fp32", "ctr_ptr": "*i32", **late,
           **{n: "constexpr" for n in cx}}
    names = list(sig)
    aligned = set(ptrs) | set(pro) | {"N", "K", "stride_xm", "stride_ym", "stride_pn", "stride_sg"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in aligned}
    src = ASTSource(fn=w4a16_ring_kernel, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()},
                    attrs=attrs)
    opts = {"num_warps": cfg.num_warps, "num_stages": 1, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def hot_loop(ins: list[tuple[int, str]], prefix: str = "LDG",
             suffix: str = ".128") -> tuple[list[tuple[int, str]], int]:
    """The main loop (the backward branch's body holding the most opcodes prefix...suffix: LDG.128 here, HMMA for
    w4a16_gring, whose loads are cp.async), less the flush: forward-branch regions holding an atomic and no HMMA (a
    tile's end, once a tile, not once an item). Returns (body, flush instrs)."""
    from flashscale.kernels.aot import branch_target, sass_loops, sass_opcode

    body = max(sass_loops(ins), key=lambda b: sum(sass_opcode(t).startswith(prefix) and sass_opcode(t).endswith(suffix)
                                                   for _, t in b))
    skips = []
    for a, t in body:
        e = branch_target(t)
        if e is not None and e > a:
            ops = [sass_opcode(x) for b, x in body if a < b < e]
            if any(o.startswith(("ATOM", "RED")) for o in ops) and not any(o.startswith("HMMA") for o in ops):
                skips.append((a, e))
    keep = [(a, t) for a, t in body if not any(s < a < e for s, e in skips)]
    return keep, len(body) - len(keep)


def census(cfg: RingConfig, **kw) -> dict:
    """Compile for sm_90 and count: registers, spills, local memory, shared memory, atomics, and the hot loop's
    instruction mix a RING-item iteration, its modelled loads in flight a thread and load waits an iteration."""
    import collections
    import re
    from dataclasses import asdict

    from flashscale.kernels.aot import ptxas_stats, sass, sass_instructions, sass_opcode
    from flashscale.kernels.w4a16_stream import sass_load_rate

    k = compile_sm90(cfg, **kw)
    text = sass(k.asm["cubin"])
    body, flush = hot_loop(sass_instructions(text))
    ops = collections.Counter(sass_opcode(t) for _, t in body)
    rate = sass_load_rate(body)
    stats = ptxas_stats(k.asm["ptx"])

    def n(*prefixes, suffix=""):
        return sum(c for o, c in ops.items() if o.startswith(prefixes) and o.endswith(suffix))

    weights = cfg.ring * cfg.bn * 64 * cfg.kt // (32 * cfg.num_warps)  # a thread's weights an iteration
    return dict(config=asdict(cfg), label=cfg.label, bm=kw.get("bm", 8), dtype=kw.get("dtype", "bf16"),
                **{n_: v for n_, v in stats.items() if n_ != "log"}, shared=k.metadata.shared,
                local=len(re.findall(r"\b(?:LDL|STL)\b", text)),
                atomics_ptx=len(re.findall(r"\b(?:atom|red)\.global", k.asm["ptx"])),
                loop_instructions=sum(ops.values()), flush_instructions=flush, per_weight=sum(ops.values()) / weights,
                ldg128=n("LDG", suffix=".128"), ldg_other=n("LDG") - n("LDG", suffix=".128"), hmma=n("HMMA"),
                lop3=ops["LOP3.LUT"], shifts=n("SHF", "IMAD.SHL"), prmt=ops["PRMT"], moves=n("MOV", "IMAD.MOV"),
                uniform=n("U"), fp32=n("FFMA", "FMUL", "FADD"), smem=n("LDS", "STS"), bar=n("BAR"),
                loads_in_flight=rate["loads_in_flight"], ldg_per_iter=rate["ldg_per_iter"],
                cycles_per_iter=rate["cycles_per_iter"], waits_per_iter=rate["waits_per_iter"],
                resident=cfg.resident(stats["registers"]), per_sm_options=cfg.per_sm_options(stats["registers"]))


def aot_jobs() -> list[tuple[RingConfig, dict]]:
    """(config, compile kwargs) of the census: every candidate of each token bucket (bf16, G = 128; kt1 configs at
    G = 64, the group size they are for)."""
    return [(c, dict(bm=bm, group_size=128 if c.kt == 2 else 64)) for bm in (8, 16) for c in configs_for(bm)]


if __name__ == "__main__":  # PYTHONPATH=src python -m flashscale.kernels.w4a16_ring (TRITON_INTERPRET unset)
    print("config (tokens) | regs spills local smem | resident/SM per_sm options | loop instr (flush) instr/weight | "
          "LDG.128 other-LDG HMMA LOP3 shifts PRMT moves uniform fp32 | modelled loads in flight, waits an iteration")
    bad = []
    for c, kw in aot_jobs():
        r = census(c, **kw)
        if r["spill_stores"] or r["spill_loads"] or r["stack"] or r["local"]:
            bad.append(r["label"])
        print(f"{c.label:40s} M<={kw['bm']:2d} | {r['registers']:3d} {r['spill_stores']}/{r['spill_loads']} "
              f"{r['local']} {r['shared']:5d} | {r['resident']:2d} {r['per_sm_options']} | {r['loop_instructions']:5d} "
              f"({r['flush_instructions']}) {r['per_weight']:.2f} | {r['ldg128']:3d} {r['ldg_other']:3d} "
              f"{r['hmma']:3d} "
              f"{r['lop3']:3d} {r['shifts']:3d} {r['prmt']:3d} {r['moves']:3d} {r['uniform']:3d} {r['fp32']:3d} | "
              f"{r['loads_in_flight']:.1f} of {r['ldg_per_iter']}, {r['waits_per_iter']} waits", flush=True)
    assert not bad, f"spills or local memory: {bad}"
