"""The register-ring decode kernel's Triton code: w4a16_ring_kernel and its @triton.jit helpers (the item slots, the
split-K flush, the item ranges). Apart from its configs and plan (w4a16_ring_config.py) and its launcher
(w4a16_ring.py, docs/w4a16_decode.md "Round 5"); the design it implements:

The math is the stream-K decode kernel's (w4a16_decode.w4a16_decode_kernel, w4a16_common "tensor-core decode"):
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

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, globaltimer, smid

from flashscale.kernels.pdl import l2_prefetch_lines
from flashscale.kernels.w4a16_common import last_split, reset_ticket
from flashscale.kernels.w4a16_gemv import _dec_item, _dec_layout, _dec_store, _dec_tile, _dec_w, _dec_x, _next_item
from flashscale.kernels.w4a16_prologue import x_prologue


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
        l2_prefetch_lines(ptrs, on)


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
