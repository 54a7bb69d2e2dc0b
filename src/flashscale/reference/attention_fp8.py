"""FP8 (e4m3) attention as FlashAttention-3 does it, emulated step by step in plain PyTorch.

The oracle of kernels/attention_fp8.py and kernels/hadamard.py, and the CPU path of ops.attention_fp8.
torch.float8_e4m3fn casts run on the CPU, so every rounding the GPU does is reproduced here except the
order of fp32 additions inside a product (and Hopper's FP8 tensor cores, which keep fewer mantissa bits
while accumulating a K-chunk: the GPU tests measure that, they do not assume it).

Pipeline (shapes: B batch, S sequence, H query heads, Hkv K/V heads, D head dim):

1. Incoherent processing (FA3 section 3.3): x <- (x * signs) @ Hadamard_D / sqrt(D) on Q and K, one
   seeded sign vector (D,) shared by both, so Q K^T is unchanged: R = diag(signs) H / sqrt(D) is
   orthogonal (H H^T = D I) and (Q R)(K R)^T = Q K^T. An outlier coordinate is spread over all D
   coordinates. V is not transformed (its rotation would have to be undone on the output).
2. Block quantization: one fp32 descale per block of `block_m` rows of Q (per batch and head), per
   `block_n` rows of K and of V: descale = max(amax, FLOOR) / 448 (448 = e4m3's largest finite), the
   block stored as e4m3(x / descale) (round to nearest even). All-zero blocks get FLOOR instead of a
   0 descale, so nothing divides by zero and they dequantize to exact zeros.
   Per-tensor quantization (FA3's baseline) is the same with one block a tensor.
3. The forward, FlashAttention-2's loop over key tiles of `tile_n` rows (tile_n divides block_n):
     S_j = (q8 @ k8_j^T) * (q_descale * k_descale_j * softmax_scale)            fp32 accumulators
     m   = max(m, rowmax(S_j));  P_j = exp2((S_j - m) * log2(e) + P_SHIFT_LOG2)   P in (0, 2^8]
     l   = l * alpha + rowsum(P_j)          (P in fp32: the same normalizer as the bf16 path)
     O   = O * alpha + (e4m3(P_j) @ v8_j) * v_descale_j
   out = O / l, rounded to bf16. The running max decides P's scale, so the emulation walks the same
   tiles as the kernel: results depend on tile_n and this loop reproduces it.

Why P is shifted by 2^8 (FA3's hopper/softmax.h does the same with its Max_offset = 8): after the
max subtraction P lies in (0, 1], and e4m3's normal range stops at 2^-6 (subnormal steps of 2^-9,
zero below 2^-10). A row whose scores spread over ~10 units (outlier rows) has most of its P under
2^-6: they would round with absolute steps of 2^-9, or vanish, and since l sums the unrounded P the
output would shrink towards 0. Scaling P into (0, 256] keeps everything down to 2^-14 (relative to the
row max) in the normal range (relative error <= 2^-4); 256 < 448 never saturates. The factor cancels in
O / l because l carries it too.

Causal masks are aligned bottom-right (key j visible to query i iff j <= i + Sk - Sq), as ops.attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
FLOOR = 2.0 ** -64  # amax floor: all-zero blocks; tiny enough that no real block ever reaches it
P_SHIFT_LOG2 = 8.0  # P scaled into (0, 2^8] before its e4m3 cast (see the module docstring)
LOG2E = 1.4426950408889634
DEFAULT_BLOCK_M = 128
DEFAULT_BLOCK_N = 128


def hadamard_matrix(n: int, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """(n, n) Sylvester Hadamard matrix, entries +-1: H[i, j] = (-1)^popcount(i & j); H H^T = n I."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"n must be a power of 2; got {n}")
    i = torch.arange(n, device=device)
    bits = i[:, None] & i[None, :]
    parity = torch.zeros_like(bits)
    for b in range(max(n.bit_length() - 1, 0)):
        parity ^= (bits >> b) & 1
    return (1 - 2 * parity).to(dtype)


def random_signs(d: int, seed: int, *, device=None) -> torch.Tensor:
    """(d,) float32 of +-1 from a seeded CPU generator (the same on every device and run)."""
    g = torch.Generator().manual_seed(int(seed))
    return (torch.randint(0, 2, (d,), generator=g) * 2 - 1).to(torch.float32).to(device)


def hadamard_ref(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """x (..., D) -> (x * signs) @ H_D / sqrt(D) in float32 (float64 stays float64)."""
    D = x.shape[-1]
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = hadamard_matrix(D, dtype=dt, device=x.device)
    return ((x.to(dt) * signs.to(dt)) @ h) * (1.0 / math.sqrt(D))


def quantize_blocks_ref(x: torch.Tensor, block: int, *, per_tensor: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, S, H, D) float -> (x8 (B, S, H, D) e4m3, descale (B, H, ceil(S / block)) float32).

    per_tensor: one amax for the whole tensor (FA3's baseline), its descale repeated in every block, so
    both variants feed the same attention code.
    """
    B, S, H, D = x.shape
    nb = -(-S // block)
    xf = x.to(torch.float32)
    if per_tensor:
        amax = xf.abs().amax().clamp_min(FLOOR).reshape(1, 1).expand(B, nb, H)  # (B, nb, H)
    else:
        pad = nb * block - S
        xp = torch.nn.functional.pad(xf, (0, 0, 0, 0, 0, pad)) if pad else xf  # zero rows raise no amax
        amax = xp.reshape(B, nb, block, H, D).abs().amax(dim=(2, 4)).clamp_min(FLOOR)  # (B, nb, H)
    # Tensor / tensor on purpose: on CUDA, torch divides by a Python scalar as a multiplication by its
    # reciprocal (1/448 is inexact: 1 ulp off IEEE division, which the kernels do with div_rn)
    lim = torch.full_like(amax, E4M3_MAX)
    inv = (lim / amax).repeat_interleave(block, dim=1)[:, :S, :, None]  # (B, S, H, 1)
    x8 = (xf * inv).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return x8, (amax / lim).transpose(1, 2).contiguous()  # (B, H, nb)


def dequantize_blocks_ref(x8: torch.Tensor, descale: torch.Tensor, block: int) -> torch.Tensor:
    """Inverse of quantize_blocks_ref: (B, S, H, D) float32."""
    S = x8.shape[1]
    d = descale.transpose(1, 2).repeat_interleave(block, dim=1)[:, :S, :, None]  # (B, S, H, 1)
    return x8.to(torch.float32) * d


def padded_len(s: int, multiple: int = 16) -> int:
    """Sequence length of the transposed V layout: a multiple of 16 (16-byte aligned rows for TMA; 32 with the keys
    permuted, whole groups of the permutation)."""
    return -(-s // multiple) * multiple


def v_key_of_slot(k):
    """The key a key-permuted V^T (the FA3 FP8 kernel's v_perm layout) holds at column k: within each 32-key group,
    slot 4t + i of a 16-key half holds key 2t + (i & 1) + 8 (i >> 1) of that half (the wgmma accumulator columns of
    lane t's registers, so P reaches the FP8 A operand without shuffles). Works on ints and integer tensors."""
    return (k & ~15) | (((k >> 2) & 3) << 1) | (k & 1) | (((k >> 1) & 1) << 3)


def permute_v_keys(vt: torch.Tensor, seqlen_k: int) -> torch.Tensor:
    """vt (..., >= seqlen_k) in natural key order -> (..., seqlen_k rounded up to 32) with column k holding key
    v_key_of_slot(k) (zeros for keys >= seqlen_k): the key-permuted V^T."""
    n = padded_len(seqlen_k, 32)
    nat = torch.zeros((*vt.shape[:-1], n), dtype=vt.dtype, device=vt.device)
    nat[..., :seqlen_k] = vt[..., :seqlen_k]
    return nat[..., v_key_of_slot(torch.arange(n, device=vt.device))].contiguous()


def unpermute_v_keys(vt: torch.Tensor, seqlen_k: int) -> torch.Tensor:
    """Inverse of permute_v_keys: a key-permuted V^T (..., >= seqlen_k rounded up to 32) -> natural key order
    (..., seqlen_k rounded up to 16), zeros past seqlen_k (the layout quantize_fp8 writes without key permutation)."""
    n = padded_len(seqlen_k, 32)
    if vt.shape[-1] < n:
        raise ValueError(f"a key-permuted V^T holds whole 32-key groups: >= {n} columns for seqlen_k={seqlen_k}; "
                         f"got {vt.shape[-1]}")
    slot_of_key = torch.argsort(v_key_of_slot(torch.arange(n, device=vt.device)))
    out = torch.zeros((*vt.shape[:-1], padded_len(seqlen_k)), dtype=vt.dtype, device=vt.device)
    out[..., :seqlen_k] = vt[..., slot_of_key[:seqlen_k]]
    return out


@dataclass(frozen=True, kw_only=True)
class Fp8Inputs:
    """Quantized Q, K, V in the emulation's layout: q8 (B, Sq, H, D), k8/v8 (B, Sk, Hkv, D) e4m3;
    descales (B, H or Hkv, blocks) float32, one per block_m rows of Q and block_n rows of K/V."""

    q8: torch.Tensor
    k8: torch.Tensor
    v8: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    block_m: int
    block_n: int


def quantize_qkv_ref(q, k, v, *, hadamard: bool = True, block_quant: bool = True, seed: int = 0,
                     block_m: int = DEFAULT_BLOCK_M, block_n: int = DEFAULT_BLOCK_N) -> Fp8Inputs:
    """The pre-pass: (optional) random-sign Hadamard on Q and K, then block (or per-tensor) quantization."""
    if hadamard:
        signs = random_signs(q.shape[-1], seed, device=q.device)
        q, k = hadamard_ref(q, signs), hadamard_ref(k, signs)
        # the kernel rounds the transform's fp32 result straight to e4m3 (no bf16 in between)
    pt = not block_quant
    q8, qd = quantize_blocks_ref(q, block_m, per_tensor=pt)
    k8, kd = quantize_blocks_ref(k, block_n, per_tensor=pt)
    v8, vd = quantize_blocks_ref(v, block_n, per_tensor=pt)
    return Fp8Inputs(q8=q8, k8=k8, v8=v8, q_descale=qd, k_descale=kd, v_descale=vd, block_m=block_m,
                     block_n=block_n)


def attention_fp8_quantized_ref(x: Fp8Inputs, *, causal: bool = False, softmax_scale: float | None = None,
                                tile_n: int | None = None, out_dtype=torch.bfloat16,
                                return_lse: bool = False, p_shift_log2: float = P_SHIFT_LOG2):
    """The kernel's forward on quantized inputs (see the module docstring, step 3).

    tile_n: the kernel's key tile (BLOCK_N); must divide block_n (default: block_n, capped at 128).
    p_shift_log2: P's scale exponent (8, FA3's; 0 reproduces an unshifted P in (0, 1] for ablations).
    Returns out (B, Sq, H, D) in out_dtype [, lse (B, H, Sq) float32, natural log].
    """
    q8, k8, v8 = x.q8, x.k8, x.v8
    B, Sq, H, D = q8.shape
    Sk, Hkv = k8.shape[1], k8.shape[2]
    G = H // Hkv
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else float(softmax_scale)
    tile = tile_n or min(x.block_n, 128)
    if x.block_n % tile:
        raise ValueError(f"tile_n ({tile}) must divide block_n ({x.block_n})")
    # per-row Q descale and per-column K/V descales, expanded once: (B, H, Sq) and (B, Hkv, Sk)
    qd = x.q_descale.repeat_interleave(x.block_m, dim=2)[:, :, :Sq]
    kd = x.k_descale.repeat_interleave(x.block_n, dim=2)[:, :, :Sk]
    vd = x.v_descale.repeat_interleave(x.block_n, dim=2)[:, :, :Sk]
    qf = q8.to(torch.float32).permute(0, 2, 1, 3)  # (B, H, Sq, D), exact e4m3 values
    kf = k8.to(torch.float32).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)  # (B, H, Sk, D)
    vf = v8.to(torch.float32).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
    kd, vd = kd.repeat_interleave(G, dim=1), vd.repeat_interleave(G, dim=1)  # (B, H, Sk)
    row_scale = (qd * (scale * LOG2E))[..., None]  # (B, H, Sq, 1): log2 units, as the kernel
    dev = q8.device
    rows = torch.arange(Sq, device=dev)[:, None] + (Sk - Sq)  # query position on the key axis (bottom-right)

    m = torch.full((B, H, Sq), float("-inf"), device=dev)
    l = torch.zeros((B, H, Sq), device=dev)
    acc = torch.zeros((B, H, Sq, D), device=dev)
    for n0 in range(0, Sk, tile):
        n1 = min(n0 + tile, Sk)
        qk = qf @ kf[:, :, n0:n1].transpose(-1, -2)  # (B, H, Sq, t) fp32 accumulators
        s = qk * (row_scale * kd[:, :, None, n0:n1])
        if causal:
            s = s.masked_fill(torch.arange(n0, n1, device=dev)[None, :] > rows, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_use = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)  # no -inf - -inf
        p = torch.exp2(s - m_use[..., None] + p_shift_log2)
        alpha = torch.exp2(m - m_use)
        l = l * alpha + p.sum(-1)
        pv = p.to(E4M3).to(torch.float32) @ vf[:, :, n0:n1]  # (B, H, Sq, D)
        acc = acc * alpha[..., None] + pv * vd[:, :, n0, None, None]  # one V descale a tile
        m = m_new
    empty = l == 0
    l_safe = torch.where(empty, torch.ones_like(l), l)
    out = (acc / l_safe[..., None]).permute(0, 2, 1, 3).to(out_dtype)  # (B, Sq, H, D)
    if not return_lse:
        return out
    lse = torch.where(empty, torch.full_like(l, float("-inf")),
                      (m + torch.log2(l_safe) - p_shift_log2) * math.log(2.0))
    return out, lse


def attention_fp8_ref(q, k, v, *, causal: bool = False, softmax_scale: float | None = None, hadamard: bool = True,
                      block_quant: bool = True, seed: int = 0, block_m: int = DEFAULT_BLOCK_M,
                      block_n: int = DEFAULT_BLOCK_N, tile_n: int | None = None, out_dtype=torch.bfloat16,
                      p_shift_log2: float = P_SHIFT_LOG2):
    """Quantize (pre-pass) and attend: q (B, Sq, H, D), k/v (B, Sk, Hkv, D) -> out (B, Sq, H, D)."""
    x = quantize_qkv_ref(q, k, v, hadamard=hadamard, block_quant=block_quant, seed=seed, block_m=block_m,
                         block_n=block_n)
    return attention_fp8_quantized_ref(x, causal=causal, softmax_scale=softmax_scale, tile_n=tile_n,
                                       out_dtype=out_dtype, p_shift_log2=p_shift_log2)
