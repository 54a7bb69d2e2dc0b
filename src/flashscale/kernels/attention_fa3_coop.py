"""Gluon partitions of the FA3-style forward's cooperative layout (FA3Config.pingpong=False: one producer warp,
one 4 * CONSUMERS-warp consumer partition) and the helpers both consumer layouts share: the row-reduction
combiners, the S = Q K^T and O += P V issues (_qk, _pv) and the online-softmax step (_softmax). Separate from the
ping-pong partitions (attention_fa3_pingpong.py); the barrier protocol is kernels/attention_fa3.py's docstring."""

from __future__ import annotations

from flashscale.kernels.attention_fa3_sched import HAS_GLUON  # the family's one probe of Gluon

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)

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
