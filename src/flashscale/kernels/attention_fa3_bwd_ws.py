"""Warp-specialized variant of the FA3-style backward (kernels.attention_fa3_bwd, FA3BwdConfig(ws=True)).

Same math, operand orders, precisions and layouts as _fa3_bwd_kernel (see its module docstring): one program
= one BLOCK_N block of keys of one (batch, K/V head), walking the query blocks of every query head of its GQA
group; the eight MMA warps compute S^T, dP^T, P^T, dS^T, dV, dK and dQ exactly as there. What moves out of
them is the data movement (FA3's Hopper backward, hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp):

  * producer, 1 warp (few registers): TMA loads of K and V once, then of Q and dO into a STAGES-deep ring
    (DO_SINGLE: dO into one buffer of its own, see the barrier protocol);
    it also loads the step's LSE (already in log2 units, -inf -> +inf, +inf past Sq) and delta (0 past Sq)
    with plain loads into a small ring beside it. TMA cannot take LSE/delta in general (the row stride
    Sq * 4 bytes must be a multiple of 16); the producer's pointer loads keep them out of the MMA warps'
    registers, which read them from shared memory only where they are used.
  * consumers, the default partition of 8 warps (two warpgroups, the accumulators split as in the plain
    kernel): the five GEMMs of a step. dQ's accumulator fragment goes to a float32 tile in shared memory
    (DQ_STAGES slots) instead of to the atomics, so the tensor-core warps never issue a global reduction.
  * dQ writer (few registers): takes each step's dQ tile from shared memory and adds it into the float32 dQ
    buffer. DQ_TMA (the default): one warp issues one TMA reduce-add of the tile (cp.reduce.async.bulk.tensor
    .add.f32, FA3's way; Gluon 3.6 has the op in its IR builder, not in gluon.language for Hopper, hence
    _tma_reduce_add) from a 128-byte-swizzled unpadded tile, and frees the slot once the TMA has read it.
    Otherwise DQ_WARPS warps go through registers with red.global.add.v4.f32, 4 floats a thread at a time:
    with 24 registers their loop is serial (load, wait, reduce) and ncu found the MMA warps waiting on them.

Barrier protocol (m-th completion of a barrier waited with parity m & 1; a fresh barrier passes parity 1):
  * kv_bar (count 1): the producer's expect-tx arrive + the K/V bytes; consumers wait parity 0.
  * ready[s] (count 2): step i uses slot s = i % STAGES, the (i // STAGES)-th completion: the producer's
    expect-tx arrive (+ the Q/dO TMA bytes) and its plain arrive after its lanes stored LSE/delta (a warp
    barrier first). The TMA is issued before the LSE/delta loads, so their latencies overlap.
  * empty[s] (count 1): the consumers' thread 0 after a barrier of all eight warps at the end of step i
    (every wgmma reading Q/dO and every LSE/delta read retired); the producer waits parity
    ((i // STAGES) & 1) ^ 1 before refilling the slot for step i (the first round passes at once).
  * dq_full[d] (count 1), d = i % DQ_STAGES: the consumers' thread 0 after the same end-of-step barrier (all
    warps stored their dQ fragment); the writer waits parity (i // DQ_STAGES) & 1.
  * dq_empty[d] (count 1): the writer's thread 0 after a barrier of its warps (all its shared loads done);
    the consumers wait parity ((i // DQ_STAGES) & 1) ^ 1 before storing step i's dQ.
  * (DO_SINGLE: dO in one buffer outside the Q ring, FA3's Stages_dO = 1 at D 256, the 32 KB it frees going to
    dQ) do_ready (count 1): the producer's expect-tx arrive + the dO bytes, step i waits parity i & 1; do_empty
    (count 1): the consumers' thread 0 after the barrier of step i's first dQ piece (every warp's dP^T and dV
    wgmmas, the two that read dO, retired before it), so the next dO streams in under dQ and dK; the producer
    waits parity (i & 1) ^ 1 before loading step i's dO. Q, LSE and delta keep the ring (ready / empty).
The end-of-step barrier also orders this step's dQ wgmma (which reads all of dS^T) before the next step's
dS^T stores, as the loop-top barrier of the plain kernel does.
"""

from __future__ import annotations

from flashscale.kernels.attention_fa3_bwd import HAS_GLUON

if HAS_GLUON:
    from triton._C.libtriton import ir
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import builtin
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)

    from flashscale.kernels.attention_fa3_bwd import _kv_block

    @builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """global[box at coord] += shared src, by TMA (cp.reduce.async.bulk.tensor ... .add, one bulk group).
        Gluon 3.6 exposes the op in its IR builder (ttng.async_tma_reduce) but not in gluon.language for
        Hopper; this is the same call tma.async_copy_shared_to_global makes, with the reduce kind. Elements of
        the box outside the tensor's bounds are skipped, as for a TMA store. tma.store_wait(n) waits for it to
        have read src."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                  src.handle)

    @gluon.jit
    def _red_add_v4(ptrs, vals, mask):
        """*ptrs += vals with red.global.add.v4.f32 (sm_90): four floats a thread-instruction. The four
        elements of a pack are consecutive columns of one row (the writer's layout holds 4 a thread), so the
        first pointer addresses all four (16-byte aligned: D and the column are multiples of 4)."""
        m = gl.broadcast(mask, vals)[0].to(gl.int32)
        addr = ptrs.to(gl.int64, bitcast=True)
        return gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $12, 0; "
            "@p red.relaxed.gpu.global.add.v4.f32 [$4], {$8, $9, $10, $11}; "
            "mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0; }",
            "=r,=r,=r,=r,l,l,l,l,f,f,f,f,r,r,r,r", [addr, vals, m], dtype=gl.int32, is_pure=False, pack=4)

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar,
                  ready, empty, do_ready, do_empty, LSE, DELTA, stride_lb, stride_lh, b, hk, n0, seqlen_q, m_lo, n_mb,
                  n_steps, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  STAGES: gl.constexpr, DO_SINGLE: gl.constexpr):
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, n0, hk * HEAD_DIM], kv_bar, k_smem)
        tma.async_copy_global_to_shared(v_desc, [b, n0, hk * HEAD_DIM], kv_bar, v_smem)
        stat_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
        cols = gl.arange(0, BLOCK_M, layout=stat_layout)
        for step in range(n_steps):
            slot = step % STAGES
            mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
            h = hk * GROUP + step // n_mb
            m0 = (m_lo + step % n_mb) * BLOCK_M
            bar = ready.index(slot)
            # the Q slot's bytes, and dO's too when it shares the ring
            mbarrier.expect(bar, q_desc.block_type.nbytes + (0 if DO_SINGLE else do_desc.block_type.nbytes))
            tma.async_copy_global_to_shared(q_desc, [b, m0, h * HEAD_DIM], bar, q_smem.index(slot))
            if not DO_SINGLE:
                tma.async_copy_global_to_shared(do_desc, [b, m0, h * HEAD_DIM], bar, do_smem.index(slot))
            rows = m0 + cols
            stat = b.to(gl.int64) * stride_lb + h.to(gl.int64) * stride_lh + rows
            lse = gl.load(LSE + stat, mask=rows < seqlen_q, other=float("inf"))
            lse = gl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)  # as the plain kernel
            delta = gl.load(DELTA + stat, mask=rows < seqlen_q, other=0.0)
            lse_smem.index(slot).store(lse)
            delta_smem.index(slot).store(delta)
            gl.thread_barrier()  # every lane's stores before lane 0's (release) arrive
            mbarrier.arrive(bar, count=1)
            if DO_SINGLE:  # after this step's Q: dO's buffer frees in the middle of the step before
                mbarrier.wait(do_empty, (step & 1) ^ 1)
                mbarrier.expect(do_ready, do_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(do_desc, [b, m0, h * HEAD_DIM], do_ready, do_smem.index(0))

    @gluon.jit
    def _dq_store(dq, dq_smem, dq_empty, i, BLOCK_M: gl.constexpr, DQ_N: gl.constexpr, DQ_STAGES: gl.constexpr,
                  DQ_TMA: gl.constexpr):
        """This thread's part of the i-th dQ piece (step * DQ_SPLIT + piece) into slot i % DQ_STAGES, once the
        writer freed it; the slot, for the barrier and arrive that hand it over."""
        dslot = i % DQ_STAGES
        mbarrier.wait(dq_empty.index(dslot), ((i // DQ_STAGES) & 1) ^ 1)
        if DQ_TMA:
            dq_smem.index(dslot).reshape([BLOCK_M, DQ_N]).store(dq)
            fence_async_shared()  # the generic-proxy stores, visible to the TMA that reads the tile
        else:
            dq_smem.index(dslot).store(dq)
        return dslot

    @gluon.jit
    def _dq_to_slot(dq, dq_smem, dq_full, dq_empty, i, BLOCK_M: gl.constexpr, DQ_N: gl.constexpr,
                    DQ_STAGES: gl.constexpr, DQ_TMA: gl.constexpr):
        """The i-th dQ piece into its slot and handed to the writer."""
        dslot = _dq_store(dq, dq_smem, dq_empty, i, BLOCK_M, DQ_N, DQ_STAGES, DQ_TMA)
        gl.thread_barrier()  # every warp's dQ fragment is in the slot
        mbarrier.arrive(dq_full.index(dslot), count=1)

    @gluon.jit
    def _consumer(k_smem, v_smem, q_smem, do_smem, ds_smem, p_smem, dq_smem, lse_smem, delta_smem, kv_bar, ready,
                  empty, do_ready, do_empty, dq_full, dq_empty, dk_desc, dv_desc, b, hk, n0, m_lo, m_full, n_mb,
                  n_steps, off, sm_scale, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, KV_WM: gl.constexpr, DQ_WM: gl.constexpr,
                  STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, DQ_TMA: gl.constexpr, DQ_SPLIT: gl.constexpr,
                  SS_DKV: gl.constexpr, DO_SINGLE: gl.constexpr, EARLY_STATS: gl.constexpr,
                  ONE_END_BAR: gl.constexpr, num_warps: gl.constexpr):
        dtype: gl.constexpr = k_smem.dtype
        KV_WN: gl.constexpr = num_warps // KV_WM
        DQ_WN: gl.constexpr = num_warps // DQ_WM
        # the plain kernel's accumulator layouts (same wgmma shapes, same numerics)
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[KV_WM, KV_WN],
                                                            instr_shape=[16, BLOCK_M // KV_WN, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[KV_WM, KV_WN],
                                                            instr_shape=[16, HEAD_DIM // KV_WN, 16])
        DQ_N: gl.constexpr = HEAD_DIM // DQ_SPLIT  # columns of one dQ piece (one slot)
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[DQ_WM, DQ_WN],
                                                            instr_shape=[16, DQ_N // DQ_WN, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
        col_s: gl.constexpr = gl.SliceLayout(0, st_layout)
        row_s: gl.constexpr = gl.SliceLayout(1, st_layout)

        k = k_smem.reshape([BLOCK_N, HEAD_DIM])
        v = v_smem.reshape([BLOCK_N, HEAD_DIM])
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        keys = n0 + gl.arange(0, BLOCK_N, layout=row_s)
        mbarrier.wait(kv_bar, 0)
        # the query block (and, for a ring of 3, the slot and its phase) run as counters: no division a step, as
        # registers are short (a power-of-two ring takes them from `step` at no cost)
        POW2: gl.constexpr = STAGES & (STAGES - 1) == 0
        slot_c = 0
        phase_c = 0
        mb = m_lo
        for step in range(n_steps):
            if POW2:
                slot = step % STAGES
                phase = (step // STAGES) & 1
            else:
                slot = slot_c
                phase = phase_c
            mbarrier.wait(ready.index(slot), phase)
            q = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
            if DO_SINGLE:
                mbarrier.wait(do_ready, step & 1)
                do = do_smem.index(0).reshape([BLOCK_M, HEAD_DIM])
            else:
                do = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
            tok_s = warpgroup_mma(k, q.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout),
                                  use_acc=False, is_async=True)
            tok_dp = warpgroup_mma(v, do.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout),
                                   use_acc=False, is_async=True)
            if EARLY_STATS:  # the load's latency under the wgmmas
                lse = lse_smem.index(slot).load(col_s)
            st = warpgroup_mma_wait(1, deps=(tok_s, ))
            if not EARLY_STATS:
                lse = lse_smem.index(slot).load(col_s)
            pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
            if CAUSAL:
                if mb < m_full:  # uniform branch: only blocks crossing the diagonal pay for the mask
                    rows_q = mb * BLOCK_M + gl.arange(0, BLOCK_M, layout=col_s)
                    vis = gl.expand_dims(keys, 1) <= gl.expand_dims(rows_q, 0) + off
                    pt = gl.where(vis, pt, 0.0)
            dpt = warpgroup_mma_wait(0, deps=(tok_dp, ))
            # SS_DKV: P^T and dS^T as the A operands of dV and dK straight from shared memory (SS wgmma): with the
            # warpgroups side by side along the queries (BLOCK_N = 64), the register A operand needs every query of
            # the tile in each warpgroup, i.e. a layout conversion through shared memory anyway
            if not SS_DKV:
                tok_dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), do, dv, is_async=True)
            delta = delta_smem.index(slot).load(col_s)
            dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)
            if SS_DKV:
                p_smem.store(pt.to(dtype))
            ds_smem.store(dst)
            fence_async_shared()
            gl.thread_barrier()  # every warp's rows of dS^T (and P^T) are in shared memory before the wgmmas read them
            if SS_DKV:
                tok_dv = warpgroup_mma(p_smem, do, dv, is_async=True)
            dq_zero = gl.zeros([BLOCK_M, DQ_N], gl.float32, layout=dq_layout)
            tok_dq = warpgroup_mma(ds_smem.permute((1, 0)), k.slice(0, DQ_N, dim=1), dq_zero, use_acc=False,
                                   is_async=True)
            if SS_DKV:
                tok_dk = warpgroup_mma(ds_smem, q, dk, is_async=True)
            else:
                tok_dk = warpgroup_mma(gl.convert_layout(dst, a_layout), q, dk, is_async=True)
            dv = warpgroup_mma_wait(2, deps=(tok_dv, ))
            dq = warpgroup_mma_wait(1, deps=(tok_dq, ))
            if ONE_END_BAR:  # empty[slot]'s arrive below hands the tile to the writer. (Storing it before dK's wait
                # crashes ptxas 12.8 at D 128, signal 11)
                dk = warpgroup_mma_wait(0, deps=(tok_dk, ))
                _dq_store(dq, dq_smem, dq_empty, step, BLOCK_M, DQ_N, DQ_STAGES, DQ_TMA)
                gl.thread_barrier()  # every warp's dQ fragment stored, its wgmmas on Q/dO/dS^T retired, LSE read
            else:
                # dQ to the writer's slot (free once the writer is done with the piece DQ_STAGES before); dK still
                # runs
                _dq_to_slot(dq, dq_smem, dq_full, dq_empty, step * DQ_SPLIT, BLOCK_M, DQ_N, DQ_STAGES, DQ_TMA)
            if DO_SINGLE:  # _dq_to_slot's barrier: every warp waited for its dV (and dP^T) wgmma, the last on dO
                mbarrier.arrive(do_empty, count=1)
            for piece in gl.static_range(1, DQ_SPLIT):  # (DQ_TMA) the next columns of dQ through the slots
                tok_dq = warpgroup_mma(ds_smem.permute((1, 0)), k.slice(piece * DQ_N, DQ_N, dim=1), dq_zero,
                                       use_acc=False, is_async=True)
                dq = warpgroup_mma_wait(0, deps=(tok_dq, ))
                _dq_to_slot(dq, dq_smem, dq_full, dq_empty, step * DQ_SPLIT + piece, BLOCK_M, DQ_N, DQ_STAGES,
                            DQ_TMA)
            if not ONE_END_BAR:
                dk = warpgroup_mma_wait(0, deps=(tok_dk, ))
                gl.thread_barrier()  # every warp's wgmmas reading Q/dO and dS^T retired, LSE/delta read
            mbarrier.arrive(empty.index(slot), count=1)
            if not POW2:
                slot_c += 1
                if slot_c == STAGES:
                    slot_c = 0
                    phase_c ^= 1
            mb += 1
            if mb == m_lo + n_mb:
                mb = m_lo

        # epilogue: dK (times the scale) and dV through the dead K/V tiles, TMA-stored (clipped past Sk)
        k.store((dk * sm_scale).to(dtype))
        v.store(dv.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(dk_desc, [b, n0, hk * HEAD_DIM], k_smem)
        tma.async_copy_shared_to_global(dv_desc, [b, n0, hk * HEAD_DIM], v_smem)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _dq_writer(dq_smem, dq_full, dq_empty, DQ, b, hk, H, seqlen_q, m_lo, n_mb, n_steps, GROUP: gl.constexpr,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, DQ_STAGES: gl.constexpr, WARPS: gl.constexpr):
        TPR: gl.constexpr = HEAD_DIM // 4  # threads along a row, 4 floats each (one red.v4)
        RPW: gl.constexpr = 32 // TPR  # rows a warp covers at once
        CHUNK: gl.constexpr = RPW * WARPS * 2  # rows a chunk: 8 floats (two red.v4) a thread
        lay: gl.constexpr = gl.BlockedLayout([1, 4], [RPW, TPR], [WARPS, 1], [1, 0])
        r = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, lay))
        c = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, lay))
        offs = gl.expand_dims(r * (H * HEAD_DIM), 1) + gl.expand_dims(c, 0)  # int32: Sq * H * D < 2^31
        for step in range(n_steps):
            if DQ_STAGES == 1:
                # 0, written so that LLVM cannot see it: the slot's shared addresses (padded-layout arithmetic a
                # chunk) then stay inside the loop instead of being hoisted, 16 of them live across it (spills)
                dslot = step // (n_steps + 1)
            else:
                dslot = step % DQ_STAGES
            h = hk * GROUP + step // n_mb
            m0 = (m_lo + step % n_mb) * BLOCK_M
            base = DQ + ((b.to(gl.int64) * seqlen_q + m0) * H + h) * HEAD_DIM
            mbarrier.wait(dq_full.index(dslot), (step // DQ_STAGES) & 1)
            tile = dq_smem.index(dslot)
            rows_left = seqlen_q - m0  # rows past Sq dropped; compared with the chunk's own row index only
            for c0 in gl.static_range(0, BLOCK_M, CHUNK):  # (so nothing per chunk stays live across steps)
                vals = tile.slice(c0, CHUNK, dim=0).load(lay)
                mask = gl.expand_dims(r < rows_left - c0, 1)
                _red_add_v4((base + c0 * (H * HEAD_DIM)) + offs, vals, mask)
            gl.thread_barrier()  # every warp has read the slot before thread 0 frees it
            mbarrier.arrive(dq_empty.index(dslot), count=1)

    @gluon.jit
    def _dq_tma_writer(dq_smem, dq_full, dq_empty, dq_desc, b, hk, m_lo, n_mb, n_steps, GROUP: gl.constexpr,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, DQ_STAGES: gl.constexpr,
                       DQ_SPLIT: gl.constexpr):
        """One warp: each step's float32 dQ tile (in DQ_SPLIT column pieces) into the dQ buffer by TMA reduce-add
        (rows past Sq are outside the descriptor's bounds and skipped); a slot is freed once the TMA read it."""
        DQ_N: gl.constexpr = HEAD_DIM // DQ_SPLIT
        for step in range(n_steps):
            h = hk * GROUP + step // n_mb
            m0 = (m_lo + step % n_mb) * BLOCK_M
            for piece in gl.static_range(DQ_SPLIT):
                i = step * DQ_SPLIT + piece
                dslot = i % DQ_STAGES
                mbarrier.wait(dq_full.index(dslot), (i // DQ_STAGES) & 1)
                _tma_reduce_add(dq_desc, [b, m0, h * HEAD_DIM + piece * DQ_N], dq_smem.index(dslot))
                tma.store_wait(pendings=0)
                mbarrier.arrive(dq_empty.index(dslot), count=1)

    @gluon.jit
    def _dq_any_writer(dq_smem, dq_full, dq_empty, DQ, b, hk, H, seqlen_q, m_lo, n_mb, n_steps, GROUP: gl.constexpr,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, DQ_STAGES: gl.constexpr, WARPS: gl.constexpr,
                       DQ_TMA: gl.constexpr, DQ_SPLIT: gl.constexpr):
        if DQ_TMA:  # DQ is a float32 (B, Sq, H * D) descriptor with (1, BLOCK_M, D // DQ_SPLIT) boxes
            _dq_tma_writer(dq_smem, dq_full, dq_empty, DQ, b, hk, m_lo, n_mb, n_steps, GROUP, HEAD_DIM, BLOCK_M,
                           DQ_STAGES, DQ_SPLIT)
        else:  # DQ points at the float32 (B, Sq, H, D) buffer
            _dq_writer(dq_smem, dq_full, dq_empty, DQ, b, hk, H, seqlen_q, m_lo, n_mb, n_steps, GROUP, HEAD_DIM,
                       BLOCK_M, DQ_STAGES, WARPS)

    @gluon.jit(do_not_specialize=["stride_lb", "stride_lh", "H", "seqlen_q", "seqlen_k"])
    def _fa3_bwd_ws_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, LSE, DELTA, DQ, stride_lb, stride_lh,
                           H, seqlen_q, seqlen_k, sm_scale, qk_scale, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr,
                           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, KV_WM: gl.constexpr,
                           DQ_WM: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr,
                           DQ_WARPS: gl.constexpr, DQ_TMA: gl.constexpr, DQ_SPLIT: gl.constexpr,
                           SS_DKV: gl.constexpr, DO_SINGLE: gl.constexpr, EARLY_STATS: gl.constexpr,
                           ONE_END_BAR: gl.constexpr, PRODUCER_REGS: gl.constexpr, WRITER_REGS: gl.constexpr,
                           num_warps: gl.constexpr):
        dtype: gl.constexpr = q_desc.dtype
        b, hk, n0, off, m_lo, m_full, n_mb, n_steps = _kv_block(H, seqlen_q, seqlen_k, GROUP, BLOCK_M, BLOCK_N,
                                                                CAUSAL)

        k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
        DO_SLOTS: gl.constexpr = 1 if DO_SINGLE else STAGES
        do_smem = gl.allocate_shared_memory(dtype, [DO_SLOTS] + do_desc.block_type.shape, do_desc.layout)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
        if SS_DKV:  # P^T beside dS^T, both read by wgmma from here
            p_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
        else:
            p_smem = ds_smem  # (unused)
        if DQ_TMA:  # the TMA's own (1, BLOCK_M, D // DQ_SPLIT) box layout, 128-byte swizzled, unpadded
            dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_STAGES] + DQ.block_type.shape, DQ.layout)
        else:
            # float32 dQ tiles, rows padded by 16 bytes: the accumulator fragment's stores (8 rows x 8 floats a
            # warp-instruction) and the writer's row loads are both free of bank conflicts, and the writer may
            # slice any number of rows (a 128-byte swizzle would not let it split an 8-row phase)
            dq_layout: gl.constexpr = gl.PaddedSharedLayout.with_identity_for([[HEAD_DIM, 4]], [BLOCK_M, HEAD_DIM],
                                                                              [1, 0])
            dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_STAGES, BLOCK_M, HEAD_DIM], dq_layout)
        stat_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # per slot
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stat_layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stat_layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        dq_full = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        do_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        mbarrier.init(do_ready, count=1)
        mbarrier.init(do_empty, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=2)  # expect-tx arrive (Q/dO bytes) + arrive after LSE/delta
            mbarrier.init(empty.index(i), count=1)
        for i in gl.static_range(DQ_STAGES):
            mbarrier.init(dq_full.index(i), count=1)
            mbarrier.init(dq_empty.index(i), count=1)

        if ONE_END_BAR:  # one arrive a step: the Q/dO slot free for the producer and the dQ tile for the writer
            dq_ready = empty
        else:
            dq_ready = dq_full
        gl.warp_specialize([
            (_consumer, (k_smem, v_smem, q_smem, do_smem, ds_smem, p_smem, dq_smem, lse_smem, delta_smem, kv_bar,
                         ready, empty, do_ready, do_empty, dq_full, dq_empty, dk_desc, dv_desc, b, hk, n0, m_lo,
                         m_full, n_mb, n_steps, off, sm_scale, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, KV_WM,
                         DQ_WM, STAGES, DQ_STAGES, DQ_TMA, DQ_SPLIT, SS_DKV, DO_SINGLE, EARLY_STATS, ONE_END_BAR,
                         num_warps)),
            (_producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
                         kv_bar, ready, empty, do_ready, do_empty, LSE, DELTA, stride_lb, stride_lh, b, hk, n0,
                         seqlen_q, m_lo, n_mb, n_steps, GROUP, HEAD_DIM, BLOCK_M, STAGES, DO_SINGLE)),
            (_dq_any_writer, (dq_smem, dq_ready, dq_empty, DQ, b, hk, H, seqlen_q, m_lo, n_mb, n_steps, GROUP,
                              HEAD_DIM, BLOCK_M, DQ_STAGES, DQ_WARPS, DQ_TMA, DQ_SPLIT)),
        ], [1, DQ_WARPS], [PRODUCER_REGS, WRITER_REGS])
