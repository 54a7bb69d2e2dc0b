"""Kernels of the batch-1 decode step (flashscale.infer.decode.StaticDecoder), small enough that a CUDA graph of
the whole step replays them: residual add + RMSNorm, RoPE + KV-cache write + attention of one query over the
static cache, SiLU(gate) * up. Their reference is the model itself: tests/test_infer_decode.py checks the step's
logits against Llama.forward with a KVCache (Triton's interpreter on the CPU, the GPU when there is one).

PDL (kernels.pdl): each may run with programmatic dependent launch, waiting for its predecessor first thing.
Shapes: E hidden size, H query heads, G kv heads, D head_dim (a power of two), T_MAX cache positions; the cache
is (G, T_MAX, D) a layer, q/k/v one row (H + 2G) * D; NS splits of the context a head (a power of two).
The linears' outputs they read (r, qkv, g/u) may be float32 sums (StaticDecoder(accumulate=True)): each is rounded
to the model's dtype on load, as the linear would have stored it.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer, smid

from flashscale.kernels.pdl import pdl_enter
from flashscale.kernels.w4a16_common import last_split, reset_ticket


@triton.jit
def add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, E, eps, HAS_R: tl.constexpr, BLOCK: tl.constexpr,
                       PDL: tl.constexpr = False):
    """x <- x + r (r rounded to x's dtype first, the sum too, as the model's residual add); h = RMSNorm(x) * w (HF
    order)."""
    pdl_enter(PDL)
    offs = tl.arange(0, BLOCK)
    m = offs < E
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if HAS_R:
        r = tl.load(r_ptr + offs, mask=m, other=0.0).to(x_ptr.dtype.element_ty)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
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
def _ld(ptrs, dt):
    """A linear's output (its dtype, or a float32 sum) as the model stored it: rounded to dt, then float32."""
    return tl.load(ptrs).to(dt).to(tl.float32)


@triton.jit
def _kv_tile(kc_ptr, vc_ptr, g, T_MAX, t0, hi, d, D: tl.constexpr, BT: tl.constexpr):
    """Cached rows t0 .. t0 + BT - 1 (those < hi) of kv group g: row mask (BT,), K and V (BT, D) in float32."""
    t = t0 + tl.arange(0, BT)
    tm = t < hi
    off = (g * T_MAX + t)[:, None] * D + d[None, :]
    kt = tl.load(kc_ptr + off, mask=tm[:, None], other=0.0).to(tl.float32)
    vt = tl.load(vc_ptr + off, mask=tm[:, None], other=0.0).to(tl.float32)
    return tm, kt, vt


@triton.jit
def decode_attention_kernel(qkv_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, out_ptr, pos_ptr, ws_ptr, cnt_ptr, T_MAX, scale,
                            H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
                            NS: tl.constexpr = 1, PDL: tl.constexpr = False, COMBINE: tl.constexpr = True,
                            trace_ptr=None, TRACE: tl.constexpr = False):
    """Program (query head, split): RoPE on q and the new k (cos_ptr / sin_ptr: (T_MAX, D) tables, row pos), the
    group's first head writes k/v at pos (split 0), then softmax(q K^T) V over positions 0..pos (cache rows < pos,
    the new row from registers: no race).

    Flash-decoding: the NS splits of a head take consecutive chunks of ceil(pos / NS) cached rows (the last split
    also the new row), so a short step is one round of loads instead of a loop over the whole context. With
    NS > 1 each writes its unnormalised partial (acc, max, sum) to ws (H * NS, D + 2) fp32, takes a ticket on
    cnt[head] (int32, zero), and the split that draws NS - 1 combines the NS partials in split order (the same
    bits whatever the arrival order), writes the head's output and puts the ticket back to zero. COMBINE False
    (NS > 1): the partials are the output; the kernel that reads them combines them (w4a16_prologue.XAttn in the o
    projection's GEMV), no ticket, no re-read here.

    PDL: position, RoPE table and the split's first tile of cached rows (< pos: earlier steps wrote them) load before
    the wait for the kernel ahead (the q/k/v linear), the rest after it. TRACE (diagnostics, GPU): program
    hq * NS + sp writes %globaltimer at its start, after its wait and at its end to trace_ptr (int64) at 16 * program
    + 0, 8 and 5 (the ring GEMV's TRACE_FIELDS places), and its SM at + 6."""
    hq = tl.program_id(0)
    sp = tl.program_id(1)
    if TRACE:
        tp = trace_ptr + (hq * NS + sp) * 16
        tl.store(tp, globaltimer())
        tl.store(tp + 6, smid().to(tl.int64))
    g = hq // (H // G)
    pos = tl.load(pos_ptr)
    d = tl.arange(0, D)
    rot = (d + D // 2) % D
    cos = tl.load(cos_ptr + pos * D + d).to(tl.float32)  # the RoPE tables' row at pos
    sin = tl.load(sin_ptr + pos * D + d).to(tl.float32)
    chunk = tl.cdiv(pos, NS)
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, pos)
    tm, kt, vt = _kv_tile(kc_ptr, vc_ptr, g, T_MAX, lo, hi, d, D, BT)  # the first tile
    pdl_enter(PDL)
    if TRACE:
        tl.store(tp + 8, globaltimer())
    dt = out_ptr.dtype.element_ty
    q = _rope(_ld(qkv_ptr + hq * D + d, dt), _ld(qkv_ptr + hq * D + rot, dt), cos, sin, D)
    q = q.to(dt).to(tl.float32)
    kb = (H + g) * D
    k_new = _rope(_ld(qkv_ptr + kb + d, dt), _ld(qkv_ptr + kb + rot, dt), cos, sin, D)
    k_new = k_new.to(dt)
    v_new = tl.load(qkv_ptr + (H + G + g) * D + d).to(dt)
    row = (g * T_MAX + pos) * D
    if (hq % (H // G) == 0) & (sp == 0):
        tl.store(kc_ptr + row + d, k_new)
        tl.store(vc_ptr + row + d, v_new)
    s_new = tl.sum(q * k_new.to(tl.float32), axis=0) * scale
    own_new = sp == NS - 1
    m_i = tl.where(own_new, s_new, float("-inf"))
    l_i = tl.where(own_new, 1.0, 0.0)
    acc = tl.where(own_new, v_new.to(tl.float32), 0.0)
    for t0 in range(lo, hi, BT):  # every turn has a valid row (t0 < hi), so m_new is finite
        if t0 > lo:  # the first tile was loaded before the wait
            tm, kt, vt = _kv_tile(kc_ptr, vc_ptr, g, T_MAX, t0, hi, d, D, BT)
        s = tl.where(tm, tl.sum(kt * q[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        acc = acc * alpha + tl.sum(p[:, None] * vt, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    if NS == 1:
        tl.store(out_ptr + hq * D + d, (acc / l_i).to(dt))
    else:
        base = (hq * NS + sp) * (D + 2)
        tl.store(ws_ptr + base + d, acc)
        tl.store(ws_ptr + base + D, m_i)
        tl.store(ws_ptr + base + D + 1, l_i)
        if COMBINE and last_split(cnt_ptr, hq, NS):  # the W4A16 split-K ticket: barrier, then one acq_rel add
            sr = (hq * NS + tl.arange(0, NS)) * (D + 2)
            m_s = tl.load(ws_ptr + sr + D, cache_modifier=".cg")  # .cg: through L2 (L1 may hold a stale line)
            l_s = tl.load(ws_ptr + sr + D + 1, cache_modifier=".cg")
            a_s = tl.load(ws_ptr + sr[:, None] + d[None, :], cache_modifier=".cg")  # (NS, D)
            w = tl.exp(m_s - tl.max(m_s, axis=0))  # the last split holds the new row: the max is finite
            o = tl.sum(w[:, None] * a_s, axis=0) / tl.sum(w * l_s, axis=0)
            tl.store(out_ptr + hq * D + d, o.to(dt))
            reset_ticket(cnt_ptr, hq)
    if TRACE:
        tl.store(tp + 5, globaltimer())


@triton.jit
def silu_mul_kernel(g_ptr, u_ptr, out_ptr, F_: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out = SiLU(g) * u (F_ elements): SiLU in g's dtype as F.silu, then the product rounded once."""
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < F_
    dt = out_ptr.dtype.element_ty
    g = tl.load(g_ptr + offs, mask=m, other=0.0).to(dt).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=m, other=0.0).to(dt)
    a = (g / (1.0 + tl.exp(-g))).to(dt)  # F.silu in the model's dtype, then * up
    tl.store(out_ptr + offs, (a.to(tl.float32) * u.to(tl.float32)).to(dt), mask=m)


@triton.jit
def step_begin_kernel(tok_ptr, emb_ptr, x_ptr, acc_ptr, ctr_ptr, E, N_ACC, N_CTR, BLOCK_E: tl.constexpr,
                      BLOCK_Z: tl.constexpr, BLOCK_C: tl.constexpr = 256, PDL: tl.constexpr = False):
    """A step's first kernel: x <- emb[tok] (program 0, (E,) in BLOCK_E rounds), acc[:N_ACC] <- 0 (float32, the
    linears' sums of StaticDecoder(accumulate=True): BLOCK_Z a program) and ctr[:N_CTR] <- 0 (program 0: int32, the
    GEMVs' work counters, StaticDecoder.dyn). One launch where the step ran an index
    select, a copy and a memset (torch's: no PDL, so the chain of PDL launches restarted at every step)."""
    pdl_enter(PDL)
    pid = tl.program_id(0)
    z = pid * BLOCK_Z + tl.arange(0, BLOCK_Z)
    tl.store(acc_ptr + z, tl.zeros([BLOCK_Z], dtype=tl.float32), mask=z < N_ACC)
    if pid == 0:
        for c0 in range(0, N_CTR, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            tl.store(ctr_ptr + c, tl.zeros([BLOCK_C], dtype=tl.int32), mask=c < N_CTR)
        row = tl.load(tok_ptr).to(tl.int64) * E
        for e0 in range(0, E, BLOCK_E):
            e = e0 + tl.arange(0, BLOCK_E)
            tl.store(x_ptr + e, tl.load(emb_ptr + row + e, mask=e < E), mask=e < E)


@triton.jit
def _argmax_key(v, idx):
    """int64 keys ordered as (value, -index): the largest key is the first index of the largest value (NaN above
    +inf, as torch.argmax takes NaN for the maximum)."""
    bits = v.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # float order as signed int order
    return (ordered.to(tl.int64) << 32) + (0xFFFFFFFF - idx.to(tl.int64))


@triton.jit
def step_end_kernel(logits_ptr, tok_ptr, pos_ptr, best_ptr, cnt_ptr, V, BLOCK: tl.constexpr, GREEDY: tl.constexpr,
                    PDL: tl.constexpr = False):
    """A step's last kernel: with GREEDY tok <- argmax(logits[:V]) (float32; the first index of the maximum, as
    torch.argmax), then pos += 1. Each program reduces BLOCK logits to one key (_argmax_key) and takes an acq_rel
    atomic max into best_ptr (int64, left at INT64_MIN); the program that draws the last ticket (cnt_ptr, int32,
    left at 0) reads and resets it, writes tok and pos. Without GREEDY one program adds 1 to pos."""
    pdl_enter(PDL)
    if GREEDY:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(logits_ptr + offs, mask=offs < V, other=float("-inf"))
        key = tl.max(tl.where(offs < V, _argmax_key(v, offs), -9223372036854775807 - 1), axis=0)
        tl.atomic_max(best_ptr, key, sem="acq_rel", scope="gpu")
        if last_split(cnt_ptr, 0, tl.num_programs(0)):
            best = tl.atomic_xchg(best_ptr, -9223372036854775807 - 1, sem="acq_rel", scope="gpu")
            tl.store(tok_ptr, 0xFFFFFFFF - (best & 0xFFFFFFFF))
            tl.store(pos_ptr, tl.load(pos_ptr) + 1)
            reset_ticket(cnt_ptr, 0)
    else:
        tl.store(pos_ptr, tl.load(pos_ptr) + 1)
