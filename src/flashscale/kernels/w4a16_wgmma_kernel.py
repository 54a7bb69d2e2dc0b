"""The W4A16 wgmma GEMM's Gluon kernel: the tile order (_coords), the TMA producer warp (_produce, _producer, the
stream-K run _sk_run / _sk_segment), the consumers' main loops (_step, _mainloop_wait0, _mainloop_wait1, _tile_acc),
the consumers (_consumer_tile, _consumer_sk, _consumer) and w4a16_wgmma_kernel, which warp-specializes them; and the
shared-memory layouts its descriptors take (_layouts, host side, used by the launcher and the sm_90 compiles). The
design is in kernels/w4a16_wgmma.py's docstring; the unpack (w4a16_wgmma_unpack.py) and the epilogue / fix-ups
(w4a16_wgmma_epilogue.py) are apart.
"""

from __future__ import annotations

import functools

import torch

from flashscale.kernels.w4a16_wgmma_config import WgmmaConfig
from flashscale.kernels.w4a16_wgmma_unpack import HAS_GLUON

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

    from flashscale.kernels.w4a16_wgmma_epilogue import _epilogue, _fixup
    from flashscale.kernels.w4a16_wgmma_unpack import _load_slot, _unpack

    @gluon.jit
    def _coords(t, num_n, num_m, GROUP: gl.constexpr):
        """Tile t -> (pid_n, pid_m): GROUP n-tiles sweep the token tiles together (their weights stay in L2)."""
        width = GROUP * num_m
        first_n = (t // width) * GROUP
        gsz = gl.minimum(num_n - first_n, GROUP)
        return first_n + (t % width) % gsz, (t % width) // gsz

    @gluon.jit
    def _produce(w_desc, x_desc, sz_desc, w_smem, x_smem, sz_smem, ready, empty, t, base, it0, n_it, num_n, num_m,
                 G: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                 GROUP: gl.constexpr):
        """Tile t's K steps it0 .. it0 + n_it - 1 into ring steps base .. base + n_it - 1."""
        nbytes: gl.constexpr = w_desc.block_type.nbytes + x_desc.block_type.nbytes + sz_desc.block_type.nbytes
        pid_n, pid_m = _coords(t, num_n, num_m, GROUP)
        for j in range(n_it):
            g = base + j
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)  # a fresh slot passes at once
            mbarrier.expect(ready.index(s), nbytes)
            k0 = (it0 + j) * BK
            tma.async_copy_global_to_shared(w_desc, [pid_n * (BN // 16), k0 // 64, 0], ready.index(s),
                                            w_smem.index(s))
            tma.async_copy_global_to_shared(x_desc, [pid_m * BM, k0], ready.index(s), x_smem.index(s))
            tma.async_copy_global_to_shared(sz_desc, [k0 // G, pid_n * BN], ready.index(s), sz_smem.index(s))

    @gluon.jit
    def _sk_run(tile0, tiles, DP, SKQ, n_it):
        """Program tile0's stream-K run: steps [s0, s1) of the K steps of tiles DP .. tiles - 1 taken in order, and
        the stream-K tiles r_lo .. r_hi - 1 it touches (none where s0 >= s1)."""
        s0 = tile0 * SKQ
        s1 = gl.minimum(s0 + SKQ, (tiles - DP) * n_it)
        r_lo = s0 // n_it
        r_hi = r_lo
        if s0 < s1:
            r_hi = (s1 - 1) // n_it + 1
        return s0, s1, r_lo, r_hi

    @gluon.jit
    def _sk_segment(r, s0, s1, n_it):
        """The K steps [k0, k1) of stream-K tile r in the run [s0, s1)."""
        return gl.maximum(s0 - r * n_it, 0), gl.minimum(s1 - r * n_it, n_it)

    @gluon.jit
    def _producer(w_desc, x_desc, sz_desc, w_smem, x_smem, sz_smem, ready, empty, tile0, tiles, tstride, num_n, num_m,
                  it0, n_it, DP, SKQ, G: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  STAGES: gl.constexpr, GROUP: gl.constexpr, STREAM_K: gl.constexpr):
        base = 0  # ring steps of the earlier tiles (persistent: the ring runs on from tile to tile)
        for t in range(tile0, DP, tstride):  # DP = tiles but with stream-K
            _produce(w_desc, x_desc, sz_desc, w_smem, x_smem, sz_smem, ready, empty, t, base, it0, n_it, num_n, num_m,
                     G, BM, BN, BK, STAGES, GROUP)
            base += n_it
        if STREAM_K:  # the same segments as _consumer_sk's
            s0, s1, r_lo, r_hi = _sk_run(tile0, tiles, DP, SKQ, n_it)
            for r in range(r_lo, r_hi):
                k0, k1 = _sk_segment(r, s0, s1, n_it)
                _produce(w_desc, x_desc, sz_desc, w_smem, x_smem, sz_smem, ready, empty, DP + r, base, k0, k1 - k0,
                         num_n, num_m, G, BM, BN, BK, STAGES, GROUP)
                base += k1 - k0

    @gluon.jit
    def _step(a_prev, acc, w_smem, x_smem, sz_smem, ready, empty, j, MAGIC, H2: gl.constexpr, C: gl.constexpr,
              a_l: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr, STAGES: gl.constexpr):
        """K step j >= 1, wgmma j-1 (A = a_prev) in flight: slot j's words to registers -> unpack A_j (ALU work under
        wgmma j-1) -> issue wgmma j async (queued behind j-1: the tensor cores never wait for the unpack) ->
        wait(1): wgmma j-1 retired, a_prev's registers free -> release slot j-1. The issue reads A_j, so ptxas
        cannot sink the unpack below it (with wait(0) between issue and the next step's unpack it sank the
        unpack of the first half of an unrolled pair below the wait: 48 % overlap)."""
        s = j % STAGES
        mbarrier.wait(ready.index(s), (j // STAGES) & 1)
        p, szw = _load_slot(w_smem.index(s), sz_smem.index(s), C, BK, SZR, 4, w_smem.shape[1])  # one consumer
        a = _unpack(p, szw, MAGIC, H2, x_smem.dtype, a_l, BK, 4)
        acc = warpgroup_mma(a, x_smem.index(s).permute((1, 0)), acc, is_async=True)
        acc, a_prev = warpgroup_mma_wait(1, deps=(acc, a_prev))
        mbarrier.arrive(empty.index((j - 1) % STAGES), count=1)
        return acc, a

    @gluon.jit
    def _mainloop_wait0(a, acc, w_smem, x_smem, sz_smem, ready, empty, turn, base, n_it, MAGIC, H2: gl.constexpr,
                        C: gl.constexpr, a_l: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr, STAGES: gl.constexpr,
                        PINGPONG: gl.constexpr):
        """The first loop (two consumer warpgroups): issue wgmma(A_j, x_j) -> unpack A_{j+1} -> wait for slot j+2 ->
        wait(0) -> release j. A_{j+1} is a dependency of the wait too (no sinking the unpack below it in the PTX),
        and A_j stays live until wgmma j retires; the loop-carried a = a_next costs 12-58 register moves a step.
        The mbarrier wait for slot j+2 (the next step's load, predicated off past the last step) is a try-wait
        loop, a basic-block boundary between the unpack and the wgmma wait: without it ptxas hoisted
        WARPGROUP.DEPBAR right after the HGMMAs at bm256 (the unpack ran after its own wgmma retired, 15 of 96
        dequant ops overlapped), as it does with the PV wait in the attention kernels (`late_pv_wait`).
        PINGPONG (FA3's inter-warpgroup schedule, kernels/attention_fa3.py's turns): consumer C issues its wgmma of
        step j only after the other consumer issued its own of step j - 1 (C = 0) / j (C = 1), and passes the
        turn right after issuing, so the tensor cores take the two warpgroups' wgmmas in alternation and one's
        unpack runs under the other's MMA instead of both unpacking at once (the two share every x slot, so
        without turns they run in lockstep). turn[c] has count 1; consumer c's j-th wait has parity (j & 1) ^ FIRST
        (FIRST = 1 for consumer 0, whose turn 0 passes on the fresh barrier). Both take n_it turns: no skew."""
        FIRST: gl.constexpr = 1 if C == 0 else 0
        # base: ring steps (and turns) of this program's earlier tiles; slot and phase of step j are base + j's
        mbarrier.wait(ready.index((base + 1) % STAGES), ((base + 1) // STAGES) & 1, pred=n_it > 1)
        for j in range(n_it - 1):
            s = (base + j) % STAGES
            s1 = (base + j + 1) % STAGES
            p, szw = _load_slot(w_smem.index(s1), sz_smem.index(s1), C, BK, SZR, 4, w_smem.shape[1] // 2)  # slot j+1
            if PINGPONG:
                mbarrier.wait(turn.index(C), ((base + j) & 1) ^ FIRST)
            tok = warpgroup_mma(a, x_smem.index(s).permute((1, 0)), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - C))
            a_next = _unpack(p, szw, MAGIC, H2, x_smem.dtype, a_l, BK, 4)  # only ALU work under wgmma j
            mbarrier.wait(ready.index((base + j + 2) % STAGES), ((base + j + 2) // STAGES) & 1, pred=j + 2 < n_it)
            acc, a, a_next = warpgroup_mma_wait(0, deps=(tok, a, a_next))
            mbarrier.arrive(empty.index(s), count=1)
            a = a_next
        s = (base + n_it - 1) % STAGES
        if PINGPONG:
            mbarrier.wait(turn.index(C), ((base + n_it - 1) & 1) ^ FIRST)
        tok = warpgroup_mma(a, x_smem.index(s).permute((1, 0)), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - C))
        acc, a = warpgroup_mma_wait(0, deps=(tok, a))
        mbarrier.arrive(empty.index(s), count=1)
        return acc

    @gluon.jit
    def _mainloop_wait1(a0, acc, w_smem, x_smem, sz_smem, ready, empty, base, n_it, MAGIC, H2: gl.constexpr,
                        C: gl.constexpr, a_l: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr, STAGES: gl.constexpr):
        """Steps 0..n_it-1 (A_0 = a0 unpacked) with _step (ring steps base + j); returns the retired accumulator."""
        acc = warpgroup_mma(a0, x_smem.index(base % STAGES).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(1, deps=(acc, ))  # a no-op (one group in flight): the loop carries a tensor
        # unrolled by two: steps 2i+1 and 2i+2 use the A buffers alternately, so A_j is unpacked into the registers
        # that wgmma j-2 freed (no a = a_next copies: ptxas moved 21-58 registers a step for the loop-carried A)
        for i in range((n_it - 1) // 2):
            acc, a1 = _step(a0, acc, w_smem, x_smem, sz_smem, ready, empty, base + 2 * i + 1, MAGIC, H2, C, a_l, BK,
                            SZR, STAGES)
            acc, a0 = _step(a1, acc, w_smem, x_smem, sz_smem, ready, empty, base + 2 * i + 2, MAGIC, H2, C, a_l, BK,
                            SZR, STAGES)
        if (n_it - 1) % 2 == 1:  # an odd count of steps after the first
            acc, a1 = _step(a0, acc, w_smem, x_smem, sz_smem, ready, empty, base + n_it - 1, MAGIC, H2, C, a_l, BK, SZR,
                            STAGES)
            acc, a1 = warpgroup_mma_wait(0, deps=(acc, a1))
        else:
            acc, a0 = warpgroup_mma_wait(0, deps=(acc, a0))
        mbarrier.arrive(empty.index((base + n_it - 1) % STAGES), count=1)
        return acc

    @gluon.jit
    def _tile_acc(w_smem, x_smem, sz_smem, ready, empty, turn, base, n_it, MAGIC, H2: gl.constexpr, C: gl.constexpr,
                  BM: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                  PINGPONG: gl.constexpr):
        """The accumulator (BN / CONSUMERS features, BM tokens) of the K steps at ring steps base .. base + n_it - 1."""
        NBF: gl.constexpr = w_smem.shape[1] // CONSUMERS  # 16-feature fragments a consumer
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
        acc = gl.zeros([16 * NBF, BM], gl.float32, acc_l)
        mbarrier.wait(ready.index(base % STAGES), (base // STAGES) & 1)
        p, szw = _load_slot(w_smem.index(base % STAGES), sz_smem.index(base % STAGES), C, BK, SZR, 4, NBF)
        a0 = _unpack(p, szw, MAGIC, H2, x_smem.dtype, a_l, BK, 4)
        if CONSUMERS == 2:  # 12 warps (168 registers at launch, 240 by setmaxnreg): wait(1) serializes the wgmma there
            acc = _mainloop_wait0(a0, acc, w_smem, x_smem, sz_smem, ready, empty, turn, base, n_it, MAGIC, H2, C, a_l,
                                  BK, SZR, STAGES, PINGPONG)
        else:
            acc = _mainloop_wait1(a0, acc, w_smem, x_smem, sz_smem, ready, empty, base, n_it, MAGIC, H2, C, a_l, BK,
                                  SZR, STAGES)
        return acc

    @gluon.jit
    def _consumer_tile(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, t, base, num_n,
                       num_m, n_it, M, N, MAGIC, H2: gl.constexpr, SPLIT_K, C: gl.constexpr, HAS_BIAS: gl.constexpr,
                       VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr,
                       STAGES: gl.constexpr, CONSUMERS: gl.constexpr, HAS_SPLIT: gl.constexpr, PINGPONG: gl.constexpr,
                       GROUP: gl.constexpr):
        """Tile t, its K steps at ring steps base .. base + n_it - 1: main loop, then the epilogue."""
        CHUNKS: gl.constexpr = 4 if BM >= 128 else (2 if BM == 64 else 1)  # 16..64 tokens a chunk
        pid_n, pid_m = _coords(t, num_n, num_m, GROUP)
        acc = _tile_acc(w_smem, x_smem, sz_smem, ready, empty, turn, base, n_it, MAGIC, H2, C, BM, BK, SZR, STAGES,
                        CONSUMERS, PINGPONG)
        if HAS_SPLIT:  # never persistent (config_error); slices, the last split sums them in split order
            _fixup(acc, y_ptr, bias_ptr, ws_ptr, ws_ptr, cnt_ptr, t, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS, VEC_Y,
                   BM, BN, CHUNKS, CONSUMERS, 1, 2)
        else:
            _epilogue(acc, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS, VEC_Y, BM, BN,
                      CHUNKS, 0)

    @gluon.jit
    def _consumer_sk(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, tile0, tiles, num_n,
                     num_m, n_it, M, N, MAGIC, H2: gl.constexpr, base, DP, SKQ, MAXC, C: gl.constexpr,
                     HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                     BK: gl.constexpr, SZR: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                     PINGPONG: gl.constexpr, GROUP: gl.constexpr):
        """Stream-K tail: the K steps of tiles DP .. tiles - 1 in one run, program p taking run steps [p SKQ, (p + 1)
        SKQ): one segment a tile it touches. A tile done by one program is stored; a shared one is written by each
        of its contributors to its own fp32 block (tile r's blocks r MAXC + idx, idx = program - the tile's first),
        and the last to take the (tile, consumer) ticket sums the blocks in idx order (the same bits every call)."""
        CHUNKS: gl.constexpr = 4 if BM >= 128 else (2 if BM == 64 else 1)
        s0, s1, r_lo, r_hi = _sk_run(tile0, tiles, DP, SKQ, n_it)
        for r in range(r_lo, r_hi):
            k0, k1 = _sk_segment(r, s0, s1, n_it)
            acc = _tile_acc(w_smem, x_smem, sz_smem, ready, empty, turn, base, k1 - k0, MAGIC, H2, C, BM, BK, SZR,
                            STAGES, CONSUMERS, PINGPONG)
            base += k1 - k0
            t = DP + r
            pid_n, pid_m = _coords(t, num_n, num_m, GROUP)
            first = (r * n_it) // SKQ
            count = ((r + 1) * n_it - 1) // SKQ - first + 1
            if count == 1:
                _epilogue(acc, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, 1, C, HAS_BIAS, VEC_Y, BM, BN,
                          CHUNKS, 0)
            else:
                blk = ws_ptr + (r * MAXC).to(gl.int64) * (BM * BN)
                _fixup(acc, y_ptr, bias_ptr, blk + (tile0 - first) * (BM * BN), blk, cnt_ptr, t, pid_n, pid_m, M,
                       N, count, C, HAS_BIAS, VEC_Y, BM, BN, CHUNKS, CONSUMERS, 3, 4)

    @gluon.jit
    def _consumer(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, tile0, tiles, tstride,
                  num_n, num_m, it0, n_it, M, N, MAGIC, H2: gl.constexpr, SPLIT_K, DP, SKQ, MAXC, C: gl.constexpr,
                  HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  SZR: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, HAS_SPLIT: gl.constexpr,
                  PINGPONG: gl.constexpr, GROUP: gl.constexpr, PERSISTENT: gl.constexpr, STREAM_K: gl.constexpr):
        if PERSISTENT:  # tiles tile0, tile0 + tstride, ... < DP: the ring's steps (and turns) run on from tile to tile
            base = 0
            for t in range(tile0, DP, tstride):
                _consumer_tile(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, t, base,
                               num_n, num_m, n_it, M, N, MAGIC, H2, SPLIT_K, C, HAS_BIAS, VEC_Y, BM, BN, BK, SZR,
                               STAGES, CONSUMERS, HAS_SPLIT, PINGPONG, GROUP)
                base += n_it
            if STREAM_K:
                _consumer_sk(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, tile0,
                             tiles, num_n, num_m, n_it, M, N, MAGIC, H2, base, DP, SKQ, MAXC, C, HAS_BIAS, VEC_Y, BM,
                             BN, BK, SZR, STAGES, CONSUMERS, PINGPONG, GROUP)
        else:  # one tile a program (no loop: a tile loop around the body made bm256-bn64-bk128 spill 12 B)
            _consumer_tile(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, tile0, 0,
                           num_n, num_m, n_it, M, N, MAGIC, H2, SPLIT_K, C, HAS_BIAS, VEC_Y, BM, BN, BK, SZR, STAGES,
                           CONSUMERS, HAS_SPLIT, PINGPONG, GROUP)

    @gluon.jit(do_not_specialize=["M", "N", "K", "SPLIT_K", "DP", "SKQ", "MAXC"])
    def w4a16_wgmma_kernel(w_desc, x_desc, sz_desc, y_ptr, bias_ptr, ws_ptr, cnt_ptr, M, N, K, MAGIC, SPLIT_K, DP, SKQ,
                           MAXC, G: gl.constexpr, HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr,
                           BK: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, GROUP: gl.constexpr,
                           PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, HAS_SPLIT: gl.constexpr,
                           PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr, STREAM_K: gl.constexpr,
                           H2: gl.constexpr):
        BN: gl.constexpr = w_desc.block_type.shape[0] * 16  # 64 or 128 features a consumer
        SZR: gl.constexpr = sz_desc.block_type.shape[0]
        num_n = (N + BN - 1) // BN
        num_m = (M + BM - 1) // BM
        tiles = num_n * num_m
        tile0 = gl.program_id(0)
        if PERSISTENT:  # tiles tile0, tile0 + grid, ... < DP (the grid is min(tiles, SMs), or SMs with stream-K)
            tstride = gl.num_programs(0)
        else:  # one tile a program
            tstride = tiles
        n_iter = (K + BK - 1) // BK
        it0 = gl.program_id(1) * n_iter // SPLIT_K
        n_it = (gl.program_id(1) + 1) * n_iter // SPLIT_K - it0  # >= 1: the host keeps SPLIT_K <= n_iter

        w_smem = gl.allocate_shared_memory(gl.int32, [STAGES] + w_desc.block_type.shape, w_desc.layout)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
        sz_smem = gl.allocate_shared_memory(gl.int32, [STAGES] + sz_desc.block_type.shape, sz_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=CONSUMERS)
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        if CONSUMERS == 2:
            gl.warp_specialize([ (_consumer, (w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr,
                               cnt_ptr, tile0, tiles, tstride, num_n, num_m, it0, n_it, M, N, MAGIC, H2, SPLIT_K, DP,
                               SKQ, MAXC, 0, HAS_BIAS, VEC_Y, BM, BN, BK, SZR, STAGES, CONSUMERS, HAS_SPLIT, PINGPONG,
                               GROUP, PERSISTENT, STREAM_K)), (_consumer, (w_smem, x_smem, sz_smem, ready, empty, turn,
                               y_ptr, bias_ptr, ws_ptr, cnt_ptr, tile0, tiles, tstride, num_n, num_m, it0, n_it, M, N,
                               MAGIC, H2, SPLIT_K, DP, SKQ, MAXC, 1, HAS_BIAS, VEC_Y, BM, BN, BK, SZR, STAGES,
                               CONSUMERS, HAS_SPLIT, PINGPONG, GROUP, PERSISTENT, STREAM_K)), (_producer, (w_desc,
                               x_desc, sz_desc, w_smem, x_smem, sz_smem, ready, empty, tile0, tiles, tstride, num_n,
                               num_m, it0, n_it, DP, SKQ, G, BM, BN, BK, STAGES, GROUP, STREAM_K)), ], [4, 1],
                               [CONSUMER_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([ (_consumer, (w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr,
                               cnt_ptr, tile0, tiles, tstride, num_n, num_m, it0, n_it, M, N, MAGIC, H2, SPLIT_K, DP,
                               SKQ, MAXC, 0, HAS_BIAS, VEC_Y, BM, BN, BK, SZR, STAGES, CONSUMERS, HAS_SPLIT, PINGPONG,
                               GROUP, PERSISTENT, STREAM_K)), (_producer, (w_desc, x_desc, sz_desc, w_smem, x_smem,
                               sz_smem, ready, empty, tile0, tiles, tstride, num_n, num_m, it0, n_it, DP, SKQ, G, BM,
                               BN, BK, STAGES, GROUP, STREAM_K)), ], [1], [PRODUCER_REGS])


def _gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]


@functools.lru_cache(maxsize=None)  # get_default_for alone took 14 us a call (host time of every launch)
def _layouts(cfg: WgmmaConfig, dtype: torch.dtype):
    w_l = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
    sz_l = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    x_l = gl.NVMMASharedLayout.get_default_for([cfg.bm, cfg.bk], _gl_dtype(dtype))
    return w_l, x_l, sz_l
