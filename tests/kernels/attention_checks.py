"""Shared helpers for the attention tests: run ours, the float64 oracle and the same-dtype PyTorch baseline.

The tolerance rule (flash-attn's): for the output, the LSE and every gradient,
    max |ours - oracle| <= 2 * max |pytorch_same_dtype - oracle| + eps(dtype) * max(max |oracle|, 0.3)
where the oracle is the reference in float64 and the baseline is the same reference computed in the
input dtype. The eps term is about one rounding of the largest value (at least of 0.3, flash-attn's
anchor for unit-scale inputs: a gradient that is exactly zero in theory, e.g. dQ at seqlen 1, is still
a difference of rounded terms); it only matters when the baseline is exact by luck.
Gradients get one more term, eps(float32) * max |lse| * max |oracle|: the backward recomputes
P = exp(S - LSE) from the float32 LSE (FlashAttention's design), and one rounding of an LSE of size |lse|
is a relative error eps * |lse| in every P. PyTorch's autograd keeps P and does not pay it. Under 16-bit
inputs this term is negligible; in float32 it is the whole difference.
A third, for dQ and dK: the backward forms dS = P * (dP - delta) with delta = rowsum(dO * O) computed in
float32 by its own pass (FlashAttention's preprocessing), so a row whose dP - delta cancels (one key: dQ is
exactly zero in theory) keeps one float32 rounding of delta: eps(float32) * max_i sum_d |dO * O| *
softmax_scale * max(|Q|, |K|). PyTorch's softmax backward forms the same difference from P * dP and gets
an exact zero there by luck (seen: dQ 2e-7 against an exact baseline at seqlen 1 in float32).
"""

from __future__ import annotations

import torch

from flashscale.ops import attention
from flashscale.reference.attention import attention_ref


def randn(*shape, dtype, device="cpu", grad=True):
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_(grad)


def _grads(outs, inputs, grad_outs):
    pairs = [(o, g) for o, g in zip(outs, grad_outs) if g is not None]
    return torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs])


def run_all(q, k, v, *, dlse: bool = False, impl: str = "triton", **kw):
    """Forward + backward of ours, the float64 oracle and the same-dtype baseline on the same inputs.

    Returns {name: (out, lse, dq, dk, dv)} for name in ("ours", "oracle", "base").
    """
    torch.manual_seed(1)
    do = torch.randn_like(q)
    res = {}
    out, lse = attention(q, k, v, return_lse=True, impl=impl, **kw)
    g_lse = torch.randn_like(lse) if dlse else None
    res["ours"] = (out, lse, *_grads((out, lse), (q, k, v), (do, g_lse)))
    kw.pop("deterministic", None)  # a kernel option; the reference is deterministic anyway
    for name, cast, upcast in (("oracle", torch.float64, False), ("base", q.dtype, False)):
        qq, kk, vv = (t.detach().to(cast).requires_grad_() for t in (q, k, v))
        o, l = attention_ref(qq, kk, vv, return_lse=True, upcast=upcast, **kw)
        res[name] = (o, l, *_grads((o, l), (qq, kk, vv), (do.to(cast), None if g_lse is None else g_lse.to(l.dtype))))
        if name == "oracle":  # the float32 rounding of delta = rowsum(dO * O), carried into dQ and dK
            sm = kw.get("softmax_scale") or q.shape[-1] ** -0.5
            delta_abs = (do.double() * o.detach()).abs().sum(-1).max().item() if o.numel() else 0.0
            qk_abs = max(q.detach().abs().max().item(), k.detach().abs().max().item()) if q.numel() and k.numel() else 0.0
            res["delta_term"] = torch.finfo(torch.float32).eps * delta_abs * sm * qk_abs
    return res


def assert_close_rule(res, names=("out", "lse", "dq", "dk", "dv")):
    ours, oracle, base = res["ours"], res["oracle"], res["base"]
    dtype = ours[0].dtype
    eps = torch.finfo(dtype).eps
    lse = oracle[1][torch.isfinite(oracle[1])]
    lse_term = torch.finfo(torch.float32).eps * (lse.abs().max().item() if lse.numel() else 0.0)
    for name, a, ref, b in zip(names, ours, oracle, base):
        assert not torch.isnan(a).any(), f"{name}: NaN in ours"
        ref = ref.double()
        if name == "lse":  # empty rows: -inf in all three, and compared as such
            fin = torch.isfinite(ref)
            assert torch.equal(torch.isfinite(a), fin), "lse: empty rows differ"
            assert torch.all(a[~fin] == float("-inf")), "lse of an empty row must be -inf"
            a, ref, b = a[fin], ref[fin], b.double()[fin]
        err = (a.double() - ref).abs().max().item() if a.numel() else 0.0
        base_err = (b.double() - ref).abs().max().item() if a.numel() else 0.0
        scale = max(ref.abs().max().item() if a.numel() else 0.0, 0.3)
        floor = (eps + (lse_term if name.startswith("d") else 0.0)) * scale
        floor += res.get("delta_term", 0.0) if name in ("dq", "dk") else 0.0
        assert err <= 2 * base_err + floor, \
            f"{name}: error {err:.3e} > 2 x baseline {base_err:.3e} + floor {floor:.3e}"
