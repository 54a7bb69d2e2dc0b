"""FlashAttention-3's FP8 forward (section 3.3) for Hopper (sm_90) in Gluon: the ping-pong kernel of
kernels/attention_fa3.py with e4m3 operands on both GEMMs.

Inputs are those of flashscale.ops.attention_fp8_quantized (the pre-pass of kernels/hadamard.py):
q8 (B, Sq, H, D), k8 (B, Sk, Hkv, D) e4m3; V TRANSPOSED, v8 (B, Hkv, D, Sk_pad >= Sk) e4m3 with the key
index contiguous; fp32 descales q_descale (B, H, ceil(Sq / QBLOCK_M)), k/v_descale (B, Hkv, ceil(Sk /
QBLOCK_N)) (any strides) with QBLOCK_M / QBLOCK_N the quantization blocks (ops' block_m / block_n).
Output out (B, Sq, H, D) in bf16 (fp16, fp32) and lse (B, H, Sq) fp32 natural log. It computes what
flashscale.reference.attention_fp8.attention_fp8_quantized_ref computes with tile_n = BLOCK_N (the same
key tiles, so the same running max and the same e4m3 rounding of P):
    S_j = (q8 k8_j^T) * (q_descale[row] * k_descale[j] * scale * log2 e)       FP8 wgmma, fp32 accumulator
    m   = max(m, rowmax S_j);  P_j = exp2(S_j - m + 8)                          FA3's Max_offset: P in (0, 2^8]
    l   = l * alpha + rowsum(P_j)  (fp32 P)
    O   = O * alpha + (e4m3(P_j) v8_j) * v_descale[j]                           FP8 wgmma, fp32 accumulator
    out = O / l;  lse = (m + log2 l - 8) ln 2;  rows that see no key: out 0, lse -inf.
BLOCK_N must divide QBLOCK_N (one K and one V descale a key tile, as in the reference, whose tile_n must
divide block_n); quantize with block_n=256 to run the 256-key tiles.

Schedule (kernels/attention_fa3.py's ping-pong path; its barrier protocol, module docstring there, is
reused unchanged: K/V ring of STAGES slots with k/v_ready (expect-tx) and k/v_empty (count = CONSUMERS)
mbarriers, q_ready/q_empty per consumer, tensor-core turns through turn[c]):
  * producer, 1 warp at 24 registers: TMA loads of each consumer's Q slice (box (1, SUB_M, D) of the
    (B, Sq, H * D) view), K tiles (1, BLOCK_N, D) of (B, Sk, Hkv * D), V^T tiles (D, BLOCK_N) of the 2-D view
    (B * Hkv * D, Sk) of v8 (row (b * Hkv + hk) * D; columns >= Sk read as TMA zeros, so the padding of
    Sk_pad is never read), GQA by coordinate (hk = h // (H / Hkv)).
  * CONSUMERS (2 or 3) 4-warp consumer partitions of SUB_M = BLOCK_M / CONSUMERS query rows each:
    S_j = Q K_j^T as an SS-wgmma (both operands K-major: Q and K rows are D-contiguous); P_j cast to e4m3
    in registers and moved into the FP8 A-operand layout (DotOperandLayout(k_width=4)): the fp32 accumulator
    layout is not the FP8 A layout (FA3 section 3.3, "layout conformance"), so _p_to_a runs FA3's
    permute_Aregs_fp8 as inline PTX (2 quad shuffles + 2 byte permutes a 64-bit pair; gl.convert_layout
    would cost ~5x the instructions) and renames the indices for free (no shared memory), then
    O += P_j V_j as an RS-wgmma whose B operand is the V^T tile (K-major: keys contiguous, why V is stored
    transposed). With OVERLAP (default) S_{j+1} is issued before the softmax of block j and one turn is
    {S_j, O += P_{j-1} V_{j-1}} (FA3's intra-warpgroup overlap); PINGPONG hands the tensor cores from one
    consumer to the next through turn[] (pingpong=False: the same partitions run freely, no turns).
  * Descales: q_descale is loaded once a tile as a per-row vector (any QBLOCK_M); the K and V descales of
    key tile j are two scalars (loaded before the tile's barrier waits, so their latency hides there).
    S's scale folds into one multiply-add with the max subtraction: P = exp2(raw * rs - (m - 8)) with
    rs = q_descale * k_descale * scale * log2 e > 0 (rowmax(raw) * rs == rowmax(raw * rs) exactly: rounding
    is monotonic). V's descale is applied lazily: the accumulator holds O / v_descale[j] while block j is
    added, so the rescale after each PV product is a single multiply by alpha * v_descale[j-1] / v_descale[j]
    (the bf16 kernel's alpha rescale, one factor changed), and the epilogue multiplies by v_descale[last] / l.
    (Edge: an all-zero V block has v_descale = 2^-64 / 448, and the accumulator holds O * ~2^73 while it
    is the current block: finite while |O| (unnormalised: up to 256 * Sk * max|V|) stays below ~2^54.)
  * Epilogue: out staged in the consumer's own (SUB_M, D) output tile in shared memory (out dtype: not Q's
    fp8 slice) and TMA-stored (rows >= Sq clipped). The Q slice is released (q_empty) as soon as the last
    QK^T of the tile has retired, so a persistent program loads the next Q during the last PV product.

Causal aligned bottom-right (key j visible to query i iff j <= i + Sk - Sq), only key blocks intersecting
the band are visited, masks only on blocks j >= n_full (ragged last block, causal diagonal band).
Accumulation: FP8 wgmma with Triton's sm_90 default (max_num_imprecise_acc = 2^30: Hopper's fast FP8
accumulation, as FA3 and the Triton FP8 kernel); the GPU tests measure its effect against the emulation.

Shapes: B batch, S sequence, H query heads, Hkv K/V heads, G = H // Hkv, D head dim (64, 128 or 256).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from flashscale.kernels.attention_fa3 import _num_sms, head_group
from flashscale.kernels.attention_tune import capability
from flashscale.reference.attention_fp8 import (padded_len, permute_v_keys, unpermute_v_keys,  # noqa: F401
                                                v_key_of_slot)

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

E4M3 = torch.float8_e4m3fn
LOG2E = 1.4426950408889634
P_SHIFT_LOG2 = 8.0  # flashscale.reference.attention_fp8.P_SHIFT_LOG2 (FA3's Max_offset)
HEAD_DIMS = (64, 128, 256)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SMEM_LIMIT = 232_448  # H100/H200: 227 KB the most one block may take

# Software exp2 on the FMA pipe (FA3Fp8Config.exp2_fma; FlashAttention-4's exp2 emulation, written here with
# round-to-nearest so it needs no directed-rounding add): x = max(x, -127); t = x + 1.5 * 2^23 holds j = round(x)
# in its low mantissa bits (exact for |x| < 2^22); f = x - (t - 1.5 * 2^23) in [-0.5, 0.5] (exact);
# 2^f ~ 1 + f (c1 + f (c2 + f c3)) (3 FFMA, Horner); 2^x = bits(2^f) + (bits(t) << 23) as integers (the shift
# keeps j's low 9 bits: bits(1.5 * 2^23) << 23 == 0 mod 2^32). Coefficients: minimax of the relative error on
# [-0.5, 0.5] with the constant term pinned to 1 (so that x <= -127, masked -inf included, gives exactly +0:
# bits(1.0) + (-127 << 23) == 0). Relative error <= 1.02e-4 for x in [-126, 8] (1.013e-4 the polynomial, the rest
# fp32 rounding; tests/kernels/test_attention_fa3_fp8_exp2.py); for x in (-127, -126) a denormal-range value
# within 2^-126 of 2^x, for x <= -127 exactly 0; never negative, never NaN. P is rounded to e4m3 (relative
# spacing 2^-4..2^-3) afterwards: 1e-4 moves an e4m3 rounding of P for ~0.03 % of the elements it touches, by one
# step (in the CPU emulation the output moves by ~3 % of the FP8 error at exp2_fma=3).
EXP2_FMA_CLAMP = -127.0
EXP2_FMA_ROUND = 12582912.0  # 1.5 * 2^23
EXP2_FMA_POLY = (0.6932829022407532, 0.2422110140323639, 0.05500895157456398)  # c1, c2, c3 (float32 values)
EXP2_FMA_REL_ERR = 1.02e-4


def exp2_fma_emulated(x: torch.Tensor) -> torch.Tensor:
    """The kernel's software exp2 (_exp2_fma) replayed op by op in float32 with torch (CPU or GPU): the same
    clamp, round-to-nearest split, Horner polynomial (fma as one float64 multiply-add rounded once to float32: the
    float32 product is exact in float64, so this differs from a fused float32 fma only by a rare double rounding)
    and integer exponent add. For tests and error studies; the kernel's result is this up to that double rounding."""
    x = torch.clamp_min(x.float(), EXP2_FMA_CLAMP)  # -inf -> -127 (NaN never occurs: scores are finite or -inf)
    t = x + EXP2_FMA_ROUND
    f = x - (t - EXP2_FMA_ROUND)

    def fma(a, b, c):
        return (a.double() * b.double() + c).float()

    c1, c2, c3 = EXP2_FMA_POLY
    p = fma(fma(fma(f, torch.full_like(f, c3), c2), f, c1), f, 1.0)
    bits = p.view(torch.int32) + (t.view(torch.int32) << 23)  # int32 arithmetic wraps, as the GPU's
    return bits.view(torch.float32)


@dataclass(frozen=True, kw_only=True)
class FA3Fp8Config:
    """Tile shape and pipeline of one launch (docs/attention_fp8.md, "FA3-style Gluon kernel").
    FP8 halves the bytes of a tile, so 256-key tiles and deeper rings fit in shared memory; registers
    (fp32 O and S accumulators of SUB_M = block_m / consumers rows) are the bound."""

    block_m: int = 128  # query rows of one tile (block_m // consumers a consumer warpgroup)
    block_n: int = 128  # keys a K/V tile; must divide the quantization block_n
    stages: int = 3  # K/V ring depth
    consumers: int = 2  # consumer warpgroups (separate 4-warp partitions), 2 or 3
    overlap: bool = True  # issue QK^T of block j+1 before the softmax of block j (intra-warpgroup)
    pingpong: bool = True  # tensor-core turns between the consumers (inter-warpgroup); False: free-running
    producer_regs: int = 24  # setmaxnreg of the TMA warp
    consumer_regs: int = 0  # setmaxnreg of the worker consumers; 0: 240 / 160 for 2 / 3 consumers
    persistent: bool = False  # one program an SM looping over the tiles, heaviest first
    l2_groups: bool = True  # tiles grouped by (batch, head), about a wave a group (attention_fa3.FA3Config.l2_groups)
    # Software exp2 (FlashAttention-4's trick) for part of P: of every 8 groups of 8 keys of the S tile, this many
    # (spread: group g when (g * exp2_fma) % 8 < exp2_fma) compute P = 2^x as a degree-3 polynomial on the FMA
    # pipe (_exp2_fma) instead of MUFU.EX2, whose 16 ops/clk/SM limit the D 128 softmax. 0 (default): all MUFU.
    # The choice is by column index, static per register: no branch, the compiler drops the unused path.
    exp2_fma: int = 0
    # With overlap: wait for V_j's tile (an mbarrier try-wait loop, i.e. a basic-block boundary) between the softmax of
    # block j and the wait for PV_{j-1}. Without it ptxas (12.8, Triton 3.6's) hoists that WARPGROUP.DEPBAR (with the
    # V slot's release) above the whole softmax, so each consumer waits for its own PV before its softmax and the
    # intra-warpgroup overlap is lost (SASS of the default). V_j is needed by the next PV anyway; the later wait on it
    # passes at once.
    late_pv_wait: bool = False
    # Row max of S as a tree instead of Triton's in-thread chain. The SASS of the default shows the thread's 32 scores of
    # a row folded by 32 dependent FMNMX (and the second row's chain only after the first row's shuffles): ~150 clocks
    # between S's arrival and the first MUFU.EX2 in which the softmax warp issues almost nothing else. tree_max halves
    # the columns log2(BN / 8) times with elementwise maxima (independent FMNMX of both rows; the halving is on column
    # bits that are register bits of the accumulator layout, a free reshape/permute/split), then reduces the last 8
    # columns as before: same instruction count, the loop's FMNMX dependency chain 8 deep instead of 34. max is exact,
    # so the output is bitwise the default's. (docs/attention_fp8.md, "SASS audit".)
    tree_max: bool = False
    # V^T's keys permuted within every 32-key group (v8 from permute_v_keys): then P's e4m3 bytes are already in the
    # threads the FP8 A operand wants and only two PRMT a register pair move them (no SHFL / SEL: _ACC_TO_A's
    # shuffles were ~11 % of the D 128 loop, docs/attention_fp8.md "SASS audit"); the PV wgmma pairs slot k of a group
    # with key v_key_of_slot(k), which is what v8 holds there (quantize_fp8(..., v_key_perm=True) writes it). Session
    # 27 on the H200: D 256 +2-9 % (the default there since), D 128 -0.3-2.5 % (not taken).
    v_perm: bool = False
    # The output stored from the accumulator's registers (masked global stores, 4 bytes a thread and row chunk) instead
    # of through a shared-memory tile and a TMA store: the tile (block_m x D in the output dtype, 64 KB at D 256) is
    # what keeps D 256 at 2 stages and D 128's 256-key tiles at 2; without it both take a third K/V stage (session 39;
    # measured on an H100: slower, the store costs more than the stage gives; docs/attention_fp8.md)
    o_direct: bool = False

    @property
    def sub_m(self) -> int:
        """Query rows of one consumer (its Q and output TMA boxes)."""
        return self.block_m // self.consumers

    @property
    def num_warps(self) -> int:
        """Warps of the default partition (consumer 0): the launch's num_warps."""
        return 4

    @property
    def worker_consumer_regs(self) -> int:
        return self.consumer_regs or (240 if self.consumers <= 2 else 160)


_C = FA3Fp8Config
# Variants worth timing (benchmarks/attention_fa3_fp8_sweep.py; the GPU tests run each one). Names: pp = ping-pong,
# n<keys> / s<stages> = tile / ring, free = no turns, serial = no intra-warpgroup overlap, 3c = 3 consumers,
# persist = persistent grid, fma<k> = exp2_fma=k (k/8 of P's exp2 on the FMA pipe), late = late_pv_wait (softmax_j
# overlaps PV_{j-1} in the SASS too). n256 tiles need K/V quantized in 256-row blocks (quantize_fp8(..., block_n=256)).
# Left out because ptxas spills in the key loop (sm_90a, 240 registers a consumer thread): 128 x 256 with overlap
# at D 128 (~360 B), 3 consumers at D 128 (160 registers: ~400 B), the persistent grid at D 256 (~300 B), and
# late_pv_wait at D 256 with 128-key tiles (184 B; 304 B causal: O's 128 registers + S + P stay live together).
TUNING_CONFIGS = {
    64: {
        "pp": _C(block_m=128, block_n=128, stages=3),
        "pp3c_m192": _C(block_m=192, block_n=128, stages=3, consumers=3),
        "pp_n256": _C(block_m=128, block_n=256, stages=2),
        "free": _C(block_m=128, block_n=128, stages=3, pingpong=False),
        "pp_vperm": _C(block_m=128, block_n=128, stages=3, v_perm=True),  # as at D 128
    },
    128: {
        "pp": _C(block_m=128, block_n=128, stages=3),
        "pp_s2": _C(block_m=128, block_n=128, stages=2),
        "pp_persist": _C(block_m=128, block_n=128, stages=3, persistent=True),  # causal: 28 B spilled a tile
        "free": _C(block_m=128, block_n=128, stages=3, pingpong=False),
        "pp_serial": _C(block_m=128, block_n=128, stages=3, overlap=False),
        "pp_n256_serial": _C(block_m=128, block_n=256, stages=2, overlap=False),
        "pp_n64_s4": _C(block_m=128, block_n=64, stages=4),
        # MUFU relief (issue #5): 16 / 24 of the 64 exp2 a thread and block as FMA-pipe polynomials (MUFU.EX2 66 ->
        # 50 / 42 a loop iteration, +114 / +172 instructions), the PV wait kept after the softmax, and both
        "pp_fma2": _C(block_m=128, block_n=128, stages=3, exp2_fma=2),
        "pp_fma3": _C(block_m=128, block_n=128, stages=3, exp2_fma=3),
        "pp_late": _C(block_m=128, block_n=128, stages=3, late_pv_wait=True),
        "pp_late_fma2": _C(block_m=128, block_n=128, stages=3, late_pv_wait=True, exp2_fma=2),
        "pp_late_fma3": _C(block_m=128, block_n=128, stages=3, late_pv_wait=True, exp2_fma=3),
        # SASS audit: the row max as a tree (shorter S -> first exp2 latency; bitwise the default's output)
        "pp_tree": _C(block_m=128, block_n=128, stages=3, tree_max=True),
        "pp_flat": _C(block_m=128, block_n=128, stages=3, l2_groups=False),  # the tile order before 2026-12-03
        # session 26: V^T's keys permuted, no shuffles for P (session 27: -2.5 to +0.4 % here, the D 256 default)
        "pp_vperm": _C(block_m=128, block_n=128, stages=3, v_perm=True),
        # session 27 (spill-free full and causal): FA3's FP8 D 128 tile is 128 x 224 (non-power-of-two, out of
        # Gluon's reach); 256 keys without overlap, V^T's keys permuted: +4-6 % over pp full in session 28's sweep,
        # the D 128 default since (K/V in 256-row blocks). (With overlap, 360 B spilled.)
        "pp_n256_serial_vperm": _C(block_m=128, block_n=256, stages=2, overlap=False, v_perm=True),
        # session 38 (compile-checked, not run): three consumers (160 registers: 128-key blocks without overlap fit,
        # with overlap 384 B spill and the wgmma serializes; 256 keys do not compile): a third warpgroup's softmax
        # under the other two's MMAs where the default alternates MUFU and tensor phases (ncu, session 37). Key loop
        # 676 instructions a 128-key block (vperm) against the default's 1146 a 256-key one: +18 % issue a key.
        # Measured in session 39 (an H100, attention-fa3-fp8-sweep-pp3c-h100.json): 4-15 % slower; not taken.
        "pp3c_m192_serial_vperm": _C(block_m=192, block_n=128, stages=3, consumers=3, overlap=False, v_perm=True),
        "pp3c_m192_serial": _C(block_m=192, block_n=128, stages=3, consumers=3, overlap=False),
        # session 39 (compile-checked): the default with a third K/V stage, which fits once the output is stored
        # from registers (o_direct: 213,512 B against 245,760 with its tile), spill-free, key loop 1140 instructions.
        # Session 39 on an H100: 6-11 % slower than the default (the same sweep file); not taken
        "pp_n256_serial_vperm_s3_od": _C(block_m=128, block_n=256, stages=3, overlap=False, v_perm=True,
                                         o_direct=True),
    },
    256: {
        "pp": _C(block_m=128, block_n=128, stages=2),  # causal: 44 B spilled (the diagonal block's mask)
        "pp_n64_s3": _C(block_m=128, block_n=64, stages=3),
        "free": _C(block_m=128, block_n=128, stages=2, pingpong=False),  # causal: as pp
        "pp_serial": _C(block_m=128, block_n=128, stages=2, overlap=False),
        "pp_n64_s3_serial": _C(block_m=128, block_n=64, stages=3, overlap=False),
        # the one spill-free late_pv_wait tile at D 256 (S is 32 registers), 4 stages (229,912 B of shared memory)
        "pp_n64_s4_late": _C(block_m=128, block_n=64, stages=4, late_pv_wait=True),
        "pp_flat": _C(block_m=128, block_n=128, stages=2, l2_groups=False),
        "pp_vperm": _C(block_m=128, block_n=128, stages=2, v_perm=True),  # as at D 128
        # session 39 (compile-checked): the output stored from registers (o_direct), which frees the 64 KB output
        # tile for a third K/V stage (229,896 B); no spill in the key loop (the default has one STL / LDL there),
        # 72 / 84 B (full) and 140 / 236 B (causal) in the epilogue's addresses; key loop 846 instructions (801).
        # _od alone separates the store's cost from the stage's gain. Session 39 on an H100
        # (attention-fa3-fp8-sweep-od256-h100.json): the store costs 8-17 %, the stage gains nothing; not taken.
        "pp_vperm_od": _C(block_m=128, block_n=128, stages=2, v_perm=True, o_direct=True),
        "pp_vperm_s3_od": _C(block_m=128, block_n=128, stages=3, v_perm=True, o_direct=True),
    },
}
# Defaults, (head dim, causal) -> config, from the sweeps. D 256 takes V^T's keys permuted, 128-key tiles causal
# too: session 27's sweep (attention-fa3-fp8-sweep-vperm-h200.json) had pp_vperm 2-9 % over pp, and every sweep
# since 2026-11-29 had pp causal 15-25 % over the 64-key tiles that were the causal default for being spill-free;
# ptxas spills 4 B (full) / 76 B (causal, the diagonal's mask) there, which the compile test holds them to
# (SPILL_ALLOWANCE). D 128 takes 256-key tiles without overlap, V^T's keys permuted (session 28's sweep,
# attention-fa3-fp8-sweep-n256-h200.json: full 4k / 8k / 16k 808 / 840 / 850 TFLOP/s against pp's 764 / 798 / 816,
# causal 650 / 743 / 827 against 648 / 724 / 812); those need K/V quantized in 256-row blocks (QUANT_BLOCK_N).
DEFAULT_CONFIGS = {(64, False): TUNING_CONFIGS[64]["pp"], (64, True): TUNING_CONFIGS[64]["pp"],
                   (128, False): TUNING_CONFIGS[128]["pp_n256_serial_vperm"],
                   (128, True): TUNING_CONFIGS[128]["pp_n256_serial_vperm"],
                   (256, False): TUNING_CONFIGS[256]["pp_vperm"], (256, True): TUNING_CONFIGS[256]["pp_vperm"]}
# For K/V quantization blocks the default's key tile does not divide (D 128 at 128-row blocks, the ops default
# before session 28): the best config of 128-key tiles, its block_n cut further to the block where needed.
SMALL_BLOCK_CONFIGS = {(128, False): TUNING_CONFIGS[128]["pp"], (128, True): TUNING_CONFIGS[128]["pp"]}


def quant_block_n(head_dim: int, causal: bool = False) -> int:
    """The K/V quantization block (rows per scale) the default config wants: its key tile, at least 128
    (ops.quantize_fp8's default)."""
    cfg = DEFAULT_CONFIGS.get((head_dim, bool(causal)))
    return max(128, cfg.block_n) if cfg is not None else 128


def default_config(head_dim: int, quant_block_n: int = 128, causal: bool = False,
                   v_perm: bool | None = None) -> FA3Fp8Config:
    """The default config whose key tile divides the quantization block (e.g. 64 -> 64-key tiles). v_perm: the
    layout of the V^T at hand (True: keys permuted, False: natural order; None: the default's own)."""
    key = (head_dim, bool(causal))
    cfg = DEFAULT_CONFIGS[key]
    if quant_block_n % cfg.block_n:
        cfg = SMALL_BLOCK_CONFIGS.get(key, cfg)
    if quant_block_n % cfg.block_n:
        cfg = replace(cfg, block_n=quant_block_n)
    if v_perm is not None and cfg.v_perm != v_perm:
        cfg = replace(cfg, v_perm=bool(v_perm))
    return cfg


def _out_elem(out_dtype: torch.dtype) -> int:
    return torch.empty((), dtype=out_dtype).element_size()


def smem_bytes(head_dim: int, cfg: FA3Fp8Config, out_dtype: torch.dtype = torch.bfloat16) -> int:
    """Shared memory of one program, about (Triton aligns and adds a few hundred bytes): the fp8 Q slices,
    the fp8 K/V ring, one output tile a consumer (out dtype) and the barriers."""
    n_bars = 4 * cfg.stages + 3 * cfg.consumers
    o_tile = 0 if cfg.o_direct else cfg.block_m * head_dim * _out_elem(out_dtype)
    return head_dim * (cfg.block_m + 2 * cfg.stages * cfg.block_n) + o_tile + 8 * n_bars


def config_error(head_dim: int, cfg: FA3Fp8Config, *, quant_block_n: int | None = None,
                 out_dtype: torch.dtype = torch.bfloat16) -> str | None:
    """Why this config cannot compile, fit an SM, or match these quantization blocks; or None."""
    pow2 = lambda x: x > 0 and x & (x - 1) == 0  # noqa: E731
    if head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim} not in {HEAD_DIMS}"
    if not (pow2(cfg.block_n) and 32 <= cfg.block_n <= 256):
        return f"block_n {cfg.block_n}: a power of two in 32..256 (Gluon shapes; FP8 wgmma's K step is 32)"
    if quant_block_n is not None and quant_block_n % cfg.block_n:
        return (f"block_n {cfg.block_n} must divide the quantization block_n {quant_block_n} (one K/V descale a "
                f"key tile, as the emulation walks them)")
    if cfg.stages < 2:
        return "stages >= 2"
    if cfg.consumers not in (2, 3):
        return f"2 or 3 consumer warpgroups, not {cfg.consumers}"
    if cfg.block_m % cfg.consumers or cfg.sub_m not in (64, 128):
        return f"block_m {cfg.block_m}: {cfg.consumers} slices of 64 or 128 rows"
    if cfg.late_pv_wait and not cfg.overlap:
        return "late_pv_wait orders the overlapped loop (overlap=True)"
    if not 0 <= cfg.exp2_fma <= 8:
        return f"exp2_fma {cfg.exp2_fma}: eighths of P's key groups on the FMA pipe, 0..8"
    if smem_bytes(head_dim, cfg, out_dtype) > SMEM_LIMIT:
        return f"{smem_bytes(head_dim, cfg, out_dtype)} B of shared memory > {SMEM_LIMIT}"
    return None


if HAS_GLUON:
    # the tile order (head groups; the persistent programs' snake) is the bf16 forward's
    from flashscale.kernels.attention_fa3 import _grouped_tile, _program_tiles, _snake_tile

    @gluon.jit
    def _max_combine(a, b):
        return gl.maximum(a, b)

    @gluon.jit
    def _sum_combine(a, b):
        return a + b

    @gluon.jit
    def _tile_info(tile, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   CAUSAL: gl.constexpr):
        """Tile t -> (b, h, K/V head, first query row, key blocks to visit): (batch, head)s in groups of HG,
        heaviest (last) query tiles first within a group (attention_fa3._tile_info, attention_fa3.head_group)."""
        bh, m_blk = _grouped_tile(tile, n_m, BH, HG)
        m0 = m_blk * BLOCK_M
        h = bh % H
        if CAUSAL:  # keys [0, hi) are visible to some row of the tile
            hi = gl.maximum(gl.minimum(seqlen_k, m0 + BLOCK_M + seqlen_k - seqlen_q), 0)
        else:
            hi = seqlen_k
        return bh // H, h, h // GROUP, m0, (hi + BLOCK_N - 1) // BLOCK_N

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                  v_empty, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr):
        """TMA warp (attention_fa3._producer_pp with V^T tiles): per tile, the first K (prefetched during the
        previous tile's epilogue), each consumer's Q slice once released, then the K/V tiles of the ring."""
        it = 0
        t_i = 0
        if PERSISTENT:  # the snake order of attention_fa3._snake_tile
            for kt in range(0, _program_tiles(tile0, n_tiles, tile_step)):
                it, t_i = _producer_next(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                         k_empty, v_ready, v_empty, _snake_tile(kt, tile0, tile_step), it, t_i, n_m,
                                         BH, HG, H, GROUP, seqlen_q, seqlen_k, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                                         CONSUMERS, CAUSAL)
        else:  # one tile a program (the plain loop: the 24-register warp spills with the snake's arithmetic)
            for tile in range(tile0, n_tiles, tile_step):
                it, t_i = _producer_next(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready,
                                         k_empty, v_ready, v_empty, tile, it, t_i, n_m, BH, HG, H, GROUP, seqlen_q,
                                         seqlen_k, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL)

    @gluon.jit
    def _producer_next(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                       v_empty, tile, it, t_i, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, HEAD_DIM: gl.constexpr,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                       CAUSAL: gl.constexpr):
        """The producer's loads of one tile; returns the counters (K/V blocks, tiles) after it."""
        SUB_M: gl.constexpr = BLOCK_M // CONSUMERS
        HKV = H // GROUP
        b, h, hk, m0, n_blocks = _tile_info(tile, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N,
                                            CAUSAL)
        k_col = hk * HEAD_DIM
        v_row = (b * HKV + hk) * HEAD_DIM  # V^T rows of this (batch, K/V head) in the (B * Hkv * D, Sk) view
        if n_blocks > 0:
            s = it % STAGES
            mbarrier.wait(k_empty.index(s), ((it // STAGES) & 1) ^ 1)  # a fresh slot passes at once
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [b, 0, k_col], k_ready.index(s), k_smem.index(s))
        for c in gl.static_range(CONSUMERS):
            mbarrier.wait(q_empty.index(c), (t_i & 1) ^ 1)
            mbarrier.expect(q_ready.index(c), q_desc.block_type.nbytes)
            # a slice wholly past Sq loads rows from Sq - 1 (never stored): no box starts outside the tensor
            q_row = gl.minimum(m0 + c * SUB_M, seqlen_q - 1)
            tma.async_copy_global_to_shared(q_desc, [b, q_row, h * HEAD_DIM], q_ready.index(c), q_smem.index(c))
        for j in range(n_blocks):
            s = (it + j) % STAGES
            free = (((it + j) // STAGES) & 1) ^ 1
            if j > 0:
                mbarrier.wait(k_empty.index(s), free)
                mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(k_desc, [b, j * BLOCK_N, k_col], k_ready.index(s),
                                                k_smem.index(s))
            mbarrier.wait(v_empty.index(s), free)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [v_row, j * BLOCK_N], v_ready.index(s), v_smem.index(s))
        it += n_blocks
        t_i += 1
        return it, t_i

    # FP8 A-operand fix-up (FA3 section 3.3, its permute_Aregs_fp8), per 64 bits = the 8 e4m3 of two adjacent
    # registers R0, R1 of the accumulator layout (registers 4m..4m+3: rows r / r + 8 of the key pair (k, k+1);
    # R1: the same 8 columns on). The A layout wants thread t of a quad to hold keys 4t..4t+3 of a 16-key group,
    # the accumulator gives it 2t, 2t+1, 8+2t, 9+2t: two quad shuffles (lanes 0/3 send R0 first, 1/2 R1) and
    # two byte permutes. Registers 4m..4m+3 then hold exactly what the A layout's registers hold, but the tensor
    # still carries the accumulator's index labels: _relabel_a renames them (a free reshape/permute whose
    # inferred layout is the A layout, checked by convert_layout(assert_trivial=True)).
    # tests/kernels/test_attention_fa3_fp8_compile.py replays this exchange on the linear layouts.
    _ACC_TO_A_ASM = """
    {
    .reg .u32 lane, t, q, sh, lut, su, sl, x1, x2, s1, s2, slo, shi;
    .reg .pred p;
    mov.u32 lane, %laneid;
    and.b32 t, lane, 3;
    and.b32 q, lane, 28;
    shl.b32 sh, t, 2;
    mov.u32 lut, 0x2130;
    shr.u32 su, lut, sh;
    and.b32 su, su, 15;
    or.b32 su, su, q;
    mov.u32 lut, 0x3021;
    shr.u32 sl, lut, sh;
    and.b32 sl, sl, 15;
    or.b32 sl, sl, q;
    setp.eq.u32 p, t, 0;
    setp.eq.or.u32 p, t, 3, p;
    selp.b32 slo, 0x5410, 0x1054, p;
    selp.b32 shi, 0x7632, 0x3276, p;
    PAIRS
    }
    """
    _ACC_TO_A_PAIR = """
    selp.b32 s1, $I0, $I1, p;
    selp.b32 s2, $I1, $I0, p;
    shfl.sync.idx.b32 x1, s1, su, 0x1f, 0xffffffff;
    shfl.sync.idx.b32 x2, s2, sl, 0x1f, 0xffffffff;
    prmt.b32 $O0, x1, x2, slo;
    prmt.b32 $O1, x1, x2, shi;
    """

    # V_PERM: the A operand's slots k = 4t + i (i < 4) of each 16-key half hold the accumulator's own columns
    # 2t + (i & 1) + 8 (i >> 1) of that half: from the thread's registers of column chunks (0, 1) (slots 0-15) and
    # (2, 3) (16-31), bytes (row g, row g + 8) of each; two byte permutes a pair, no lane crossing
    _ACC_TO_A_PERM_PAIR = """
    prmt.b32 $O0, $I0, $I1, 0x5410;
    prmt.b32 $O1, $I0, $I1, 0x7632;
    """

    def _pairs(pair: str, pack: int) -> str:
        """`pair` once for each register pair of a call: outputs $0..$n-1, inputs $n..$2n-1 (n 32-bit registers)."""
        n = pack // 4
        return "".join(pair.replace("$I0", f"${n + 2 * k}").replace("$I1", f"${n + 2 * k + 1}")
                       .replace("$O0", f"${2 * k}").replace("$O1", f"${2 * k + 1}") for k in range(n // 2))

    def _acc_to_a_asm(pack: int) -> str:
        return _ACC_TO_A_ASM.replace("PAIRS", _pairs(_ACC_TO_A_PAIR, pack))

    def _acc_to_a_perm_asm(pack: int) -> str:
        return "{" + _pairs(_ACC_TO_A_PERM_PAIR, pack) + "}"

    # module globals a kernel reads must be constexpr
    _ACC_TO_A_16 = gl.constexpr(_acc_to_a_asm(16))
    _ACC_TO_A_32 = gl.constexpr(_acc_to_a_asm(32))
    _ACC_TO_A_PERM_16 = gl.constexpr(_acc_to_a_perm_asm(16))
    _ACC_TO_A_PERM_32 = gl.constexpr(_acc_to_a_perm_asm(32))
    _CONSTRAINTS_16 = gl.constexpr(",".join(["=r"] * 4 + ["r"] * 4))
    _CONSTRAINTS_32 = gl.constexpr(",".join(["=r"] * 8 + ["r"] * 8))

    @gluon.jit
    def _relabel_a(x, SUB_M: gl.constexpr, BN: gl.constexpr):
        """Rename indices (row bit 3 <- col bit 3, col bits 1, 2, 3 <- row bit 3, col bits 1, 2): the accumulator
        layout's register slots under the FP8 A layout's labels (no data movement)."""
        x8 = x.reshape([SUB_M // 16, 2, 8, BN // 16, 2, 2, 2, 2])  # (r5 r4, r3, r2..r0, c_hi, c3, c2, c1, c0)
        return x8.permute((0, 4, 2, 3, 5, 6, 1, 7)).reshape([SUB_M, BN])

    @gluon.jit
    def _p_to_a(p, p_layout: gl.constexpr, SUB_M: gl.constexpr, BN: gl.constexpr, f8: gl.constexpr,
                V_PERM: gl.constexpr = False):
        """P (SUB_M, BN) fp32 in the wgmma accumulator layout -> e4m3 in the FP8 A-operand layout (registers).
        V_PERM: slot k of a 32-key group gets column v_key_of_slot(k) (V^T's keys stored in that order)."""
        p8 = p.to(f8)  # F2FP: 2 fp32 -> 2 e4m3, merged 4 a register
        if V_PERM:
            if SUB_M * BN >= 128 * 32:
                x = gl.inline_asm_elementwise(_ACC_TO_A_PERM_32, _CONSTRAINTS_32, [p8], dtype=gl.float8e4nv,
                                              is_pure=True, pack=32)
            else:
                x = gl.inline_asm_elementwise(_ACC_TO_A_PERM_16, _CONSTRAINTS_16, [p8], dtype=gl.float8e4nv,
                                              is_pure=True, pack=16)
        elif SUB_M * BN >= 128 * 32:  # 32 e4m3 a thread and a call (amortises the lane arithmetic)
            x = gl.inline_asm_elementwise(_ACC_TO_A_32, _CONSTRAINTS_32, [p8], dtype=gl.float8e4nv, is_pure=False,
                                          pack=32)
        else:
            x = gl.inline_asm_elementwise(_ACC_TO_A_16, _CONSTRAINTS_16, [p8], dtype=gl.float8e4nv, is_pure=False,
                                          pack=16)
        # the same renaming either way: the permuted bytes sit where the shuffled ones would (V_PERM: holding keys
        # v_key_of_slot(k) of the slots k the shuffle would have filled with key k)
        return gl.convert_layout(_relabel_a(x, SUB_M, BN), p_layout, assert_trivial=True)

    _E2_CLAMP = gl.constexpr(EXP2_FMA_CLAMP)
    _E2_ROUND = gl.constexpr(EXP2_FMA_ROUND)
    _E2_C1 = gl.constexpr(EXP2_FMA_POLY[0])
    _E2_C2 = gl.constexpr(EXP2_FMA_POLY[1])
    _E2_C3 = gl.constexpr(EXP2_FMA_POLY[2])

    @gluon.jit
    def _exp2_fma(x):
        """2^x (fp32, x <= 8 here; valid below 128) without MUFU: FMNMX, 3 FADD, 3 FFMA and an integer
        shift-add (module constants EXP2_FMA_*, replayed by exp2_fma_emulated). x <= -127 (-inf) gives +0."""
        x = gl.maximum(x, _E2_CLAMP)
        t = x + _E2_ROUND  # round(x) in the low mantissa bits (round to nearest, |x| < 2^22)
        f = x - (t - _E2_ROUND)  # in [-0.5, 0.5], exact
        p = gl.fma(gl.fma(gl.fma(f, _E2_C3, _E2_C2), f, _E2_C1), f, 1.0)  # 2^f, relative error <= 1.02e-4
        bits = p.to(gl.int32, bitcast=True) + (t.to(gl.int32, bitcast=True) << 23)  # exponent += round(x)
        return bits.to(gl.float32, bitcast=True)

    @gluon.jit
    def _halve_max(x, ROWS: gl.constexpr, N: gl.constexpr):
        """(ROWS, N) -> (ROWS, N / 2): the elementwise max of the two column halves (the top column bit must be a
        register bit of x's layout: the reshape/permute/split is then a relabelling, no data movement)."""
        a, b = x.reshape([ROWS, 2, N // 2]).permute((0, 2, 1)).split()
        return gl.maximum(a, b)

    @gluon.jit
    def _row_max_tree(s, SUB_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """rowmax of s (SUB_M, BLOCK_N) in the wgmma accumulator layout, as a tree: halve the columns down to 8 (column
        bits >= 3 are register bits of that layout), then reduce the 8 (2 in the thread, 4 lanes) as gl.reduce does.
        Exact (max is associative), so bitwise gl.reduce(s, 1, max)."""
        x = s
        if BLOCK_N >= 256:
            x = _halve_max(x, SUB_M, 256)
        if BLOCK_N >= 128:
            x = _halve_max(x, SUB_M, 128)
        if BLOCK_N >= 64:
            x = _halve_max(x, SUB_M, 64)
        if BLOCK_N >= 32:
            x = _halve_max(x, SUB_M, 32)
        x = _halve_max(x, SUB_M, 16)
        return gl.reduce(x, 1, _max_combine)

    @gluon.jit
    def _softmax(s, j, m_i, l_i, rs, rows, off, seqlen_k, cols0, n_full, CAUSAL: gl.constexpr,
                 BLOCK_N: gl.constexpr, EXP2_FMA: gl.constexpr, TREE_MAX: gl.constexpr = False):
        """Online-softmax step on raw scores s (SUB_M, BN) fp32 with the per-row scale rs (log2 units)
        -> p = exp2(s * rs - m + 8) (fp32), alpha, new m, new l. Blocks j >= n_full (the ragged last block, the
        causal diagonal band) mask keys >= Sk and, if CAUSAL, past the diagonal (key > row + Sk - Sq)."""
        if j >= n_full:  # uniform branch
            cols = j * BLOCK_N + cols0
            vis = gl.expand_dims(cols, 0) < seqlen_k
            if CAUSAL:
                vis = vis & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + off)
            s = gl.where(vis, s, float("-inf"))
        # rs > 0 and rounding is monotonic: rowmax(s) * rs == rowmax(s * rs), bit for bit
        if TREE_MAX:
            # the reduced slice layout is the row layout relabelled: the conversion is proven free at compile time
            row_max = gl.convert_layout(_row_max_tree(s, s.shape[0], BLOCK_N), m_i.type.layout, assert_trivial=True)
            m_new = gl.maximum(m_i, row_max * rs)
        else:
            m_new = gl.maximum(m_i, gl.reduce(s, 1, _max_combine) * rs)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # nothing visible yet: no -inf - -inf
        x = s * gl.expand_dims(rs, 1) - gl.expand_dims(m_use - 8.0, 1)  # one FFMA an element
        if EXP2_FMA > 0:
            # key groups of 8 (g = col // 8) with (g * EXP2_FMA) % 8 < EXP2_FMA on the FMA pipe: the column bits
            # >= 3 of the accumulator layout are register bits, so the predicate is a constant per register and
            # each element keeps one of the two paths (the compile test counts MUFU.EX2 in the key loop)
            emu = ((cols0 // 8) * EXP2_FMA) % 8 < EXP2_FMA
            p = gl.where(gl.expand_dims(emu, 0), _exp2_fma(x), gl.exp2(x))
        else:
            p = gl.exp2(x)  # MUFU.EX2
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.reduce(p, 1, _sum_combine)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _consumer_tile(q_tile, o_tile, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                       my_turn, next_turn, o_desc, O, LSE, stride_lb, stride_lh, QD, sqd_b, sqd_h, sqd_n, KD, skd_b,
                       skd_h, skd_n, VD, svd_b, svd_h, svd_n, tile, it, t_i, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k,
                       qk_scale, C: gl.constexpr, FIRST: gl.constexpr, HEAD_DIM: gl.constexpr,
                       BLOCK_M: gl.constexpr, SUB_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                       QBLOCK_M: gl.constexpr, QBLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                       OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr,
                       EXP2_FMA: gl.constexpr, LATE_PV_WAIT: gl.constexpr, TREE_MAX: gl.constexpr,
                       V_PERM: gl.constexpr, O_DIRECT: gl.constexpr):
        """One tile of consumer C (attention_fa3._consumer_pp_tile with FP8 operands and descales). `it` / `t_i`:
        K/V blocks and tiles before this one. Returns the updated it."""
        # FP8 wgmma: instruction K = 32 (256 bits of e4m3); the accumulators are the bf16 kernel's
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 32])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 32])
        # P as the FP8 A operand from registers: 4 e4m3 a 32-bit register (k_width 4)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        f8: gl.constexpr = q_tile.dtype
        q = q_tile.reshape([SUB_M, HEAD_DIM])
        zero_s = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=s_layout)
        cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        off = seqlen_k - seqlen_q

        b, h, hk, m0, n_blocks = _tile_info(tile, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)
        r0 = m0 + C * SUB_M
        if CAUSAL:  # blocks [0, n_full) are visible to every row of this slice: no mask there
            n_full = gl.maximum(gl.minimum(seqlen_k, r0 + off + 1), 0) // BLOCK_N
        else:
            n_full = seqlen_k // BLOCK_N
        rows = r0 + gl.arange(0, SUB_M, layout=row_s)
        # per-row Q descale (any quantization block), times scale * log2 e: the scores' row scale. Descale
        # offsets in int32 (the descale tensors are small): no 64-bit index registers in the key loop.
        qd = gl.load(QD + (b * sqd_b + h * sqd_h) + (rows // QBLOCK_M) * sqd_n, mask=rows < seqlen_q, other=1.0)
        row_scale = qd * qk_scale
        kd_ptr = KD + (b * skd_b + hk * skd_h)
        vd_ptr = VD + (b * svd_b + hk * svd_h)
        m_i = gl.full([SUB_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([SUB_M], gl.float32, layout=row_s)
        acc = gl.zeros([SUB_M, HEAD_DIM], gl.float32, layout=o_layout)
        vd_last = gl.to_tensor(1.0)  # the V descale the accumulator's units are (O = acc * vd_last)
        mbarrier.wait(q_ready.index(C), t_i & 1)
        if OVERLAP:
            # turn (per block j) = {S_j = Q K_j^T, O += P_{j-1} V_{j-1}}
            if n_blocks > 0:
                st = it % STAGES
                kd = gl.load(kd_ptr)
                vd_last = gl.load(vd_ptr)
                mbarrier.wait(k_ready.index(st), (it // STAGES) & 1)
                if PINGPONG:
                    mbarrier.wait(my_turn, (it & 1) ^ FIRST)
                kt = k_smem.index(st).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                tok = warpgroup_mma(q, kt, zero_s, use_acc=False, is_async=True)
                if PINGPONG:
                    mbarrier.arrive(next_turn)
                s = warpgroup_mma_wait(0, deps=(tok, ))
                mbarrier.arrive(k_empty.index(st))
                if n_blocks == 1:
                    mbarrier.arrive(q_empty.index(C))  # last QK^T of the tile retired: Q slice free
                p, alpha, m_i, l_i = _softmax(s, 0, m_i, l_i, row_scale * kd, rows, off, seqlen_k, cols0,
                                              n_full, CAUSAL, BLOCK_N, EXP2_FMA, TREE_MAX)
                # P is carried in fp32 and converted at the top of the next iteration (before its waits): an e4m3
                # tensor carried around the loop would be unpacked to one byte a register by the compiler
                for j in range(1, n_blocks):
                    st = (it + j) % STAGES
                    sv = (it + j - 1) % STAGES
                    p8 = _p_to_a(p, p_layout, SUB_M, BLOCK_N, f8, V_PERM)
                    # this block's descales, loaded before the waits that hide their latency
                    kd = gl.load(kd_ptr + ((j * BLOCK_N) // QBLOCK_N) * skd_n)
                    vd = gl.load(vd_ptr + ((j * BLOCK_N) // QBLOCK_N) * svd_n)
                    mbarrier.wait(k_ready.index(st), ((it + j) // STAGES) & 1)
                    if PINGPONG:
                        mbarrier.wait(my_turn, ((it + j) & 1) ^ FIRST)
                    kt = k_smem.index(st).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                    tok_s = warpgroup_mma(q, kt, zero_s, use_acc=False, is_async=True)
                    mbarrier.wait(v_ready.index(sv), ((it + j - 1) // STAGES) & 1)
                    vt = v_smem.index(sv).permute((1, 0))  # (BN, D) view of the V^T tile: K-major B
                    tok_o = warpgroup_mma(p8, vt, acc, is_async=True)
                    if PINGPONG:
                        mbarrier.arrive(next_turn)
                    s = warpgroup_mma_wait(1, deps=(tok_s, ))  # groups retire in order: S_j done, PV not
                    mbarrier.arrive(k_empty.index(st))
                    if j == n_blocks - 1:
                        mbarrier.arrive(q_empty.index(C))
                    p, alpha, m_i, l_i = _softmax(s, j, m_i, l_i, row_scale * kd, rows, off, seqlen_k,
                                                  cols0, n_full, CAUSAL, BLOCK_N, EXP2_FMA, TREE_MAX)
                    if LATE_PV_WAIT:  # a block boundary: keeps the wgmma wait below after the softmax
                        mbarrier.wait(v_ready.index(st), ((it + j) // STAGES) & 1)
                    acc = warpgroup_mma_wait(0, deps=(tok_o, ))
                    mbarrier.arrive(v_empty.index(sv))
                    # O = O alpha + (P V) vd, with acc = O / vd_{current}: one multiply an element
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha * (vd_last / vd), row_o), 1)
                    vd_last = vd
                # the last PV outside the turns (as FA3): every consumer takes n_blocks turns a tile
                sv = (it + n_blocks - 1) % STAGES
                p8 = _p_to_a(p, p_layout, SUB_M, BLOCK_N, f8, V_PERM)
                mbarrier.wait(v_ready.index(sv), ((it + n_blocks - 1) // STAGES) & 1)
                tok_o = warpgroup_mma(p8, v_smem.index(sv).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(tok_o, ))
                mbarrier.arrive(v_empty.index(sv))
            else:
                mbarrier.arrive(q_empty.index(C))
        else:
            # two turns a block, {S_j} then {O += P_j V_j}
            for j in range(n_blocks):
                st = (it + j) % STAGES
                ph = ((it + j) // STAGES) & 1
                kd = gl.load(kd_ptr + ((j * BLOCK_N) // QBLOCK_N) * skd_n)
                vd = gl.load(vd_ptr + ((j * BLOCK_N) // QBLOCK_N) * svd_n)
                mbarrier.wait(k_ready.index(st), ph)
                if PINGPONG:
                    mbarrier.wait(my_turn, FIRST)  # turn 2 (it + j): even
                kt = k_smem.index(st).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                tok = warpgroup_mma(q, kt, zero_s, use_acc=False, is_async=True)
                if PINGPONG:
                    mbarrier.arrive(next_turn)
                s = warpgroup_mma_wait(0, deps=(tok, ))
                mbarrier.arrive(k_empty.index(st))
                p, alpha, m_i, l_i = _softmax(s, j, m_i, l_i, row_scale * kd, rows, off, seqlen_k, cols0,
                                              n_full, CAUSAL, BLOCK_N, EXP2_FMA, TREE_MAX)
                acc = acc * gl.expand_dims(gl.convert_layout(alpha * (vd_last / vd), row_o), 1)
                vd_last = vd
                p8 = _p_to_a(p, p_layout, SUB_M, BLOCK_N, f8, V_PERM)
                mbarrier.wait(v_ready.index(st), ph)
                if PINGPONG:
                    mbarrier.wait(my_turn, FIRST ^ 1)  # turn 2 (it + j) + 1: odd
                tok_o = warpgroup_mma(p8, v_smem.index(st).permute((1, 0)), acc, is_async=True)
                if PINGPONG:
                    mbarrier.arrive(next_turn)
                acc = warpgroup_mma_wait(0, deps=(tok_o, ))
                mbarrier.arrive(v_empty.index(st))
            mbarrier.arrive(q_empty.index(C))
        it += n_blocks

        # Epilogue: out = acc * vd_last / l; empty rows (l = 0) give 0 and lse = -inf.
        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe) - 8.0) * 0.6931471805599453)
        lse_ptr = LSE + b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh
        gl.store(lse_ptr + rows, lse, mask=rows < seqlen_q)
        out = acc * gl.expand_dims(gl.convert_layout(vd_last / l_safe, row_o), 1)
        if O_DIRECT:  # from the accumulator's registers (masked rows), no shared-memory tile
            ocols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
            orows = r0 + gl.arange(0, SUB_M, layout=row_o)
            # out is (B, Sq, H, D) contiguous (attention_fa3_fp8_fwd allocates it): row r of (b, h) at
            # ((b Sq + r) H + h) D, from values the consumer holds anyway (no strides kept live across the loop)
            o_row = (b.to(gl.int64) * seqlen_q + orows) * H + h
            o_ptrs = O + gl.expand_dims(o_row * HEAD_DIM, 1) + gl.expand_dims(ocols, 0)
            gl.store(o_ptrs, out.to(O.dtype.element_ty), mask=gl.expand_dims(orows < seqlen_q, 1))
        elif r0 < seqlen_q:  # a slice wholly past Sq (its Q loaded from row Sq - 1) stores nothing
            if PERSISTENT:
                tma.store_wait(pendings=0)  # the previous tile's store has read o_tile
            o_tile.reshape([SUB_M, HEAD_DIM]).store(out.to(o_tile.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [b, r0, h * HEAD_DIM], o_tile)  # clips rows >= Sq
            if not PERSISTENT:
                tma.store_wait(pendings=0)
        return it

    @gluon.jit
    def _consumer(q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn,
                  o_desc, O, LSE, stride_lb, stride_lh, QD, sqd_b, sqd_h, sqd_n, KD, skd_b, skd_h, skd_n, VD, svd_b,
                  svd_h, svd_n, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, qk_scale,
                  C: gl.constexpr, CONSUMERS: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, QBLOCK_M: gl.constexpr, QBLOCK_N: gl.constexpr,
                  CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr,
                  EXP2_FMA: gl.constexpr, LATE_PV_WAIT: gl.constexpr, TREE_MAX: gl.constexpr,
                  V_PERM: gl.constexpr, O_DIRECT: gl.constexpr):
        """Consumer C: rows [m0 + C * SUB_M, m0 + (C + 1) * SUB_M) of each tile; turn protocol of
        attention_fa3 (turn t of consumer c waits turn[c] on parity (t & 1) ^ (c == 0))."""
        SUB_M: gl.constexpr = BLOCK_M // CONSUMERS
        FIRST: gl.constexpr = 1 if C == 0 else 0
        my_turn = turn.index(C)
        next_turn = turn.index((C + 1) % CONSUMERS)
        q_tile = q_smem.index(C)
        o_tile = o_smem.index(C)
        if PERSISTENT:
            it = 0
            t_i = 0
            for kt in range(0, _program_tiles(tile0, n_tiles, tile_step)):
                tile = _snake_tile(kt, tile0, tile_step)
                it = _consumer_tile(q_tile, o_tile, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                                    v_empty, my_turn, next_turn, o_desc, O, LSE, stride_lb, stride_lh, QD, sqd_b, sqd_h,
                                    sqd_n, KD, skd_b, skd_h, skd_n, VD, svd_b, svd_h, svd_n, tile, it, t_i, n_m, BH, HG,
                                    H, GROUP, seqlen_q, seqlen_k, qk_scale, C, FIRST, HEAD_DIM, BLOCK_M, SUB_M,
                                    BLOCK_N, STAGES, QBLOCK_M, QBLOCK_N, CAUSAL, OVERLAP, PINGPONG, PERSISTENT,
                                    EXP2_FMA, LATE_PV_WAIT, TREE_MAX, V_PERM, O_DIRECT)
                t_i += 1
            if not O_DIRECT:
                tma.store_wait(pendings=0)
        else:  # one tile a program: constant counters (fewer live registers)
            _consumer_tile(q_tile, o_tile, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                           my_turn, next_turn, o_desc, O, LSE, stride_lb, stride_lh, QD, sqd_b, sqd_h, sqd_n, KD, skd_b,
                           skd_h, skd_n, VD, svd_b, svd_h, svd_n, tile0, 0, 0, n_m, BH, HG, H, GROUP, seqlen_q,
                           seqlen_k, qk_scale, C, FIRST, HEAD_DIM, BLOCK_M, SUB_M, BLOCK_N, STAGES, QBLOCK_M, QBLOCK_N,
                           CAUSAL, OVERLAP, PINGPONG, PERSISTENT, EXP2_FMA, LATE_PV_WAIT, TREE_MAX, V_PERM, O_DIRECT)

    # One binary per (config, head dim, causal, quantization blocks, out dtype): no integer specialisation.
    @gluon.jit(do_not_specialize=["stride_lb", "stride_lh", "sqd_b", "sqd_h", "sqd_n", "skd_b", "skd_h", "skd_n",
                                  "svd_b", "svd_h", "svd_n", "H", "GROUP", "BH", "HG", "seqlen_q", "seqlen_k"])
    def _fa3_fp8_fwd_kernel(q_desc, k_desc, v_desc, o_desc, O, LSE, stride_lb, stride_lh, QD, sqd_b, sqd_h, sqd_n, KD,
                            skd_b, skd_h, skd_n, VD, svd_b, svd_h, svd_n, H, GROUP, BH, HG, seqlen_q, seqlen_k,
                            qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            STAGES: gl.constexpr, QBLOCK_M: gl.constexpr, QBLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                            OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, CONSUMERS: gl.constexpr,
                            PERSISTENT: gl.constexpr, EXP2_FMA: gl.constexpr, LATE_PV_WAIT: gl.constexpr,
                            TREE_MAX: gl.constexpr, V_PERM: gl.constexpr, O_DIRECT: gl.constexpr,
                            PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
        f8: gl.constexpr = q_desc.dtype
        n_m = (seqlen_q + BLOCK_M - 1) // BLOCK_M
        n_tiles = n_m * BH
        tile0 = gl.program_id(0)
        if PERSISTENT:
            tile_step = gl.num_programs(0)
        else:
            tile_step = n_tiles  # one tile a program
        q_smem = gl.allocate_shared_memory(f8, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
        if O_DIRECT:  # no output tiles in shared memory (the consumers store from registers); o_smem unused
            o_smem = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS, 1, 8, 8],
                                               gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        else:
            o_smem = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS] + o_desc.block_type.shape, o_desc.layout)
        k_smem = gl.allocate_shared_memory(f8, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(f8, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(CONSUMERS):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=1)
            mbarrier.init(turn.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=CONSUMERS)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=CONSUMERS)
        if CONSUMERS == 2:
            gl.warp_specialize([
                (_consumer, (q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                             turn, o_desc, O, LSE, stride_lb, stride_lh, QD, sqd_b, sqd_h, sqd_n, KD, skd_b, skd_h,
                             skd_n, VD, svd_b, svd_h, svd_n, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q,
                             seqlen_k, qk_scale, 0, CONSUMERS, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, QBLOCK_M, QBLOCK_N,
                             CAUSAL, OVERLAP, PINGPONG, PERSISTENT, EXP2_FMA, LATE_PV_WAIT, TREE_MAX, V_PERM,
                             O_DIRECT)),
                (_consumer, (q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                             turn, o_desc, O, LSE, stride_lb, stride_lh, QD, sqd_b, sqd_h, sqd_n, KD, skd_b, skd_h,
                             skd_n, VD, svd_b, svd_h, svd_n, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q,
                             seqlen_k, qk_scale, 1, CONSUMERS, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, QBLOCK_M, QBLOCK_N,
                             CAUSAL, OVERLAP, PINGPONG, PERSISTENT, EXP2_FMA, LATE_PV_WAIT, TREE_MAX, V_PERM,
                             O_DIRECT)),
                (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty,
                             v_ready, v_empty, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k,
                             HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, PERSISTENT)),
            ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
        else:
            gl.static_assert(CONSUMERS == 3, "2 or 3 consumer warpgroups")
            gl.warp_specialize([
                (_consumer, (q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                             turn, o_desc, O, LSE, stride_lb, stride_lh, QD, sqd_b, sqd_h, sqd_n, KD, skd_b, skd_h,
                             skd_n, VD, svd_b, svd_h, svd_n, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q,
                             seqlen_k, qk_scale, 0, CONSUMERS, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, QBLOCK_M, QBLOCK_N,
                             CAUSAL, OVERLAP, PINGPONG, PERSISTENT, EXP2_FMA, LATE_PV_WAIT, TREE_MAX, V_PERM,
                             O_DIRECT)),
                (_consumer, (q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                             turn, o_desc, O, LSE, stride_lb, stride_lh, QD, sqd_b, sqd_h, sqd_n, KD, skd_b, skd_h,
                             skd_n, VD, svd_b, svd_h, svd_n, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q,
                             seqlen_k, qk_scale, 1, CONSUMERS, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, QBLOCK_M, QBLOCK_N,
                             CAUSAL, OVERLAP, PINGPONG, PERSISTENT, EXP2_FMA, LATE_PV_WAIT, TREE_MAX, V_PERM,
                             O_DIRECT)),
                (_consumer, (q_smem, o_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                             turn, o_desc, O, LSE, stride_lb, stride_lh, QD, sqd_b, sqd_h, sqd_n, KD, skd_b, skd_h,
                             skd_n, VD, svd_b, svd_h, svd_n, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q,
                             seqlen_k, qk_scale, 2, CONSUMERS, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, QBLOCK_M, QBLOCK_N,
                             CAUSAL, OVERLAP, PINGPONG, PERSISTENT, EXP2_FMA, LATE_PV_WAIT, TREE_MAX, V_PERM,
                             O_DIRECT)),
                (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty,
                             v_ready, v_empty, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k,
                             HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, PERSISTENT)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


_GL_DTYPES = {}


def _gl_dtype(dtype: torch.dtype):
    if not _GL_DTYPES:
        _GL_DTYPES.update({torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32,
                           E4M3: gl.float8e4nv})
    return _GL_DTYPES[dtype]


def _layout(shape, dtype: torch.dtype):
    """NVMMA (swizzled) shared layout of a TMA box, as wgmma reads it."""
    return gl.NVMMASharedLayout.get_default_for(list(shape), _gl_dtype(dtype))


def unsupported(q8, k8, v8, q_descale=None, k_descale=None, v_descale=None, *, causal: bool = False,
                block_m: int = 128, block_n: int = 128, out_dtype: torch.dtype = torch.bfloat16,
                config: FA3Fp8Config | None = None, v_key_perm: bool = False) -> str | None:
    """Why attention_fa3_fp8_fwd cannot run these inputs, or None. Shapes and dtypes beyond what this
    kernel needs are validated by flashscale.ops.attention_fp8_quantized."""
    if not all(isinstance(t, torch.Tensor) for t in (q8, k8, v8)):
        return "q8, k8, v8 must be tensors"
    if q8.dim() != 4 or k8.dim() != 4 or v8.dim() != 4:
        return "fa3 fp8 takes q8 (B, Sq, H, D), k8 (B, Sk, Hkv, D), v8 transposed (B, Hkv, D, Sk_pad)"
    B, Sq, H, D = q8.shape
    Sk, Hkv = k8.shape[1], k8.shape[2]
    if D not in HEAD_DIMS:
        return f"head_dim={D}: fa3 fp8 takes 64, 128 or 256"
    if k8.shape[0] != B or k8.shape[3] != D or Hkv == 0 or H % Hkv:
        return f"k8 {tuple(k8.shape)} does not fit q8 {tuple(q8.shape)}"
    if tuple(v8.shape[:3]) != (B, Hkv, D) or v8.shape[3] < Sk:
        return f"v8 must be (B, Hkv, D, >= Sk) = ({B}, {Hkv}, {D}, >= {Sk}); got {tuple(v8.shape)}"
    if any(t.dtype != E4M3 for t in (q8, k8, v8)):
        return "q8, k8, v8 must be float8_e4m3fn"
    if out_dtype not in OUT_DTYPES:
        return f"out_dtype {out_dtype}: bfloat16, float16 or float32"
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device != q8.device):
            return f"{name} must be a float32 tensor on {q8.device}"
    if not (q8.is_cuda and k8.is_cuda and v8.is_cuda) or capability(q8.device)[0] != 9:
        return f"fa3 fp8 needs a Hopper GPU (compute capability 9.x); q8 is on {q8.device}"
    if not HAS_GLUON:
        return "fa3 fp8 needs triton.experimental.gluon with warp_specialize (Triton >= 3.6)"
    if not (q8.is_contiguous() and k8.is_contiguous()):
        return "fa3 fp8 needs contiguous q8 and k8"
    if v8.stride(3) != 1 or v8.stride(2) % 16 or v8.stride(1) != D * v8.stride(2) or v8.stride(0) != Hkv * v8.stride(1):
        return "fa3 fp8 needs v8 (B, Hkv, D, Sk_pad) row-major with rows 16-byte aligned (Sk_pad % 16 == 0)"
    if any(t.data_ptr() % 16 for t in (q8, k8, v8)):
        return "fa3 fp8 needs 16-byte aligned q8, k8, v8"
    cfg = config or default_config(D, block_n, causal, v_perm=bool(v_key_perm))
    if cfg.v_perm != bool(v_key_perm):
        return (f"config.v_perm={cfg.v_perm} reads V^T's keys {'permuted' if cfg.v_perm else 'in natural order'} "
                f"but v_key_perm={bool(v_key_perm)} says v8 holds them {'permuted' if v_key_perm else 'in order'}")
    if cfg.v_perm and v8.shape[3] < padded_len(Sk, 32):
        return (f"v_key_perm: v8 must hold whole 32-key groups (permute_v_keys), >= {padded_len(Sk, 32)} keys; got "
                f"{v8.shape[3]}")
    return config_error(D, cfg, quant_block_n=block_n, out_dtype=out_dtype)


def supported(q8, k8, v8, q_descale=None, k_descale=None, v_descale=None, **kw) -> bool:
    """Whether attention_fa3_fp8_fwd can run these inputs (see unsupported)."""
    return unsupported(q8, k8, v8, q_descale, k_descale, v_descale, **kw) is None


def attention_fa3_fp8_fwd(q8, k8, v8, q_descale, k_descale, v_descale, *, causal: bool = False,
                          softmax_scale: float | None = None, block_m: int = 128, block_n: int = 128,
                          out_dtype: torch.dtype = torch.bfloat16, config: FA3Fp8Config | None = None,
                          v_key_perm: bool = False):
    """out (B, Sq, H, D) in out_dtype and lse (B, H, Sq) fp32 of the FP8 forward (module docstring).

    Arguments as flashscale.ops.attention_fp8_quantized: q8 (B, Sq, H, D), k8 (B, Sk, Hkv, D), v8 transposed
    (B, Hkv, D, Sk_pad) e4m3; q_descale (B, H, ceil(Sq / block_m)), k/v_descale (B, Hkv, ceil(Sk / block_n))
    fp32; block_m / block_n the quantization blocks. config: an FA3Fp8Config (default_config(D, block_n, causal,
    v_key_perm)). v_key_perm: v8's keys permuted within 32-key groups (permute_v_keys; quantize_fp8(...,
    v_key_perm=True)), which configs with v_perm read and the others do not."""
    why = unsupported(q8, k8, v8, q_descale, k_descale, v_descale, causal=causal, block_m=block_m,
                      block_n=block_n, out_dtype=out_dtype, config=config, v_key_perm=v_key_perm)
    if why is not None:
        raise ValueError(f"attention_fa3_fp8_fwd: {why}")
    B, Sq, H, D = q8.shape
    out = torch.empty((B, Sq, H, D), dtype=out_dtype, device=q8.device)
    lse = torch.empty((B, H, Sq), device=q8.device, dtype=torch.float32)
    if B == 0 or Sq == 0 or H == 0:
        return out, lse
    if k8.shape[1] == 0:  # no keys: every row is empty (and a TMA box needs a non-empty tensor)
        return out.zero_(), lse.fill_(float("-inf"))
    grid, args, constexprs = _launch(q8, k8, v8, q_descale, k_descale, v_descale, out, lse, causal, softmax_scale,
                                     block_m, block_n, config, v_key_perm)
    _fa3_fp8_fwd_kernel[grid](*args, **constexprs)
    return out, lse


def precompile(q8, k8, v8, q_descale, k_descale, v_descale, *, causal: bool = False, block_m: int = 128,
               block_n: int = 128, out_dtype: torch.dtype = torch.bfloat16,
               config: FA3Fp8Config | None = None, v_key_perm: bool = False) -> None:
    """Compile (into Triton's cache, without launching) the kernel attention_fa3_fp8_fwd would run."""
    why = unsupported(q8, k8, v8, q_descale, k_descale, v_descale, causal=causal, block_m=block_m,
                      block_n=block_n, out_dtype=out_dtype, config=config, v_key_perm=v_key_perm)
    if why is not None:
        raise ValueError(f"precompile: {why}")
    B, Sq, H, D = q8.shape
    out = torch.empty((B, Sq, H, D), dtype=out_dtype, device=q8.device)
    lse = torch.empty((B, H, Sq), device=q8.device, dtype=torch.float32)
    grid, args, constexprs = _launch(q8, k8, v8, q_descale, k_descale, v_descale, out, lse, causal, None, block_m,
                                     block_n, config, v_key_perm)
    _fa3_fp8_fwd_kernel.warmup(*args, grid=grid, **constexprs)


def _launch(q8, k8, v8, qd, kd, vd, out, lse, causal, softmax_scale, block_m, block_n, config, v_key_perm):
    """(grid, arguments, constexprs) of the kernel for non-empty inputs."""
    B, Sq, H, D = q8.shape
    Sk, Hkv = k8.shape[1], k8.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    cfg = config or default_config(D, block_n, causal, bool(v_key_perm))
    sub = cfg.sub_m
    # (B, S, heads * D) views: the box (1, rows, D) at [b, row, head * D] stays inside batch b, so TMA
    # zero-fills rows past this sequence's end and clips stores there.
    q_desc = TensorDescriptor(q8, [B, Sq, H * D], [Sq * H * D, H * D, 1], [1, sub, D], _layout([1, sub, D], E4M3))
    o_desc = TensorDescriptor(out, [B, Sq, H * D], [Sq * H * D, H * D, 1], [1, sub, D],
                              _layout([1, sub, D], out.dtype))
    k_desc = TensorDescriptor(k8, [B, Sk, Hkv * D], [Sk * Hkv * D, Hkv * D, 1], [1, cfg.block_n, D],
                              _layout([1, cfg.block_n, D], E4M3))
    # V^T as a 2-D (B * Hkv * D, Sk) view: columns >= Sk (the padding) read as zeros. With v_perm the keys of the
    # last 32-key group sit anywhere in it: the view spans the whole group (permute_v_keys zero-fills the padding)
    v_cols = padded_len(Sk, 32) if cfg.v_perm else Sk
    v_desc = TensorDescriptor(v8, [B * Hkv * D, v_cols], [v8.stride(2), 1], [D, cfg.block_n],
                              _layout([D, cfg.block_n], E4M3))
    n_m = triton.cdiv(Sq, cfg.block_m)
    n_sms = _num_sms(q8.device)
    grid = (min(n_m * B * H, n_sms), ) if cfg.persistent else (n_m * B * H, )
    args = (q_desc, k_desc, v_desc, o_desc, out, lse, lse.stride(0), lse.stride(1), qd, *qd.stride(), kd, *kd.stride(),
            vd, *vd.stride(), H, H // Hkv, B * H, head_group(B * H, n_m, n_sms, cfg.l2_groups), Sq, Sk,
            float(scale) * LOG2E)
    return grid, args, _constexprs(D, bool(causal), cfg, block_m, block_n)


def _constexprs(head_dim: int, causal: bool, cfg: FA3Fp8Config, block_m: int, block_n: int) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "STAGES": cfg.stages,
            "QBLOCK_M": block_m, "QBLOCK_N": block_n, "CAUSAL": causal, "OVERLAP": cfg.overlap,
            "PINGPONG": cfg.pingpong, "CONSUMERS": cfg.consumers, "PERSISTENT": cfg.persistent,
            "EXP2_FMA": cfg.exp2_fma, "LATE_PV_WAIT": cfg.late_pv_wait, "TREE_MAX": cfg.tree_max,
            "V_PERM": cfg.v_perm, "O_DIRECT": cfg.o_direct,
            "PRODUCER_REGS": cfg.producer_regs, "CONSUMER_REGS": cfg.worker_consumer_regs, "num_warps": cfg.num_warps}


def compile_sm90(head_dim: int, causal: bool, *, config: FA3Fp8Config | None = None, block_m: int = 128,
                 block_n: int | None = None, out_dtype: torch.dtype = torch.bfloat16):
    """Ahead-of-time compile for sm_90 (no GPU needed: Triton ships ptxas). block_n: the quantization block
    (default: max(128, config.block_n)). Returns triton's CompiledKernel (.asm["ptx"], .asm["cubin"],
    .metadata.shared). For tests and tools."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = config or DEFAULT_CONFIGS[(head_dim, bool(causal))]
    qbn = block_n or max(128, cfg.block_n)
    bad = config_error(head_dim, cfg, quant_block_n=qbn, out_dtype=out_dtype)
    if bad is not None:
        raise ValueError(f"compile_sm90: {cfg}: {bad}")
    oty = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[out_dtype]

    def desc(ty, shape, dtype):
        return f"tensordesc<{ty}[{','.join(map(str, shape))}],{_layout(shape, dtype)!r}>"

    sub, D = cfg.sub_m, head_dim
    signature = {"q_desc": desc("fp8e4nv", [1, sub, D], E4M3), "k_desc": desc("fp8e4nv", [1, cfg.block_n, D], E4M3),
                 "v_desc": desc("fp8e4nv", [D, cfg.block_n], E4M3), "o_desc": desc(oty, [1, sub, D], out_dtype),
                 "O": f"*{oty}", "LSE": "*fp32", "stride_lb": "i32", "stride_lh": "i32",
                 "QD": "*fp32", "sqd_b": "i32", "sqd_h": "i32", "sqd_n": "i32",
                 "KD": "*fp32", "skd_b": "i32", "skd_h": "i32", "skd_n": "i32",
                 "VD": "*fp32", "svd_b": "i32", "svd_h": "i32", "svd_n": "i32",
                 "H": "i32", "GROUP": "i32", "BH": "i32", "HG": "i32", "seqlen_q": "i32", "seqlen_k": "i32", "qk_scale": "fp32"}
    constexprs = _constexprs(head_dim, bool(causal), cfg, block_m, qbn)
    signature.update({name: "constexpr" for name in constexprs})
    src = GluonASTSource(fn=_fa3_fp8_fwd_kernel, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})
