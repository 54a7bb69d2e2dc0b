"""The loads-only streaming kernels of w4a16_stream.py (the three ways to issue the loads its module docstring
describes): stream_ldg_kernel (plain Triton, a register ring of LDG.128), stream_tma_kernel (Triton tensor
descriptors, the pipeliner's TMA ring) and stream_gluon_kernel (Gluon, a TMA producer warp and a consumer warpgroup
over a shared-memory ring), with the Gluon box's shared layout and the consumer's chunk rows. Apart from the configs
and the launcher so that the JIT code and its globals sit in one module.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashscale.kernels.w4a16_stream_config import StreamConfig

try:  # Gluon is experimental: absent from older Tritons
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    HAS_GLUON = hasattr(gl, "warp_specialize")
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False


# ---- plain Triton: LDG.128 into a register ring

@triton.jit
def _box(src, u, u_last, S, offs, rr, cc, ROWS, COLS, RS, BR: tl.constexpr, BC: tl.constexpr, EVEN: tl.constexpr,
         FLAT: tl.constexpr):
    """Words of box min(u, u_last) (past the range: the last box again, an L2 hit, instead of masking)."""
    u = tl.minimum(u, u_last)
    if FLAT:  # one box a row of boxes (S = 1)
        tile = u
    else:
        tile = u // S
    ks = u - tile * S
    r0 = tile * BR
    c0 = ks * BC
    ptrs = src + (r0.to(tl.int64) * RS + c0) + offs
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=(r0 + rr < ROWS) & (c0 + cc < COLS), other=0)


@triton.jit
def _fold(chk, w, live, z):
    """chk ^ w (w ignored unless live), rotated left by z, a runtime 0: the rotation sits between two boxes'
    XORs into the same word, so ptxas cannot fuse them into one 3-input LOP3 (which would make the older box
    wait for the newer one's load: the ring emptied)."""
    x = (chk ^ (w & -live.to(tl.int32))).to(tl.uint32, bitcast=True)
    return ((x << z) | (x >> ((32 - z) & 31))).to(tl.int32, bitcast=True)


@triton.jit(do_not_specialize=["ROWS", "COLS", "S", "U", "ZERO"])
def stream_ldg_kernel(src, out, ROWS, COLS, RS, S, U, ZERO,
                      BR: tl.constexpr, BC: tl.constexpr, RING: tl.constexpr, EVEN: tl.constexpr,
                      FLAT: tl.constexpr):
    """XOR of the (BR, BC) boxes [pid U / P, (pid + 1) U / P) (tile-major: box u at rows (u // S) BR, columns
    (u % S) BC of a (ROWS, COLS) view with row stride RS words) -> out[pid]. A RING-slot register ring (1..4):
    slot j holds box g + j of the group being XORed; right after XORing it, the slot is refilled with box
    g + RING + j. The slots rotate by position (the loop handles RING boxes an iteration), not by register
    moves: a move of a register with a load in flight waits for the load, which would empty the ring. So
    while the kernel waits for a box, RING boxes are in flight. EVEN: no box crosses the view's edge; FLAT:
    S = 1 (no division a box)."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    u0 = pid * U // P
    u1 = (pid + 1) * U // P
    ul = u1 - 1
    rr = tl.arange(0, BR)[:, None]
    cc = tl.arange(0, BC)[None, :]
    offs = rr * RS + cc
    chk = tl.zeros([BR, BC], dtype=tl.int32)
    a = _box(src, u0, ul, S, offs, rr, cc, ROWS, COLS, RS, BR, BC, EVEN, FLAT)
    if RING >= 2:
        b = _box(src, u0 + 1, ul, S, offs, rr, cc, ROWS, COLS, RS, BR, BC, EVEN, FLAT)
    if RING >= 3:
        c = _box(src, u0 + 2, ul, S, offs, rr, cc, ROWS, COLS, RS, BR, BC, EVEN, FLAT)
    if RING >= 4:
        d = _box(src, u0 + 3, ul, S, offs, rr, cc, ROWS, COLS, RS, BR, BC, EVEN, FLAT)
    for g in range(u0, u1, RING):
        chk = _fold(chk, a, g < u1, ZERO)
        a = _box(src, g + RING, ul, S, offs, rr, cc, ROWS, COLS, RS, BR, BC, EVEN, FLAT)
        if RING >= 2:
            chk = _fold(chk, b, g + 1 < u1, ZERO)
            b = _box(src, g + RING + 1, ul, S, offs, rr, cc, ROWS, COLS, RS, BR, BC, EVEN, FLAT)
        if RING >= 3:
            chk = _fold(chk, c, g + 2 < u1, ZERO)
            c = _box(src, g + RING + 2, ul, S, offs, rr, cc, ROWS, COLS, RS, BR, BC, EVEN, FLAT)
        if RING >= 4:
            chk = _fold(chk, d, g + 3 < u1, ZERO)
            d = _box(src, g + RING + 3, ul, S, offs, rr, cc, ROWS, COLS, RS, BR, BC, EVEN, FLAT)
    tl.store(out + pid, tl.xor_sum(tl.reshape(chk, [BR * BC]), 0))


# ---- Triton tensor descriptors: the pipeliner's TMA ring

@triton.jit(do_not_specialize=["S", "U"])
def stream_tma_kernel(desc, out, S, U, BR: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr,
                      FLAT: tl.constexpr):
    """As stream_ldg_kernel, the boxes loaded through a tensor descriptor (TMA; out-of-range rows and columns
    read as zeros) in a `tl.range(num_stages=STAGES)` loop, which Triton pipelines through shared memory."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    u0 = pid * U // P
    u1 = (pid + 1) * U // P
    chk = tl.zeros([BR, BC], dtype=tl.int32)
    for u in tl.range(u0, u1, num_stages=STAGES):
        if FLAT:
            tile = u
        else:
            tile = u // S
        ks = u - tile * S
        chk ^= desc.load([tile * BR, ks * BC])
    tl.store(out + pid, tl.xor_sum(tl.reshape(chk, [BR * BC]), 0))


# ---- Gluon: a TMA producer warp, a shared-memory ring, a consumer warpgroup

if HAS_GLUON:

    @gluon.jit
    def _g_producer(desc, smem, ready, empty, u0, u1, S, BR: gl.constexpr, BC: gl.constexpr, STAGES: gl.constexpr):
        tile = u0 // S
        ks = u0 - tile * S
        for i in range(u1 - u0):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh slot passes at once
            mbarrier.expect(ready.index(s), desc.block_type.nbytes)
            tma.async_copy_global_to_shared(desc, [tile * BR, ks * BC], ready.index(s), smem.index(s))
            ks += 1
            wrap = ks == S
            tile += wrap.to(gl.int32)
            ks = gl.where(wrap, 0, ks)

    @gluon.jit
    def _g_consumer(smem, ready, empty, out, pid, u0, u1, BR: gl.constexpr, BC: gl.constexpr,
                    STAGES: gl.constexpr, CR: gl.constexpr, num_warps: gl.constexpr):
        """XOR every slot CR rows at a time (a warp 512 contiguous bytes, 16 a thread: LDS.128, no replication:
        CR = num_warps / (BC / 128) rows of BC words), then release it."""
        WC: gl.constexpr = BC // 128
        lay: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [num_warps // WC, WC], [1, 0])
        chk = gl.zeros([CR, BC], gl.int32, lay)
        for i in range(u1 - u0):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            slot = smem.index(s)
            for r in gl.static_range(0, BR, CR):
                chk ^= slot.slice(r, CR, dim=0).load(lay)
            gl.thread_barrier()  # every warp of the partition is done with the slot (the arrive is thread 0's)
            mbarrier.arrive(empty.index(s), count=1)
        gl.store(out + pid, gl.xor_sum(gl.xor_sum(chk, 1), 0))

    @gluon.jit(do_not_specialize=["S", "U"])
    def stream_gluon_kernel(desc, out, S, U, BR: gl.constexpr, BC: gl.constexpr, STAGES: gl.constexpr,
                            CR: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """Boxes [pid U / P, (pid + 1) U / P) of desc's view (tile-major, S boxes a row of boxes) through a
        STAGES-slot ring: the producer warp's TMA copies complete ready[s] (expect-tx), the consumer partition
        (the default one, num_warps warps) XORs the slot and arrives on empty[s]."""
        pid = gl.program_id(0)
        P = gl.num_programs(0)
        u0 = pid * U // P
        u1 = (pid + 1) * U // P
        smem = gl.allocate_shared_memory(gl.int32, [STAGES, BR, BC], desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        gl.warp_specialize([
            (_g_consumer, (smem, ready, empty, out, pid, u0, u1, BR, BC, STAGES, CR, num_warps)),
            (_g_producer, (desc, smem, ready, empty, u0, u1, S, BR, BC, STAGES)),
        ], [1], [PRODUCER_REGS])


def smem_layout(cfg: StreamConfig):
    """Unswizzled shared layout of a (br, bc) int32 box: a TMA box with bc x 4 > 128 bytes cannot be swizzled,
    and the consumer reads 512 contiguous bytes a warp (no bank conflicts)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def _chunk_rows(cfg: StreamConfig) -> int:
    """Rows of a box the Gluon consumer loads at once: 16 bytes a thread (one LDS.128 each)."""
    assert cfg.bc % 128 == 0 and cfg.num_warps % (cfg.bc // 128) == 0 and cfg.br % (cfg.num_warps * 128 // cfg.bc) == 0
    return cfg.num_warps * 128 // cfg.bc
