"""The W4A16 wgmma GEMM's epilogue (Gluon helpers of the consumers): the accumulator to y in column chunks
(_epilogue, _epi_store, _halves), y by 16-byte stores (_store_y_vec, vec_y), and the split-K / stream-K fix-up
(_fixup: fp32 partials, one acq_rel ticket a (tile, consumer), the last contributor sums in order; _fence_gpu and the
gl.constexpr _FENCE of the FIXUP_FENCE diagnosis knob, which must live in the module of _fixup that reads it). Apart
from the main loops (w4a16_wgmma_kernel.py): what a tile does with its accumulator once its K steps are done.
"""

from __future__ import annotations

from flashscale.kernels.w4a16_wgmma_config import FIXUP_FENCE
from flashscale.kernels.w4a16_wgmma_unpack import HAS_GLUON

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def _halves(t):
        """(R, W) -> columns [0, W/2) and [W/2, W): the top column bit of the wgmma layout is a register bit."""
        return gl.split(gl.permute(gl.reshape(t, [t.shape[0], 2, t.shape[1] // 2]), [0, 2, 1]))

    @gluon.jit
    def _epi_store(v, col0, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C: gl.constexpr,
                   HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, MODE: gl.constexpr):
        """One column chunk (F = BN / CONSUMERS features, W tokens) of the accumulator, its offsets computed for it
        alone (the 64-bit pointers of the whole tile would not fit beside acc at BM >= 128). MODE 0: to y; 1: to this
        split's workspace slice; 2: the last split sums the slices in split order (v unused) and writes y; stream-K,
        ws_ptr at a (BN features, BM tokens) fp32 block of the tile: 3: to that block; 4: sums SPLIT_K consecutive
        blocks in order (v unused) and writes y."""
        W: gl.constexpr = v.shape[1]
        F: gl.constexpr = v.shape[0]
        l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, W, 16])
        offs_n = pid_n * BN + C * F + gl.arange(0, F, layout=gl.SliceLayout(1, l))
        offs_m = pid_m * BM + col0 + gl.arange(0, W, layout=gl.SliceLayout(0, l))
        mask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims(offs_m < M, 0)
        off = gl.expand_dims(offs_m * N, 0) + gl.expand_dims(offs_n, 1)  # M * N < 2^31 (unsupported())
        if MODE >= 3:  # the block's own offsets: tokens contiguous (a thread's column pairs: 8-byte accesses)
            loc = (gl.expand_dims((C * F + gl.arange(0, F, layout=gl.SliceLayout(1, l))) * BM, 1)
                   + gl.expand_dims(col0 + gl.arange(0, W, layout=gl.SliceLayout(0, l)), 0))
        if MODE == 2:
            acc = gl.load(ws_ptr + off, mask=mask, other=0.0, cache_modifier=".cg")
            for sp in range(1, SPLIT_K):
                acc += gl.load(ws_ptr + sp * M.to(gl.int64) * N + off, mask=mask, other=0.0, cache_modifier=".cg")
        elif MODE == 4:
            acc = gl.load(ws_ptr + loc, cache_modifier=".cg")
            for sp in range(1, SPLIT_K):
                acc += gl.load(ws_ptr + sp * (BM * BN) + loc, cache_modifier=".cg")
        else:
            acc = gl.convert_layout(v, l)  # the same registers (the chunk of the wgmma layout is this layout)
        if MODE == 1:
            gl.store(ws_ptr + gl.program_id(1).to(gl.int64) * M * N + off, acc, mask=mask)
        elif MODE == 3:
            gl.store(ws_ptr + loc, acc)
        else:
            if HAS_BIAS:
                acc += gl.expand_dims(gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32), 1)
            if VEC_Y:
                _store_y_vec(acc.to(y_ptr.dtype.element_ty), y_ptr, pid_n * BN + C * F, pid_m * BM + col0, M, N)
            else:
                gl.store(y_ptr + off, acc.to(y_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _store_y_vec(v, y_ptr, n0, m0, M, N):
        """v (F features, W tokens; 16-bit) -> y[m0 + j, n0 + i] with 16-byte stores: a layout conversion (through a
        few KB of shared memory: stmatrix, then 128-bit loads) gives each thread 8 consecutive features of one token,
        so a warp writes whole 32-byte sectors of y's rows. In the accumulator's layout a thread holds 2 tokens of a
        feature (rows of y N apart): 2-byte stores, half of each sector. Needs N % 8 == 0 (VEC_Y); the mask is on the
        tokens alone except in the last feature tile, where it goes back to element stores."""
        F: gl.constexpr = v.shape[0]
        W: gl.constexpr = v.shape[1]
        vl: gl.constexpr = gl.BlockedLayout(size_per_thread=[8, 1], threads_per_warp=[2, 16], warps_per_cta=[4, 1],
                                            order=[0, 1])
        yv = gl.convert_layout(v, vl)
        offs_n = n0 + gl.arange(0, F, layout=gl.SliceLayout(1, vl))
        offs_m = m0 + gl.arange(0, W, layout=gl.SliceLayout(0, vl))
        ptr = (y_ptr + gl.expand_dims(gl.multiple_of(offs_m * N, 8), 0)
               + gl.expand_dims(gl.max_contiguous(gl.multiple_of(offs_n, 8), 8), 1))
        if n0 + F <= N:  # a whole feature tile: only the token mask (constant along a thread's 8 features)
            gl.store(ptr, yv, mask=gl.expand_dims(offs_m < M, 0) & gl.expand_dims(offs_n >= 0, 1))
        else:
            gl.store(ptr, yv, mask=gl.expand_dims(offs_m < M, 0) & gl.expand_dims(offs_n < N, 1))

    @gluon.jit
    def _epilogue(acc, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C: gl.constexpr,
                  HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, CHUNKS: gl.constexpr,
                  MODE: gl.constexpr):
        """acc (BN / CONSUMERS features, BM tokens) -> y[m, n] (MODE, _epi_store) in CHUNKS (1, 2 or 4) column chunks."""
        if CHUNKS == 1:
            _epi_store(acc, 0, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS, VEC_Y, BM,
                       BN, MODE)
        else:
            h0, h1 = _halves(acc)
            if CHUNKS == 2:
                _epi_store(h0, 0, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS, VEC_Y,
                           BM, BN, MODE)
                _epi_store(h1, BM // 2, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS,
                           VEC_Y, BM, BN, MODE)
            else:
                q0, q1 = _halves(h0)
                _epi_store(q0, 0, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS, VEC_Y,
                           BM, BN, MODE)
                _epi_store(q1, BM // 4, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS,
                           VEC_Y, BM, BN, MODE)
                q2, q3 = _halves(h1)
                _epi_store(q2, BM // 2, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS,
                           VEC_Y, BM, BN, MODE)
                _epi_store(q3, 3 * BM // 4, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C,
                           HAS_BIAS, VEC_Y, BM, BN, MODE)

    _FENCE = gl.constexpr(FIXUP_FENCE)

    @gluon.jit
    def _fence_gpu():
        """fence.acq_rel.gpu in every thread of a warpgroup (one element a thread)."""
        l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[4], order=[0])
        gl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r,r", [gl.arange(0, 128, layout=l)],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _fixup(acc, y_ptr, bias_ptr, part_ptr, sum_ptr, cnt_ptr, t, pid_n, pid_m, M, N, COUNT, C: gl.constexpr,
               HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, CHUNKS: gl.constexpr,
               CONSUMERS: gl.constexpr, PART: gl.constexpr, SUM: gl.constexpr):
        """Tile t split among COUNT programs (split-K: PART 1 / SUM 2; stream-K: 3 / 4, _epi_store's modes): this
        one's fp32 partial to part_ptr, then one acq_rel ticket a (tile, consumer); the last to take it sums the
        COUNT partials from sum_ptr in order (the same bits whatever the arrival order), writes y and puts the
        ticket back to zero."""
        _epilogue(acc, y_ptr, bias_ptr, part_ptr, cnt_ptr, pid_n, pid_m, M, N, COUNT, C, HAS_BIAS, VEC_Y, BM, BN,
                  CHUNKS, PART)
        if _FENCE:
            _fence_gpu()
        gl.thread_barrier()
        tkt = t * CONSUMERS + C
        if gl.atomic_add(cnt_ptr + tkt, 1, sem="acq_rel", scope="gpu") == COUNT - 1:
            if _FENCE:
                _fence_gpu()
            _epilogue(acc, y_ptr, bias_ptr, sum_ptr, cnt_ptr, pid_n, pid_m, M, N, COUNT, C, HAS_BIAS, VEC_Y, BM, BN,
                      CHUNKS, SUM)
            gl.atomic_xchg(cnt_ptr + tkt, 0, sem="relaxed", scope="gpu")
