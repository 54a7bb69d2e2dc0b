"""FP8 (e4m3) attention forward for Hopper in Triton: FlashAttention-3's FP8 path.

Inputs come quantized from kernels/hadamard.py: q8 (B, Sq, H, D), k8 (B, Sk, Hkv, D) e4m3; V transposed,
vt8 (B, Hkv, D, Sk_pad) e4m3 with the key index contiguous; fp32 descales, one per QBLOCK_M rows of Q and
per QBLOCK_N rows of K and V (per batch and head). Output bf16 (B, Sq, H, D) and the fp32 LSE.

Per program: one (BLOCK_M, D) query tile (inside one Q scale block), the FA2 loop over key tiles of
BLOCK_N rows (each inside one K/V scale block), exactly the math of
flashscale.reference.attention_fp8.attention_fp8_quantized_ref:
  S = (q8 @ k8^T) * (q_descale * k_descale * scale * log2 e)       fp8 x fp8 -> fp32 on the tensor cores
  P = exp2(S - m + 8)                                               in (0, 2^8]: see the reference
  O = O * alpha + (e4m3(P) @ v8) * v_descale                        fp8 x fp8 -> fp32
The descales multiply the fp32 accumulators: the Q and K ones fold into the one multiply the scores
need anyway; the V one costs a multiply-add per output element per tile, which is why each V tile's
descale is a scalar (per-block, not per-row, scaling).

FP8 wgmma on Hopper takes both operands K-major (contiguous along the reduction): for Q K^T that is
D, which q8 and k8 rows already are; for P V it is the key index, hence V's transposed layout (the
quantization pre-pass writes it, so the kernel never transposes in shared memory). P (fp32 registers)
is cast to e4m3 and fed from registers.

Grid: (query tiles, B * H), heaviest causal tiles first; causal aligned bottom-right; GQA by index.
Only tiles intersecting the causal band are visited, and only the edge tiles pay for masks
(attention_common.block_range, shared with the bf16 kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from flashscale.kernels.attention_common import block_range, visible
from flashscale.kernels.attention_tune import cdiv
from flashscale.kernels.interpreter import interpreting

P_SHIFT_LOG2 = tl.constexpr(8.0)  # flashscale.reference.attention_fp8.P_SHIFT_LOG2


@dataclass(frozen=True, kw_only=True)
class Fp8Config:
    """BLOCK_M query rows x BLOCK_N key rows a step; they must divide the quantization blocks."""

    block_m: int
    block_n: int
    num_warps: int = 8
    num_stages: int = 2


def fp8_candidates(head_dim: int, *, gpu: bool) -> list[Fp8Config]:
    """Default first. FP8 tiles hold twice the elements of bf16 ones in the same bytes, so K/V stages
    are cheap in shared memory; registers bound BLOCK_M x D (fp32 O) + BLOCK_M x BLOCK_N (fp32 S, P).
    Not yet measured on the H200: the speed benchmark tunes over the list (--tune)."""
    if not gpu:
        return [Fp8Config(block_m=16, block_n=16, num_warps=4, num_stages=1)]
    if head_dim <= 64:
        return [Fp8Config(block_m=128, block_n=128, num_warps=8, num_stages=3),
                Fp8Config(block_m=128, block_n=64, num_warps=4, num_stages=3),
                Fp8Config(block_m=64, block_n=128, num_warps=4, num_stages=3)]
    if head_dim <= 128:
        return [Fp8Config(block_m=128, block_n=128, num_warps=8, num_stages=3),
                Fp8Config(block_m=128, block_n=64, num_warps=8, num_stages=3),
                Fp8Config(block_m=128, block_n=128, num_warps=8, num_stages=2),
                Fp8Config(block_m=64, block_n=128, num_warps=4, num_stages=3)]
    return [Fp8Config(block_m=128, block_n=64, num_warps=8, num_stages=2),
            Fp8Config(block_m=128, block_n=32, num_warps=8, num_stages=2),
            Fp8Config(block_m=64, block_n=64, num_warps=4, num_stages=2),
            Fp8Config(block_m=128, block_n=128, num_warps=8, num_stages=2)]


@triton.jit
def _round_e4m3(x):
    """Round fp32 to e4m3's 3 mantissa bits (nearest even) in integer arithmetic, normal range only.

    Interpreter only (triton 3.6.0, 2026-11): its float8e4nv cast loses the carry into the next binade
    (124.3 -> 64, not 128), so under TRITON_INTERPRET the kernel rounds P here first and the cast is then
    exact. P's subnormals (below 2^-6, i.e. 2^-14 of the row max) still flush to 0 there; the GPU's cvt
    needs none of this.
    """
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # -1048576 = 0xFFF00000: sign, exponent, 3 bits
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _fp8_inner(acc, l_i, m_i, q, k_base, vt_base, kd_base, vd_base, stride_ks, stride_vd, stride_kdn, stride_vdn, start,
               end, offs_m,
               offs_n, offs_d, seqlen_k, off, qk_scale, BLOCK_N: tl.constexpr, QBLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, ROUND_P: tl.constexpr):
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k_ptrs = k_base + cols[:, None].to(tl.int64) * stride_ks + offs_d[None, :]  # (BN, D)
        v_ptrs = vt_base + offs_d[:, None].to(tl.int64) * stride_vd + cols[None, :]  # (D, BN), keys contiguous
        if MASKED:  # the ragged last tile: rows past seqlen_k read 0 (never NaN bit patterns)
            k = tl.load(k_ptrs, mask=cols[:, None] < seqlen_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
        kd = tl.load(kd_base + (start_n // QBLOCK_N) * stride_kdn)
        qk = tl.dot(q, tl.trans(k))  # (BM, BN) fp32
        s = qk * (qk_scale * kd)
        if MASKED:
            vis = visible(offs_m[:, None], cols[None, :], seqlen_k, off, 0, 0, False, CAUSAL)
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = m_new
        p = tl.exp2(s - m_use[:, None] + P_SHIFT_LOG2)
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            vt = tl.load(v_ptrs, mask=cols[None, :] < seqlen_k, other=0.0)
        else:
            vt = tl.load(v_ptrs)
        vd = tl.load(vd_base + (start_n // QBLOCK_N) * stride_vdn)
        if ROUND_P:
            p8 = _round_e4m3(p).to(tl.float8e4nv)
        else:
            p8 = p.to(tl.float8e4nv)
        pv = tl.dot(p8, tl.trans(vt))  # (BM, D) fp32
        acc = acc * alpha[:, None] + pv * vd
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fp8_fwd_kernel(
    Q, K, VT, QD, KD, VD, O, LSE,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vh, stride_vd,
    stride_qdb, stride_qdh, stride_qdn, stride_kdb, stride_kdh, stride_kdn, stride_vdb, stride_vdh, stride_vdn,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    H, GROUP, seqlen_q, seqlen_k, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QBLOCK_M: tl.constexpr,
    QBLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, ROUND_P: tl.constexpr,
):
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest causal tiles first
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    m0 = start_m * BLOCK_M
    off = seqlen_k - seqlen_q
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None].to(tl.int64) * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < seqlen_q, other=0.0)  # (BM, D) e4m3
    qd = tl.load(QD + b * stride_qdb + h * stride_qdh + (m0 // QBLOCK_M) * stride_qdn)
    qk_scale = sm_scale * 1.4426950408889634 * qd  # log2 units
    k_base = K + b * stride_kb + hk * stride_kh
    vt_base = VT + b * stride_vb + hk * stride_vh
    kd_base = KD + b * stride_kdb + hk * stride_kdh
    vd_base = VD + b * stride_vdb + hk * stride_vdh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    lo, hi, full_lo, full_hi = block_range(m0, seqlen_q, seqlen_k, off, 0, 0, BLOCK_M, BLOCK_N, False, CAUSAL)
    # without a left window lo = full_lo = 0: these three calls walk the key tiles left to right, the
    # emulation's order, so the running max (and with it every rounding of P) is the same
    acc, l_i, m_i = _fp8_inner(acc, l_i, m_i, q, k_base, vt_base, kd_base, vd_base, stride_ks, stride_vd, stride_kdn,
                               stride_vdn, full_lo,
                               full_hi, offs_m, offs_n, offs_d, seqlen_k, off, qk_scale, BLOCK_N, QBLOCK_N, False,
                               CAUSAL, ROUND_P)
    acc, l_i, m_i = _fp8_inner(acc, l_i, m_i, q, k_base, vt_base, kd_base, vd_base, stride_ks, stride_vd, stride_kdn,
                               stride_vdn, lo,
                               full_lo, offs_m, offs_n, offs_d, seqlen_k, off, qk_scale, BLOCK_N, QBLOCK_N, True,
                               CAUSAL, ROUND_P)
    acc, l_i, m_i = _fp8_inner(acc, l_i, m_i, q, k_base, vt_base, kd_base, vd_base, stride_ks, stride_vd, stride_kdn,
                               stride_vdn, full_hi,
                               hi, offs_m, offs_n, offs_d, seqlen_k, off, qk_scale, BLOCK_N, QBLOCK_N, True,
                               CAUSAL, ROUND_P)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe) - P_SHIFT_LOG2) * 0.6931471805599453)
    row_ok = offs_m < seqlen_q
    tl.store(LSE + b * stride_lb + h * stride_lh + offs_m, lse, mask=row_ok)
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None].to(tl.int64) * stride_os + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])


def attention_fp8_fwd(q8, k8, vt8, q_descale, k_descale, v_descale, out, lse, *, causal: bool,
                      softmax_scale: float, block_m: int, block_n: int, config: Fp8Config | None = None):
    """Launch the forward. Inputs are validated by flashscale.ops.attention_fp8; this only computes.

    q8 (B, Sq, H, D), k8 (B, Sk, Hkv, D), vt8 (B, Hkv, D, >= Sk) e4m3 with unit last stride;
    q_descale (B, H, ceil(Sq / block_m)), k/v_descale (B, Hkv, ceil(Sk / block_n)) fp32 (any strides:
    expanded per-tensor scales work); out (B, Sq, H, D) bf16/fp16/fp32, lse (B, H, Sq) fp32.
    block_m/block_n: the quantization blocks; the kernel's tiles must divide them.
    """
    B, Sq, H, D = q8.shape
    Sk, Hkv = k8.shape[1], k8.shape[2]
    if B * H * Sq == 0:
        return out, lse
    if config is None:
        cands = fp8_candidates(D, gpu=q8.is_cuda and not interpreting())
        config = next((c for c in cands if block_m % c.block_m == 0 and block_n % c.block_n == 0), None)
        if config is None:
            raise ValueError(f"no FP8 tile divides the quantization blocks ({block_m}, {block_n}); "
                             f"use multiples of 64")
    if block_m % config.block_m or block_n % config.block_n:
        raise ValueError(f"config tiles ({config.block_m}, {config.block_n}) must divide the quantization "
                         f"blocks ({block_m}, {block_n})")
    grid = (cdiv(Sq, config.block_m), B * H)
    _attn_fp8_fwd_kernel[grid](
        q8, k8, vt8, q_descale, k_descale, v_descale, out, lse,
        q8.stride(0), q8.stride(1), q8.stride(2), k8.stride(0), k8.stride(1), k8.stride(2),
        vt8.stride(0), vt8.stride(1), vt8.stride(2),
        *q_descale.stride(), *k_descale.stride(), *v_descale.stride(),
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        H, H // Hkv, Sq, Sk, float(softmax_scale),
        HEAD_DIM=D, BLOCK_M=config.block_m, BLOCK_N=config.block_n, QBLOCK_M=block_m, QBLOCK_N=block_n,
        CAUSAL=bool(causal), ROUND_P=interpreting(), num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out, lse
