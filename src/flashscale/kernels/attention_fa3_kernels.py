"""The FA3-style forward's @gluon.jit entry points: _fa3_fwd_kernel (dense; the ping-pong or the cooperative
program) and _fa3_fwd_varlen_kernel (packed varlen), and _pp_run, the ping-pong program (shared memory, barriers,
warp_specialize over the partitions of attention_fa3_pingpong.py). The launchers (kernels/attention_fa3.py) launch
and compile these."""

from __future__ import annotations

from flashscale.kernels.attention_fa3_sched import HAS_GLUON  # the family's one probe of Gluon

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    from flashscale.kernels.attention_fa3_coop import _consumer, _producer
    from flashscale.kernels.attention_fa3_pingpong import _consumer_pp, _producer_pp
    from flashscale.kernels.attention_fa3_sched import _varlen_total

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
