"""The FA3-style forward's configs: FA3Config (tile shape and pipeline of one launch), the tables of variants and
defaults (TUNING_CONFIGS, DEFAULT_CONFIGS, SEQLEN_CONFIGS, default_config) and the checks of a config against the
kernel and the SM (smem_bytes, config_error). Pure Python (no Triton import), apart from the Gluon kernels and
the launchers; kernels/attention_fa3.py re-exports every name."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

HEAD_DIMS = (64, 128, 256)


@dataclass(frozen=True, kw_only=True)
class FA3Config:
    """Tile shape and pipeline of one launch. Chosen per head dim from the H100/H200 budgets
    (228 KB shared memory and 64K registers an SM); see docs/attention_fa3.md for the arithmetic."""

    block_m: int = 128  # query rows of one program (block_m // consumers a warpgroup)
    block_n: int = 128  # keys a K/V block (Gluon tensors are powers of two: 64, 128 or 256)
    stages: int = 2  # K/V ring depth
    consumers: int = 2  # consumer warpgroups
    overlap: bool = True  # issue QK^T of block j+1 before the softmax of block j (intra-warpgroup)
    pingpong: bool = True  # one 4-warp partition a consumer, tensor-core turns between them (inter-warpgroup)
    producer_regs: int = 24  # setmaxnreg budget of the TMA warp
    consumer_regs: int = 0  # setmaxnreg of the worker consumer partitions (ping-pong); 0: 240 / 160 for 2 / 3
    persistent: bool = False  # ping-pong only: one program an SM looping over the tiles, heaviest first
    # Ping-pong's tile order: (batch, head)s in groups of about one wave of tiles (head_group), heaviest first within
    # a group, so a head's K/V comes from HBM once and from L2 for its other query tiles. False: one group, heaviest
    # first over all heads (every concurrent tile another head's K/V when batch x heads >= SMs: HBM-bound at 1k-2k).
    l2_groups: bool = True
    # persistent: programs take their next tile from an atomic counter (FA3's dynamic scheduler; the producer
    # passes it to the consumers through shared memory) instead of the static snake order, which a causal mask
    # leaves unbalanced (benchmarks/persistent_balance.py). Dense only.
    dynamic: bool = False
    # the softmax scale folded into the max subtraction (one FFMA an element instead of FMUL + FADD; the row max
    # taken on raw scores, exact for a scale > 0): -62 instructions a key block at D 64 / 128, no new spills; spills
    # 12 B in the D 256 varlen causal kernel. Measured in session 25 (2-9 % faster): the dense D 64 / 128 rows of
    # SEQLEN_CONFIGS take it; DEFAULT_CONFIGS (varlen, the compile tests) do not yet.
    fold_scale: bool = False

    @property
    def is_pingpong(self) -> bool:
        return self.pingpong and self.consumers > 1

    @property
    def num_warps(self) -> int:
        """Warps of the default partition (the launch's num_warps)."""
        return 4 if self.is_pingpong else 4 * self.consumers

    @property
    def q_rows(self) -> int:
        """Rows of one Q / output TMA box: a consumer's slice with ping-pong, the whole tile without."""
        return self.block_m // self.consumers if self.is_pingpong else self.block_m

    @property
    def worker_consumer_regs(self) -> int:
        return self.consumer_regs or (240 if self.consumers <= 2 else 160)


# Variants worth timing (benchmarks/attention_fa3_sweep.py; the GPU tests run each one).
# Block sizes are powers of two (Gluon tensor shapes), so FA3's 128 x 176 tile for D = 128 has no equivalent.
# All compile without spills except the persistent ones under causal at D 128/256 (a few registers stored
# once a tile, outside the key loop). See docs/attention_fa3.md.
_PP = {64: FA3Config(block_m=128, block_n=128, stages=3), 128: FA3Config(block_m=128, block_n=128, stages=2),
       256: FA3Config(block_m=128, block_n=64, stages=2)}
TUNING_CONFIGS = {
    64: {
        "pp": _PP[64],
        "coop": replace(_PP[64], pingpong=False),
        "pp_serial": replace(_PP[64], overlap=False),
        "pp_persist": replace(_PP[64], persistent=True),
        "pp_s4": replace(_PP[64], stages=4),
        "pp_flat": replace(_PP[64], l2_groups=False),
        "pp3_m192": FA3Config(block_m=192, block_n=128, stages=3, consumers=3),
        "pp3_m192_s2": FA3Config(block_m=192, block_n=128, stages=2, consumers=3),
        "pp3_m192_flat": FA3Config(block_m=192, block_n=128, stages=3, consumers=3, l2_groups=False),
        # 4 B spilled (full), 344 B (causal): the 160-register consumers have no room for the tile loop's counters
        "pp3_m192_persist": FA3Config(block_m=192, block_n=128, stages=3, consumers=3, persistent=True),
        # short causal sequences (2026-12-03): a deeper ring, 64-key blocks (half the diagonal block's masked work,
        # twice the turns), 128-row slices; all persistent, spill-free
        "pp_persist_s4": FA3Config(block_m=128, block_n=128, stages=4, persistent=True),
        "pp_n64_s6_persist": FA3Config(block_m=128, block_n=64, stages=6, persistent=True),
        "pp_m256_n64_persist": FA3Config(block_m=256, block_n=64, stages=4, persistent=True),
        # the dynamic tile scheduler (an atomic counter; attention-fa3-sweep-dyn-h200.json)
        "pp_persist_dyn": replace(_PP[64], persistent=True, dynamic=True),
        "pp3_m192_persist_dyn": FA3Config(block_m=192, block_n=128, stages=3, consumers=3, persistent=True,
                                          dynamic=True),
        "pp_m256_n64": FA3Config(block_m=256, block_n=64, stages=4),
        # the scale folded into the max subtraction (fold_scale; session 24, measured in session 25)
        "pp_persist_fold": replace(_PP[64], persistent=True, fold_scale=True),
        "pp3_m192_persist_dyn_fold": FA3Config(block_m=192, block_n=128, stages=3, consumers=3, persistent=True,
                                               dynamic=True, fold_scale=True),
        "pp3_m192_persist_fold": FA3Config(block_m=192, block_n=128, stages=3, consumers=3, persistent=True,
                                           fold_scale=True),
        "pp3_m192_fold": FA3Config(block_m=192, block_n=128, stages=3, consumers=3, fold_scale=True),
        "pp_n256_serial": FA3Config(block_m=128, block_n=256, stages=2, overlap=False),
    },
    128: {
        "pp": _PP[128],
        "coop": replace(_PP[128], pingpong=False),
        "pp_serial": replace(_PP[128], overlap=False),
        "pp_persist": replace(_PP[128], persistent=True),
        "pp_s3": replace(_PP[128], stages=3),
        "pp_s3_persist": replace(_PP[128], stages=3, persistent=True),
        "pp_n64_s4": FA3Config(block_m=128, block_n=64, stages=4),
        "pp_flat": replace(_PP[128], l2_groups=False),
        "pp_persist_dyn": replace(_PP[128], persistent=True, dynamic=True),
        "pp_persist_fold": replace(_PP[128], persistent=True, fold_scale=True),
        "pp_persist_dyn_fold": replace(_PP[128], persistent=True, dynamic=True, fold_scale=True),
        # three consumers at D 128 with 64-key blocks (the 160-register budget fits S of 64 keys, not 128: 192 x 128
        # spills 832 B and serializes its wgmma), session 38, compile-checked spill-free full and causal: 411 / 381
        # (fold) instructions a 64-key block against pp_persist_fold's 603 a 128-key one, +26 / +16 % issue a key
        # for a third warpgroup to hide the other two's softmax (D 64's pp3_m192: +16 %). Measured in session 39 (an
        # H100, attention-fa3-sweep-pp3d128-h100.json): 5-17 % slower than the dense rule's defaults; not taken
        "pp3_m192_n64": FA3Config(block_m=192, block_n=64, stages=4, consumers=3),
        "pp3_m192_n64_fold": FA3Config(block_m=192, block_n=64, stages=4, consumers=3, fold_scale=True),
        # the same with the dynamic persistent scheduler (causal: 4 B spilled, outside the key loop)
        "pp3_m192_n64_persist_dyn_fold": FA3Config(block_m=192, block_n=64, stages=4, consumers=3, fold_scale=True,
                                                   persistent=True, dynamic=True),
    },
    256: {
        "pp": _PP[256],
        "coop": replace(_PP[256], pingpong=False),
        "pp_serial": replace(_PP[256], overlap=False),
        "pp_persist": replace(_PP[256], persistent=True),
        "pp_flat": replace(_PP[256], l2_groups=False),
        "pp_persist_dyn": replace(_PP[256], persistent=True, dynamic=True),
        # session 27 (spill-free full and causal): the folded scale, left out at D 256 as "tensor-bound"; session 28
        # measured it -7 to +2 % against pp (attention-fa3-sweep-fold256-h200.json): not the default
        "pp_fold": replace(_PP[256], fold_scale=True),
    },
}
# Picked from the H200 sweep (benchmarks/results/attention-fa3-sweep-h200.json, 2026-11-29): D 64 three
# ping-pong consumers of 64 rows (466 TFLOP/s at 16k against 402 with two), D 128/256 two (581 / 634 at 16k;
# 3 stages and the persistent grid within 2% either way, so the simpler config).
DEFAULT_CONFIGS = {64: TUNING_CONFIGS[64]["pp3_m192"], 128: TUNING_CONFIGS[128]["pp"], 256: TUNING_CONFIGS[256]["pp"]}
# The dense launches' configs by (head dim, causal): (largest seqlen_q, TUNING_CONFIGS name), the first that holds
# (None: any). From the two H200 sweeps of the head-grouped order (attention-fa3-sweep-l2-h200.json and
# -snake-h200.json, 2026-12-03, 1k-16k): the persistent grid (the next tile's loads under this one's epilogue) is
# 2-10 % ahead at D 128 full and at D 64 up to 4k, and behind under a causal mask from 8k (d128 16k: 407-500
# against 576-582, whatever the program order) and at D 256; D 64 from 8k keeps three consumers on one tile a
# program. D 64 causal (and -d64-h200.json): two consumers at 1k (262 against 222), three from 2k (4k: 375-377 in
# two runs, pp_persist 354-376). pp3_m192_persist spills 4 B (full) / 344 B (causal) of counters; DEFAULT_CONFIGS
# (varlen, the AOT compile tests) stay spill-free.
# The dynamic scheduler (attention-fa3-sweep-dyn-h200.json, session 24): programs take tiles from an atomic counter,
# so a causal grid's uneven tiles balance themselves: d128 causal pp_persist_dyn 1k 375 (pp 340), 2k 463 (436), 4k
# 535 (518), 16k 589 (587; static persistent 412); d64 full pp3_m192_persist_dyn within 1 % of the best row at every
# length (8k 485 against pp3_m192's 480), one config for all of them.
# The folded softmax scale (attention-fa3-sweep-fold-h200.json, session 25; fold_scale against its twin, TFLOP/s):
# d128 causal pp_persist_dyn_fold 1k-16k 392 / 470 / 549 / 616 (372 / 456 / 532 / 607); d128 full pp_persist_fold
# 2k-16k +3-8 % (1k 538 against 551: the unfolded grid stays there); d64 full pp3_m192_persist_dyn_fold 1k-4k
# +4-7 %, pp3_m192_fold 16k 513 (487); d64 causal every row's fold twin 7-10 % ahead, the dynamic one best at 16k
# (490 against pp3_m192's 461).
SEQLEN_CONFIGS = {(64, False): ((4096, "pp3_m192_persist_dyn_fold"), (None, "pp3_m192_fold")),
                  (64, True): ((1024, "pp_persist_fold"), (4096, "pp3_m192_persist_fold"),
                               (None, "pp3_m192_persist_dyn_fold")),
                  (128, False): ((1024, "pp_persist"), (None, "pp_persist_fold")),
                  (128, True): ((None, "pp_persist_dyn_fold"), ),
                  (256, False): ((None, "pp"), ), (256, True): ((None, "pp"), )}


def default_config(head_dim: int, causal: bool, seqlen_q: int) -> FA3Config:
    """The config a dense call without config= runs (SEQLEN_CONFIGS)."""
    for bound, name in SEQLEN_CONFIGS[(head_dim, bool(causal))]:
        if bound is None or seqlen_q <= bound:
            return TUNING_CONFIGS[head_dim][name]
    raise AssertionError("SEQLEN_CONFIGS: every row ends with a None bound")

SMEM_LIMIT = 232_448  # H100/H200: 227 KB the most one block may take


def smem_bytes(head_dim: int, cfg: FA3Config, elem: int = 2) -> int:
    """Shared memory of one program, about (Triton aligns and adds a few hundred bytes): the Q tile (reused
    for the output tile) + the K/V ring + barriers."""
    n_bars = 4 * cfg.stages + (3 * cfg.consumers if cfg.is_pingpong else 1)
    return elem * head_dim * (cfg.block_m + 2 * cfg.stages * cfg.block_n) + 8 * n_bars


@functools.lru_cache(maxsize=None)  # pure; checked on every launch
def config_error(head_dim: int, cfg: FA3Config, *, varlen: bool = False) -> str | None:
    """Why this config cannot compile (or cannot fit an SM) at this head dim (for the varlen kernel), or None."""
    pow2 = lambda x: x > 0 and x & (x - 1) == 0  # noqa: E731
    if head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim} not in {HEAD_DIMS}"
    if not (pow2(cfg.block_n) and 16 <= cfg.block_n <= 256):
        return f"block_n {cfg.block_n}: a power of two in 16..256 (Gluon tensor shapes are powers of two)"
    if cfg.stages < 2:
        return "stages >= 2"
    if cfg.is_pingpong:
        if cfg.consumers not in (2, 3):
            return f"ping-pong takes 2 or 3 consumer warpgroups, not {cfg.consumers}"
        if cfg.block_m % cfg.consumers or cfg.q_rows not in (64, 128):
            return f"block_m {cfg.block_m}: {cfg.consumers} slices of 64 or 128 rows"
    elif not (pow2(cfg.block_m) and cfg.block_m % (64 * cfg.consumers) == 0):
        return f"block_m {cfg.block_m}: a power of two, >= 64 rows a consumer warpgroup"
    if cfg.persistent and not cfg.is_pingpong:
        return "persistent needs the ping-pong path (pingpong=True, consumers >= 2)"
    if cfg.dynamic and not (cfg.persistent and not varlen):
        return "dynamic is a scheduler of the dense persistent grid (persistent=True, no varlen)"
    if varlen and not cfg.is_pingpong:
        return "varlen runs the ping-pong path (pingpong=True, consumers >= 2)"
    if smem_bytes(head_dim, cfg) > SMEM_LIMIT:
        return f"{smem_bytes(head_dim, cfg)} B of shared memory > {SMEM_LIMIT}"
    return None
