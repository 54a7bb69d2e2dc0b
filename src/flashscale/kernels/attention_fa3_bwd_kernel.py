"""The single-partition Gluon kernel of the FA3-style backward (_fa3_bwd_kernel, FA3BwdConfig(ws=False)) and its
helpers; _kv_block is shared with the warp-specialized variant (attention_fa3_bwd_ws). Apart from the configs and
the launcher (attention_fa3_bwd.py, where the semantics are) so that the JIT code and its globals sit in one module,
under the same Gluon import guard.

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
"""

from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)

    HAS_GLUON = hasattr(gl, "warp_specialize")
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False


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
