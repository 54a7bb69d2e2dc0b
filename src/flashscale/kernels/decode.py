"""Kernels of the batch-1 decode step (flashscale.infer.decode.StaticDecoder), small enough that a CUDA graph of
the whole step replays them: residual add + RMSNorm, RoPE + KV-cache write + attention of one query over the
static cache, SiLU(gate) * up. Their reference is the model itself: tests/test_infer_decode.py checks the step's
logits against Llama.forward with a KVCache (Triton's interpreter on the CPU, the GPU when there is one).

PDL (kernels.pdl): each may run with programmatic dependent launch, waiting for its predecessor first thing.
Shapes: E hidden size, H query heads, G kv heads, D head_dim (a power of two), T_MAX cache positions; the cache
is (G, T_MAX, D) a layer, q/k/v one row (H + 2G) * D.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashscale.kernels.pdl import pdl_enter


@triton.jit
def add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, E, eps, HAS_R: tl.constexpr, BLOCK: tl.constexpr,
                       PDL: tl.constexpr = False):
    """x <- x + r (rounded to x's dtype, as the model's residual add); h = RMSNorm(x) * w (HF order)."""
    pdl_enter(PDL)
    offs = tl.arange(0, BLOCK)
    m = offs < E
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if HAS_R:
        x = (x.to(tl.float32) + tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + offs, x, mask=m)
    xf = x.to(tl.float32)
    rs = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / E + eps)
    h = (xf * rs).to(h_ptr.dtype.element_ty).to(tl.float32) * tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rope(x, x_rot, cos, sin, D: tl.constexpr):
    d = tl.arange(0, D)
    return x * cos + tl.where(d < D // 2, -x_rot, x_rot) * sin


@triton.jit
def decode_attention_kernel(qkv_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, out_ptr, pos_ptr, T_MAX, scale,
                            H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
                            PDL: tl.constexpr = False):
    """One query head a program: RoPE on q and the new k, the group's first head writes k/v at pos, then
    softmax(q K^T) V over positions 0..pos (cache rows < pos, the new row from registers: no race)."""
    pdl_enter(PDL)
    hq = tl.program_id(0)
    g = hq // (H // G)
    pos = tl.load(pos_ptr)
    d = tl.arange(0, D)
    rot = (d + D // 2) % D
    cos = tl.load(cos_ptr + d).to(tl.float32)
    sin = tl.load(sin_ptr + d).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    q = _rope(tl.load(qkv_ptr + hq * D + d).to(tl.float32), tl.load(qkv_ptr + hq * D + rot).to(tl.float32), cos, sin, D)
    q = q.to(dt).to(tl.float32)
    kb = (H + g) * D
    k_new = _rope(tl.load(qkv_ptr + kb + d).to(tl.float32), tl.load(qkv_ptr + kb + rot).to(tl.float32), cos, sin, D)
    k_new = k_new.to(dt)
    v_new = tl.load(qkv_ptr + (H + G + g) * D + d)
    row = (g * T_MAX + pos) * D
    if hq % (H // G) == 0:
        tl.store(kc_ptr + row + d, k_new)
        tl.store(vc_ptr + row + d, v_new)
    s_new = tl.sum(q * k_new.to(tl.float32), axis=0) * scale
    m_i = s_new
    l_i = s_new * 0.0 + 1.0
    acc = v_new.to(tl.float32)
    for t0 in range(0, pos, BT):
        t = t0 + tl.arange(0, BT)
        tm = t < pos
        off = (g * T_MAX + t)[:, None] * D + d[None, :]
        kt = tl.load(kc_ptr + off, mask=tm[:, None], other=0.0).to(tl.float32)  # (BT, D)
        s = tl.where(tm, tl.sum(kt * q[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        vt = tl.load(vc_ptr + off, mask=tm[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * vt, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    tl.store(out_ptr + hq * D + d, (acc / l_i).to(dt))


@triton.jit
def silu_mul_kernel(g_ptr, u_ptr, out_ptr, F_: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out = SiLU(g) * u (F_ elements): SiLU in g's dtype as F.silu, then the product rounded once."""
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < F_
    g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=m, other=0.0)
    a = (g / (1.0 + tl.exp(-g))).to(u.dtype)  # F.silu in the model's dtype, then * up
    tl.store(out_ptr + offs, (a.to(tl.float32) * u.to(tl.float32)).to(u.dtype), mask=m)
