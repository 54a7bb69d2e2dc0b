"""Configs of the FP8 FA3 forward (kernels/attention_fa3_fp8.py): FA3Fp8Config, the tuned variants and the
defaults a head dim takes (TUNING_CONFIGS, DEFAULT_CONFIGS), the quantization block they want, and the static
checks of a config (shared memory, tile shapes). Plain Python and torch, no Triton: ops and the benchmarks pick
a config here, and the kernel modules only read one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

E4M3 = torch.float8_e4m3fn
LOG2E = 1.4426950408889634
P_SHIFT_LOG2 = 8.0  # flashscale.reference.attention_fp8.P_SHIFT_LOG2 (FA3's Max_offset)
HEAD_DIMS = (64, 128, 256)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SMEM_LIMIT = 232_448  # H100/H200: 227 KB the most one block may take


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
