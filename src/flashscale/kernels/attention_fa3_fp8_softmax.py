"""The FP8 FA3 forward's register work between its two GEMMs (kernels/attention_fa3_fp8.py, module docstring):
the online-softmax step on S (_softmax: masks, row max, optionally as a tree, exp2 on MUFU or partly on the FMA
pipe) and the move of P from the fp32 wgmma accumulator layout into the FP8 A-operand layout (_p_to_a: FA3's
permute_Aregs_fp8 as inline PTX, or two byte permutes with V^T's keys permuted). Separate from the kernel's
partitions and barriers (attention_fa3_fp8_kernel.py): element-wise math on one consumer's registers, no memory.
The PTX strings _ACC_TO_A_* are replayed on the linear layouts by tests/kernels/test_attention_fa3_fp8_compile.py.
"""

from __future__ import annotations

from flashscale.kernels.attention_fa3_fp8_exp2 import HAS_GLUON

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from flashscale.kernels.attention_fa3_coop import _max_combine, _sum_combine  # the bf16 forward's combiners
    from flashscale.kernels.attention_fa3_fp8_exp2 import _exp2_fma

    # FP8 A-operand fix-up (FA3 section 3.3, its permute_Aregs_fp8), per 64 bits = the 8 e4m3 of two adjacent
    # registers R0, R1 of the accumulator layout (registers 4m..4m+3: rows r / r + 8 of the key pair (k, k+1);
    # R1: the same 8 columns on). The A layout wants thread t of a quad to hold keys 4t..4t+3 of a 16-key group,
    # the accumulator gives it 2t, 2t+1, 8+2t, 9+2t: two quad shuffles (lanes 0/3 send R0 first, 1/2 R1) and
    # two byte permutes. Registers 4m..4m+3 then hold exactly what the A layout's registers hold, but the tensor
    # still carries the accumulator's index labels: _relabel_a renames them (a free reshape/permute whose
    # inferred layout is the A layout, checked by convert_layout(assert_trivial=True)).
    # tests/kernels/test_attention_fa3_fp8_compile.py replays this exchange on the linear layouts.
    _ACC_TO_A_ASM = """
    {
    .reg .u32 lane, t, q, sh, lut, su, sl, x1, x2, s1, s2, slo, shi;
    .reg .pred p;
    mov.u32 lane, %laneid;
    and.b32 t, lane, 3;
    and.b32 q, lane, 28;
    shl.b32 sh, t, 2;
    mov.u32 lut, 0x2130;
    shr.u32 su, lut, sh;
    and.b32 su, su, 15;
    or.b32 su, su, q;
    mov.u32 lut, 0x3021;
    shr.u32 sl, lut, sh;
    and.b32 sl, sl, 15;
    or.b32 sl, sl, q;
    setp.eq.u32 p, t, 0;
    setp.eq.or.u32 p, t, 3, p;
    selp.b32 slo, 0x5410, 0x1054, p;
    selp.b32 shi, 0x7632, 0x3276, p;
    PAIRS
    }
    """
    _ACC_TO_A_PAIR = """
    selp.b32 s1, $I0, $I1, p;
    selp.b32 s2, $I1, $I0, p;
    shfl.sync.idx.b32 x1, s1, su, 0x1f, 0xffffffff;
    shfl.sync.idx.b32 x2, s2, sl, 0x1f, 0xffffffff;
    prmt.b32 $O0, x1, x2, slo;
    prmt.b32 $O1, x1, x2, shi;
    """

    # V_PERM: the A operand's slots k = 4t + i (i < 4) of each 16-key half hold the accumulator's own columns
    # 2t + (i & 1) + 8 (i >> 1) of that half: from the thread's registers of column chunks (0, 1) (slots 0-15) and
    # (2, 3) (16-31), bytes (row g, row g + 8) of each; two byte permutes a pair, no lane crossing
    _ACC_TO_A_PERM_PAIR = """
    prmt.b32 $O0, $I0, $I1, 0x5410;
    prmt.b32 $O1, $I0, $I1, 0x7632;
    """

    def _pairs(pair: str, pack: int) -> str:
        """`pair` once for each register pair of a call: outputs $0..$n-1, inputs $n..$2n-1 (n 32-bit registers)."""
        n = pack // 4
        return "".join(pair.replace("$I0", f"${n + 2 * k}").replace("$I1", f"${n + 2 * k + 1}")
                       .replace("$O0", f"${2 * k}").replace("$O1", f"${2 * k + 1}") for k in range(n // 2))

    def _acc_to_a_asm(pack: int) -> str:
        return _ACC_TO_A_ASM.replace("PAIRS", _pairs(_ACC_TO_A_PAIR, pack))

    def _acc_to_a_perm_asm(pack: int) -> str:
        return "{" + _pairs(_ACC_TO_A_PERM_PAIR, pack) + "}"

    # module globals a kernel reads must be constexpr
    _ACC_TO_A_16 = gl.constexpr(_acc_to_a_asm(16))
    _ACC_TO_A_32 = gl.constexpr(_acc_to_a_asm(32))
    _ACC_TO_A_PERM_16 = gl.constexpr(_acc_to_a_perm_asm(16))
    _ACC_TO_A_PERM_32 = gl.constexpr(_acc_to_a_perm_asm(32))
    _CONSTRAINTS_16 = gl.constexpr(",".join(["=r"] * 4 + ["r"] * 4))
    _CONSTRAINTS_32 = gl.constexpr(",".join(["=r"] * 8 + ["r"] * 8))

    @gluon.jit
    def _relabel_a(x, SUB_M: gl.constexpr, BN: gl.constexpr):
        """Rename indices (row bit 3 <- col bit 3, col bits 1, 2, 3 <- row bit 3, col bits 1, 2): the accumulator
        layout's register slots under the FP8 A layout's labels (no data movement)."""
        x8 = x.reshape([SUB_M // 16, 2, 8, BN // 16, 2, 2, 2, 2])  # (r5 r4, r3, r2..r0, c_hi, c3, c2, c1, c0)
        return x8.permute((0, 4, 2, 3, 5, 6, 1, 7)).reshape([SUB_M, BN])

    @gluon.jit
    def _p_to_a(p, p_layout: gl.constexpr, SUB_M: gl.constexpr, BN: gl.constexpr, f8: gl.constexpr,
                V_PERM: gl.constexpr = False):
        """P (SUB_M, BN) fp32 in the wgmma accumulator layout -> e4m3 in the FP8 A-operand layout (registers).
        V_PERM: slot k of a 32-key group gets column v_key_of_slot(k) (V^T's keys stored in that order)."""
        p8 = p.to(f8)  # F2FP: 2 fp32 -> 2 e4m3, merged 4 a register
        if V_PERM:
            if SUB_M * BN >= 128 * 32:
                x = gl.inline_asm_elementwise(_ACC_TO_A_PERM_32, _CONSTRAINTS_32, [p8], dtype=gl.float8e4nv,
                                              is_pure=True, pack=32)
            else:
                x = gl.inline_asm_elementwise(_ACC_TO_A_PERM_16, _CONSTRAINTS_16, [p8], dtype=gl.float8e4nv,
                                              is_pure=True, pack=16)
        elif SUB_M * BN >= 128 * 32:  # 32 e4m3 a thread and a call (amortises the lane arithmetic)
            x = gl.inline_asm_elementwise(_ACC_TO_A_32, _CONSTRAINTS_32, [p8], dtype=gl.float8e4nv, is_pure=False,
                                          pack=32)
        else:
            x = gl.inline_asm_elementwise(_ACC_TO_A_16, _CONSTRAINTS_16, [p8], dtype=gl.float8e4nv, is_pure=False,
                                          pack=16)
        # the same renaming either way: the permuted bytes sit where the shuffled ones would (V_PERM: holding keys
        # v_key_of_slot(k) of the slots k the shuffle would have filled with key k)
        return gl.convert_layout(_relabel_a(x, SUB_M, BN), p_layout, assert_trivial=True)

    @gluon.jit
    def _halve_max(x, ROWS: gl.constexpr, N: gl.constexpr):
        """(ROWS, N) -> (ROWS, N / 2): the elementwise max of the two column halves (the top column bit must be a
        register bit of x's layout: the reshape/permute/split is then a relabelling, no data movement)."""
        a, b = x.reshape([ROWS, 2, N // 2]).permute((0, 2, 1)).split()
        return gl.maximum(a, b)

    @gluon.jit
    def _row_max_tree(s, SUB_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """rowmax of s (SUB_M, BLOCK_N) in the wgmma accumulator layout, as a tree: halve the columns down to 8 (column
        bits >= 3 are register bits of that layout), then reduce the 8 (2 in the thread, 4 lanes) as gl.reduce does.
        Exact (max is associative), so bitwise gl.reduce(s, 1, max)."""
        x = s
        if BLOCK_N >= 256:
            x = _halve_max(x, SUB_M, 256)
        if BLOCK_N >= 128:
            x = _halve_max(x, SUB_M, 128)
        if BLOCK_N >= 64:
            x = _halve_max(x, SUB_M, 64)
        if BLOCK_N >= 32:
            x = _halve_max(x, SUB_M, 32)
        x = _halve_max(x, SUB_M, 16)
        return gl.reduce(x, 1, _max_combine)

    @gluon.jit
    def _softmax(s, j, m_i, l_i, rs, rows, off, seqlen_k, cols0, n_full, CAUSAL: gl.constexpr,
                 BLOCK_N: gl.constexpr, EXP2_FMA: gl.constexpr, TREE_MAX: gl.constexpr = False):
        """Online-softmax step on raw scores s (SUB_M, BN) fp32 with the per-row scale rs (log2 units)
        -> p = exp2(s * rs - m + 8) (fp32), alpha, new m, new l. Blocks j >= n_full (the ragged last block, the
        causal diagonal band) mask keys >= Sk and, if CAUSAL, past the diagonal (key > row + Sk - Sq)."""
        if j >= n_full:  # uniform branch
            cols = j * BLOCK_N + cols0
            vis = gl.expand_dims(cols, 0) < seqlen_k
            if CAUSAL:
                vis = vis & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + off)
            s = gl.where(vis, s, float("-inf"))
        # rs > 0 and rounding is monotonic: rowmax(s) * rs == rowmax(s * rs), bit for bit
        if TREE_MAX:
            # the reduced slice layout is the row layout relabelled: the conversion is proven free at compile time
            row_max = gl.convert_layout(_row_max_tree(s, s.shape[0], BLOCK_N), m_i.type.layout, assert_trivial=True)
            m_new = gl.maximum(m_i, row_max * rs)
        else:
            m_new = gl.maximum(m_i, gl.reduce(s, 1, _max_combine) * rs)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # nothing visible yet: no -inf - -inf
        x = s * gl.expand_dims(rs, 1) - gl.expand_dims(m_use - 8.0, 1)  # one FFMA an element
        if EXP2_FMA > 0:
            # key groups of 8 (g = col // 8) with (g * EXP2_FMA) % 8 < EXP2_FMA on the FMA pipe: the column bits
            # >= 3 of the accumulator layout are register bits, so the predicate is a constant per register and
            # each element keeps one of the two paths (the compile test counts MUFU.EX2 in the key loop)
            emu = ((cols0 // 8) * EXP2_FMA) % 8 < EXP2_FMA
            p = gl.where(gl.expand_dims(emu, 0), _exp2_fma(x), gl.exp2(x))
        else:
            p = gl.exp2(x)  # MUFU.EX2
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.reduce(p, 1, _sum_combine)
        return p, alpha, m_new, l_i
