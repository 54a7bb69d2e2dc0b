"""Configs of the FA3-style backward (attention_fa3_bwd.py): FA3BwdConfig (tiles, the dQ path, the warp-specialized
variant's rings and register split), the measured defaults a head dim and the named tuning configs (with why each
is or is not the default), the shared-memory estimate and config_error, which says why a config cannot run.
Plain Python, apart from the Gluon kernels and the launcher: the tests, the benchmarks and the dispatch read it
without building a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flashscale.kernels.attention_fa3 import HEAD_DIMS, SMEM_LIMIT

NUM_WARPS = 8


@dataclass(frozen=True, kw_only=True)
class FA3BwdConfig:
    """Tiles of one launch: block_n keys a program (dK/dV rows), block_m queries a step."""

    block_n: int = 128
    block_m: int = 64
    red_v2: bool = True  # dQ by red.global.add.v2.f32 (inline PTX) rather than Triton's scalar atomics
    # dQ = dS K in this many column pieces a step (single-partition kernel): 2 holds half of dQ's accumulator at a
    # time (32 fewer registers a thread at D 256, where the plain kernel spills)
    dq_split: int = 1
    # warp-specialized variant (kernels.attention_fa3_bwd_ws): a TMA producer warp, the 8 MMA warps, and a dQ
    # writer partition doing the atomics from shared memory. The fields below only matter with ws=True.
    ws: bool = False
    stages: int = 2  # Q/dO (and LSE/delta) ring depth
    dq_stages: int = 2  # float32 dQ tiles in shared memory between the MMA warps and the writer
    dq_warps: int = 2  # warps of the dQ writer (red.global.add.v4.f32)
    # dQ by TMA reduce-add (cp.reduce.async.bulk.tensor .add.f32, FA3's way): the writer is one warp that issues
    # one bulk reduction a step from a 128-byte-swizzled float32 tile, instead of dq_warps warps of red.v4
    dq_tma: bool = False
    # setmaxnreg of the producer warp and of the dQ writer. Both sit in one 4-warp group, which gets the larger of
    # the two; Triton gives the MMA warps 168 + (168 - that) / 2 rounded down to 8: 24 -> 240, 32 or 40 -> 232
    # (and at 232 ptxas serializes the causal loop's wgmmas for want of registers). Both fit 24 without spills.
    producer_regs: int = 24
    writer_regs: int = 24
    # (ws) dV and dK take P^T / dS^T from shared memory (SS wgmma) instead of registers: at BLOCK_N 64 the two
    # warpgroups sit side by side along the queries, so the register operand is a cross-warpgroup layout conversion
    ss_dkv: bool = False
    # (ws) dO in one buffer of its own, freed in the middle of a step (after dV), instead of a slot of the Q ring
    # (FA3's Stages_dO = 1 at D 256): 32 KB at D 256 for more or larger dQ pieces
    do_single: bool = False
    # (ws) LSE and delta read from shared memory right after the step's S^T / dP^T wgmmas are issued, not after
    # each one's wait (session 22's ncu: the exp2's FFMA waiting on the LSE load, 5 % of the MMA warps' samples)
    early_stats: bool = False
    # (ws, one dQ piece, dO in the ring, dq_stages == stages) one CTA barrier and one mbarrier arrive at the end of
    # a step instead of two of each: the dQ tile is stored, dK's wgmma waited, then one barrier, and empty[slot]'s
    # arrive frees the Q/dO slot for the producer and hands the dQ tile to the writer (which waits on it in place
    # of dq_full). Triton's membar pass puts a CTA barrier after every mbarrier arrive (it counts as a write to
    # all of shared memory), so two arrives cost two barriers; one saves a bar.sync a step. The writer gets the
    # tile a dK wgmma later.
    one_end_bar: bool = False

    def warps(self, rows: int) -> tuple[int, int]:
        """(warps along M, along N) of an accumulator with `rows` rows on 8 warps: wgmma puts 4 warps
        (16 rows each) of a warpgroup along M, so 64 rows take the two warpgroups side by side along N."""
        wm = min(NUM_WARPS, rows // 16)
        return wm, NUM_WARPS // wm


# The single-partition kernel's best tiles (the fallback; FA3BwdConfig(ws=False) everywhere).
PLAIN_CONFIGS = {64: FA3BwdConfig(block_n=128, block_m=128), 128: FA3BwdConfig(block_n=128, block_m=64),
                 256: FA3BwdConfig(block_n=64, block_m=64)}
# Defaults (H200, benchmarks/results/attention-fa3-bwd-sweep-tma-h200.json and -q4-h200.json, 2026-12-02, TFLOP/s
# at 1k / 16k): the warp-specialized kernel with the TMA reduce-add dQ writer everywhere. d128 402 / 531-545
# non-causal, 285 / 531-537 causal (the red.v4 writer's 309 / 395-400 and 229 / 396-399); d64 315 / 427 and 230 /
# 419 (274 / 352 and 207 / 356); d256, where only one 16 KB dQ piece fits in shared memory, dQ in four 64-column
# pieces: 253 / 310 and 197 / 312 (the single-partition kernel: 207 / 249 and 168 / 245; with dQ in two pieces,
# no spills, 237 / 278-290 and 192 / 293).
DQ_TMA_WS = dict(ws=True, dq_tma=True, dq_warps=1)
DEFAULT_CONFIGS = {# FA3's D 64 tile, 128 x 128 (session 26, attention-fa3-bwd-sweep-m128-h200.json: +10-12 % over
                   # 128 x 64 with three stages at every cell, 1k-16k full and causal; 16k 477 / 469)
                   64: FA3BwdConfig(block_n=128, block_m=128, stages=2, dq_stages=2, **DQ_TMA_WS),
                   128: FA3BwdConfig(block_n=128, block_m=64, stages=2, dq_stages=2, **DQ_TMA_WS),
                   # P^T / dS^T read by wgmma from shared memory (attention-fa3-bwd-sweep-ss-h200.json, session 25:
                   # 1.9-2.9 % faster than the register-A q4 at every cell, 1k-16k full and causal), and dO in one
                   # buffer whose 32 KB give dQ's four pieces three slots (-do1-h200.json: +15-23 % over that)
                   256: FA3BwdConfig(block_n=64, block_m=64, stages=2, dq_stages=3, dq_split=4, ss_dkv=True,
                                     do_single=True, **DQ_TMA_WS)}
TUNING_CONFIGS = {
    64: {"n128_m128": PLAIN_CONFIGS[64], "n128_m64": FA3BwdConfig(block_n=128, block_m=64),
         "n128_m64_ws_s3": FA3BwdConfig(block_n=128, block_m=64, ws=True, stages=3, dq_stages=2),
         # the default of sessions 22-25
         "n128_m64_ws_s3_tma": FA3BwdConfig(block_n=128, block_m=64, stages=3, dq_stages=2, **DQ_TMA_WS),
         # more dQ slots (session 25, -dq-slots-h200.json): +1-1.5 % at 1k-4k, -1 % at 16k; not the default
         "n128_m64_ws_s3_tma_d3": FA3BwdConfig(block_n=128, block_m=64, stages=3, dq_stages=3, **DQ_TMA_WS),
         "n128_m64_ws_s3_tma_d4": FA3BwdConfig(block_n=128, block_m=64, stages=3, dq_stages=4, **DQ_TMA_WS),
         # FA3's D 64 tile (128 x 128): twice the queries a step, half the steps and their barriers for the same
         # work; 199 KB. Spills 20 / 44 B (full / causal), all outside the key loop (once a program). The default
         # since session 26 (+10-12 %, -m128-h200.json)
         "n128_m128_ws_tma": DEFAULT_CONFIGS[64],
         # session 26: one end-of-step barrier and arrive instead of two (3 bar.sync a step, not 4; the same spills,
         # none in the loop); measured 1-4 % slower (bwd26b). (early_stats spills 52 B here, 3 in the loop)
         "n128_m128_ws_tma_1b": replace(DEFAULT_CONFIGS[64], one_end_bar=True)},
    128: {"n128_m64": PLAIN_CONFIGS[128], "n128_m64_atom": FA3BwdConfig(block_n=128, block_m=64, red_v2=False),
          "n64_m128": FA3BwdConfig(block_n=64, block_m=128),
          # warp-specialized: 2 or 3 Q/dO stages, 2 or 1 dQ tiles (the same speed on the H200)
          "n128_m64_ws": FA3BwdConfig(block_n=128, block_m=64, ws=True, stages=2, dq_stages=2),
          "n128_m64_ws_s3": FA3BwdConfig(block_n=128, block_m=64, ws=True, stages=3, dq_stages=1),
          # dQ by TMA reduce-add from a one-warp writer (ncu, 2026-12-02: the red.v4 writer is the bottleneck)
          "n128_m64_ws_tma": DEFAULT_CONFIGS[128],
          "n128_m64_ws_s3_tma": FA3BwdConfig(block_n=128, block_m=64, stages=3, dq_stages=1, **DQ_TMA_WS),
          "n128_m64_ws_s3_tma_q2": FA3BwdConfig(block_n=128, block_m=64, stages=3, dq_stages=2, dq_split=2,
                                                **DQ_TMA_WS),
          # more dQ slots (session 25, after D 256's do1_d3; -dq-slots-h200.json: 3-9 % slower): four half
          # tiles in the two whole tiles' 64 KB. (dO single-buffered spills 36-72 B in the MMA warps at D 128, one
          # dQ slot or three: their 240 registers hold S^T and dP^T of 128 keys; so no third whole tile here)
          "n128_m64_ws_tma_q2_d4": replace(DEFAULT_CONFIGS[128], dq_split=2, dq_stages=4),
          # session 26: the LSE load under the S^T / dP^T wgmmas (its 8 LDS before the wait, not after; no spills),
          # one end-of-step barrier and arrive (3 bar.sync a step), both; measured 1-7 % slower (bwd26b), opt-in
          "n128_m64_ws_tma_es": replace(DEFAULT_CONFIGS[128], early_stats=True),
          "n128_m64_ws_tma_1b": replace(DEFAULT_CONFIGS[128], one_end_bar=True),
          "n128_m64_ws_tma_es_1b": replace(DEFAULT_CONFIGS[128], early_stats=True, one_end_bar=True)},
    256: {"n64_m64": PLAIN_CONFIGS[256], "n64_m64_atom": FA3BwdConfig(block_n=64, block_m=64, red_v2=False),
          "n64_m64_split": FA3BwdConfig(block_n=64, block_m=64, dq_split=2),  # no spills (the others: ~100 B)
          # warp-specialized at D 256: fits only with one 64-column float32 dQ piece in shared memory (16 KB),
          # four pieces a step through the TMA writer
          "n64_m64_ws_tma_q4": FA3BwdConfig(block_n=64, block_m=64, stages=2, dq_stages=1, dq_split=4, **DQ_TMA_WS),
          # ncu (2026-12-03, docs/attention_fa3.md session 23): with one 16 KB dQ slot the MMA warps wait for the
          # writer's TMA to read each of the four pieces before storing the next (~18 % of their stall samples on
          # those waits, tensor pipe 33 %). Eight 32-column pieces through two 8 KB slots (the same 226 KB of shared
          # memory): a piece is stored while the previous one is reduced. Correct, but 1-2 % slower (session 24,
          # attention-fa3-bwd-sweep-q8-h200.json): halving the piece doubles the round trips
          "n64_m64_ws_tma_q8_d2": FA3BwdConfig(block_n=64, block_m=64, stages=2, dq_stages=2, dq_split=8,
                                               **DQ_TMA_WS),
          # dV and dK read P^T / dS^T from shared memory (session 24; the default since session 25's sweep): the
          # warpgroups split the 64 queries of S^T, so the register A operand was a conversion through shared
          # memory with its barriers; SASS of the key loop: BAR 16 -> 10, LDS 16 -> 8 a step, 230,796 B of smem
          "n64_m64_ws_tma_q4_ss": replace(DEFAULT_CONFIGS[256], do_single=False, dq_stages=1),
          # dO in one buffer released after dV (do_single, session 25): the 32 KB go to dQ, as more slots for its
          # four pieces (the MMA warps stop waiting for each piece's TMA read) or two 128-column pieces (half the
          # round trips, N = 64 a warpgroup in dQ's wgmma). Sweep (-do1-h200.json), 16k full / causal TFLOP/s:
          # q4_ss 317 / 320, do1 311 / 310, do1_d2 361 / 368, do1_d3 365 / 380, q2_do1 331 / 346: the dQ slots
          # were the wait
          "n64_m64_ws_tma_q4_ss_do1": replace(DEFAULT_CONFIGS[256], dq_stages=1),
          "n64_m64_ws_tma_q4_ss_do1_d2": replace(DEFAULT_CONFIGS[256], dq_stages=2),
          "n64_m64_ws_tma_q4_ss_do1_d3": DEFAULT_CONFIGS[256],
          "n64_m64_ws_tma_q2_ss_do1": replace(DEFAULT_CONFIGS[256], dq_split=2, dq_stages=1)},
}


def smem_bytes(head_dim: int, cfg: FA3BwdConfig, elem: int = 2) -> int:
    """K, V tiles + a 2-slot Q/dO ring + the dS^T tile + barriers; ws: a `stages`-slot Q/dO ring with LSE/delta
    beside it, and `dq_stages` float32 dQ tiles (rows padded by 4 floats; swizzled and unpadded for dq_tma)."""
    if cfg.ws:
        dq_row = head_dim // cfg.dq_split if cfg.dq_tma else head_dim + 4
        # + up to 1 KB of alignment a swizzled buffer (K, V, Q, dO, dS^T, dQ): Triton's allocation measured
        # 0.3-4 KB above the sum (4 KB at D 256 with a 16 KB dQ piece), so the sum alone is no bound. With ss_dkv
        # (P^T's tile added) the register operands' layout-conversion scratch is gone: 340 B above the sum at D 256;
        # at block_n 128 the warpgroups split the keys and there is none either (308 B above the sum at D 128)
        slack = 1536 if cfg.ss_dkv or cfg.block_n != 64 else 6 * 1024
        st_tiles = 2 if cfg.ss_dkv else 1  # dS^T (and P^T)
        do_slots = 1 if cfg.do_single else cfg.stages
        return (elem * (2 * cfg.block_n * head_dim + (cfg.stages + do_slots) * cfg.block_m * head_dim
                        + st_tiles * cfg.block_n * cfg.block_m) + 4 * cfg.dq_stages * cfg.block_m * dq_row
                + 4 * 2 * cfg.stages * cfg.block_m + 8 * (3 + 2 * cfg.stages + 2 * cfg.dq_stages) + slack)
    return elem * (2 * cfg.block_n * head_dim + 4 * cfg.block_m * head_dim + cfg.block_n * cfg.block_m) + 8 * 3


def config_error(head_dim: int, cfg: FA3BwdConfig) -> str | None:
    if head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim} not in {HEAD_DIMS}"
    for name, v in (("block_n", cfg.block_n), ("block_m", cfg.block_m)):
        if v not in (64, 128):
            return f"{name} {v}: 64 or 128"
    if cfg.dq_split == 8 and cfg.ws and cfg.dq_tma:  # 32 float32 columns = one 128-byte swizzle row a TMA box
        if head_dim // 8 < 32:
            return f"dq_split 8: at least 32 columns a piece (head_dim {head_dim})"
    elif cfg.dq_split not in (1, 2, 4) or head_dim // cfg.dq_split < 64:
        return (f"dq_split {cfg.dq_split}: 1, 2 or 4, with at least 64 columns a piece (head_dim {head_dim}); 8 "
                "(32 columns) with ws and dq_tma")
    if cfg.ws:
        if not 2 <= cfg.stages <= 4 or not 1 <= cfg.dq_stages <= 6 or cfg.dq_warps not in (1, 2):
            return (f"ws: stages {cfg.stages} in 2..4, dq_stages {cfg.dq_stages} 1..6, "
                    f"dq_warps {cfg.dq_warps} 1 or 2")
        if not cfg.red_v2:
            return "ws: the dQ writer always uses red.global.add.v4.f32 (red_v2=False is the plain kernel's)"
        if cfg.dq_split != 1 and not cfg.dq_tma:
            return "ws: dq_split needs dq_tma (the red.v4 writer takes whole dQ tiles)"
        if cfg.ss_dkv and cfg.block_n != 64:
            return (f"ss_dkv: for block_n 64 (warpgroups side by side along the queries); at block_n {cfg.block_n} "
                    "the register operand needs no exchange between warpgroups")
        if cfg.dq_tma and cfg.dq_warps != 1:
            return f"ws: dq_tma's writer is one warp (one bulk reduction a step): dq_warps {cfg.dq_warps} must be 1"
        if cfg.one_end_bar and (cfg.dq_split != 1 or cfg.do_single or cfg.dq_stages != cfg.stages):
            return ("one_end_bar: for one dQ piece a step (dq_split 1), dO in the Q ring (do_single False) and as "
                    f"many dQ slots as Q/dO stages (dq_stages {cfg.dq_stages}, stages {cfg.stages})")
    elif cfg.dq_tma or cfg.ss_dkv or cfg.do_single or cfg.early_stats or cfg.one_end_bar:
        name = next(n for n in ("dq_tma", "ss_dkv", "do_single", "early_stats", "one_end_bar") if getattr(cfg, n))
        return f"{name} is the warp-specialized kernel's: it needs ws=True"
    if smem_bytes(head_dim, cfg) > SMEM_LIMIT:
        return f"{smem_bytes(head_dim, cfg)} B of shared memory > {SMEM_LIMIT}"
    return None
