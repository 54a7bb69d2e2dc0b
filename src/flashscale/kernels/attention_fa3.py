"""FlashAttention-3-style forward for Hopper (sm_90) in Gluon: TMA, mbarriers, warp specialization, wgmma.

Same semantics as flashscale.reference.attention (dense layout, no extras): q (B, Sq, H, D),
k/v (B, Sk, Hkv, D) with H % Hkv == 0, out like q, lse (B, H, Sq) float32 in natural log; causal aligned
bottom-right (query i sees key j iff j <= i + Sk - Sq); rows that see no key give out = 0, lse = -inf.

One program = one (BLOCK_M, D) query tile of one (batch, head). Partitions (gl.warp_specialize):
  * producer, 1 warp, few registers: TMA-loads the Q tile once, then K and V tiles into a STAGES-deep
    ring in shared memory. Each slot has four mbarriers: k_ready/v_ready (TMA transaction bytes landed)
    and k_empty/v_empty (the consumers finished reading it). K and V have their own barriers so the
    next K can land while the current V is still being multiplied.
  * consumers, the default partition, num_warps = 4 * CONSUMERS warps: S = Q K^T and O += P V on
    warpgroup MMA (wgmma, operands from shared memory; P from registers, FA3's RS-GEMM), online softmax
    in exp2 with the scale folded in, the division by the row sum l once at the end (FA2).
  * OVERLAP (FA3's intra-warpgroup pipelining): S_{j+1} = Q K_{j+1}^T is issued (async) before the
    softmax of block j runs, so the tensor cores work while the exp2/max/sum of the previous block run.

Masking: the TMA box is bounded by this batch's sequence (a 3-D descriptor (B, S, heads * D)), so rows
past Sq/Sk read as zeros and out-of-range output rows are clipped by the TMA store; scores of keys >= Sk
(and past the causal diagonal) are set to -inf only in the blocks that need it (j >= n_full).

Shapes: B batch, S sequence, H query heads, G = H // Hkv, D head dim (64, 128 or 256).
Phase convention: the j-th use of ring slot s = j % STAGES completes barrier phase (j // STAGES) & 1.
A waiter for "slot free" waits on the opposite parity, which a freshly initialised barrier passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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

    block_m: int = 128
    block_n: int = 128
    stages: int = 2
    consumers: int = 2  # consumer warpgroups (64 query rows each at block_m = 128)
    overlap: bool = True  # issue QK^T of block j+1 before the softmax of block j
    producer_regs: int = 24  # setmaxnreg budget of the TMA warp


DEFAULT_CONFIGS = {
    64: FA3Config(block_m=128, block_n=128, stages=3),
    128: FA3Config(block_m=128, block_n=128, stages=2),
    256: FA3Config(block_m=128, block_n=64, stages=2),
}


def smem_bytes(head_dim: int, cfg: FA3Config, elem: int = 2) -> int:
    """Shared memory of one program, about (Triton aligns and adds a few hundred bytes): the Q tile (reused
    for the output tile) + the K/V ring + barriers."""
    return elem * head_dim * (cfg.block_m + 2 * cfg.stages * cfg.block_n) + 8 * (1 + 4 * cfg.stages)


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
                 BLOCK_N: gl.constexpr):
        """Online-softmax step on raw scores s (BM, BN) fp32 -> p (unnormalised), alpha, new m, new l."""
        s = s * qk_scale  # log2 units
        if j >= n_full:  # ragged last block or the causal diagonal band: mask (uniform branch)
            cols = j * BLOCK_N + cols0
            vis = gl.expand_dims(cols, 0) < seqlen_k
            if CAUSAL:
                vis = vis & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + off)
            s = gl.where(vis, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.reduce(s, 1, _max_combine))
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
                  CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, num_warps: gl.constexpr):
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
                                              CAUSAL, BLOCK_N)
                for j in range(1, n_blocks):
                    # tensor cores: S_j = Q K_j^T, then O += P_{j-1} V_{j-1}; CUDA cores meanwhile wait
                    # only for S_j and run its softmax while the PV product is still in flight
                    tok_s = _qk(q, k_smem, k_ready, j, zero_s, BLOCK_N, HEAD_DIM, STAGES)
                    tok_o = _pv(acc, p, alpha, v_smem, v_ready, j - 1, row_o, p_layout, BLOCK_N, HEAD_DIM, STAGES)
                    s = warpgroup_mma_wait(1, deps=(tok_s, ))  # wgmma groups retire in order: S_j done
                    mbarrier.arrive(k_empty.index(j % STAGES), count=1)
                    p, alpha, m_i, l_i = _softmax(s, j, m_i, l_i, n_full, rows, cols0, seqlen_k, off, qk_scale,
                                                  CAUSAL, BLOCK_N)
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
                                              CAUSAL, BLOCK_N)
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

    @gluon.jit
    def _fa3_fwd_kernel(q_desc, k_desc, v_desc, o_desc, LSE, stride_lb, stride_lh, H, GROUP, seqlen_q, seqlen_k,
                        qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
                        PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
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

        dtype: gl.constexpr = q_desc.dtype
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
            (_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, o_desc, lse_ptr, b, m0,
                         q_col, n_blocks, n_full, seqlen_q, seqlen_k, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                         CAUSAL, OVERLAP, num_warps)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                         b, m0, q_col, k_col, n_blocks, BLOCK_N, STAGES)),
        ], [1], [PRODUCER_REGS])


def _gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]


def tile_layout(block_rows: int, head_dim: int, dtype: torch.dtype):
    """NVMMA (128-byte swizzled) shared layout of a (1, rows, D) TMA box, as wgmma reads it."""
    return gl.NVMMASharedLayout.get_default_for([1, block_rows, head_dim], _gl_dtype(dtype))


def unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, need_contiguous: bool = True) -> str | None:
    """Why attention_fa3_fwd cannot run these inputs, or None (dense, 16-bit, Hopper, D in 64/128/256,
    16-byte aligned as TMA reads them, and with need_contiguous: contiguous)."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return "q, k, v must be tensors"
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        return "fa3 takes the dense layout q (B, Sq, H, D), k and v (B, Sk, Hkv, D)"
    B, Sq, H, D = q.shape
    if D not in HEAD_DIMS:
        return f"head_dim={D}: fa3 takes 64, 128 or 256"
    if k.shape[0] != B or k.shape[3] != D or k.shape[2] == 0 or H % k.shape[2]:
        return f"k/v {tuple(k.shape)} do not fit q {tuple(q.shape)} (same batch and head_dim, H % Hkv == 0)"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype}: fa3 takes float16 or bfloat16"
    if not (q.is_cuda and k.is_cuda and v.is_cuda) or torch.cuda.get_device_capability(q.device)[0] != 9:
        return f"fa3 needs a Hopper GPU (compute capability 9.x); q is on {q.device}"
    if not HAS_GLUON:
        return "fa3 needs triton.experimental.gluon with warp_specialize (Triton >= 3.6)"
    if need_contiguous and not all(t.is_contiguous() for t in (q, k, v)):
        return "fa3 needs contiguous q, k, v"
    if any(t.is_contiguous() and t.data_ptr() % 16 for t in (q, k, v)):  # a contiguous one is used as it is
        return "fa3 needs 16-byte aligned q, k, v"
    return None


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether attention_fa3_fwd can run these inputs (see unsupported)."""
    return unsupported(q, k, v) is None


def attention_fa3_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                      softmax_scale: float | None = None, config: FA3Config | None = None):
    """out (B, Sq, H, D), lse (B, H, Sq) fp32 of softmax(scale * q k^T) v; see the module docstring."""
    why = unsupported(q, k, v)
    if why is not None:
        raise ValueError(f"attention_fa3_fwd: {why}")
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else D ** -0.5
    out = torch.empty_like(q)
    lse = torch.empty((B, H, Sq), device=q.device, dtype=torch.float32)
    if B == 0 or Sq == 0 or H == 0:
        return out, lse
    if Sk == 0:  # no keys: every row is empty (and a TMA box needs a non-empty tensor)
        return out.zero_(), lse.fill_(float("-inf"))
    cfg = config or DEFAULT_CONFIGS[D]
    q_lay, kv_lay = tile_layout(cfg.block_m, D, q.dtype), tile_layout(cfg.block_n, D, q.dtype)
    # (B, S, heads * D) views: the box (1, rows, D) at [b, row, head * D] stays inside batch b, so TMA
    # zero-fills rows past this sequence's end and clips stores there.
    q_desc = TensorDescriptor(q, [B, Sq, H * D], [Sq * H * D, H * D, 1], [1, cfg.block_m, D], q_lay)
    o_desc = TensorDescriptor(out, [B, Sq, H * D], [Sq * H * D, H * D, 1], [1, cfg.block_m, D], q_lay)
    k_desc = TensorDescriptor(k, [B, Sk, Hkv * D], [Sk * Hkv * D, Hkv * D, 1], [1, cfg.block_n, D], kv_lay)
    v_desc = TensorDescriptor(v, [B, Sk, Hkv * D], [Sk * Hkv * D, Hkv * D, 1], [1, cfg.block_n, D], kv_lay)
    grid = (triton.cdiv(Sq, cfg.block_m), B * H)
    _fa3_fwd_kernel[grid](q_desc, k_desc, v_desc, o_desc, lse, lse.stride(0), lse.stride(1), H, H // Hkv, Sq, Sk,
                          float(scale) * LOG2E, HEAD_DIM=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                          STAGES=cfg.stages, CAUSAL=bool(causal), OVERLAP=cfg.overlap,
                          PRODUCER_REGS=cfg.producer_regs, num_warps=4 * cfg.consumers)
    return out, lse


def compile_sm90(head_dim: int, causal: bool, *, dtype: torch.dtype = torch.bfloat16,
                 config: FA3Config | None = None):
    """Ahead-of-time compile for sm_90 (needs no GPU: Triton ships ptxas). Returns triton's CompiledKernel
    (.asm["ptx"], .asm["cubin"], .metadata.shared, .n_regs/.n_spills once loaded). For tests and tools."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = config or DEFAULT_CONFIGS[head_dim]
    ty = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]

    def desc(rows):
        return f"tensordesc<{ty}[1,{rows},{head_dim}],{tile_layout(rows, head_dim, dtype)!r}>"

    signature = {"q_desc": desc(cfg.block_m), "k_desc": desc(cfg.block_n), "v_desc": desc(cfg.block_n),
                 "o_desc": desc(cfg.block_m), "LSE": "*fp32", "stride_lb": "i32", "stride_lh": "i32", "H": "i32",
                 "GROUP": "i32", "seqlen_q": "i32", "seqlen_k": "i32", "qk_scale": "fp32"}
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "STAGES": cfg.stages,
                  "CAUSAL": bool(causal), "OVERLAP": cfg.overlap, "PRODUCER_REGS": cfg.producer_regs,
                  "num_warps": 4 * cfg.consumers}
    signature.update({name: "constexpr" for name in constexprs})
    src = GluonASTSource(fn=_fa3_fwd_kernel, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4 * cfg.consumers})
