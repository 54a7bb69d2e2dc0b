"""Loads-only streaming probes of the packed W4A16 weights (issue #7, docs/w4a16_decode.md "Round 4").

The decode kernels' loads alone (benchmarks/w4a16_probe.py rows a-gemv / a-dec) reach 2.6-2.8 TB/s on an H200,
60-65 % of a device copy. These kernels read a PackedW4 qweight tensor exactly once, with no math, and XOR
every word into a per-program checksum (int32, out[pid]), to find an access pattern that streams at the copy
rate before the decode math is put back on it. Three ways to issue the loads:

  triton  plain Triton, 16-byte vector loads straight to registers (LDG.E.128) into a RING-slot register ring
          (RING boxes in flight while the oldest is waited for); the ring rotates by position, never by
          register moves, and a runtime-zero rotation keeps ptxas from fusing two boxes' XORs (both would make
          the loop wait on its newest load: see stream_ldg_kernel)
  tma     Triton tensor descriptors (host TensorDescriptor: the tensor map is a kernel parameter, no device
          allocator or on-device descriptor creation), `tl.range(num_stages=STAGES)`: Triton's pipeliner turns
          the box loads into TMA copies (UTMALDG) into a STAGES-deep shared-memory ring with mbarriers
  gluon   Gluon, warp-specialized: one producer warp issues TMA box copies into a STAGES-slot shared-memory
          ring (ready / empty mbarriers), the consumer warpgroup XORs each slot from shared memory (LDS.128)
          and releases it; the producer runs up to STAGES boxes ahead

Two views of the same bytes (both the PackedW4 layout the decode kernel reads; see w4a16_pack.py: qweight
(N_pad/16, K_pad/64, 32, 4) int32, one 512-byte fragment = 16 output rows x 64 inputs):

  flat    the buffer as (fragments, 128 words); a box is BR consecutive fragments (BR x 512 bytes, one
          contiguous run: BR / (K_pad/64) fragment rows of 16 outputs, or part of one), and program p of P
          takes boxes [p U / P, (p + 1) U / P): one contiguous range of the buffer a program
  tile    the buffer as (N_pad/16 fragment rows, K_pad * 2 words); a box is NB = BN/16 fragment rows x
          KT fragments (BN outputs x 64 KT inputs: the decode kernel's work item, NB runs of KT x 512 bytes
          K_pad * 8 bytes apart), walked tile-major in the decode kernel's stream-K order (a program's range
          is U / P consecutive items, the NB rows advancing together along K)

Every box is read whole; tails (rows past the view, columns past K_pad * 2 in the tile view) are masked in
the plain kernel and zero-filled by TMA, which leaves the XOR unchanged. Persistent grids: per_sm programs
an SM (per_sm 0: one program a box, the classic non-persistent grid).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from flashscale.kernels.w4a16_pack import PackedW4

try:  # Gluon is experimental: absent from older Tritons
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    HAS_GLUON = hasattr(gl, "warp_specialize")
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False

SMEM_PER_SM = 228 * 1024  # H100/H200 shared memory an SM (227 KB the most one block may take)
SMEM_PER_BLOCK = 227 * 1024
REGS_PER_SM = 65536


@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    """One loads-only streaming pattern. br x bc words a box (flat: br fragments, bc = 128; tile: br = BN / 16
    fragment rows, bc = 128 KT). stages: triton: the register ring's slots (RING, 1..4); tma: tl.range's
    num_stages; gluon: shared-memory ring slots."""

    kind: str  # "triton" | "tma" | "gluon"
    view: str  # "flat" | "tile"
    br: int
    bc: int = 128
    num_warps: int = 4
    stages: int = 2
    nonpersistent: bool = False  # also time per_sm 0 (one program a box)

    @property
    def box_bytes(self) -> int:
        return self.br * self.bc * 4

    def boxes_in_flight(self) -> int:
        """Boxes a program has requested and not yet consumed when it waits for the oldest one."""
        if self.kind == "triton":
            # RING: a slot is refilled right after it is XORed (the load reuses its registers), so while the
            # loop waits for box g, boxes g .. g + RING - 1 are in flight (census: sass_load_rate checks it)
            return self.stages
        if self.kind == "tma":
            return self.stages - 1  # Triton's pipeliner loads num_stages - 1 iterations ahead
        return self.stages  # gluon: every slot of the ring

    def smem_bytes(self) -> int:
        """Shared memory of one program (an upper bound: Triton adds alignment and a few barriers)."""
        if self.kind == "triton":
            return 1024  # the final cross-warp XOR
        ring = self.stages - 1 if self.kind == "tma" else self.stages  # the pipeliner's num_stages - 1 buffers
        return ring * self.box_bytes + 16 * self.stages + 1024

    def regs_per_thread(self) -> int:
        """Rough register need of the plain kernel (the ring, the checksum, addressing); the probe and the census
        use the compiled kernel's count instead."""
        words = self.box_bytes // 4 // (32 * self.num_warps)
        return min(255, words * (self.stages + 1) + 24)

    def resident(self, regs: int | None = None, shared: int | None = None) -> int:
        """Programs an SM can hold at once (registers allocated 8 a thread at a time, 1 KB of shared memory
        reserved a block, 2048 threads); gluon: 1 (a warp-specialized kernel is compiled with .maxnreg 256 for
        setmaxnreg: its 8 warps take every register)."""
        if self.kind == "gluon":
            return 1
        threads = 32 * self.num_warps
        regs = regs if regs is not None else (self.regs_per_thread() if self.kind == "triton" else 64)
        shared = shared if shared is not None else self.smem_bytes()
        return max(1, min(REGS_PER_SM // (-(-regs // 8) * 8 * threads), SMEM_PER_SM // (shared + 1024),
                          2048 // threads, 32))

    def per_sm_options(self, regs: int | None = None, shared: int | None = None) -> list[int]:
        """Persistent programs an SM worth timing: 1, 2, 4 while they are all resident at once (plus 0: one
        program a box, for nonpersistent configs)."""
        fit = self.resident(regs, shared)
        return ([0] if self.nonpersistent else []) + [p for p in (1, 2, 4) if p <= fit]

    def in_flight_kb(self, per_sm: int, regs: int | None = None, shared: int | None = None) -> float:
        """KB of loads in flight an SM by design (programs resident at once x boxes in flight each); per_sm 0
        (one program a box): as many programs as registers, shared memory and threads let reside."""
        if per_sm == 0:
            return self.resident(regs, shared) * self.box_bytes / 1024
        return per_sm * self.boxes_in_flight() * self.box_bytes / 1024

    @property
    def label(self) -> str:
        shape = f"nb{self.br} kt{self.bc // 128}" if self.view == "tile" else f"{self.br}frag"
        depth = {"triton": "ring", "tma": "ns", "gluon": "slots"}[self.kind]
        return f"{self.view} {shape} ({self.box_bytes // 1024} KB) w{self.num_warps} {depth}{self.stages}"


def view_of(p: PackedW4 | torch.Tensor, cfg: StreamConfig) -> tuple[torch.Tensor, int, int]:
    """(2-D view of the qweight words, its rows, its columns) for the config's view."""
    q = p.qweight if isinstance(p, PackedW4) else p
    assert q.dim() == 4 and q.shape[2:] == (32, 4) and q.is_contiguous(), tuple(q.shape)
    if cfg.view == "flat":
        v = q.view(-1, 128)
    else:
        v = q.view(q.shape[0], -1)
        assert cfg.bc % 128 == 0
    return v, v.shape[0], v.shape[1]


def stream_grid(p: PackedW4 | torch.Tensor, cfg: StreamConfig, per_sm: int, num_sms: int) -> tuple[int, int, int]:
    """(programs, items, steps per row of boxes) of a launch."""
    _, rows, cols = view_of(p, cfg)
    steps = triton.cdiv(cols, cfg.bc)
    items = triton.cdiv(rows, cfg.br) * steps
    progs = items if per_sm == 0 else max(1, min(per_sm * num_sms, items))
    return progs, items, steps


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


def launch(p: PackedW4 | torch.Tensor, out: torch.Tensor, cfg: StreamConfig, per_sm: int, num_sms: int,
           desc=None):
    """XOR-stream p's qweight with cfg at per_sm programs an SM; out (>= programs) int32 gets one checksum a
    program. desc: a prebuilt descriptor (make_desc) for tma / gluon. Returns (programs launched, the compiled
    kernel Triton's launch returned: .n_regs, .metadata.shared on a GPU)."""
    v, rows, cols = view_of(p, cfg)
    progs, items, steps = stream_grid(p, cfg, per_sm, num_sms)
    if cfg.kind == "triton":
        even = rows % cfg.br == 0 and cols % cfg.bc == 0
        k = stream_ldg_kernel[(progs,)](v, out, rows, cols, v.stride(0), steps, items, 0, BR=cfg.br, BC=cfg.bc,
                                        RING=cfg.stages, EVEN=even, FLAT=steps == 1, num_warps=cfg.num_warps,
                                        num_stages=1)
    elif cfg.kind == "tma":
        k = stream_tma_kernel[(progs,)](desc if desc is not None else make_desc(p, cfg), out, steps, items, BR=cfg.br,
                                        BC=cfg.bc, STAGES=cfg.stages, FLAT=steps == 1, num_warps=cfg.num_warps)
    elif cfg.kind == "gluon":
        if not HAS_GLUON:
            raise RuntimeError("this triton has no Gluon warp_specialize")
        k = stream_gluon_kernel[(progs,)](desc if desc is not None else make_desc(p, cfg), out, steps, items,
                                          BR=cfg.br, BC=cfg.bc, STAGES=cfg.stages, CR=_chunk_rows(cfg),
                                          PRODUCER_REGS=24, num_warps=cfg.num_warps)
    else:
        raise ValueError(f"unknown stream kind {cfg.kind!r}")
    return progs, k


def make_desc(p: PackedW4 | torch.Tensor, cfg: StreamConfig):
    """Host-side tensor descriptor of the config's view (box br x bc words)."""
    v, rows, cols = view_of(p, cfg)
    if cfg.kind == "gluon":
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GDesc

        return GDesc(v, [rows, cols], [v.stride(0), 1], [cfg.br, cfg.bc], smem_layout(cfg))
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(v, [rows, cols], [v.stride(0), 1], [cfg.br, cfg.bc])


# ---- configs timed by benchmarks/w4a16_probe.py (kinds s-triton, s-tma, s-gluon)

def _c(kind, view, br, bc=128, w=4, st=2, **kw):
    return StreamConfig(kind=kind, view=view, br=br, bc=bc, num_warps=w, stages=st, **kw)


# KB in flight an SM (in_flight_kb) at per_sm 1 / 2 / 4, as the comments say; gluon runs one program an SM.
STREAM_CONFIGS = {
    "triton": [_c("triton", "flat", 16, w=4, st=1, nonpersistent=True),  # 8 KB boxes, ring 1: 8 KB a program
               #    (per_sm 0: one program a box, the classic grid, as many resident as fit)
               _c("triton", "flat", 16, w=4, st=2),  # 8 KB x 2: 16 KB a program
               _c("triton", "flat", 16, w=4, st=4),  # 8 KB x 4: 32 KB
               _c("triton", "flat", 32, w=8, st=2),  # 16 KB x 2: 32 KB
               _c("triton", "flat", 32, w=8, st=4),  # 16 KB x 4: 64 KB
               _c("triton", "tile", 16, 256, w=8, st=2),  # the decode item bn256 kt2 x 2: 32 KB
               _c("triton", "tile", 8, 256, w=4, st=4)],  # bn128 kt2 x 4: 32 KB
    "tma": [_c("tma", "flat", 32, st=3),   # 16 KB boxes, 2 ahead: 32 / 64 / 128 KB
            _c("tma", "flat", 32, st=5),   # 16 KB, 4 ahead: 64 / 128 KB
            _c("tma", "flat", 64, w=8, st=3),  # 32 KB, 2 ahead: 64 / 128 KB
            _c("tma", "tile", 16, 256, st=4)],  # bn256 kt2, 3 ahead: 48 / 96 / 192 KB (4: 192 KB smem)
    "gluon": [_c("gluon", "flat", 32, st=4),  # 16 KB boxes x 4 slots: 64 KB
              _c("gluon", "flat", 32, st=8),  # 16 KB x 8: 128 KB
              _c("gluon", "flat", 64, st=6),  # 32 KB x 6: 192 KB
              _c("gluon", "flat", 16, st=8),  # 8 KB x 8: 64 KB
              _c("gluon", "tile", 16, 256, st=4),  # bn256 kt2 x 4: 64 KB
              _c("gluon", "tile", 16, 256, w=8, st=8)],  # bn256 kt2 x 8: 128 KB, an 8-warp consumer
}


# ---- ahead-of-time sm_90 compiles (no GPU needed) and what the machine code says

def compile_sm90(cfg: StreamConfig, *, even: bool = True):
    """Compile one config for sm_90 the way a launch on a Llama shape specializes it (pointers and strides
    16-divisible; even: no box crosses the view's edge). Returns Triton's CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    if cfg.kind == "triton":
        sig = {"src": "*i32", "out": "*i32", "ROWS": "i32", "COLS": "i32", "RS": "i32", "S": "i32", "U": "i32",
               "ZERO": "i32"}
        cx = dict(BR=cfg.br, BC=cfg.bc, RING=cfg.stages, EVEN=even, FLAT=cfg.view == "flat")
        fn, src_cls, opts = stream_ldg_kernel, ASTSource, {"num_warps": cfg.num_warps, "num_stages": 1}
    else:
        if cfg.kind == "tma":
            desc = f"tensordesc<i32[{cfg.br},{cfg.bc}]>"
            cx = dict(BR=cfg.br, BC=cfg.bc, STAGES=cfg.stages, FLAT=cfg.view == "flat")
            fn, src_cls = stream_tma_kernel, ASTSource
        else:
            from triton.experimental.gluon._runtime import GluonASTSource

            desc = f"tensordesc<i32[{cfg.br},{cfg.bc}],{smem_layout(cfg)!r}>"
            cx = dict(BR=cfg.br, BC=cfg.bc, STAGES=cfg.stages, CR=_chunk_rows(cfg), PRODUCER_REGS=24,
                      num_warps=cfg.num_warps)
            fn, src_cls = stream_gluon_kernel, GluonASTSource
        sig = {"desc": desc, "out": "*i32", "S": "i32", "U": "i32"}
        opts = {"num_warps": cfg.num_warps}
    names = list(sig) + list(cx)
    sig.update({k: "constexpr" for k in cx})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("src", "out", "RS") if n in names}
    if src_cls is ASTSource:
        src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()}, attrs=attrs)
    else:
        src = src_cls(fn=fn, signature=sig, constexprs=cx, attrs=attrs)
    return triton.compile(src, target=target, options=opts)


def _regs_of(operands: str) -> list[int]:
    import re

    return [int(x) for x in re.findall(r"\bR(\d+)\b", operands)]


def sass_load_rate(body: list[tuple[int, str]], latency: int = 1000, iters: int = 24) -> dict:
    """A static model of a loop's global loads: instructions issue one a cycle in program order, an instruction
    that reads (or overwrites) a register whose LDG is in flight waits until the load is back `latency` cycles
    after it issued. Returns the loop's LDGs an iteration, its steady-state cycles an iteration and
    loads_in_flight = LDGs a latency (Little's law: what a thread keeps in flight, as the ptxas schedule
    allows), and waits_per_iter: the instructions of a steady-state iteration (the third) that stall on a load.
    This is what exposes a register ring rotated by moves (the move waits for the load it copies) or two boxes'
    XORs fused into one LOP3 (the older waits for the newer)."""
    import re

    ready: dict[int, int] = {}
    t, starts, nld, waits = 0, [], 0, 0
    for it in range(iters):
        starts.append(t)
        for _, txt in body:
            txt = re.sub(r"^@!?U?P\w+\s+", "", txt)
            op = txt.split()[0]
            parts = txt[len(op):].split(",")
            dst, srcs = _regs_of(parts[0]), _regs_of(",".join(parts[1:]))
            writes = not op.startswith(("ST", "BRA", "RED", "ATOM"))
            used = set(srcs) | (set(dst) if writes else set())  # reads, and WAW on a load's destination
            need = max([0] + [ready.get(r, 0) for r in used])
            waits += it == 2 and need > t + 1
            t = max(t + 1, need)
            if op.startswith("LDG"):
                width = 4 if op.endswith(".128") else 2 if op.endswith(".64") else 1
                for r in range(dst[0], dst[0] + width):
                    ready[r] = t + latency
                nld += it == 0
            elif writes:
                for r in dst:
                    ready[r] = 0
    per_iter = (starts[-1] - starts[iters // 2]) / (iters - 1 - iters // 2)
    return dict(ldg_per_iter=nld, cycles_per_iter=per_iter, loads_in_flight=nld * latency / per_iter,
                waits_per_iter=waits)


def census(cfg: StreamConfig) -> dict:
    """Compile for sm_90 and count: registers, spills, shared memory, the load instructions of the whole kernel
    and, for the plain kernel, the modelled loads in flight of its main loop (sass_load_rate) and what that
    makes an SM at each per_sm option (KB: loads x 16 bytes x threads x programs)."""
    import collections
    import re
    from dataclasses import asdict

    from flashscale.kernels.aot import ptxas_stats, sass, sass_instructions, sass_loops, sass_opcode

    k = compile_sm90(cfg)
    text = sass(k.asm["cubin"])
    ins = sass_instructions(text)
    ops = collections.Counter(sass_opcode(t) for _, t in ins)
    stats = ptxas_stats(k.asm["ptx"])
    r = dict(config=asdict(cfg), label=cfg.label, kind=cfg.kind, shared=k.metadata.shared,
             **{n: v for n, v in stats.items() if n != "log"},
             ldg128=sum(c for o, c in ops.items() if o.startswith("LDG") and o.endswith(".128")),
             ldg_other=sum(c for o, c in ops.items() if o.startswith("LDG") and not o.endswith(".128")),
             ldgsts=sum(c for o, c in ops.items() if o.startswith("LDGSTS")),
             utmaldg=sum(c for o, c in ops.items() if o.startswith("UTMALDG")),
             lds128=ops["LDS.128"], local=len(re.findall(r"\b(?:LDL|STL)\b", text)),
             per_sm_options=cfg.per_sm_options(stats["registers"], k.metadata.shared),
             design_in_flight_kb={p: cfg.in_flight_kb(p, stats["registers"], k.metadata.shared)
                                  for p in cfg.per_sm_options(stats["registers"], k.metadata.shared)})
    if cfg.kind == "triton":
        body = max(sass_loops(ins), key=lambda b: sum(sass_opcode(t).startswith("LDG") for _, t in b))
        rate = sass_load_rate(body)
        r.update(loop_instructions=len(body), **rate,
                 sass_in_flight_kb={p: rate["loads_in_flight"] * 16 * 32 * cfg.num_warps * p / 1024
                                    for p in r["per_sm_options"] if p})
    return r


def all_configs() -> list[StreamConfig]:
    return [c for kind in ("triton", "tma", "gluon") for c in STREAM_CONFIGS[kind] if kind != "gluon" or HAS_GLUON]


if __name__ == "__main__":  # python -m flashscale.kernels.w4a16_stream (TRITON_INTERPRET unset): the census table
    for c in all_configs():
        r = census(c)
        modelled = {p: round(v) for p, v in r.get("sass_in_flight_kb", {}).items()}
        extra = "" if c.kind != "triton" else (
            f" | loop {r['loop_instructions']} instr, {r['ldg_per_iter']} LDG.128, modelled "
            f"{r['loads_in_flight']:.1f} loads in flight a thread -> KB/SM {modelled}")
        print(f"{c.kind:6s} {c.label:34s} | regs {r['registers']:3d} spills {r['spill_stores']}/{r['spill_loads']} "
              f"local {r['local']} | smem {r['shared']:6d} | LDG.128 {r['ldg128']:2d} other LDG {r['ldg_other']} "
              f"LDGSTS {r['ldgsts']} UTMALDG {r['utmaldg']:2d} LDS.128 {r['lds128']:2d} | design KB/SM "
              f"{({p: round(v) for p, v in r['design_in_flight_kb'].items()})}{extra}", flush=True)
