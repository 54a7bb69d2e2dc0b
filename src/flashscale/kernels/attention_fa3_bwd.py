"""FlashAttention-3-style backward for Hopper (sm_90) in Gluon: TMA, mbarriers, wgmma, P and dS from registers.

Same semantics as the FA2 backward (kernels.attention_bwd) for the dense layout without extras:
q, o, do (B, Sq, H, D), k, v (B, Sk, Hkv, D), H % Hkv == 0, lse (B, H, Sq) natural log (-inf: a row that sees
no key), causal aligned bottom-right (query i sees key n iff n <= i + Sk - Sq). Returns dq, dk, dv.

    delta_i = rowsum(dO_i * O_i)              (pre-pass)
    S^T = K Q^T      P^T = exp(S^T - LSE)      dP^T = V dO^T      dS^T = P^T * (dP^T - delta)
    dV += P^T dO     dK += dS^T Q             dQ += dS K          (dK, dQ times the softmax scale)

One program = one BLOCK_N block of keys of one (batch, K/V head) (FA2/FA3's outer loop over K/V): its K and V
tiles are TMA-loaded into shared memory once, dK and dV accumulate in registers while the program walks the
query blocks of every query head of its GQA group (so dK/dV are summed over the group in a fixed order, no
atomics, no K/V copies). Q and dO tiles stream through a two-slot TMA ring, the next step's tiles loading
while this step computes. Everything runs in transposed form (FA3): keys are the M dimension of S^T and dP^T,
so P^T and dS^T, converted to 16 bits, stay in registers as the A operand of the dV and dK wgmmas (RS-GEMM);
dS^T also goes to shared memory once, read transposed as the A operand of dQ = dS K. dQ is a float32
(B, Sq, H, D) buffer that every key block adds its share into with atomics (FA2/FA3's choice); the wrapper
scales and casts it at the end.

S^T and dP^T are issued together (async): the exp2 of P^T runs while dP^T is still on the tensor cores.

Masking: the TMA boxes are bounded by the batch's sequence ((B, S, heads * D) descriptors), so rows past Sq
or Sk read as zeros: a key past Sk has K = V = 0 and adds nothing to dQ (its dK/dV rows are clipped by the TMA
store), a query past Sq gets LSE = +inf (P = 0). Rows whose forward LSE is -inf (no visible key) also get
+inf. The causal mask is applied only in the query blocks that cross the diagonal of this key block.

Shapes: B batch, S sequence, H query heads, G = H // Hkv, D head dim (64, 128 or 256).
One partition of 8 warps (two warpgroups): accumulators of BLOCK_N rows put a warpgroup on each 64-row half
(BLOCK_N = 128) or on each half of the columns (BLOCK_N = 64); see _warps.

FA3BwdConfig(ws=True) runs the warp-specialized variant instead (kernels.attention_fa3_bwd_ws): the same math
in the same 8 warps, with a TMA producer warp (Q/dO ring of `stages`, LSE/delta) and a dQ writer partition
that takes dQ from shared memory and adds it into the float32 buffer: by one TMA reduce-add a step
(dq_tma=True, the default; FA3's way), or by red.global.add.v4 from dq_warps warps.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = hasattr(gl, "warp_specialize")
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False

from flashscale.kernels.attention_bwd import bwd_delta, scale_cast
from flashscale.kernels import launch as L
from flashscale.kernels.attention_fa3 import HEAD_DIMS, LOG2E, SMEM_LIMIT, tile_layout, unsupported  # noqa: F401
from flashscale.kernels.attention_tune import tma_ready

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


if HAS_GLUON:

    @gluon.jit
    def _kv_block(H, seqlen_q, seqlen_k, GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  CAUSAL: gl.constexpr):
        """This program's key block and its work: batch b, K/V head hk, first key n0, off = Sk - Sq, query blocks
        [m_lo, n_m) (n_mb of them, for each of the GROUP query heads: n_steps), [m_lo, m_full) crossing the
        diagonal. Shared by the plain and the warp-specialized kernels."""
        pid_n = gl.program_id(0)
        bh = gl.program_id(1)
        Hkv = H // GROUP
        b = bh // Hkv
        hk = bh % Hkv
        n0 = pid_n * BLOCK_N
        off = seqlen_k - seqlen_q
        n_m = (seqlen_q + BLOCK_M - 1) // BLOCK_M
        if CAUSAL:  # query blocks from the first one with a row that sees key n0 (i >= n0 - off)
            m_lo = gl.minimum(gl.maximum(n0 - off, 0) // BLOCK_M, n_m)
            # blocks [m_lo, m_full) cross the diagonal: some row sees some key of the block but not all
            m_full = gl.minimum(gl.maximum(n0 + BLOCK_N - 1 - off + BLOCK_M - 1, 0) // BLOCK_M, n_m)
        else:
            m_lo = 0
            m_full = 0
        n_mb = n_m - m_lo
        return b, hk, n0, off, m_lo, m_full, n_mb, GROUP * n_mb

    @gluon.jit
    def _issue_qdo(q_desc, do_desc, q_smem, do_smem, ready, step, n_mb, m_lo, b, hk, GROUP: gl.constexpr,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr):
        """TMA-load step `step`'s Q and dO tiles (query head hk * G + step // n_mb) into slot step % 2."""
        slot = step % 2
        h = hk * GROUP + step // n_mb
        m0 = (m_lo + step % n_mb) * BLOCK_M
        bar = ready.index(slot)
        mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, m0, h * HEAD_DIM], bar, q_smem.index(slot))
        tma.async_copy_global_to_shared(do_desc, [b, m0, h * HEAD_DIM], bar, do_smem.index(slot))

    @gluon.jit
    def _red_add_v2(ptrs, vals, mask):
        """*ptrs += vals with sm_90's vector reduction (red.global.add.v2.f32: two floats, one instruction, no
        value returned). Elements go in pairs as the thread holds them: a wgmma accumulator fragment keeps
        columns (2t, 2t + 1) of a row next to each other, so the first pointer of a pair addresses both."""
        m = gl.broadcast(mask, vals)[0].to(gl.int32)
        addr = ptrs.to(gl.int64, bitcast=True)
        return gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $6, 0; @p red.relaxed.gpu.global.add.v2.f32 [$2], {$4, $5}; "
            "mov.b32 $0, 0; mov.b32 $1, 0; }",
            "=r,=r,l,l,f,f,r,r", [addr, vals, m], dtype=gl.int32, is_pure=False, pack=2)

    @gluon.jit
    def _dq_add(ptrs, dq, mask, RED_V2: gl.constexpr):
        if RED_V2:
            _red_add_v2(ptrs, dq, mask)
        else:
            gl.atomic_add(ptrs, dq, mask=mask, sem="relaxed")

    @gluon.jit
    def _fa3_bwd_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, DELTA, DQ, stride_lb, stride_lh,
                        H, seqlen_q, seqlen_k, sm_scale, qk_scale, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                        KV_WM: gl.constexpr, DQ_WM: gl.constexpr, RED_V2: gl.constexpr, DQ_SPLIT: gl.constexpr,
                        num_warps: gl.constexpr):
        dtype: gl.constexpr = q_desc.dtype
        KV_WN: gl.constexpr = num_warps // KV_WM
        DQ_WN: gl.constexpr = num_warps // DQ_WM
        # accumulators: S^T / dP^T (BN, BM), dK / dV (BN, D), dQ (BM, D)
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[KV_WM, KV_WN],
                                                            instr_shape=[16, BLOCK_M // KV_WN, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[KV_WM, KV_WN],
                                                            instr_shape=[16, HEAD_DIM // KV_WN, 16])
        DQ_N: gl.constexpr = HEAD_DIM // DQ_SPLIT  # columns of one dQ piece
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[DQ_WM, DQ_WN],
                                                            instr_shape=[16, DQ_N // DQ_WN, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
        col_s: gl.constexpr = gl.SliceLayout(0, st_layout)  # a query's value, broadcast over the keys
        row_s: gl.constexpr = gl.SliceLayout(1, st_layout)

        b, hk, n0, off, m_lo, m_full, n_mb, n_steps = _kv_block(H, seqlen_q, seqlen_k, GROUP, BLOCK_M, BLOCK_N,
                                                                CAUSAL)

        k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
        q_smem = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [2] + do_desc.block_type.shape, do_desc.layout)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        mbarrier.init(ready.index(0), count=1)
        mbarrier.init(ready.index(1), count=1)

        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, n0, hk * HEAD_DIM], kv_bar, k_smem)
        tma.async_copy_global_to_shared(v_desc, [b, n0, hk * HEAD_DIM], kv_bar, v_smem)
        if n_steps > 0:
            _issue_qdo(q_desc, do_desc, q_smem, do_smem, ready, 0, n_mb, m_lo, b, hk, GROUP, HEAD_DIM, BLOCK_M)

        k = k_smem.reshape([BLOCK_N, HEAD_DIM])
        v = v_smem.reshape([BLOCK_N, HEAD_DIM])
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        keys = n0 + gl.arange(0, BLOCK_N, layout=row_s)
        qcols = gl.arange(0, BLOCK_M, layout=col_s)
        dq_rows0 = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
        dq_cols = gl.arange(0, DQ_N, layout=gl.SliceLayout(0, dq_layout))
        mbarrier.wait(kv_bar, 0)

        for step in range(n_steps):
            # both warpgroups are done with step - 1 (its wgmmas read the slot refilled now, and dS^T)
            gl.thread_barrier()
            if step + 1 < n_steps:
                _issue_qdo(q_desc, do_desc, q_smem, do_smem, ready, step + 1, n_mb, m_lo, b, hk, GROUP, HEAD_DIM,
                           BLOCK_M)
            slot = step % 2
            h = hk * GROUP + step // n_mb
            dq_base = DQ + (b.to(gl.int64) * seqlen_q * H + h) * HEAD_DIM  # int32 offsets: Sq * H * D < 2^31
            mb = m_lo + step % n_mb
            m0 = mb * BLOCK_M
            rows_q = m0 + qcols
            stat = b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh + rows_q
            lse = gl.load(LSE + stat, mask=rows_q < seqlen_q, other=float("inf"))
            lse = gl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
            delta = gl.load(DELTA + stat, mask=rows_q < seqlen_q, other=0.0)

            mbarrier.wait(ready.index(slot), (step // 2) & 1)
            q = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
            do = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
            tok_s = warpgroup_mma(k, q.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout),
                                  use_acc=False, is_async=True)
            tok_dp = warpgroup_mma(v, do.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout),
                                   use_acc=False, is_async=True)
            st = warpgroup_mma_wait(1, deps=(tok_s, ))
            pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
            if CAUSAL:
                if mb < m_full:  # uniform branch: only blocks crossing the diagonal pay for the mask
                    vis = gl.expand_dims(keys, 1) <= gl.expand_dims(rows_q, 0) + off
                    pt = gl.where(vis, pt, 0.0)
            dpt = warpgroup_mma_wait(0, deps=(tok_dp, ))
            tok_dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), do, dv, is_async=True)
            dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)
            ds_smem.store(dst)
            fence_async_shared()
            gl.thread_barrier()  # every warp's rows of dS^T are in shared memory before the dQ wgmma reads them
            dq_zero = gl.zeros([BLOCK_M, DQ_N], gl.float32, layout=dq_layout)
            tok_dq = warpgroup_mma(ds_smem.permute((1, 0)), k.slice(0, DQ_N, dim=1), dq_zero, use_acc=False,
                                   is_async=True)
            tok_dk = warpgroup_mma(gl.convert_layout(dst, a_layout), q, dk, is_async=True)
            # wgmma groups retire in issue order: dV and dQ are done, dK still runs under the atomics
            dv = warpgroup_mma_wait(2, deps=(tok_dv, ))
            dq = warpgroup_mma_wait(1, deps=(tok_dq, ))
            # dQ into the float32 buffer straight from the accumulator fragment; rows past Sq dropped
            dq_rows = m0 + dq_rows0
            dq_off = gl.expand_dims(dq_rows * (H * HEAD_DIM), 1) + gl.expand_dims(dq_cols, 0)
            dq_mask = gl.expand_dims(dq_rows < seqlen_q, 1)
            _dq_add(dq_base + dq_off, dq, dq_mask, RED_V2)
            for piece in gl.static_range(1, DQ_SPLIT):  # the next columns, while dK runs
                tok_dq = warpgroup_mma(ds_smem.permute((1, 0)), k.slice(piece * DQ_N, DQ_N, dim=1), dq_zero,
                                       use_acc=False, is_async=True)
                dq = warpgroup_mma_wait(0, deps=(tok_dq, ))
                _dq_add(dq_base + piece * DQ_N + dq_off, dq, dq_mask, RED_V2)
            dk = warpgroup_mma_wait(0, deps=(tok_dk, ))

        # epilogue: dK (times the scale) and dV through the dead K/V tiles, TMA-stored (clipped past Sk)
        gl.thread_barrier()
        k_smem.reshape([BLOCK_N, HEAD_DIM]).store((dk * sm_scale).to(dtype))
        v_smem.reshape([BLOCK_N, HEAD_DIM]).store(dv.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(dk_desc, [b, n0, hk * HEAD_DIM], k_smem)
        tma.async_copy_shared_to_global(dv_desc, [b, n0, hk * HEAD_DIM], v_smem)
        tma.store_wait(pendings=0)


def unsupported_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why attention_fa3_bwd cannot take these inputs (non-contiguous ones are copied), or None."""
    why = unsupported(q, k, v, need_contiguous=False)
    if why is None and q.shape[1] * q.shape[2] * q.shape[3] >= 2 ** 31:
        why = f"Sq * H * D = {q.shape[1] * q.shape[2] * q.shape[3]}: dQ offsets are int32 (< 2^31)"
    return why


def _bwd_unsupported(q, k, v, o, do, lse) -> str | None:
    why = unsupported_bwd(q, k, v)
    if why is not None:
        return why
    if o.shape != q.shape or do.shape != q.shape or o.dtype != q.dtype or do.dtype != q.dtype:
        return f"o and do must be like q {tuple(q.shape)} {q.dtype}"
    if lse.shape != (q.shape[0], q.shape[2], q.shape[1]) or lse.dtype != torch.float32:
        return f"lse must be float32 (B, H, Sq) = {(q.shape[0], q.shape[2], q.shape[1])}, got {tuple(lse.shape)}"
    return None


def attention_fa3_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                      lse: torch.Tensor, *, causal: bool = False, softmax_scale: float | None = None,
                      config: FA3BwdConfig | None = None, delta: torch.Tensor | None = None):
    """(dq, dk, dv) of attention_fa3_fwd / the FA2 forward for the incoming do (see the module docstring).
    delta: rowsum(do * o), float32 (B, H, Sq), if the caller already has it."""
    why = _bwd_unsupported(q, k, v, o, do, lse)
    if why is not None:
        raise ValueError(f"attention_fa3_bwd: {why}")
    # TMA reads from 16-byte aligned bases (unsupported_bwd checked q, k, v): a misaligned view of o / dO is copied
    q, k, v, o, do = (tma_ready(t) for t in (q, k, v, o, do))
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if B == 0 or Sq == 0 or H == 0 or Sk == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    scale = softmax_scale if softmax_scale is not None else D ** -0.5
    cfg = config or DEFAULT_CONFIGS[D]
    bad = config_error(D, cfg)
    if bad is not None:
        raise ValueError(f"attention_fa3_bwd: {cfg}: {bad}")
    delta = (bwd_delta(o, do, lse) if delta is None else delta).contiguous()
    lse = lse.contiguous()
    dq32 = torch.zeros((B, Sq, H, D), device=q.device, dtype=torch.float32)
    q_lay, kv_lay = tile_layout(cfg.block_m, D, q.dtype), tile_layout(cfg.block_n, D, q.dtype)

    # with the backward's launch cache on (launch.BWD_ENABLED), unchecked construction: _bwd_unsupported checked
    # the inputs (and o / dO were realigned above); otherwise the checked one, as before session 26
    make = functools.partial(L.tensor_desc, TensorDescriptor) if L.BWD_ENABLED else TensorDescriptor

    def desc(t, S, heads, rows, lay, cols=D):
        return make(t, [B, S, heads * D], [S * heads * D, heads * D, 1], [1, rows, cols], lay)

    dq_n = D // cfg.dq_split  # dq_tma: the float32 dQ buffer's TMA boxes, one dQ piece wide
    grid = (triton.cdiv(Sk, cfg.block_n), B * Hkv)
    args = (desc(q, Sq, H, cfg.block_m, q_lay), desc(k, Sk, Hkv, cfg.block_n, kv_lay),
            desc(v, Sk, Hkv, cfg.block_n, kv_lay), desc(do, Sq, H, cfg.block_m, q_lay),
            desc(dk, Sk, Hkv, cfg.block_n, kv_lay), desc(dv, Sk, Hkv, cfg.block_n, kv_lay), lse, delta,
            desc(dq32, Sq, H, cfg.block_m, tile_layout(cfg.block_m, dq_n, torch.float32), dq_n) if cfg.dq_tma
            else dq32, lse.stride(0), lse.stride(1), H, Sq, Sk, float(scale), float(scale) * LOG2E)
    key = (cfg, D, H // Hkv, bool(causal), q.dtype)  # what fixes the constexprs and the descriptors' boxes
    L.launch(_kernel(cfg), grid, args, _constexprs(D, H // Hkv, bool(causal), cfg), key, bwd=True)
    return scale_cast(dq32, scale, q.dtype), dk, dv


def _kernel(cfg: FA3BwdConfig):
    if cfg.ws:
        from flashscale.kernels.attention_fa3_bwd_ws import _fa3_bwd_ws_kernel

        return _fa3_bwd_ws_kernel
    return _fa3_bwd_kernel


def _constexprs(head_dim: int, group: int, causal: bool, cfg: FA3BwdConfig) -> dict:
    c = {"GROUP": group, "HEAD_DIM": head_dim, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "CAUSAL": causal,
         "KV_WM": cfg.warps(cfg.block_n)[0], "DQ_WM": cfg.warps(cfg.block_m)[0]}
    if cfg.ws:
        c.update({"STAGES": cfg.stages, "DQ_STAGES": cfg.dq_stages, "DQ_WARPS": cfg.dq_warps, "DQ_TMA": cfg.dq_tma,
                  "DQ_SPLIT": cfg.dq_split, "SS_DKV": cfg.ss_dkv, "DO_SINGLE": cfg.do_single,
                  "EARLY_STATS": cfg.early_stats, "ONE_END_BAR": cfg.one_end_bar,
                  "PRODUCER_REGS": cfg.producer_regs, "WRITER_REGS": cfg.writer_regs})
    else:
        c["RED_V2"] = cfg.red_v2
        c["DQ_SPLIT"] = cfg.dq_split
    c["num_warps"] = NUM_WARPS
    return c


def compile_sm90(head_dim: int, causal: bool, *, group: int = 1, dtype: torch.dtype = torch.bfloat16,
                 config: FA3BwdConfig | None = None):
    """Ahead-of-time compile for sm_90 (no GPU needed): triton's CompiledKernel, for tests and tools."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = config or DEFAULT_CONFIGS[head_dim]
    bad = config_error(head_dim, cfg)
    if bad is not None:
        raise ValueError(f"compile_sm90: {cfg}: {bad}")
    ty = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]

    def desc(rows, t=ty, dt=dtype, cols=head_dim):
        return f"tensordesc<{t}[1,{rows},{cols}],{tile_layout(rows, cols, dt)!r}>"

    signature = {"q_desc": desc(cfg.block_m), "k_desc": desc(cfg.block_n), "v_desc": desc(cfg.block_n),
                 "do_desc": desc(cfg.block_m), "dk_desc": desc(cfg.block_n), "dv_desc": desc(cfg.block_n),
                 "LSE": "*fp32", "DELTA": "*fp32",
                 "DQ": desc(cfg.block_m, "fp32", torch.float32, head_dim // cfg.dq_split) if cfg.dq_tma else "*fp32",
                 "stride_lb": "i32", "stride_lh": "i32", "H": "i32",
                 "seqlen_q": "i32", "seqlen_k": "i32", "sm_scale": "fp32", "qk_scale": "fp32"}
    constexprs = _constexprs(head_dim, group, bool(causal), cfg)
    signature.update({name: "constexpr" for name in constexprs})
    src = GluonASTSource(fn=_kernel(cfg), signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS})
