"""The FP8 FA3 forward's TMA producer warp (kernels/attention_fa3_fp8.py, module docstring: schedule and barrier
protocol) and the tile -> (batch, head, rows, key blocks) map it shares with the consumers. Separate from the
consumers (attention_fa3_fp8_kernel.py): the one partition that only moves data, at 24 registers.
"""

from __future__ import annotations

from flashscale.kernels.attention_fa3_fp8_exp2 import HAS_GLUON

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    # the tile order (head groups; the persistent programs' snake) is the bf16 forward's
    from flashscale.kernels.attention_fa3 import _program_tiles, _snake_tile
    from flashscale.kernels.attention_fa3_sched import _tile_info  # the bf16 forward's tile map

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                  v_empty, tile0, tile_step, n_tiles, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr, PERSISTENT: gl.constexpr):
        """TMA warp (attention_fa3_pingpong._producer_pp with V^T tiles): per tile, the first K (prefetched during the
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
