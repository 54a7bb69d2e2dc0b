"""Prologues of the accumulating decode GEMV (kernels.w4a16.w4a16_addmm_): the small kernel that a decode step runs
before a linear, done by the GEMV's own programs instead (docs/w4a16_decode.md "Round 10").

In a batch-1 decode step every block linear but the attention's output projection follows a tiny kernel: the
residual add + RMSNorm before q/k/v and before gate/up, SiLU(gate) * up before down. Each is a launch, a wait for
the GEMV before it and a few microseconds in which HBM idles. With a prologue the GEMV computes its input x itself,
after it waits for the kernel ahead (PDL) and while its first weight words are already in flight:

    XNorm(res, weight, eps, res_out, r):  res_out <- res + r;  x <- RMSNorm(res_out) * weight
    XSiLU(gu):                            x <- SiLU(gu[:, :K]) * gu[:, K:]
    XAttn(ws, splits, head_dim):          x <- the decode attention's output, combined from its splits' partials

(r, gu: a linear's float32 sum, rounded to x's dtype first, as the linear would have stored it; the math and its
roundings are kernels.decode's add_rmsnorm_kernel and silu_mul_kernel.) x (M, K) is the GEMV's input buffer: each
program writes the chunks of 64 kt inputs that its items read (so the union of the programs writes all of x; a chunk
shared by programs gets the same bits from each), a CTA barrier, then the GEMV's own x loads. The norm needs the
sum of squares of the whole row: every program reads it (K values from L2) and sums it itself. res_out must not
be res (other programs still read res): a decode step alternates two residual buffers.

XAttn takes the place of the attention kernel's own split combine (its last split's ticket, re-read and store):
the o projection's programs combine the partials of the heads their chunks cover, after their PDL wait.

Shapes: M tokens (<= 8; XAttn 1), K inputs; res, res_out, x (M, K) 16-bit contiguous; r (M, K), gu (M, 2K) float32
contiguous; weight (K,); ws (H * splits, head_dim + 2) float32 (acc, max, sum a row), K = H * head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

NORM_BLOCK_MAX = 8192  # the sum of squares in one block up to this K, a loop of blocks past it


@dataclass(frozen=True)
class XNorm:
    """x <- RMSNorm(res + r) * weight (HF order), res_out <- res + r (r None: res)."""
    res: torch.Tensor
    weight: torch.Tensor
    eps: float
    res_out: torch.Tensor
    r: torch.Tensor | None = None


@dataclass(frozen=True)
class XSiLU:
    """x <- SiLU(gu[:, :K]) * gu[:, K:] (gu: the fused gate/up linear's float32 sum, (M, 2K))."""
    gu: torch.Tensor


@dataclass(frozen=True)
class XAttn:
    """x <- softmax-weighted combine of the attention's split partials: for head h, rows s of ws[h * splits + s]
    = (acc (head_dim,), max, sum) unnormalised (kernels.decode.decode_attention_kernel with COMBINE False)."""
    ws: torch.Tensor
    splits: int
    head_dim: int


Prologue = XNorm | XSiLU | XAttn


def _want(name: str, t, shape: tuple, dtype: torch.dtype | tuple, device: torch.device) -> None:
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype not in dtypes:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"prologue {name} must be {' or '.join(map(str, dtypes))} {shape}, got {got}")
    if t.device != device:
        raise ValueError(f"prologue {name} is on {t.device}, x on {device}")
    if not t.is_contiguous():
        raise ValueError(f"prologue {name} must be contiguous")


def check(pro: Prologue, x2d: torch.Tensor) -> None:
    """ValueError / TypeError naming the field for a prologue that cannot write x2d (M, K)."""
    if not isinstance(pro, (XNorm, XSiLU, XAttn)):
        raise TypeError(f"prologue must be an XNorm, an XSiLU or an XAttn, got {type(pro).__name__}")
    m, k = x2d.shape
    if not x2d.is_contiguous():
        raise ValueError("x must be contiguous where a prologue writes it")
    if isinstance(pro, XAttn):
        ns, d = pro.splits, pro.head_dim
        if not isinstance(ns, int) or isinstance(ns, bool) or ns < 2 or ns & (ns - 1):
            raise ValueError(f"prologue splits must be a power of two >= 2 (one split: the attention writes x), "
                             f"got {ns!r}")
        if not isinstance(d, int) or isinstance(d, bool) or d < 1 or k % d:
            raise ValueError(f"prologue head_dim must be a positive int dividing x's {k} columns, got {d!r}")
        if m != 1:
            raise ValueError(f"prologue XAttn combines one token's heads: x must have 1 row, got {m}")
        _want("ws", pro.ws, (k // d * ns, d + 2), torch.float32, x2d.device)
        return
    if isinstance(pro, XSiLU):
        _want("gu", pro.gu, (m, 2 * k), torch.float32, x2d.device)
        return
    _want("res", pro.res, (m, k), x2d.dtype, x2d.device)
    _want("res_out", pro.res_out, (m, k), x2d.dtype, x2d.device)
    _want("weight", pro.weight, (k,), (x2d.dtype, torch.float32), x2d.device)
    if pro.r is not None:
        _want("r", pro.r, (m, k), torch.float32, x2d.device)
    if pro.res_out.data_ptr() == pro.res.data_ptr() or pro.res_out.data_ptr() == x2d.data_ptr():
        raise ValueError("prologue res_out must be a buffer of its own (not res, not x): the GEMV's programs read "
                         "res while others write res_out")
    if not isinstance(pro.eps, float) or not pro.eps > 0:
        raise ValueError(f"prologue eps must be a positive float, got {pro.eps!r}")


@torch.no_grad()
def reference(pro: Prologue, x2d: torch.Tensor) -> None:
    """What the kernel's prologue writes, in PyTorch (the same roundings): x2d (and res_out) in place."""
    dt = x2d.dtype
    if isinstance(pro, XAttn):
        d = pro.head_dim
        part = pro.ws.view(-1, pro.splits, d + 2)  # (H, NS, D + 2)
        m = part[..., d]
        w = torch.exp(m - m.max(1, keepdim=True).values)  # (H, NS)
        o = (w[..., None] * part[..., :d]).sum(1) / (w * part[..., d + 1]).sum(1)[:, None]
        x2d.copy_(o.reshape(x2d.shape).to(dt))
        return
    if isinstance(pro, XSiLU):
        k = x2d.shape[1]
        g, u = pro.gu[:, :k].to(dt).float(), pro.gu[:, k:].to(dt)
        x2d.copy_(((g / (1.0 + torch.exp(-g))).to(dt).float() * u.float()).to(dt))
        return
    x = pro.res if pro.r is None else (pro.res.float() + pro.r.to(dt).float()).to(dt)
    pro.res_out.copy_(x)
    xf = x.float()
    rs = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + pro.eps)
    x2d.copy_(((xf * rs).to(dt).float() * pro.weight.float()).to(dt))


def kernel_args(pro: Prologue | None, x2d: torch.Tensor) -> dict:
    """The ring kernel's prologue arguments (pointers stand in where the mode reads nothing)."""
    if pro is None:
        return dict(xo_ptr=x2d, pa_ptr=x2d, pr_ptr=x2d, pw_ptr=x2d, po_ptr=x2d, eps=0.0, XMODE=0, HAS_R=False,
                    NBLK=16)
    if isinstance(pro, XAttn):  # NBLK: the splits, PHD: the head dim
        return dict(xo_ptr=x2d, pa_ptr=pro.ws, pr_ptr=pro.ws, pw_ptr=x2d, po_ptr=x2d, eps=0.0, XMODE=3, HAS_R=False,
                    NBLK=pro.splits, PHD=pro.head_dim)
    if isinstance(pro, XSiLU):
        return dict(xo_ptr=x2d, pa_ptr=pro.gu, pr_ptr=pro.gu, pw_ptr=x2d, po_ptr=x2d, eps=0.0, XMODE=2,
                    HAS_R=False, NBLK=16)
    k = x2d.shape[1]
    return dict(xo_ptr=x2d, pa_ptr=pro.res, pr_ptr=pro.r if pro.r is not None else pro.res, pw_ptr=pro.weight,
                po_ptr=pro.res_out, eps=pro.eps, XMODE=1, HAS_R=pro.r is not None,
                NBLK=min(triton.next_power_of_2(k), NORM_BLOCK_MAX))


def mode_name(pro: Prologue | None) -> str:
    return "" if pro is None else {XNorm: "-norm", XSiLU: "-silu", XAttn: "-attn"}[type(pro)]


# ---- the kernel side (called by w4a16_ring_kernel after its PDL wait, before its x loads)

@triton.jit
def _res_plus_r(pa_ptr, pr_ptr, off, km, dt, HAS_R: tl.constexpr):
    """res + r at off (r rounded to dt first, the sum too: the model's residual add)."""
    x = tl.load(pa_ptr + off, mask=km, other=0.0)
    if HAS_R:
        r = tl.load(pr_ptr + off, mask=km, other=0.0).to(dt)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dt)
    return x


@triton.jit
def _norm_store(xo_ptr, po_ptr, off, km, x, w, rs, dt):
    """XNorm's writes of one round: res_out <- x (res + r), x <- (x * rs, rounded) * weight, rounded."""
    tl.store(po_ptr + off, x, mask=km)
    tl.store(xo_ptr + off, ((x.to(tl.float32) * rs).to(dt).to(tl.float32) * w).to(dt), mask=km)


@triton.jit
def x_prologue(xo_ptr, pa_ptr, pr_ptr, pw_ptr, po_ptr, eps, u0, u1, S, M, K, XMODE: tl.constexpr,
               HAS_R: tl.constexpr, NBLK: tl.constexpr, BK: tl.constexpr, CH: tl.constexpr, PHD: tl.constexpr = 1):
    """Write x's chunks read by items [u0, u1) (chunk ks = item % S, BK inputs each) for every token row: XMODE 1
    XNorm (pa res, pr r, pw weight, po res_out), 2 XSiLU (pa gu), 3 XAttn (pa ws, NBLK splits, PHD head dim; one
    row). CH inputs a round; NBLK (XNorm) a round of the norm's sum of squares over the whole row."""
    dt = xo_ptr.dtype.element_ty
    n_el = tl.minimum(u1 - u0, S) * BK  # at most every chunk once
    for m in range(M):
        rs = 0.0
        if XMODE == 1:
            # the first round's inputs load with the row, before its sum (they do not depend on it: one L2 round
            # trip instead of two, the barrier of the block sum between them)
            idx = tl.arange(0, CH)
            k = ((u0 + idx // BK) % S) * BK + idx % BK
            km = (idx < n_el) & (k < K)
            x1 = _res_plus_r(pa_ptr, pr_ptr, m * K + k, km, dt, HAS_R)
            w1 = tl.load(pw_ptr + k, mask=km, other=0.0).to(tl.float32)
            ss = 0.0
            for b0 in range(0, K, NBLK):
                kk = b0 + tl.arange(0, NBLK)
                xf = _res_plus_r(pa_ptr, pr_ptr, m * K + kk, kk < K, dt, HAS_R).to(tl.float32)
                ss += tl.sum(xf * xf, axis=0)
            rs = 1.0 / tl.sqrt(ss / K + eps)
            _norm_store(xo_ptr, po_ptr, m * K + k, km, x1, w1, rs, dt)
        for b0 in range(CH if XMODE == 1 else 0, n_el, CH):
            idx = b0 + tl.arange(0, CH)
            k = ((u0 + idx // BK) % S) * BK + idx % BK
            km = (idx < n_el) & (k < K)
            if XMODE == 1:
                x = _res_plus_r(pa_ptr, pr_ptr, m * K + k, km, dt, HAS_R)
                w = tl.load(pw_ptr + k, mask=km, other=0.0).to(tl.float32)
                _norm_store(xo_ptr, po_ptr, m * K + k, km, x, w, rs, dt)
            elif XMODE == 3:  # decode_attention_kernel's combine, for the heads of these inputs
                sp = ((k // PHD) * NBLK)[:, None] + tl.arange(0, NBLK)[None, :]  # (CH, NS) partial rows
                ok = km[:, None] & (sp >= 0)
                m_s = tl.load(pa_ptr + sp * (PHD + 2) + PHD, mask=ok, other=0.0)
                l_s = tl.load(pa_ptr + sp * (PHD + 2) + PHD + 1, mask=ok, other=0.0)
                a_s = tl.load(pa_ptr + sp * (PHD + 2) + (k % PHD)[:, None], mask=ok, other=0.0)
                w = tl.exp(m_s - tl.max(m_s, axis=1)[:, None])
                o = tl.sum(w * a_s, axis=1) / tl.sum(w * l_s, axis=1)
                tl.store(xo_ptr + k, o.to(dt), mask=km)
            else:
                g = tl.load(pa_ptr + m * 2 * K + k, mask=km, other=0.0).to(dt).to(tl.float32)
                u = tl.load(pa_ptr + m * 2 * K + K + k, mask=km, other=0.0).to(dt)
                a = (g / (1.0 + tl.exp(-g))).to(dt)
                tl.store(xo_ptr + m * K + k, (a.to(tl.float32) * u.to(tl.float32)).to(dt), mask=km)
