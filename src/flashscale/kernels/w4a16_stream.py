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

Files: w4a16_stream_config.py (StreamConfig, the machine limits, views and grids), w4a16_stream_kernels.py (the
three kernels), w4a16_stream_aot.py (sm_90 compiles, the census, sass_load_rate); this module launches, holds the
configs the probe times (STREAM_CONFIGS: patch it here), the census table (python -m), and re-exports the names that
callers import from it.
"""

from __future__ import annotations

import torch

from flashscale.kernels.w4a16_pack import PackedW4
from flashscale.kernels.w4a16_stream_aot import census, compile_sm90, sass_load_rate
from flashscale.kernels.w4a16_stream_config import (REGS_PER_SM, SMEM_PER_BLOCK, SMEM_PER_SM, StreamConfig,
                                                    stream_grid, view_of)
from flashscale.kernels.w4a16_stream_kernels import (HAS_GLUON, _chunk_rows, smem_layout, stream_ldg_kernel,
                                                     stream_tma_kernel)

if HAS_GLUON:
    from flashscale.kernels.w4a16_stream_kernels import stream_gluon_kernel

# Names tests, benchmarks and w4a16_ring_aot import from here, kept importable since the split into
# w4a16_stream_config / w4a16_stream_kernels / w4a16_stream_aot (stream_gluon_kernel too, where Gluon is there).
# STREAM_CONFIGS lives here, and so does all_configs, which reads it.
__all__ = [
    "HAS_GLUON", "PackedW4", "REGS_PER_SM", "SMEM_PER_BLOCK", "SMEM_PER_SM", "STREAM_CONFIGS", "StreamConfig",
    "all_configs", "census", "compile_sm90", "launch", "make_desc", "sass_load_rate", "smem_layout", "stream_grid",
    "stream_ldg_kernel", "stream_tma_kernel", "view_of",
]


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
