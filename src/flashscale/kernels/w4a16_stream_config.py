"""Configs of the loads-only W4A16 streaming probes (w4a16_stream.py's module docstring has the design): StreamConfig
(a box shape, how loads are issued, the ring depth; what it keeps in flight, its shared memory and registers, how
many programs an SM holds), the machine limits it is checked against, and the 2-D views and persistent grid of a
launch. Plain Python with no kernel in it, so the probe, the census and the tests read it without compiling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from flashscale.kernels.w4a16_pack import PackedW4

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
