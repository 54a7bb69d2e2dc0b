"""The FP8 FA3 forward's Gluon kernel (kernels/attention_fa3_fp8.py, module docstring: math, schedule, barriers):
the consumer warpgroups (_consumer_tile, _consumer) and the kernel _fa3_fp8_fwd_kernel that allocates the shared
memory and barriers and warp-specializes consumers and producer. The producer is in attention_fa3_fp8_producer.py,
the consumers' softmax and P conversion in attention_fa3_fp8_softmax.py; the host launch (descriptors, grid,
checks, offline compile) stays in attention_fa3_fp8.py.
"""

from __future__ import annotations

from flashscale.kernels.attention_fa3_fp8_exp2 import HAS_GLUON

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)

    # the tile order (head groups; the persistent programs' snake) is the bf16 forward's
    from flashscale.kernels.attention_fa3 import _program_tiles, _snake_tile
    from flashscale.kernels.attention_fa3_fp8_producer import _producer, _tile_info
    from flashscale.kernels.attention_fa3_fp8_softmax import _p_to_a, _softmax

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
        """One tile of consumer C (attention_fa3_pingpong._consumer_pp_tile, FP8 operands and descales). `it` / `t_i`:
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
