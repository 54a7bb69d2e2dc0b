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

import torch

from flashscale.kernels.attention_fa3_config import (DEFAULT_CONFIGS, HEAD_DIMS, SEQLEN_CONFIGS, SMEM_LIMIT,
                                                     TUNING_CONFIGS, FA3Config, config_error, default_config,
                                                     smem_bytes)
from flashscale.kernels.attention_fa3_sched import (head_group, program_tiles, tile_order, varlen_block_bound,
                                                    varlen_find, varlen_schedule)
from flashscale.kernels.attention_tune import capability, dummy_i32
from flashscale.kernels.launch import launch, tensor_desc

try:  # Gluon is experimental: absent from older Tritons, and its API moves between releases
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = hasattr(gl, "warp_specialize")
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False

if HAS_GLUON:
    from flashscale.kernels.attention_fa3_kernels import _fa3_fwd_kernel, _fa3_fwd_varlen_kernel
    # the tile order the FP8 forward shares (kernels/attention_fa3_fp8.py imports it from here)
    from flashscale.kernels.attention_fa3_sched import _grouped_tile, _program_tiles, _snake_tile

# What other modules import from here, wherever its code lives (the configs: attention_fa3_config.py; the tile
# order and varlen bookkeeping: attention_fa3_sched.py; the Gluon kernels: attention_fa3_coop.py,
# attention_fa3_pingpong.py, attention_fa3_kernels.py).
__all__ = ["DEFAULT_CONFIGS", "FA3Config", "HAS_GLUON", "HEAD_DIMS", "LOG2E", "SEQLEN_CONFIGS", "SMEM_LIMIT",
           "TUNING_CONFIGS", "attention_fa3_fwd", "compile_sm90", "config_error", "default_config", "fwd_unchecked",
           "head_group", "precompile", "program_tiles", "smem_bytes", "supported", "tile_layout", "tile_order",
           "unsupported", "varlen_block_bound", "varlen_find", "varlen_schedule", "_num_sms"]
if HAS_GLUON:
    __all__ += ["_fa3_fwd_kernel", "_fa3_fwd_varlen_kernel", "_grouped_tile", "_program_tiles", "_snake_tile"]

LOG2E = 1.4426950408889634


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


@functools.lru_cache(maxsize=None)  # on every launch
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


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
