"""Reference attention in plain PyTorch: the oracle for the Triton kernels and the CPU path of ops.attention.

Layouts (flash-attn's): dense q (B, Sq, H, D), k/v (B, Sk, Hkv, D); packed varlen q (Tq, H, D),
k/v (Tk, Hkv, D) with cu_seqlens_q/k (B+1,) int32 offsets. H % Hkv == 0 (GQA/MQA).

Score of query i and key j in one sequence (off = Sk - Sq aligns the diagonal bottom-right, as flash-attn):
    s_ij = scale * q_i . k_j
    s_ij = softcap * tanh(s_ij / softcap)                     if softcap > 0
    s_ij -= slope_h * |i + off - j|                           if alibi_slopes is given
    visible iff  j >= i + off - left  (left >= 0)  and  j <= i + off + right  (right >= 0);  causal: right = 0
P = softmax over visible keys; rows with no visible key give zeros (and lse = -inf), never NaN.
Dropout keeps P_ij when word j % 4 of tl.rand4x(seed, ((b*H + h)*SQ + i)*ceil(SK/4) + j // 4) is >= p
(SQ, SK: the sequence lengths, or max_seqlen for varlen) and scales kept entries by 1/(1-p): the
kernels' Philox stream, reproduced bit for bit.
LSE is of the (capped, biased, masked) scores before dropout, in natural log, float32:
(B, H, Sq) dense, (H, Tq) varlen.
"""

from __future__ import annotations

import math

import torch

from flashscale.reference.philox import philox_uniform4


def dropout_keep_mask(seed: int, p: float, *, batch: int, head: int, heads: int, rows: int, cols: int,
                      seq_q: int, seq_k: int, device=None) -> torch.Tensor:
    """(rows, cols) bool: which P entries of (batch, head) the kernels keep (see the module docstring)."""
    i = torch.arange(rows, dtype=torch.int64)[:, None]
    quads = torch.arange((cols + 3) // 4, dtype=torch.int64)[None, :]
    counter = ((batch * heads + head) * seq_q + i) * ((seq_k + 3) // 4) + quads
    u = philox_uniform4(seed, counter).flatten(-2)[:, :cols]  # (rows, cols): word j % 4 of counter j // 4
    return (u >= torch.tensor(p, dtype=torch.float32)).to(device)


def _scores(q, k, *, scale, causal, window, softcap, alibi):
    """q (B, Sq, H, D), k (B, Sk, H, D) -> masked scores s (B, H, Sq, Sk) (-inf where not visible) and
    t = tanh(scale * q.k / softcap) (for the softcap backward; None without softcap)."""
    Sq, Sk = q.shape[1], k.shape[1]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale  # (B, H, Sq, Sk)
    t = None
    if softcap > 0:
        t = torch.tanh(s / softcap)
        s = softcap * t
    i = torch.arange(Sq, device=q.device)[:, None] + (Sk - Sq)  # query position on the key axis
    j = torch.arange(Sk, device=q.device)[None, :]
    if alibi is not None:
        s = s - alibi.to(s.dtype)[:, :, None, None] * (i - j).abs().to(s.dtype)
    left, right = window
    if causal:
        right = 0
    visible = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    return s.masked_fill(~visible, float("-inf")), t


def _keep(seed, p, B, H, Sq, Sk, *, batch_index, seq_q, seq_k, device):
    """(B, H, Sq, Sk) dropout keep-mask of the kernels' Philox stream."""
    return torch.stack([torch.stack([
        dropout_keep_mask(seed, p, batch=batch_index + b, head=h, heads=H, rows=Sq, cols=Sk, seq_q=seq_q,
                          seq_k=seq_k, device=device) for h in range(H)]) for b in range(B)])


def _dense(q, k, v, *, scale, causal, window, softcap, alibi, dropout_p, seed, batch_index, seq_q, seq_k):
    """q (B, Sq, H, D), k/v (B, Sk, Hkv, D); alibi (B, H) or None -> out (B, Sq, H, D), lse (B, H, Sq)."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    if Sk == 0:  # no keys at all: every row is empty
        return q.new_zeros((B, Sq, H, v.shape[-1])), q.new_full((B, H, Sq), float("-inf"))
    k = k.repeat_interleave(H // Hkv, dim=2)  # (B, Sk, H, D): the oracle may copy; the kernels never do
    v = v.repeat_interleave(H // Hkv, dim=2)
    s, _ = _scores(q, k, scale=scale, causal=causal, window=window, softcap=softcap, alibi=alibi)
    # A softmax that stays finite on fully masked rows, in value and in gradient: the row max is a detached
    # stabilizer (exact: softmax does not depend on it), empty rows get l = 0 -> p = 0, lse = -inf.
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    l = e.sum(dim=-1, keepdim=True)
    l_safe = torch.where(l > 0, l, torch.ones_like(l))
    p = e / l_safe
    lse = torch.where(l > 0, m + torch.log(l_safe), torch.full_like(l, float("-inf"))).squeeze(-1)
    if dropout_p > 0:
        keep = _keep(seed, dropout_p, B, H, Sq, Sk, batch_index=batch_index, seq_q=seq_q, seq_k=seq_k,
                     device=q.device)
        p = torch.where(keep, p / (1.0 - dropout_p), torch.zeros_like(p))
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), v)
    return out, lse


def _dense_bwd(dout, q, k, v, out, lse, dlse, *, scale, causal, window, softcap, alibi, dropout_p, seed,
               batch_index, seq_q, seq_k):
    """FlashAttention-2's backward, written plainly: P from the LSE, delta = rowsum(dO * O) - dLSE,
    dS = P * (dP - delta), GQA gradients summed over each K/V head's group. Shapes as _dense."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    if Sk == 0 or Sq == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    G = H // Hkv
    kh, vh = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)  # (B, Sk, H, D)
    s, t = _scores(q, kh, scale=scale, causal=causal, window=window, softcap=softcap, alibi=alibi)
    lse = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))  # empty rows: P = 0
    p = torch.exp(s - lse[..., None])  # (B, H, Sq, Sk)
    dp = torch.einsum("bqhd,bkhd->bhqk", dout, vh)
    p_drop = p
    if dropout_p > 0:
        keep = _keep(seed, dropout_p, B, H, Sq, Sk, batch_index=batch_index, seq_q=seq_q, seq_k=seq_k,
                     device=q.device)
        p_drop = torch.where(keep, p / (1.0 - dropout_p), torch.zeros_like(p))
        dp = torch.where(keep, dp / (1.0 - dropout_p), torch.zeros_like(dp))
    delta = (dout * out).sum(-1).transpose(1, 2)  # (B, H, Sq)
    if dlse is not None:
        delta = delta - dlse
    ds = p * (dp - delta[..., None])
    if t is not None:
        ds = ds * (1.0 - t * t)
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kh) * scale
    dk = (torch.einsum("bhqk,bqhd->bkhd", ds, q) * scale).unflatten(2, (Hkv, G)).sum(3)
    dv = torch.einsum("bhqk,bqhd->bkhd", p_drop, dout).unflatten(2, (Hkv, G)).sum(3)
    return dq, dk, dv


def _setup(q, k, v, softmax_scale, upcast):
    dtype = q.dtype
    if upcast and dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return q, k, v, dtype, scale


def _sequences(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """Packed varlen: [(q slice, k slice)] per sequence and the dropout pitches (max lengths)."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    mq = max_seqlen_q if max_seqlen_q is not None else max(b - a for a, b in zip(cq, cq[1:]))
    mk = max_seqlen_k if max_seqlen_k is not None else max(b - a for a, b in zip(ck, ck[1:]))
    return [(slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])) for b in range(len(cq) - 1)], mq, mk


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    seed: int = 0,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    return_lse: bool = False,
    upcast: bool = True,
):
    """Attention as the module docstring defines it. Differentiable (autograd) in q, k, v.

    upcast=True computes half-precision inputs in float32 (the CPU path); upcast=False computes in the input
    dtype (the "PyTorch in the same dtype" baseline of the tests). float64 inputs give the float64 oracle.
    Returns out in q's dtype [and lse in float32, float64 for float64 inputs].
    """
    q, k, v, dtype, scale = _setup(q, k, v, softmax_scale, upcast)
    kw = dict(scale=scale, causal=causal, window=window, softcap=softcap, dropout_p=dropout_p, seed=seed)
    if cu_seqlens_q is None:
        B, Sq, H = q.shape[:3]
        alibi = None if alibi_slopes is None else alibi_slopes.float().expand(B, H).to(q.device)
        out, lse = _dense(q, k, v, alibi=alibi, batch_index=0, seq_q=Sq, seq_k=k.shape[1], **kw)
    else:
        # Packed varlen: each sequence on its own; dropout offsets use max_seqlen as the row/column pitch.
        seqs, mq, mk = _sequences(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        H = q.shape[1]
        alibi = None if alibi_slopes is None else alibi_slopes.float().expand(len(seqs), H).to(q.device)
        outs, lses = [], []
        for b, (sq, sk) in enumerate(seqs):
            ab = None if alibi is None else alibi[b:b + 1]
            ob, lb = _dense(q[sq][None], k[sk][None], v[sk][None], alibi=ab, batch_index=b, seq_q=mq, seq_k=mk, **kw)
            outs.append(ob[0])
            lses.append(lb[0])  # (H, Sq_b)
        out = torch.cat(outs, 0) if outs else q.new_zeros(q.shape)
        lse = torch.cat(lses, 1) if lses else q.new_zeros((H, 0), dtype=torch.float32)
    out = out.to(dtype)
    if return_lse:
        return out, (lse if lse.dtype == torch.float64 else lse.float())
    return out


def attention_bwd_ref(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    dlse: torch.Tensor | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    seed: int = 0,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    upcast: bool = True,
):
    """Gradients (dq, dk, dv) of attention_ref's (out, lse) given dout [and dlse], by FA2's formulas.

    out and lse are the forward's. Computes in float32 for half inputs (upcast=True); returns grads in
    the input dtypes. The CPU backward of ops.attention; tests check it against autograd.
    """
    dtypes = (q.dtype, k.dtype, v.dtype)
    q, k, v, _, scale = _setup(q, k, v, softmax_scale, upcast)
    dout, out = dout.to(q.dtype), out.to(q.dtype)
    lse = lse.to(q.dtype if q.dtype == torch.float64 else torch.float32)
    dlse = None if dlse is None else dlse.to(lse.dtype)
    kw = dict(scale=scale, causal=causal, window=window, softcap=softcap, dropout_p=dropout_p, seed=seed)
    if cu_seqlens_q is None:
        B, Sq, H = q.shape[:3]
        alibi = None if alibi_slopes is None else alibi_slopes.float().expand(B, H).to(q.device)
        grads = _dense_bwd(dout, q, k, v, out, lse, dlse, alibi=alibi, batch_index=0, seq_q=Sq, seq_k=k.shape[1],
                           **kw)
    else:
        seqs, mq, mk = _sequences(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        alibi = None if alibi_slopes is None else alibi_slopes.float().expand(len(seqs), q.shape[1]).to(q.device)
        grads = [torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)]
        for b, (sq, sk) in enumerate(seqs):
            g = _dense_bwd(dout[sq][None], q[sq][None], k[sk][None], v[sk][None], out[sq][None], lse[:, sq][None],
                           None if dlse is None else dlse[:, sq][None], alibi=None if alibi is None else alibi[b:b + 1],
                           batch_index=b, seq_q=mq, seq_k=mk, **kw)
            grads[0][sq], grads[1][sk], grads[2][sk] = g[0][0], g[1][0], g[2][0]
    return tuple(g.to(dt) for g, dt in zip(grads, dtypes))
