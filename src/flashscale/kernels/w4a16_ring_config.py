"""The register-ring decode kernel's configs and launch plan, pure Python: RingConfig, the candidate lists of each
token bucket, the trace buffer's layout, and the grid and item shares of a launch (ring_grid, late_cut, dyn_chunk).

Apart from the kernel (w4a16_ring_kernel.py) and its launcher (w4a16_ring.py, which re-exports every name here), so
that reading or sweeping configs needs no kernel code.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashscale.kernels.w4a16_configs import stream_k_grid


TRACE_FIELDS = ("t_start_ns", "clk_start", "clk_first", "clk_end", "clk_last_flush", "t_end_ns", "smid", "items",
                "t_wait_ns", "t_x_ns", "t_first_ns")  # t_wait: after the PDL wait; t_x: prologue done, x loads next
TRACE_STRIDE = 16  # int64 values a program in a trace buffer

REGS_PER_SM = 65536
MAX_TOKENS = 16


def resident_programs(regs: int, num_warps: int) -> int:
    """Programs of num_warps warps an SM can hold at regs registers a thread (allocated 8 a thread at a time; 2048
    threads, 32 blocks)."""
    threads = 32 * num_warps
    return max(1, min(REGS_PER_SM // (-(-regs // 8) * 8 * threads), 2048 // threads, 32))


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
        return resident_programs(regs, self.num_warps)

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


def ring_grid(k: int, n: int, cfg: RingConfig, per_sm: int, num_sms: int) -> tuple[int, int, int, int]:
    """(programs, items, items a tile S, workspace slots a tile CMAX) of a launch: the decode kernel's grid."""
    return stream_k_grid(k, n, cfg.bn, cfg.kt, per_sm, num_sms)


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
