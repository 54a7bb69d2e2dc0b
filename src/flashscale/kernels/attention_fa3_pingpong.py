"""Gluon partitions of the FA3-style forward's ping-pong layout (the default, dense and varlen, one tile a program
or persistent): the TMA producer warp (_producer_pp), the consumer warpgroups taking turns on the tensor cores
(_consumer_pp) and the varlen epilogue's masked row stores. The program that runs them (shared memory, barriers,
warp_specialize) is _pp_run in attention_fa3_kernels.py; the barrier protocol is kernels/attention_fa3.py's
docstring."""

from __future__ import annotations

from flashscale.kernels.attention_fa3_sched import HAS_GLUON  # the family's one probe of Gluon

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)

    from flashscale.kernels.attention_fa3_coop import _softmax
    from flashscale.kernels.attention_fa3_sched import (_pass_next_tile, _program_tiles, _snake_tile,
                                                        _take_next_tile, _tile_info, _tile_info_varlen)

    # ---- ping-pong path: one 4-warp partition per consumer warpgroup, optionally persistent -----------------

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
        turn[(c + 1) % CONSUMERS] right after issuing its wgmmas (protocol: attention_fa3.py's docstring)."""
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
