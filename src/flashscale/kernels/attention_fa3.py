"""FlashAttention-3-style forward for Hopper (sm_90) in Gluon: TMA, mbarriers, warp specialization, wgmma.

Same semantics as flashscale.reference.attention (no extras): q (B, Sq, H, D), k/v (B, Sk, Hkv, D) with
H % Hkv == 0, out like q, lse (B, H, Sq) float32 in natural log; causal aligned bottom-right (query i sees
key j iff j <= i + Sk - Sq); rows that see no key give out = 0, lse = -inf. Varlen (flash-attn's packed
layout, ping-pong path only): q (Tq, H, D), k/v (Tk, Hkv, D), int32 cu_seqlens_q/k (B + 1,), out like q,
lse (H, Tq); every sequence with its own Sq, Sk (causal bottom-right in each), see "Varlen" below.

One program = one (BLOCK_M, D) query tile of one (batch, head) (or, persistent, a list of tiles in snake order).
Ping-pong tiles run in head groups of about one wave (head_group), heaviest first within a group.
Two consumer layouts (FA3Config.pingpong):
  * ping-pong (default): CONSUMERS (2 or 3) separate 4-warp partitions, consumer c owning rows
    [c * SUB_M, (c + 1) * SUB_M) of the tile (SUB_M = BLOCK_M / CONSUMERS, its own Q box and output box),
    all reading the same K/V ring, and taking turns on the tensor cores (FA3 section 3.1): while one
    warpgroup's wgmmas run, the other does its softmax. Consumer 0 is the default partition.
  * cooperative (pingpong=False, the first version): one 4 * CONSUMERS-warp partition whose warpgroups
    work in lock-step (every barrier release is a bar.sync of all of them).
  * producer, 1 warp, few registers: TMA-loads Q, then K and V tiles into a STAGES-deep ring in shared
    memory. Each slot has four mbarriers: k_ready/v_ready (TMA transaction bytes landed) and
    k_empty/v_empty (the consumers finished reading it). K and V have their own barriers so the next K can
    land while the current V is still being multiplied.
  * consumers: S = Q K^T and O += P V on warpgroup MMA (wgmma, operands from shared memory; P from
    registers, FA3's RS-GEMM), online softmax in exp2 with the scale folded in, the division by the row
    sum l once at the end (FA2).
  * OVERLAP (FA3's intra-warpgroup pipelining): S_{j+1} = Q K_{j+1}^T is issued (async) before the
    softmax of block j runs, so the tensor cores work while the exp2/max/sum of the previous block run.

Masking: the TMA box is bounded by this batch's sequence (a 3-D descriptor (B, S, heads * D)), so rows
past Sq/Sk read as zeros and out-of-range output rows are clipped by the TMA store; scores of keys >= Sk
(and past the causal diagonal) are set to -inf only in the blocks that need it (j >= n_full).

Shapes: B batch, S sequence, H query heads, G = H // Hkv, D head dim (64, 128 or 256).

Barrier protocol. An mbarrier's m-th phase completion (m = 0, 1, ...) is waited with parity m & 1; a
fresh barrier passes a wait on parity 1 at once. No waiter below can fall two completions behind.
  * Ring: K/V block number idx (counted across all tiles of the program) uses slot idx % STAGES and is the
    (idx // STAGES)-th completion of k_ready/v_ready[slot] (count 1: the producer's expect-tx arrive +
    the TMA bytes). k_empty/v_empty[slot] have count N = the number of consumer partitions (CONSUMERS
    with ping-pong, 1 for the cooperative partition): every consumer arrives once per block after its
    wgmma reading the slot retired. The producer waits "slot free" for block idx on parity
    ((idx // STAGES) & 1) ^ 1, i.e. the completion made by block idx - STAGES.
  * Q (ping-pong): q_ready[c] (count 1, expect-tx) completes once per tile; consumer c waits parity
    t & 1 for its t-th tile. q_empty[c] (count 1) is arrived by consumer c after the TMA store of its
    output (staged in its Q slice) has read shared memory; the producer waits parity (t & 1) ^ 1 before
    loading tile t's Q slice c (tile 0 passes on the fresh barrier). The producer loads the first K of a
    tile before waiting on q_empty, so it lands during the previous tile's epilogue.
  * Tensor-core turns (ping-pong): turn[c] (count 1). Consumer c's turn number t (counted across tiles)
    waits on turn[c], issues its wgmmas, and arrives on turn[(c + 1) % CONSUMERS] right after issuing
    them (before they finish). Consumer 0's turn t needs consumer CONSUMERS - 1's turn t - 1 (the
    (t-1)-th completion of turn[0]; t = 0 passes on the fresh barrier), consumer c > 0's turn t needs
    consumer c - 1's turn t (the t-th completion of turn[c]): parity (t & 1) ^ FIRST with FIRST = 1 for
    c = 0, else 0. With OVERLAP a turn is {S_j = Q K_j^T, O += P_{j-1} V_{j-1}} (one a block, so turn
    t = block idx; the last PV of a tile runs outside the turns, as in FA3); without, {S_j} and
    {O += P_j V_j} are two turns, 2 idx and 2 idx + 1. Every consumer takes the same turns for every
    tile (all see the same key blocks; a slice wholly past Sq computes on rows loaded from Sq - 1 and
    stores nothing), so the rotation never skews, and a tile with no visible key block takes none.

Varlen (_fa3_fwd_varlen_kernel: the same partitions and protocol, VARLEN=True). Tiles are (query block,
head, sequence) with each sequence's own lengths, in a compact list: sequence b has cdiv(len_q_b, BLOCK_M)
blocks, numbered after those of sequences 0..b-1, last block first; tile t is head t % H of compact block
t // H. Every partition maps its tile to (b, block) itself (_varlen_find: a prefix sum of the block counts
over cu_seqlens_q, 32 sequences a warp at a time). The one-tile-a-program grid is H times a host-side bound
on the block count (varlen_block_bound: no device sync); programs past the real count find no sequence and
do nothing (no partition touches a barrier). Persistent: the exact count (_varlen_total) bounds the loop.
Descriptors are the packed tensors as (1, T, heads * D) (the dense boxes and layouts), boxes at row
cu_seqlens[b] + block start; TMA bounds are the packed tensor's, so rows past a sequence's end hold the next
sequence's tokens: as keys they are masked (cols >= len_k, the ragged-block mask), as queries computed and
never stored. The epilogue TMA-stores a consumer's slice only when it lies wholly inside its sequence; a
slice the sequence ends in goes through shared memory to masked 16-byte stores of its rows < len_q, so no
tile writes another sequence's rows. lse (H, Tq) at [h, cu_seqlens_q[b] + row], as FA2's varlen forward.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from flashscale.kernels.attention_tune import capability, dummy_i32
from flashscale.kernels.launch import launch, tensor_desc

try:  # Gluon is experimental: absent from older Tritons, and its API moves between releases
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = hasattr(gl, "warp_specialize")
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False

LOG2E = 1.4426950408889634
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


if HAS_GLUON:

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                  b, m0, q_col, k_col, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, m0, q_col], q_bar, q_smem)
        for j in range(n_blocks):
            s = j % STAGES
            free = ((j // STAGES) & 1) ^ 1  # passes at once on the first round (fresh barrier)
            mbarrier.wait(k_empty.index(s), free)
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [b, j * BLOCK_N, k_col], k_ready.index(s), k_smem.index(s))
            mbarrier.wait(v_empty.index(s), free)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [b, j * BLOCK_N, k_col], v_ready.index(s), v_smem.index(s))

    # Row reductions with Gluon-jitted combiners: gl.max/gl.sum combine through @triton.jit helpers, which
    # become interpreter objects under TRITON_INTERPRET=1 (our CPU test setup) and then fail to compile.
    @gluon.jit
    def _max_combine(a, b):
        return gl.maximum(a, b)

    @gluon.jit
    def _sum_combine(a, b):
        return a + b

    @gluon.jit
    def _qk(q, k_smem, k_ready, j, zero_s, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """Issue S_j = Q K_j^T (async) once K_j has landed; returns the wgmma token."""
        s = j % STAGES
        mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
        kt = k_smem.index(s).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))  # (D, BN): K^T as a smem view
        return warpgroup_mma(q, kt, zero_s, use_acc=False, is_async=True)

    @gluon.jit
    def _pv(acc, p, alpha, v_smem, v_ready, j, row_o: gl.constexpr, p_layout: gl.constexpr, BLOCK_N: gl.constexpr,
            HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """Issue O = alpha O + P_j V_j (async, P from registers) once V_j has landed; returns the token."""
        s = j % STAGES
        mbarrier.wait(v_ready.index(s), (j // STAGES) & 1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        p16 = gl.convert_layout(p.to(v_smem.dtype), p_layout)
        v = v_smem.index(s).reshape([BLOCK_N, HEAD_DIM])
        return warpgroup_mma(p16, v, acc, is_async=True)

    @gluon.jit
    def _softmax(s, j, m_i, l_i, n_full, rows, cols0, seqlen_k, off, qk_scale, CAUSAL: gl.constexpr,
                 BLOCK_N: gl.constexpr, FOLD: gl.constexpr):
        """Online-softmax step on raw scores s (BM, BN) fp32 -> p (unnormalised), alpha, new m, new l (m in log2
        units: scores times qk_scale = softmax_scale * log2 e, which the launch requires > 0)."""
        if not FOLD:
            s = s * qk_scale  # log2 units
        if j >= n_full:  # ragged last block or the causal diagonal band: mask (uniform branch)
            cols = j * BLOCK_N + cols0
            vis = gl.expand_dims(cols, 0) < seqlen_k
            if CAUSAL:
                vis = vis & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + off)
            s = gl.where(vis, s, float("-inf"))
        row_max = gl.reduce(s, 1, _max_combine)
        if FOLD:
            # qk_scale > 0 and rounding is monotonic: rowmax(s) * qk_scale == rowmax(s * qk_scale), bit for bit;
            # the scale then folds into the subtraction below, one FFMA an element instead of FMUL + FADD (as the
            # FP8 kernel): 62 fewer instructions a key block (of ~620 / 665 at D 64 / 128; FA3Config.fold_scale)
            row_max = row_max * qk_scale
            s = s * qk_scale
        m_new = gl.maximum(m_i, row_max)
        # a row with nothing visible yet keeps m = -inf; subtract 0 there instead (no -inf - -inf NaN)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - gl.expand_dims(m_use, 1))
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.reduce(p, 1, _sum_combine)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _consumer(q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, o_desc, lse_ptr,
                  b, m0, q_col, n_blocks, n_full, seqlen_q, seqlen_k, qk_scale,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, FOLD: gl.constexpr, num_warps: gl.constexpr):
        dtype: gl.constexpr = q_smem.dtype
        # wgmma accumulators: warps stacked along M (64 rows a warpgroup), instruction N = the full tile
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        # P stays in registers as wgmma's A operand: S's accumulator fragment is already A's layout
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        off = seqlen_k - seqlen_q
        rows = m0 + gl.arange(0, BLOCK_M, layout=row_s)
        cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

        q = q_smem.reshape([BLOCK_M, HEAD_DIM])
        mbarrier.wait(q_bar, 0)
        if OVERLAP:
            if n_blocks > 0:
                tok = _qk(q, k_smem, k_ready, 0, zero_s, BLOCK_N, HEAD_DIM, STAGES)
                s = warpgroup_mma_wait(0, deps=(tok, ))
                mbarrier.arrive(k_empty.index(0), count=1)
                p, alpha, m_i, l_i = _softmax(s, 0, m_i, l_i, n_full, rows, cols0, seqlen_k, off, qk_scale,
                                              CAUSAL, BLOCK_N, FOLD)
                for j in range(1, n_blocks):
                    # tensor cores: S_j = Q K_j^T, then O += P_{j-1} V_{j-1}; CUDA cores meanwhile wait
                    # only for S_j and run its softmax while the PV product is still in flight
                    tok_s = _qk(q, k_smem, k_ready, j, zero_s, BLOCK_N, HEAD_DIM, STAGES)
                    tok_o = _pv(acc, p, alpha, v_smem, v_ready, j - 1, row_o, p_layout, BLOCK_N, HEAD_DIM, STAGES)
                    s = warpgroup_mma_wait(1, deps=(tok_s, ))  # wgmma groups retire in order: S_j done
                    mbarrier.arrive(k_empty.index(j % STAGES), count=1)
                    p, alpha, m_i, l_i = _softmax(s, j, m_i, l_i, n_full, rows, cols0, seqlen_k, off, qk_scale,
                                                  CAUSAL, BLOCK_N, FOLD)
                    acc = warpgroup_mma_wait(0, deps=(tok_o, ))
                    mbarrier.arrive(v_empty.index((j - 1) % STAGES), count=1)
                tok_o = _pv(acc, p, alpha, v_smem, v_ready, n_blocks - 1, row_o, p_layout, BLOCK_N, HEAD_DIM, STAGES)
                acc = warpgroup_mma_wait(0, deps=(tok_o, ))
                mbarrier.arrive(v_empty.index((n_blocks - 1) % STAGES), count=1)
        else:
            for j in range(n_blocks):
                st = j % STAGES
                tok = _qk(q, k_smem, k_ready, j, zero_s, BLOCK_N, HEAD_DIM, STAGES)
                s = warpgroup_mma_wait(0, deps=(tok, ))
                mbarrier.arrive(k_empty.index(st), count=1)
                p, alpha, m_i, l_i = _softmax(s, j, m_i, l_i, n_full, rows, cols0, seqlen_k, off, qk_scale,
                                              CAUSAL, BLOCK_N, FOLD)
                tok_o = _pv(acc, p, alpha, v_smem, v_ready, j, row_o, p_layout, BLOCK_N, HEAD_DIM, STAGES)
                acc = warpgroup_mma_wait(0, deps=(tok_o, ))
                mbarrier.arrive(v_empty.index(st), count=1)

        # Epilogue: one division by l per row; empty rows (l = 0) give 0 and lse = -inf.
        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
        gl.store(lse_ptr + rows, lse, mask=rows < seqlen_q)
        out = acc / gl.expand_dims(gl.convert_layout(l_safe, row_o), 1)
        # Q's tile is dead (every wgmma reading it has retired): it stages the output for the TMA store,
        # which clips rows past Sq.
        q.store(out.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [b, m0, q_col], q_smem)
        tma.store_wait(pendings=0)

    # ---- ping-pong path: one 4-warp partition per consumer warpgroup, optionally persistent -----------------

    @gluon.jit
    def _grouped_tile(tile, n_m, BH, HG):
        """Tile t -> ((batch, head) index, query block) in head groups of HG, heaviest first within a group
        (tile_order is this in Python)."""
        tg = HG * n_m  # tiles of a full group
        g = tile // tg
        r = tile - g * tg
        hg = gl.minimum(HG, BH - g * HG)  # heads of this group (the last one may have fewer)
        return g * HG + r % hg, n_m - 1 - r // hg

    @gluon.jit
    def _tile_info(tile, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   CAUSAL: gl.constexpr):
        """Tile t -> (b, h, K/V head, first query row, key blocks to visit). The (batch, head)s are taken HG
        at a time (head_group: about one wave of tiles a group, so the group's K/V is read from HBM once and
        from L2 by its other query tiles); within a group heaviest first: the last query tiles (the most keys
        under a causal mask) of its heads, then the next ones. HG = BH: one group, heaviest first globally."""
        bh, m_blk = _grouped_tile(tile, n_m, BH, HG)
        m0 = m_blk * BLOCK_M
        h = bh % H
        if CAUSAL:  # keys [0, hi) are visible to some row of the tile
            hi = gl.maximum(gl.minimum(seqlen_k, m0 + BLOCK_M + seqlen_k - seqlen_q), 0)
        else:
            hi = seqlen_k
        return bh // H, h, h // GROUP, m0, (hi + BLOCK_N - 1) // BLOCK_N

    @gluon.jit
    def _program_tiles(p, n_tiles, P):
        """Tiles of program p of P in the snake order of _snake_tile: R = n_tiles // P full rounds, and one of
        the rem = n_tiles % P tiles of the last round when the round's slot of p (p, or P - 1 - p in an odd
        round) is below rem. One-tile-a-program grids (P = n_tiles) give 1."""
        rounds = n_tiles // P
        rem = n_tiles - rounds * P
        slot = p + (rounds % 2) * (P - 1 - 2 * p)
        return rounds + (slot < rem).to(gl.int32)

    @gluon.jit
    def _snake_tile(k, p, P):
        """Program p's k-th tile: round k of P tiles, taken left to right in even rounds and right to left in
        odd ones, so the programs that drew a round's heaviest tiles draw the next round's lightest (the tile
        list runs heaviest first within a head group: round-robin would hand program 0 the heaviest causal
        tile of every round)."""
        return k * P + p + (k % 2) * (P - 1 - 2 * p)

    @gluon.jit
    def _pass_next_tile(next_smem, next_ready, next_free, k, tile, lay: gl.constexpr):
        """Dynamic scheduler, producer side: the tile after the program's k-th into slot k % 2 of next_smem,
        once every consumer has read what slot held two tiles before (next_free, count = consumers)."""
        slot = k % 2
        mbarrier.wait(next_free.index(slot), ((k // 2) & 1) ^ 1)  # a fresh barrier passes at once
        next_smem.index(slot).store(gl.full([1], tile, gl.int32, layout=lay))
        mbarrier.arrive(next_ready.index(slot), count=1)  # (Triton puts the warp's barrier before it)

    @gluon.jit
    def _take_next_tile(next_smem, next_ready, next_free, k, lay: gl.constexpr):
        """Dynamic scheduler, consumer side: the tile after the program's k-th, from the producer."""
        slot = k % 2
        mbarrier.wait(next_ready.index(slot), (k // 2) & 1)
        tile = gl.max(next_smem.index(slot).load(lay), 0)
        mbarrier.arrive(next_free.index(slot), count=1)
        return tile

    # ---- varlen (packed q (Tq, H, D), k/v (Tk, Hkv, D), int32 cu_seqlens): the compact tile list -----------
    # Sequence b has nb_b = cdiv(len_q_b, BLOCK_M) query blocks; they take the compact block numbers
    # [S_b, S_b + nb_b), S_b = nb_0 + ... + nb_{b-1}, last block first (heaviest under causal, as the dense
    # order). Tile t = (compact block t // H, head t % H). varlen_schedule() is this in Python (tested).

    @gluon.jit
    def _varlen_find(i, CU_Q, n_seq, BLOCK_M: gl.constexpr, WARPS: gl.constexpr):
        """Compact query block i -> (sequence b, its query block (last first), first token, length); b = n_seq
        when i is past the last block. A prefix sum of the block counts over 32 * WARPS sequences at a time
        (one a thread), from sequence 0, until the chunk that holds i (FA3's varlen scheduler does the same
        a warp at a time)."""
        CHUNK: gl.constexpr = 32 * WARPS
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        zero = i * 0
        base = zero  # blocks of the sequences before the chunk
        b = zero + n_seq
        m_blk = zero
        start = zero
        length = zero
        c0 = zero
        while c0 < n_seq:
            offs = c0 + gl.arange(0, CHUNK, layout=lay)
            inb = offs < n_seq
            lo = gl.load(CU_Q + offs, mask=inb, other=0)
            hi = gl.load(CU_Q + offs + 1, mask=inb, other=0)
            nb = (hi - lo + (BLOCK_M - 1)) // BLOCK_M  # 0 past n_seq and for empty sequences
            end = base + gl.associative_scan(nb, 0, _sum_combine)  # S_b + nb_b
            hit = (i < end) & (i >= end - nb)  # at most one lane (an empty sequence never hits)
            hb = gl.reduce(gl.where(hit, offs, -1), 0, _max_combine)
            if hb >= 0:
                b = hb
                m_blk = gl.reduce(gl.where(hit, end - 1 - i, 0), 0, _sum_combine)  # nb_b - 1 - (i - S_b)
                start = gl.reduce(gl.where(hit, lo, 0), 0, _sum_combine)
                length = gl.reduce(gl.where(hit, hi - lo, 0), 0, _sum_combine)
                c0 = zero + n_seq
            else:
                base = gl.reduce(gl.where(inb, end, 0), 0, _max_combine)
                c0 = c0 + CHUNK
        return b, m_blk, start, length

    @gluon.jit
    def _varlen_total(CU_Q, n_seq, BLOCK_M: gl.constexpr, WARPS: gl.constexpr):
        """Query blocks of all sequences, sum of cdiv(len_q_b, BLOCK_M) (the persistent grid's tile count / H)."""
        CHUNK: gl.constexpr = 32 * WARPS
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        total = n_seq * 0
        for c0 in range(0, n_seq, CHUNK):
            offs = c0 + gl.arange(0, CHUNK, layout=lay)
            inb = offs < n_seq
            lo = gl.load(CU_Q + offs, mask=inb, other=0)
            hi = gl.load(CU_Q + offs + 1, mask=inb, other=0)
            total += gl.reduce((hi - lo + (BLOCK_M - 1)) // BLOCK_M, 0, _sum_combine)
        return total

    @gluon.jit
    def _tile_info_varlen(tile, CU_Q, CU_K, n_seq, H, GROUP, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          CAUSAL: gl.constexpr, WARPS: gl.constexpr):
        """Tile t -> (valid, b, h, K/V head, first query row in the sequence, key blocks to visit, q start, len_q,
        k start, len_k): _tile_info with each sequence's own lengths (causal aligned bottom-right per sequence)."""
        h = tile % H
        b, m_blk, q_start, len_q = _varlen_find(tile // H, CU_Q, n_seq, BLOCK_M, WARPS)
        bk = gl.minimum(b, n_seq - 1)  # a tile past the end (b = n_seq) reads a valid entry; it does nothing
        k_start = gl.load(CU_K + bk)
        len_k = gl.load(CU_K + bk + 1) - k_start
        m0 = m_blk * BLOCK_M
        if CAUSAL:  # keys [0, hi) are visible to some row of the tile
            hi = gl.maximum(gl.minimum(len_k, m0 + BLOCK_M + len_k - len_q), 0)
        else:
            hi = len_k
        return b < n_seq, b, h, h // GROUP, m0, (hi + BLOCK_N - 1) // BLOCK_N, q_start, len_q, k_start, len_k

    @gluon.jit
    def _producer_pp_tile(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty,
                          v_ready, v_empty, it, t_i, qb, q_start, q_len, m0, k_start, h, hk, n_blocks,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
        """The producer's loads for one tile: Q box of batch qb at rows q_start + .., K/V boxes at rows
        k_start + j * BLOCK_N (dense: qb = b, starts 0; varlen: qb = 0, starts = the sequence's first token)."""
        SUB_M: gl.constexpr = BLOCK_M // CONSUMERS
        k_col = hk * HEAD_DIM
        if n_blocks > 0:
            s = it % STAGES
            mbarrier.wait(k_empty.index(s), ((it // STAGES) & 1) ^ 1)  # a fresh slot passes at once
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [qb, k_start, k_col], k_ready.index(s), k_smem.index(s))
        for c in gl.static_range(CONSUMERS):
            # completion t of q_empty[c]: consumer c stored tile t's output from its Q slice
            mbarrier.wait(q_empty.index(c), (t_i & 1) ^ 1)
            mbarrier.expect(q_ready.index(c), q_desc.block_type.nbytes)
            # a slice wholly past the sequence's end (last tile) loads rows from its last row instead: its rows are
            # never stored, and no box starts outside the tensor (partly outside is the usual ragged case)
            q_row = q_start + gl.minimum(m0 + c * SUB_M, q_len - 1)
            tma.async_copy_global_to_shared(q_desc, [qb, q_row, h * HEAD_DIM], q_ready.index(c), q_smem.index(c))
        for j in range(n_blocks):
            s = (it + j) % STAGES
            free = (((it + j) // STAGES) & 1) ^ 1
            if j > 0:
                mbarrier.wait(k_empty.index(s), free)
                mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(k_desc, [qb, k_start + j * BLOCK_N, k_col], k_ready.index(s),
                                                k_smem.index(s))
            mbarrier.wait(v_empty.index(s), free)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [qb, k_start + j * BLOCK_N, k_col], v_ready.index(s),
                                            v_smem.index(s))

    @gluon.jit
    def _producer_pp(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                     v_empty, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k,
                     HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr, CU_Q, CU_K, n_seq, VARLEN: gl.constexpr,
                     PERSISTENT: gl.constexpr, COUNTER, next_smem, next_ready, next_free):
        """TMA warp of the ping-pong path. Per tile: K of its first block (prefetched while the consumers
        still run the previous tile's epilogue), then each consumer's Q slice once that consumer has released
        it (q_empty), then the K/V blocks. Counters run on across tiles: `it` counts K/V blocks, `t_i` tiles.
        Varlen: a tile past the last query block (the one-tile-a-program grid is sized by a bound) loads
        nothing and counts nothing; the consumers skip it alike."""
        it = 0
        t_i = 0
        if PERSISTENT == 2:  # dynamic: tile0, then tile_step + the counter's next value, until past the last tile
            lay: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
            tile = tile0
            kt = 0
            while tile < n_tiles:
                it, t_i = _producer_pp_next(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                            k_empty, v_ready, v_empty, tile, it, t_i, n_m, BH, HG, H, GROUP, seqlen_q,
                                            seqlen_k, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, CU_Q,
                                            CU_K, n_seq, VARLEN)
                tile = tile_step + gl.atomic_add(COUNTER, 1)
                _pass_next_tile(next_smem, next_ready, next_free, kt, tile, lay)
                kt += 1
        elif PERSISTENT:  # the snake order of _snake_tile
            for kt in range(0, _program_tiles(tile0, n_tiles, tile_step)):
                it, t_i = _producer_pp_next(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                            k_empty, v_ready, v_empty, _snake_tile(kt, tile0, tile_step), it, t_i,
                                            n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, HEAD_DIM, BLOCK_M, BLOCK_N,
                                            STAGES, CONSUMERS, CAUSAL, CU_Q, CU_K, n_seq, VARLEN)
        else:  # one tile a program (the plain loop: the 24-register warp spills with the snake's arithmetic)
            for tile in range(tile0, n_tiles, tile_step):
                it, t_i = _producer_pp_next(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                            k_empty, v_ready, v_empty, tile, it, t_i, n_m, BH, HG, H, GROUP, seqlen_q,
                                            seqlen_k, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, CU_Q,
                                            CU_K, n_seq, VARLEN)

    @gluon.jit
    def _producer_pp_next(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty,
                          v_ready, v_empty, tile, it, t_i, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                          CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr, CU_Q, CU_K, n_seq, VARLEN: gl.constexpr):
        """The producer's loads of one tile; returns the counters (K/V blocks, tiles) after it."""
        if VARLEN:
            ok, b, h, hk, m0, n_blocks, q_start, len_q, k_start, len_k = _tile_info_varlen(
                tile, CU_Q, CU_K, n_seq, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL, 1)
            if ok:
                _producer_pp_tile(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                  k_empty, v_ready, v_empty, it, t_i, 0, q_start, len_q, m0, k_start, h, hk,
                                  n_blocks, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CONSUMERS)
                it += n_blocks
                t_i += 1
        else:
            b, h, hk, m0, n_blocks = _tile_info(tile, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N,
                                                CAUSAL)
            _producer_pp_tile(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                              k_empty, v_ready, v_empty, it, t_i, b, 0, seqlen_q, m0, 0, h, hk, n_blocks,
                              HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CONSUMERS)
            it += n_blocks
            t_i += 1
        return it, t_i

    @gluon.jit
    def _store_rows_masked(q, O, q_start, r0, len_q, H, h, HEAD_DIM: gl.constexpr, SUB_M: gl.constexpr):
        """Rows r0 + i < len_q of the output slice staged in shared memory (q, (SUB_M, D)) to O (Tq, H, D) at
        token q_start + r0 + i, head h: 8 contiguous elements (16 bytes) a thread, rows past len_q masked."""
        TPR: gl.constexpr = HEAD_DIM // 8  # threads along a row
        st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPR, TPR], [4, 1], [1, 0])
        vals = q.load(st_layout)  # Triton puts the partition's barrier between q.store and this load
        ri = gl.arange(0, SUB_M, layout=gl.SliceLayout(1, st_layout))
        ci = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, st_layout))
        row = (q_start + r0 + ri).to(gl.int64) * (H * HEAD_DIM) + h * HEAD_DIM
        ptrs = O + gl.expand_dims(row, 1) + gl.expand_dims(ci, 0)
        gl.store(ptrs, vals, mask=gl.expand_dims(r0 + ri < len_q, 1))

    @gluon.jit
    def _consumer_pp_tile(q_tile, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, my_turn,
                          next_turn, o_desc, LSE, stride_lb, stride_lh, tile, it, t_i, n_m, BH, HG, H, GROUP,
                          seqlen_q, seqlen_k, qk_scale, C: gl.constexpr, FIRST: gl.constexpr,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, SUB_M: gl.constexpr,
                          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
                          FOLD: gl.constexpr,
                          CU_Q, CU_K, n_seq, O, VARLEN: gl.constexpr):
        """One tile of ping-pong consumer C. `it` / `t_i`: K/V blocks and tiles before this one (phases run on
        across the tiles of a persistent program). Turns: one a block with OVERLAP, so the turn number of
        block j is it + j; two without (2 (it + j) and 2 (it + j) + 1, parities FIRST and FIRST ^ 1).
        Returns the updated it. Varlen: seqlen_q/k are the tile's sequence's lengths; a tile past the last
        query block (ok false) does nothing, as in the producer."""
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        q = q_tile.reshape([SUB_M, HEAD_DIM])
        zero_s = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=s_layout)
        cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        if VARLEN:
            ok, b, h, hk, m0, n_blocks, q_start, len_q, k_start, len_k = _tile_info_varlen(
                tile, CU_Q, CU_K, n_seq, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL, 4)
            it = gl.to_tensor(it)  # a constant 0 in the one-tile-a-program grid; a tensor on both branches
            if ok:
                it = _consumer_pp_work(q_tile, q, zero_s, cols0, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty,
                                       v_ready, v_empty, my_turn, next_turn, o_desc, LSE, stride_lb, stride_lh, it,
                                       t_i, b, h, m0, n_blocks, len_q, len_k, len_k - len_q, qk_scale, C, FIRST,
                                       HEAD_DIM, SUB_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, FOLD, q_start, O, H, True)
        else:
            off = seqlen_k - seqlen_q
            b, h, hk, m0, n_blocks = _tile_info(tile, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N,
                                                CAUSAL)
            it = _consumer_pp_work(q_tile, q, zero_s, cols0, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty,
                                   v_ready, v_empty, my_turn, next_turn, o_desc, LSE, stride_lb, stride_lh, it, t_i,
                                   b, h, m0, n_blocks, seqlen_q, seqlen_k, off, qk_scale, C, FIRST, HEAD_DIM, SUB_M,
                                   BLOCK_N, STAGES, CAUSAL, OVERLAP, FOLD, None, None, None, False)
        return it

    @gluon.jit
    def _consumer_pp_work(q_tile, q, zero_s, cols0, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                          v_empty, my_turn, next_turn, o_desc, LSE, stride_lb, stride_lh, it, t_i, b, h, m0, n_blocks,
                          seqlen_q, seqlen_k, off, qk_scale, C: gl.constexpr, FIRST: gl.constexpr,
                          HEAD_DIM: gl.constexpr, SUB_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                          CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, FOLD: gl.constexpr, q_start, O, H,
                          VARLEN: gl.constexpr):
        """The key loop and epilogue of one tile (see _consumer_pp_tile); off = seqlen_k - seqlen_q."""
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        dtype: gl.constexpr = q_tile.dtype
        r0 = m0 + C * SUB_M
        if CAUSAL:  # blocks [0, n_full) are visible to every row of this slice: no mask there
            n_full = gl.maximum(gl.minimum(seqlen_k, r0 + off + 1), 0) // BLOCK_N
        else:
            n_full = seqlen_k // BLOCK_N
        rows = r0 + gl.arange(0, SUB_M, layout=row_s)
        m_i = gl.full([SUB_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([SUB_M], gl.float32, layout=row_s)
        acc = gl.zeros([SUB_M, HEAD_DIM], gl.float32, layout=o_layout)
        mbarrier.wait(q_ready.index(C), t_i & 1)
        if OVERLAP:
            # turn (per block j) = {S_j = Q K_j^T, O += P_{j-1} V_{j-1}}; rescaling O and converting P
            # happen outside the turn, after the PV product retired
            if n_blocks > 0:
                st = it % STAGES
                mbarrier.wait(k_ready.index(st), (it // STAGES) & 1)
                mbarrier.wait(my_turn, (it & 1) ^ FIRST)
                kt = k_smem.index(st).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                tok = warpgroup_mma(q, kt, zero_s, use_acc=False, is_async=True)
                mbarrier.arrive(next_turn)
                s = warpgroup_mma_wait(0, deps=(tok, ))
                mbarrier.arrive(k_empty.index(st))
                p, alpha, m_i, l_i = _softmax(s, 0, m_i, l_i, n_full, rows, cols0, seqlen_k, off, qk_scale,
                                              CAUSAL, BLOCK_N, FOLD)
                p16 = gl.convert_layout(p.to(dtype), p_layout)  # O is still 0: nothing to rescale
                for j in range(1, n_blocks):
                    st = (it + j) % STAGES
                    sv = (it + j - 1) % STAGES
                    mbarrier.wait(k_ready.index(st), ((it + j) // STAGES) & 1)
                    mbarrier.wait(my_turn, ((it + j) & 1) ^ FIRST)
                    kt = k_smem.index(st).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                    tok_s = warpgroup_mma(q, kt, zero_s, use_acc=False, is_async=True)
                    mbarrier.wait(v_ready.index(sv), ((it + j - 1) // STAGES) & 1)
                    tok_o = warpgroup_mma(p16, v_smem.index(sv).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
                    mbarrier.arrive(next_turn)
                    s = warpgroup_mma_wait(1, deps=(tok_s, ))  # groups retire in order: S_j done, PV not
                    mbarrier.arrive(k_empty.index(st))
                    p, alpha, m_i, l_i = _softmax(s, j, m_i, l_i, n_full, rows, cols0, seqlen_k, off, qk_scale,
                                                  CAUSAL, BLOCK_N, FOLD)
                    acc = warpgroup_mma_wait(0, deps=(tok_o, ))
                    mbarrier.arrive(v_empty.index(sv))
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                    p16 = gl.convert_layout(p.to(dtype), p_layout)
                # the last PV outside the turns (as FA3): every consumer takes n_blocks turns a tile
                sv = (it + n_blocks - 1) % STAGES
                mbarrier.wait(v_ready.index(sv), ((it + n_blocks - 1) // STAGES) & 1)
                tok_o = warpgroup_mma(p16, v_smem.index(sv).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(tok_o, ))
                mbarrier.arrive(v_empty.index(sv))
        else:
            # two turns a block, {S_j} then {O += P_j V_j}: turn numbers tn + 2j and tn + 2j + 1
            for j in range(n_blocks):
                st = (it + j) % STAGES
                ph = ((it + j) // STAGES) & 1
                mbarrier.wait(k_ready.index(st), ph)
                mbarrier.wait(my_turn, FIRST)  # turn 2 (it + j): even
                kt = k_smem.index(st).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                tok = warpgroup_mma(q, kt, zero_s, use_acc=False, is_async=True)
                mbarrier.arrive(next_turn)
                s = warpgroup_mma_wait(0, deps=(tok, ))
                mbarrier.arrive(k_empty.index(st))
                p, alpha, m_i, l_i = _softmax(s, j, m_i, l_i, n_full, rows, cols0, seqlen_k, off, qk_scale,
                                              CAUSAL, BLOCK_N, FOLD)
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                p16 = gl.convert_layout(p.to(dtype), p_layout)
                mbarrier.wait(v_ready.index(st), ph)
                mbarrier.wait(my_turn, FIRST ^ 1)  # turn 2 (it + j) + 1: odd
                tok_o = warpgroup_mma(p16, v_smem.index(st).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
                mbarrier.arrive(next_turn)
                acc = warpgroup_mma_wait(0, deps=(tok_o, ))
                mbarrier.arrive(v_empty.index(st))
        it += n_blocks

        # Epilogue: one division by l per row; empty rows (l = 0) give 0 and lse = -inf.
        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
        if VARLEN:  # lse (H, Tq): row q_start + i of head h; H * Tq < 2**31 (the launcher checks it), and
            # int32 here keeps ptxas from hoisting a sign-extended stride_lh to the kernel entry (a spill at D 256)
            lse_ptr = LSE + (h * stride_lh + q_start)
        else:
            lse_ptr = LSE + b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh
        gl.store(lse_ptr + rows, lse, mask=rows < seqlen_q)
        out = acc / gl.expand_dims(gl.convert_layout(l_safe, row_o), 1)
        if r0 < seqlen_q:  # a slice wholly past Sq (last tile, its Q loaded from row Sq - 1) stores nothing
            q.store(out.to(dtype))  # this slice's Q is dead (its wgmmas retired): it stages the output
            if VARLEN:
                if r0 + SUB_M <= seqlen_q:  # the whole slice inside its sequence: the TMA store, as dense
                    fence_async_shared()
                    tma.async_copy_shared_to_global(o_desc, [0, q_start + r0, h * HEAD_DIM], q_tile)
                    tma.store_wait(pendings=0)
                else:  # the sequence ends inside the slice: the rows after it are the next sequence's, so
                    # masked 16-byte stores of the rows < len_q only (a TMA box would clip only at Tq)
                    _store_rows_masked(q, O, q_start, r0, seqlen_q, H, h, HEAD_DIM, SUB_M)
            else:
                fence_async_shared()
                tma.async_copy_shared_to_global(o_desc, [b, r0, h * HEAD_DIM], q_tile)  # clips rows >= Sq
                tma.store_wait(pendings=0)
        mbarrier.arrive(q_empty.index(C))  # the producer may load the next tile's Q slice into it
        return it

    @gluon.jit
    def _consumer_pp(q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn, o_desc,
                     LSE, stride_lb, stride_lh, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k,
                     qk_scale, C: gl.constexpr, CONSUMERS: gl.constexpr, HEAD_DIM: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                     OVERLAP: gl.constexpr, FOLD: gl.constexpr, PERSISTENT: gl.constexpr, CU_Q, CU_K, n_seq, O,
                     VARLEN: gl.constexpr, next_smem, next_ready, next_free):
        """Ping-pong consumer C: one warpgroup, rows [m0 + C * SUB_M, m0 + (C + 1) * SUB_M) of each tile
        against all its key blocks. K/V block `idx` (counted across tiles) sits in slot idx % STAGES and
        completes phase (idx // STAGES) & 1 of k/v_ready; consumer c's tensor-core turn number t (counted
        across tiles) waits on turn[c] with parity (t & 1) ^ FIRST and hands over by arriving on
        turn[(c + 1) % CONSUMERS] right after issuing its wgmmas (protocol: the module docstring)."""
        SUB_M: gl.constexpr = BLOCK_M // CONSUMERS
        FIRST: gl.constexpr = 1 if C == 0 else 0
        my_turn = turn.index(C)
        next_turn = turn.index((C + 1) % CONSUMERS)
        q_tile = q_smem.index(C)
        if PERSISTENT == 2:  # dynamic: the producer's tile sequence (_pass_next_tile)
            lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
            it = 0
            t_i = 0
            tile = tile0
            while tile < n_tiles:
                it = _consumer_pp_tile(q_tile, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                                       v_empty, my_turn, next_turn, o_desc, LSE, stride_lb, stride_lh, tile, it,
                                       t_i, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, qk_scale, C, FIRST,
                                       HEAD_DIM, BLOCK_M, SUB_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, FOLD, CU_Q, CU_K,
                                       n_seq, O, VARLEN)
                tile = _take_next_tile(next_smem, next_ready, next_free, t_i, lay)
                t_i += 1
        elif PERSISTENT:
            it = 0  # K/V blocks consumed so far (and, with OVERLAP, turns taken)
            t_i = 0  # tiles done
            for kt in range(0, _program_tiles(tile0, n_tiles, tile_step)):
                tile = _snake_tile(kt, tile0, tile_step)
                it = _consumer_pp_tile(q_tile, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                                       v_empty, my_turn, next_turn, o_desc, LSE, stride_lb, stride_lh, tile, it,
                                       t_i, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, qk_scale, C, FIRST,
                                       HEAD_DIM, BLOCK_M, SUB_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, FOLD, CU_Q, CU_K,
                                       n_seq, O, VARLEN)
                t_i += 1
        else:  # one tile a program: no loop, so the counters are constants (fewer live registers)
            _consumer_pp_tile(q_tile, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, my_turn,
                              next_turn, o_desc, LSE, stride_lb, stride_lh, tile0, 0, 0, n_m, BH, HG, H, GROUP,
                              seqlen_q, seqlen_k, qk_scale, C, FIRST, HEAD_DIM, BLOCK_M, SUB_M, BLOCK_N, STAGES,
                              CAUSAL, OVERLAP, FOLD, CU_Q, CU_K, n_seq, O, VARLEN)

    @gluon.jit
    def _pp_run(q_desc, k_desc, v_desc, o_desc, LSE, stride_lb, stride_lh, tile0, tile_step, n_tiles, n_m, BH, HG, H,
                GROUP, seqlen_q, seqlen_k, qk_scale, CU_Q, CU_K, n_seq, O, COUNTER, HEAD_DIM: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                OVERLAP: gl.constexpr, FOLD: gl.constexpr, CONSUMERS: gl.constexpr, PERSISTENT: gl.constexpr,
                PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, VARLEN: gl.constexpr):
        """The ping-pong program (dense and varlen): shared memory, barriers, the partitions. A program runs tile0
        alone (tile_step = n_tiles), or persistent the snake order of _snake_tile, or (PERSISTENT == 2, dynamic)
        tile0 then tiles from the counter."""
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(CONSUMERS):
            mbarrier.init(q_ready.index(i), count=1)  # the producer's expect-tx arrive
            mbarrier.init(q_empty.index(i), count=1)  # consumer i's arrive after its output store
            mbarrier.init(turn.index(i), count=1)  # the previous consumer's hand-over
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=CONSUMERS)  # every consumer reads every K/V block
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=CONSUMERS)
        if PERSISTENT == 2:  # the dynamic scheduler's next-tile slots: the producer writes, every consumer reads
            next_smem = gl.allocate_shared_memory(gl.int32, [2, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
            next_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            next_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(2):
                mbarrier.init(next_ready.index(i), count=1)
                mbarrier.init(next_free.index(i), count=CONSUMERS)
        else:
            next_smem: gl.constexpr = None
            next_ready: gl.constexpr = None
            next_free: gl.constexpr = None
        # consumer 0 is the default partition (num_warps = 4), the others 4-warp workers; Triton packs the
        # producer warp with padding warps into the last warpgroup, which gives registers back
        if CONSUMERS == 2:
            gl.warp_specialize([
                (_consumer_pp, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                                turn, o_desc, LSE, stride_lb, stride_lh, tile0, tile_step, n_tiles, n_m, BH, HG, H,
                                GROUP, seqlen_q, seqlen_k, qk_scale, 0, CONSUMERS, HEAD_DIM, BLOCK_M, BLOCK_N,
                                STAGES, CAUSAL, OVERLAP, FOLD, PERSISTENT, CU_Q, CU_K, n_seq, O, VARLEN, next_smem,
                                next_ready, next_free)),
                (_consumer_pp, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                                turn, o_desc, LSE, stride_lb, stride_lh, tile0, tile_step, n_tiles, n_m, BH, HG, H,
                                GROUP, seqlen_q, seqlen_k, qk_scale, 1, CONSUMERS, HEAD_DIM, BLOCK_M, BLOCK_N,
                                STAGES, CAUSAL, OVERLAP, FOLD, PERSISTENT, CU_Q, CU_K, n_seq, O, VARLEN, next_smem,
                                next_ready, next_free)),
                (_producer_pp, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                k_empty, v_ready, v_empty, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q,
                                seqlen_k, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, CU_Q, CU_K,
                                n_seq, VARLEN, PERSISTENT, COUNTER, next_smem, next_ready, next_free)),
            ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
        else:
            gl.static_assert(CONSUMERS == 3, "ping-pong takes 2 or 3 consumer warpgroups")
            gl.warp_specialize([
                (_consumer_pp, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                                turn, o_desc, LSE, stride_lb, stride_lh, tile0, tile_step, n_tiles, n_m, BH, HG, H,
                                GROUP, seqlen_q, seqlen_k, qk_scale, 0, CONSUMERS, HEAD_DIM, BLOCK_M, BLOCK_N,
                                STAGES, CAUSAL, OVERLAP, FOLD, PERSISTENT, CU_Q, CU_K, n_seq, O, VARLEN, next_smem,
                                next_ready, next_free)),
                (_consumer_pp, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                                turn, o_desc, LSE, stride_lb, stride_lh, tile0, tile_step, n_tiles, n_m, BH, HG, H,
                                GROUP, seqlen_q, seqlen_k, qk_scale, 1, CONSUMERS, HEAD_DIM, BLOCK_M, BLOCK_N,
                                STAGES, CAUSAL, OVERLAP, FOLD, PERSISTENT, CU_Q, CU_K, n_seq, O, VARLEN, next_smem,
                                next_ready, next_free)),
                (_consumer_pp, (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                                turn, o_desc, LSE, stride_lb, stride_lh, tile0, tile_step, n_tiles, n_m, BH, HG, H,
                                GROUP, seqlen_q, seqlen_k, qk_scale, 2, CONSUMERS, HEAD_DIM, BLOCK_M, BLOCK_N,
                                STAGES, CAUSAL, OVERLAP, FOLD, PERSISTENT, CU_Q, CU_K, n_seq, O, VARLEN, next_smem,
                                next_ready, next_free)),
                (_producer_pp, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                k_empty, v_ready, v_empty, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q,
                                seqlen_k, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, CU_Q, CU_K,
                                n_seq, VARLEN, PERSISTENT, COUNTER, next_smem, next_ready, next_free)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])

    # No value specialisation of the integer arguments (Triton would otherwise compile one kernel per
    # divisibility-by-16 / == 1 class of each): one binary per (config, head dim, causal), the same one that
    # compile_sm90 builds ahead of time and the compile test checks.
    @gluon.jit(do_not_specialize=["stride_lb", "stride_lh", "H", "GROUP", "BH", "HG", "seqlen_q", "seqlen_k"])
    def _fa3_fwd_kernel(q_desc, k_desc, v_desc, o_desc, LSE, COUNTER, stride_lb, stride_lh, H, GROUP, BH, HG,
                        seqlen_q, seqlen_k, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
                        FOLD: gl.constexpr, PINGPONG: gl.constexpr, CONSUMERS: gl.constexpr,
                        PERSISTENT: gl.constexpr, PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                        num_warps: gl.constexpr):
        dtype: gl.constexpr = q_desc.dtype
        if PINGPONG:
            # 1-D grid of tiles (head groups, heaviest first: _tile_info); persistent: one program an SM (_pp_run)
            n_m = (seqlen_q + BLOCK_M - 1) // BLOCK_M
            n_tiles = n_m * BH
            tile0 = gl.program_id(0)
            if PERSISTENT:
                tile_step = gl.num_programs(0)
            else:
                tile_step = n_tiles  # one tile a program
            _pp_run(q_desc, k_desc, v_desc, o_desc, LSE, stride_lb, stride_lh, tile0, tile_step, n_tiles, n_m, BH, HG,
                    H, GROUP, seqlen_q, seqlen_k, qk_scale, None, None, None, None, COUNTER, HEAD_DIM, BLOCK_M,
                    BLOCK_N, STAGES, CAUSAL, OVERLAP, FOLD, CONSUMERS, PERSISTENT, PRODUCER_REGS, CONSUMER_REGS, False)
        else:
            # Heaviest query tiles first: under a causal mask the last tiles see the most keys.
            pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
            bh = gl.program_id(1)
            b = bh // H
            h = bh % H
            hk = h // GROUP  # GQA: the K/V head by index, never a copy
            m0 = pid_m * BLOCK_M
            off = seqlen_k - seqlen_q
            if CAUSAL:  # keys [0, hi) are visible to some row of the tile; [0, n_full * BN) to every row
                hi = gl.maximum(gl.minimum(seqlen_k, m0 + BLOCK_M + off), 0)
                n_full = gl.maximum(gl.minimum(seqlen_k, m0 + off + 1), 0) // BLOCK_N
            else:
                hi = seqlen_k
                n_full = seqlen_k // BLOCK_N
            n_blocks = (hi + BLOCK_N - 1) // BLOCK_N

            q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
            k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
            v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
            q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            mbarrier.init(q_bar, count=1)
            for i in gl.static_range(STAGES):
                mbarrier.init(k_ready.index(i), count=1)
                mbarrier.init(k_empty.index(i), count=1)
                mbarrier.init(v_ready.index(i), count=1)
                mbarrier.init(v_empty.index(i), count=1)

            q_col = h * HEAD_DIM
            k_col = hk * HEAD_DIM
            lse_ptr = LSE + b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh
            gl.warp_specialize([
                (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, o_desc, lse_ptr, b,
                             m0, q_col, n_blocks, n_full, seqlen_q, seqlen_k, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N,
                             STAGES, CAUSAL, OVERLAP, FOLD, num_warps)),
                (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready,
                             v_empty, b, m0, q_col, k_col, n_blocks, BLOCK_N, STAGES)),
            ], [1], [PRODUCER_REGS])

    # Packed varlen layout (ping-pong only): q/out as (1, Tq, H * D), k/v as (1, Tk, Hkv * D) descriptors (the
    # packed 2-D tensor with a unit batch dimension, so boxes and shared layouts are the dense path's), boxes at
    # row cu_seqlens[b] + block start; rows past a sequence's end read the next sequence's (masked keys, query
    # rows never stored). Grid: one program per tile of a bound n_tiles = H * (bound on sum cdiv(len_q_b,
    # BLOCK_M)) (tiles past the last block do nothing), or persistent: the exact count from cu_seqlens_q.
    @gluon.jit(do_not_specialize=["stride_lh", "H", "GROUP", "n_seq", "n_tiles"])
    def _fa3_fwd_varlen_kernel(q_desc, k_desc, v_desc, o_desc, O, LSE, CU_Q, CU_K, stride_lh, H, GROUP, n_seq,
                               n_tiles, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                               OVERLAP: gl.constexpr, FOLD: gl.constexpr, PINGPONG: gl.constexpr,
                               CONSUMERS: gl.constexpr, PERSISTENT: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                               CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
        gl.static_assert(PINGPONG, "the varlen forward runs the ping-pong schedule")
        tile0 = gl.program_id(0)
        if PERSISTENT:
            n_tiles = _varlen_total(CU_Q, n_seq, BLOCK_M, num_warps) * H  # every tile below it is a real one
            tile_step = gl.num_programs(0)
        else:
            tile_step = n_tiles  # one tile a program
        # (COUNTER: the dense grid's dynamic scheduler, never read here; any int32 pointer)
        _pp_run(q_desc, k_desc, v_desc, o_desc, LSE, 0, stride_lh, tile0, tile_step, n_tiles, 0, 0, 0, H, GROUP, 0, 0,
                qk_scale, CU_Q, CU_K, n_seq, O, CU_Q, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, FOLD,
                CONSUMERS, PERSISTENT, PRODUCER_REGS, CONSUMER_REGS, True)


def _gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]


@functools.lru_cache(maxsize=None)  # 25 us a call uncached: host time of every launch (benchmarks/attention_host.py)
def tile_layout(block_rows: int, head_dim: int, dtype: torch.dtype):
    """NVMMA (128-byte swizzled) shared layout of a (1, rows, D) TMA box, as wgmma reads it."""
    return gl.NVMMASharedLayout.get_default_for([1, block_rows, head_dim], _gl_dtype(dtype))


def unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, need_contiguous: bool = True,
                varlen: bool = False, need_aligned: bool = True) -> str | None:
    """Why attention_fa3_fwd cannot run these inputs, or None (dense, or with varlen the packed layout; 16-bit,
    Hopper, D in 64/128/256, with need_contiguous: contiguous, with need_aligned: 16-byte aligned as TMA reads
    them). need_aligned=False is for a caller that copies misaligned tensors itself, and reads no data pointer, so
    torch.compile traces it (ops.attention decides there)."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return "q, k, v must be tensors"
    if varlen:
        if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
            return "fa3 varlen takes the packed layout q (Tq, H, D), k and v (Tk, Hkv, D)"
        H, D = q.shape[1:]
        if D not in HEAD_DIMS:
            return f"head_dim={D}: fa3 takes 64, 128 or 256"
        if k.shape[2] != D or k.shape[1] == 0 or H % k.shape[1]:
            return f"k/v {tuple(k.shape)} do not fit q {tuple(q.shape)} (same head_dim, H % Hkv == 0)"
    else:
        if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
            return "fa3 takes the dense layout q (B, Sq, H, D), k and v (B, Sk, Hkv, D)"
        B, Sq, H, D = q.shape
        if D not in HEAD_DIMS:
            return f"head_dim={D}: fa3 takes 64, 128 or 256"
        if k.shape[0] != B or k.shape[3] != D or k.shape[2] == 0 or H % k.shape[2]:
            return f"k/v {tuple(k.shape)} do not fit q {tuple(q.shape)} (same batch and head_dim, H % Hkv == 0)"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype}: fa3 takes float16 or bfloat16"
    if not (q.is_cuda and k.is_cuda and v.is_cuda) or capability(q.device)[0] != 9:  # cached: host path
        return f"fa3 needs a Hopper GPU (compute capability 9.x); q is on {q.device}"
    if not HAS_GLUON:
        return "fa3 needs triton.experimental.gluon with warp_specialize (Triton >= 3.6)"
    if need_contiguous and not all(t.is_contiguous() for t in (q, k, v)):
        return "fa3 needs contiguous q, k, v"
    if need_aligned and any(t.is_contiguous() and t.data_ptr() % 16 for t in (q, k, v)):  # used as it is
        return "fa3 needs 16-byte aligned q, k, v"
    return None


# ---- varlen bookkeeping (pure Python; the kernel's _varlen_find / _tile_info_varlen do the same on the GPU) ----

def varlen_block_bound(total_q: int, n_seq: int, max_seqlen_q: int, block_m: int) -> int:
    """An upper bound on the query blocks of a packed batch, sum_b cdiv(len_q_b, block_m), from what the host
    knows without reading cu_seqlens_q (no device sync): sum_b floor(len_b / block_m) <= total_q // block_m plus
    at most one partial block a sequence; and at most cdiv(max_seqlen_q, block_m) a sequence. Exact when every
    sequence has max_seqlen_q tokens. The one-tile-a-program grid is H times this."""
    return min(total_q // block_m + n_seq, n_seq * -(-max_seqlen_q // block_m))


def varlen_schedule(cu_seqlens_q, n_heads: int, block_m: int) -> list[tuple[int, int, int]]:
    """(sequence, head, query block) of tile t = 0, 1, ... as the kernel orders them: sequence by sequence,
    each one's query blocks last first (the most keys under a causal mask), all heads of a block together
    (t % n_heads is the head). Empty sequences have no tile. For tests and tools."""
    cu = [int(x) for x in cu_seqlens_q]
    tiles = []
    for b in range(len(cu) - 1):
        for blk in reversed(range(-(-(cu[b + 1] - cu[b]) // block_m))):
            tiles += [(b, h, blk) for h in range(n_heads)]
    return tiles


def varlen_find(i: int, cu_seqlens_q, block_m: int, chunk: int = 128) -> tuple[int, int, int, int]:
    """What the kernel's _varlen_find computes for compact query block i (tile // H), step by step as it does
    (a prefix sum over `chunk` sequences at a time, 32 per warp): (sequence b, its query block, first token,
    length); b = number of sequences when i is past the last block. For the unit test of that arithmetic."""
    cu = [int(x) for x in cu_seqlens_q]
    n_seq = len(cu) - 1
    base, c0 = 0, 0
    while c0 < n_seq:
        offs = [o for o in range(c0, c0 + chunk)]
        lo = [cu[o] if o < n_seq else 0 for o in offs]
        hi = [cu[o + 1] if o < n_seq else 0 for o in offs]
        nb = [(h - l + block_m - 1) // block_m for l, h in zip(lo, hi)]
        end = [base + sum(nb[:j + 1]) for j in range(chunk)]
        hit = [j for j in range(chunk) if end[j] - nb[j] <= i < end[j]]
        assert len(hit) <= 1
        if hit:
            j = hit[0]
            return offs[j], end[j] - 1 - i, lo[j], hi[j] - lo[j]
        base = max(e for e, o in zip(end, offs) if o < n_seq)
        c0 += chunk
    return n_seq, 0, 0, 0


@functools.lru_cache(maxsize=None)  # on every launch
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def head_group(bh: int, n_m: int, n_sms: int, grouped: bool = True) -> int:
    """(batch, head)s a group of the ping-pong tile order (_tile_info): enough that a group's bh x n_m tiles
    fill the SMs once (ceil(n_sms / n_m), at most bh), so the tiles running at once share few heads' K/V
    and each head's K/V is read from HBM about once. grouped=False: bh (one group: heaviest tile first over
    all heads, the order before 2026-12-03)."""
    if bh < 1 or n_m < 1 or n_sms < 1:
        raise ValueError(f"head_group: bh, n_m, n_sms must be >= 1, got {bh}, {n_m}, {n_sms}")
    return max(1, min(bh, -(-n_sms // n_m))) if grouped else bh


def program_tiles(n_tiles: int, programs: int) -> list[list[int]]:
    """The tiles each persistent program runs, in order (_program_tiles / _snake_tile in Python): rounds of
    `programs` tiles, left to right in even rounds and right to left in odd ones."""
    out = [[] for _ in range(programs)]
    for t in range(n_tiles):
        k, j = divmod(t, programs)
        out[j if k % 2 == 0 else programs - 1 - j].append(t)
    return out


def tile_order(bh: int, n_m: int, hg: int) -> list[tuple[int, int]]:
    """The kernel's tile -> ((batch, head) index, query block) map for tiles 0 .. bh * n_m - 1, in Python
    (_tile_info does the same on the GPU; tests check it is a permutation, heaviest first within a group)."""
    out = []
    for t in range(bh * n_m):
        g, r = divmod(t, hg * n_m)
        n = min(hg, bh - g * hg)
        out.append((g * hg + r % n, n_m - 1 - r // n))
    return out


def _num_sms(device: torch.device) -> int:
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, varlen: bool = False) -> bool:
    """Whether attention_fa3_fwd can run these inputs (see unsupported)."""
    return unsupported(q, k, v, varlen=varlen) is None


def _check_cu(q, cu_seqlens_q, cu_seqlens_k) -> str | None:
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
            return f"{name} must be a 1-D int32 tensor of batch + 1 >= 2 offsets"
        if cu.device != q.device:
            return f"{name} is on {cu.device} but q is on {q.device}"
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        return "cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1)"
    return None


def attention_fa3_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                      softmax_scale: float | None = None, config: FA3Config | None = None,
                      cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
                      max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                      out: torch.Tensor | None = None):
    """out (B, Sq, H, D), lse (B, H, Sq) fp32 of softmax(scale * q k^T) v; see the module docstring.

    Varlen (cu_seqlens_q/k given, flash-attn's packed layout, as ops.attention): q (Tq, H, D), k/v (Tk, Hkv, D),
    cu_seqlens int32 (B + 1,) on q's device -> out (Tq, H, D), lse (H, Tq). Sequence b is tokens
    [cu_seqlens[b], cu_seqlens[b + 1]); causal aligned bottom-right in each; rows of a sequence with no key give
    0 and lse -inf. The offsets are trusted as they are (ops.attention checks them: non-decreasing from 0 to
    Tq / Tk); they may also start above 0 or end below Tq / Tk: the rows outside are neither attended nor
    written (unless k has no token at all: then out is zeroed, lse -inf, whole). max_seqlen_q must be at
    least the longest query sequence (it sizes the grid; None: read from cu_seqlens_q, a device sync).
    max_seqlen_k is unused.
    out: written in place when given (q's shape and dtype, contiguous); rows no sequence covers keep their
    values (the GPU tests fill it with a sentinel)."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    why = unsupported(q, k, v, varlen=varlen) or (_check_cu(q, cu_seqlens_q, cu_seqlens_k) if varlen else None)
    if why is None and out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device
                                            or not out.is_contiguous() or out.data_ptr() % 16):
        why = f"out must be a contiguous, 16-byte aligned tensor like q {tuple(q.shape)} {q.dtype}"
    if why is not None:
        raise ValueError(f"attention_fa3_fwd: {why}")
    return fwd_unchecked(q, k, v, causal=causal, softmax_scale=softmax_scale, config=config, cu_seqlens_q=cu_seqlens_q,
                         cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, out=out)


def fwd_unchecked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                  softmax_scale: float | None = None, config: FA3Config | None = None,
                  cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
                  max_seqlen_q: int | None = None, out: torch.Tensor | None = None):
    """attention_fa3_fwd without its input checks, for a caller that ran them on these tensors already
    (ops.attention: fa3_unsupported, then contiguous copies, which are aligned; the cu_seqlens checks); a few
    microseconds of host time a call (benchmarks/attention_host.py). Anything unchecked is undefined here."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if out is None:
        out = torch.empty_like(q)
    if varlen:
        Tq, H, _ = q.shape
        lse = torch.empty((H, Tq), device=q.device, dtype=torch.float32)
        if Tq == 0 or H == 0:
            return out, lse
        if k.shape[0] == 0:  # no keys anywhere: every row is empty (and a TMA box needs a non-empty tensor)
            return out.zero_(), lse.fill_(float("-inf"))
        grid, args, constexprs, key = _launch_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                     causal, softmax_scale, config)
        if grid[0] > 0:  # 0: every sequence is empty
            launch(_fa3_fwd_varlen_kernel, grid, args, constexprs, key)
        return out, lse
    B, Sq, H, D = q.shape
    lse = torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)
    if B == 0 or Sq == 0 or H == 0:
        return out, lse
    if k.shape[1] == 0:  # no keys: every row is empty (and a TMA box needs a non-empty tensor)
        return out.zero_(), lse.fill_(float("-inf"))
    grid, args, constexprs, key = _launch(q, k, v, out, lse, causal, softmax_scale, config)
    launch(_fa3_fwd_kernel, grid, args, constexprs, key)
    return out, lse


def precompile(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
               config: FA3Config | None = None, cu_seqlens_q: torch.Tensor | None = None,
               cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: int | None = None) -> None:
    """Compile (into Triton's cache, without launching) the kernel attention_fa3_fwd would run on inputs
    like these; only dtype, head dim, causal, varlen and the config matter (no integer is specialised)."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    why = unsupported(q, k, v, varlen=varlen) or (_check_cu(q, cu_seqlens_q, cu_seqlens_k) if varlen else None)
    if why is not None:
        raise ValueError(f"precompile: {why}")
    out = torch.empty_like(q)
    if varlen:
        lse = torch.empty(q.shape[1], q.shape[0], device=q.device, dtype=torch.float32)
        grid, args, constexprs, _ = _launch_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                   causal, None, config)
        _fa3_fwd_varlen_kernel.warmup(*args, grid=grid, **constexprs)
        return
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device, dtype=torch.float32)
    grid, args, constexprs, _ = _launch(q, k, v, out, lse, causal, None, config)
    _fa3_fwd_kernel.warmup(*args, grid=grid, **constexprs)


def _scale(softmax_scale, head_dim: int) -> float:
    scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    if not scale > 0:  # the softmax takes the row max of the raw scores (_softmax)
        raise ValueError(f"attention_fa3_fwd: softmax_scale must be > 0 (FA2's kernels take any); got {scale!r}")
    return scale


def _launch(q, k, v, out, lse, causal, softmax_scale, config):
    """(grid, arguments, constexprs, launch-cache key) of the kernel for non-empty inputs."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    scale = _scale(softmax_scale, D)
    cfg = config or default_config(D, causal, Sq)
    bad = config_error(D, cfg)
    if bad is not None:
        raise ValueError(f"attention_fa3_fwd: {cfg}: {bad}")
    q_lay, kv_lay = tile_layout(cfg.q_rows, D, q.dtype), tile_layout(cfg.block_n, D, q.dtype)
    # (B, S, heads * D) views: the box (1, rows, D) at [b, row, head * D] stays inside batch b, so TMA
    # zero-fills rows past this sequence's end and clips stores there.
    # (unchecked construction: unsupported() checked q, k, v, config_error the boxes; out is like q)
    q_desc = tensor_desc(TensorDescriptor, q, [B, Sq, H * D], [Sq * H * D, H * D, 1], [1, cfg.q_rows, D], q_lay)
    o_desc = tensor_desc(TensorDescriptor, out, [B, Sq, H * D], [Sq * H * D, H * D, 1], [1, cfg.q_rows, D], q_lay)
    k_desc = tensor_desc(TensorDescriptor, k, [B, Sk, Hkv * D], [Sk * Hkv * D, Hkv * D, 1], [1, cfg.block_n, D],
                         kv_lay)
    v_desc = tensor_desc(TensorDescriptor, v, [B, Sk, Hkv * D], [Sk * Hkv * D, Hkv * D, 1], [1, cfg.block_n, D],
                         kv_lay)
    n_m = triton.cdiv(Sq, cfg.block_m)
    n_sms = _num_sms(q.device)
    if not cfg.is_pingpong:
        grid = (n_m, B * H)
    elif cfg.persistent:
        grid = (min(n_m * B * H, n_sms), )
    else:
        grid = (n_m * B * H, )
    # the dynamic scheduler's tile counter (zeroed a launch); otherwise any int32 pointer (never read)
    counter = torch.zeros(1, dtype=torch.int32, device=q.device) if cfg.dynamic else dummy_i32(q.device)
    args = (q_desc, k_desc, v_desc, o_desc, lse, counter, lse.stride(0), lse.stride(1), H, H // Hkv, B * H,
            head_group(B * H, n_m, n_sms, cfg.l2_groups), Sq, Sk, float(scale) * LOG2E)
    return grid, args, _constexprs(D, bool(causal), cfg), (cfg, D, bool(causal), q.dtype)


def _launch_varlen(q, k, v, out, lse, cu_q, cu_k, max_q, causal, softmax_scale, config):
    """(grid, arguments, constexprs, launch-cache key) of the varlen kernel for non-empty packed inputs."""
    Tq, H, D = q.shape
    Tk, Hkv = k.shape[0], k.shape[1]
    n_seq = cu_q.numel() - 1
    scale = _scale(softmax_scale, D)
    cfg = config or DEFAULT_CONFIGS[D]
    bad = config_error(D, cfg, varlen=True)
    if bad is not None:
        raise ValueError(f"attention_fa3_fwd: {cfg}: {bad}")
    if max_q is None:
        max_q = int((cu_q[1:] - cu_q[:-1]).max())
    q_lay, kv_lay = tile_layout(cfg.q_rows, D, q.dtype), tile_layout(cfg.block_n, D, q.dtype)
    # The packed (T, heads * D) tensors with a unit batch dimension: the dense path's boxes and layouts, at
    # row cu_seqlens[b] + block start. TMA bounds are the whole packed tensor's (zero-fill past T only): rows
    # past a sequence's end are the next sequence's, masked as keys and never stored as queries.
    q_desc = TensorDescriptor(q, [1, Tq, H * D], [Tq * H * D, H * D, 1], [1, cfg.q_rows, D], q_lay)
    o_desc = TensorDescriptor(out, [1, Tq, H * D], [Tq * H * D, H * D, 1], [1, cfg.q_rows, D], q_lay)
    k_desc = TensorDescriptor(k, [1, Tk, Hkv * D], [Tk * Hkv * D, Hkv * D, 1], [1, cfg.block_n, D], kv_lay)
    v_desc = TensorDescriptor(v, [1, Tk, Hkv * D], [Tk * Hkv * D, Hkv * D, 1], [1, cfg.block_n, D], kv_lay)
    if H * Tq >= 2**31:  # the kernel indexes lse (H, Tq) in int32 (a q that big is > 256 GB)
        raise ValueError(f"attention_fa3_fwd: {H} heads x {Tq} tokens: more than 2**31 lse entries")
    n_tiles = varlen_block_bound(Tq, n_seq, max_q, cfg.block_m) * H
    grid = (min(n_tiles, _num_sms(q.device)), ) if cfg.persistent else (n_tiles, )
    args = (q_desc, k_desc, v_desc, o_desc, out, lse, cu_q.contiguous(), cu_k.contiguous(), lse.stride(0), H,
            H // Hkv, n_seq, n_tiles, float(scale) * LOG2E)
    return grid, args, _constexprs(D, bool(causal), cfg), (cfg, D, bool(causal), q.dtype)


def compile_sm90(head_dim: int, causal: bool, *, dtype: torch.dtype = torch.bfloat16,
                 config: FA3Config | None = None, varlen: bool = False):
    """Ahead-of-time compile for sm_90 (needs no GPU: Triton ships ptxas). Returns triton's CompiledKernel
    (.asm["ptx"], .asm["cubin"], .metadata.shared, .n_regs/.n_spills once loaded). For tests and tools.
    varlen: the packed-layout kernel, its pointers 16-byte aligned as a launch on torch tensors specialises them."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = config or DEFAULT_CONFIGS[head_dim]
    bad = config_error(head_dim, cfg, varlen=varlen)
    if bad is not None:
        raise ValueError(f"compile_sm90: {cfg}: {bad}")
    ty = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]

    def desc(rows):
        return f"tensordesc<{ty}[1,{rows},{head_dim}],{tile_layout(rows, head_dim, dtype)!r}>"

    if varlen:
        signature = {"q_desc": desc(cfg.q_rows), "k_desc": desc(cfg.block_n), "v_desc": desc(cfg.block_n),
                     "o_desc": desc(cfg.q_rows), "O": f"*{ty}", "LSE": "*fp32", "CU_Q": "*i32", "CU_K": "*i32",
                     "stride_lh": "i32", "H": "i32", "GROUP": "i32", "n_seq": "i32", "n_tiles": "i32",
                     "qk_scale": "fp32"}
        names = list(signature)
        attrs = {(names.index(n), ): [["tt.divisibility", 16]] for n in ("O", "LSE", "CU_Q", "CU_K")}
        constexprs = _constexprs(head_dim, bool(causal), cfg)
        signature.update({name: "constexpr" for name in constexprs})
        src = GluonASTSource(fn=_fa3_fwd_varlen_kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})
    signature = {"q_desc": desc(cfg.q_rows), "k_desc": desc(cfg.block_n), "v_desc": desc(cfg.block_n),
                 "o_desc": desc(cfg.q_rows), "LSE": "*fp32", "COUNTER": "*i32", "stride_lb": "i32",
                 "stride_lh": "i32", "H": "i32", "GROUP": "i32", "BH": "i32", "HG": "i32", "seqlen_q": "i32",
                 "seqlen_k": "i32", "qk_scale": "fp32"}
    constexprs = _constexprs(head_dim, bool(causal), cfg)
    signature.update({name: "constexpr" for name in constexprs})
    src = GluonASTSource(fn=_fa3_fwd_kernel, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})


def _constexprs(head_dim: int, causal: bool, cfg: FA3Config) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "STAGES": cfg.stages,
            "CAUSAL": causal, "OVERLAP": cfg.overlap, "FOLD": cfg.fold_scale, "PINGPONG": cfg.is_pingpong,
            "CONSUMERS": cfg.consumers, "PERSISTENT": 2 if cfg.dynamic else int(cfg.persistent),
            "PRODUCER_REGS": cfg.producer_regs, "CONSUMER_REGS": cfg.worker_consumer_regs,
            "num_warps": cfg.num_warps}
