"""The Gluon shared-memory ring decode kernel's configs (w4a16_gring.py, where the launcher is; the kernel:
w4a16_gring_kernel.py): GRingConfig with its shared-memory, residency and in-flight arithmetic, the M <= 8 and
M <= 16 candidates, configs_for. Plain Python, no kernel code.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashscale.kernels.w4a16_ring_config import REGS_PER_SM

SMEM_PER_SM = 228 * 1024


@dataclass(frozen=True, kw_only=True)
class GRingConfig:
    bn: int = 128  # output rows an item (NB = bn / 16 fragment rows, split over the warps)
    kt: int = 2  # 64-wide fragment columns an item (1 or 2)
    num_warps: int = 4
    stages: int = 4  # ring slots: stages - 1 items in flight while one is computed
    per_sm: int = 4  # programs an SM
    atomic: bool = True  # split-K: red.add + element tickets; False: slots summed in order (deterministic)

    @property
    def item_bytes(self) -> int:
        return self.bn * self.kt * 32

    def smem_bytes(self, tokens: int = 8) -> int:
        """A program's ring: per slot the packed words, the scale/zero words (4 a lane and row, duplicated as the
        C layout wants them), the x words (2 a chunk x 4 chunks x lanes, per column and token block)."""
        tb = 1 if tokens <= 8 else 2
        return self.stages * (self.item_bytes + self.bn // 16 * 512 + self.kt * tb * 2 * 512)

    def resident(self, regs: int) -> int:
        threads = 32 * self.num_warps
        by_regs = REGS_PER_SM // (-(-regs // 8) * 8 * threads)
        return max(1, min(by_regs, SMEM_PER_SM // (self.smem_bytes() + 1024), 2048 // threads, 32))

    def per_sm_options(self, regs: int | None = None) -> list[int]:
        fit = self.resident(regs) if regs else self.per_sm
        return sorted({min(self.per_sm, fit), *[p for p in (2, 3, 4, 5, 6, 8) if self.per_sm < p <= fit][-2:]})

    def in_flight_kb(self, per_sm: int) -> float:
        return per_sm * (self.stages - 1) * self.item_bytes / 1024

    @property
    def label(self) -> str:
        return (f"bn{self.bn} kt{self.kt} w{self.num_warps} st{self.stages} ({self.item_bytes // 1024} KB)"
                + (" atomic" if self.atomic else " slots"))


GRING_CONFIGS: list[GRingConfig] = [  # M <= 8; comment: KB of packed words in flight an SM (shared memory a program)
    GRingConfig(bn=128, kt=2, num_warps=4, stages=4, per_sm=4),  # 3 x 8 KB x 4 = 96 KB (56 KB)
    GRingConfig(bn=128, kt=2, num_warps=4, stages=4, per_sm=4, atomic=False),  # the same, deterministic
    GRingConfig(bn=128, kt=2, num_warps=4, stages=3, per_sm=5),  # 2 x 8 x 5 = 80 KB (42 KB)
    GRingConfig(bn=128, kt=2, num_warps=8, stages=6, per_sm=2),  # a fragment row a warp: 5 x 8 x 2 = 80 KB (84 KB)
    GRingConfig(bn=256, kt=2, num_warps=8, stages=4, per_sm=2),  # 3 x 16 x 2 = 96 KB (104 KB)
    GRingConfig(bn=64, kt=2, num_warps=4, stages=6, per_sm=4),  # 5 x 4 x 4 = 80 KB (48 KB)
]
GRING_CONFIGS_16: list[GRingConfig] = [  # 9 <= M <= 16 (x and the second accumulator: 102-122 registers)
    GRingConfig(bn=128, kt=2, num_warps=4, stages=4, per_sm=3),
    GRingConfig(bn=128, kt=2, num_warps=4, stages=4, per_sm=3, atomic=False),
    GRingConfig(bn=128, kt=2, num_warps=8, stages=4, per_sm=2),
]


def configs_for(m: int) -> list[GRingConfig]:
    return GRING_CONFIGS if m <= 8 else GRING_CONFIGS_16
