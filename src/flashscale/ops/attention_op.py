"""The attention op's two front doors over one implementation:

- eager: `AttentionFunction` (a torch.autograd.Function). Host time per call is what decides short
  sequences: torch.library's custom-op dispatch costs several times a small kernel's run (measured on
  the H200 2026-11-29: a constant ~0.3-0.6 ms on every forward), so eager calls skip it.
- torch.compile: the custom ops `flashscale::attention_fwd` / `flashscale::attention_bwd`, with fake
  implementations and autograd registered, so a compiled model traces through attention without a graph
  break. The seed travels there as a 0-d int64 CPU tensor (no .item() in traced code).

Inputs arrive validated by flashscale.ops.attention.attention. Dispatch per call:
  impl="triton"    -> the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1 for tests)
  impl="reference" -> plain PyTorch (flashscale.reference.attention)
  impl="auto"      -> Triton on CUDA for 16/32-bit floats, the reference otherwise (CPU, float64)
  impl="fa3"       -> the Hopper forward (kernels.attention_fa3, dense or varlen; checked eligible by
                      ops.attention) and the Hopper backward wherever it applies (FA2's otherwise)
  impl="auto_fa3"  -> what "auto" becomes when ops.attention gives the forward to fa3: the Hopper forward,
                      and the backward by auto's own measured rule (fa3_bwd_wanted), not forced
Causal is window_right = 0 here. Outputs are always freshly allocated and contiguous (the fakes say so).
"""

from __future__ import annotations

import os
from collections import Counter

import torch
from torch import Tensor

from flashscale.reference.attention import attention_bwd_ref, attention_ref

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Which kernels ran, counted per call: ("fwd", "fa3" | "fa2" | "reference") and ("bwd", "fa3" | "fa2_dq" |
# "fa2_atomic" | "reference"). For benchmarks and tests to record what a dispatch rule actually chose (a rule whose
# inputs never reach it fails silently: see docs/attention_fa3.md, session 18); one dict increment a call.
PATHS: Counter = Counter()


def use_triton(q: Tensor, impl: str) -> bool:
    if impl == "reference":
        return False
    if impl in ("triton", "fa3", "auto_fa3"):
        return True
    return q.is_cuda and q.dtype in _KERNEL_DTYPES


def _lse_shape(q: Tensor, varlen: bool) -> tuple[int, ...]:
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _ref_kwargs(cu_q, cu_k, alibi, seed, max_q, max_k, scale, wl, wr, softcap, dropout_p) -> dict:
    return dict(softmax_scale=scale, window=(wl, wr), softcap=softcap, alibi_slopes=alibi, dropout_p=dropout_p,
                seed=seed, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)


def fwd_impl(q, k, v, cu_q, cu_k, alibi, seed: int, max_q, max_k, scale, wl, wr, softcap, dropout_p, impl):
    """-> out (like q, contiguous), lse (B, H, Sq) or (H, Tq) float32."""
    if impl in ("fa3", "auto_fa3"):
        from flashscale.kernels.attention_fa3 import fwd_unchecked  # ops.attention checked (fa3_unsupported)
        from flashscale.kernels.attention_tune import tma_ready

        PATHS["fwd", "fa3"] += 1
        q, k, v = (tma_ready(t) for t in (q, k, v))  # misaligned ones copied (fa3_unsupported does not look)
        return fwd_unchecked(q, k, v, causal=wr == 0, softmax_scale=scale, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                             max_seqlen_q=max_q)
    if use_triton(q, impl):
        from flashscale.kernels.attention_fwd import attention_fwd  # kernels load on first use, not at import

        PATHS["fwd", "fa2"] += 1
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(_lse_shape(q, cu_q is not None), dtype=torch.float32, device=q.device)
        attention_fwd(q, k, v, out, lse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                      max_seqlen_k=max_k, softmax_scale=scale, window=(wl, wr), softcap=softcap, alibi_slopes=alibi,
                      dropout_p=dropout_p, seed=seed)
        return out, lse
    PATHS["fwd", "reference"] += 1
    with torch.autocast(q.device.type, enabled=False):  # the reference picks its own precision
        out, lse = attention_ref(q, k, v, return_lse=True, **_ref_kwargs(cu_q, cu_k, alibi, seed, max_q, max_k, scale,
                                                                         wl, wr, softcap, dropout_p))
    return out.contiguous(), lse.to(torch.float32).contiguous()


# The Hopper backward (kernels.attention_fa3_bwd) where the H200 measured it faster than FA2's backward, by
# (head_dim, causal) -> from how many query rows. Since the dQ writer became a TMA reduce-add (2026-12-02,
# session 22; benchmarks/results/attention-fa3-bwd-sweep-tma-h200.json) and D 256 computes dQ in two pieces,
# it leads FA2 in every cell measured, from 1024 on (TFLOP/s at 1k, FA2 in brackets: d64 315 (249) / causal 230
# (223), d128 402 (277) / causal 285 (230), d256 237 (153) / causal 191 (114)); 512 was not measured with
# these kernels and stays FA2's (the warp-specialized kernel lost there before: 69 against 94 at d256 causal).
# FLASHSCALE_FA3=1 takes it wherever it applies (and impl="fa3"), =0 never; deterministic=True always runs FA2's
# dQ kernel (no atomics). Until 2026-12-02 ops.attention passed impl="fa3" on when auto chose the fa3 forward, so
# the backward was forced too in every such cell (d64 from 2k, d128 from 1k): "auto_fa3" keeps auto's rule.
# Session 26, the grid's 512 cells with fa3 forced (attention-fa3-512-h200.json): the Gluon backward 294 / 181 (d64
# full / causal), 291 / 172 (d128), 265 / 134 (d256) TFLOP/s against FA2's 214 / 167, 230 / 164, 117 / 94 in the
# grid before: every cell from 512 now.
FA3_BWD_AUTO_MIN_SEQLEN_Q = {(d, c): 512 for d in (64, 128, 256) for c in (False, True)}

# FA2's backward computes dQ either by atomics inside the dK/dV kernel or by its own kernel (the deterministic
# path). The H200 measured the dQ kernel faster in these dense cells, (head_dim, causal) -> from how many query
# rows (benchmarks/results/attention-h200.json, 2026-11-29 and 2026-12-02, flashscale vs flashscale_det rows):
# causal 64 and 128 at every length (+4-15 %: 271 / 305 / 326 against 246 / 269 / 284 at d64 2k / 4k / 8k),
# 64 non-causal from 2048 (272 / 297 against 265 / 277 at 2k / 4k; within 2 % above), 256 at every length (where
# FA2 still runs it: 118 / 94 against 115 / 87 at 512). Elsewhere (d128 non-causal: 269 against 277 at 1k) atomics.
FA2_BWD_DQ_KERNEL_MIN_SEQLEN_Q = {(64, True): 0, (128, True): 0, (64, False): 2048, (256, False): 0, (256, True): 0}


def _measured(rule: dict, q, wr) -> bool:
    """Whether a (head_dim, causal) -> minimum query rows rule covers q's cell (dense (B, S, H, D) q)."""
    need = rule.get((q.shape[-1], wr == 0))
    return need is not None and q.shape[1] >= need


def fa3_bwd_wanted(q, k, v, cu_q, wl, wr, softcap, alibi, dropout_p, deterministic, impl) -> bool:
    if impl not in ("fa3", "auto", "auto_fa3") or deterministic or cu_q is not None or not q.is_cuda:
        return False
    if wl != -1 or wr not in (-1, 0) or softcap or alibi is not None or dropout_p:
        return False
    from flashscale.kernels.attention_fa3_bwd import unsupported_bwd

    if unsupported_bwd(q, k, v) is not None:
        return False
    mode = os.environ.get("FLASHSCALE_FA3", "")
    if mode == "0":
        return False
    return impl == "fa3" or mode == "1" or _measured(FA3_BWD_AUTO_MIN_SEQLEN_Q, q, wr)


def fa2_dq_kernel_wanted(q, cu_q, wr, impl) -> bool:
    """Whether FA2's backward (not deterministic by request) takes its dQ kernel over atomics: on CUDA, dense,
    in the cells where that measured faster (FA2_BWD_DQ_KERNEL_MIN_SEQLEN_Q)."""
    if impl == "reference" or not q.is_cuda or cu_q is not None:
        return False
    return _measured(FA2_BWD_DQ_KERNEL_MIN_SEQLEN_Q, q, wr)


def bwd_impl(dout, q, k, v, out, lse, dlse, cu_q, cu_k, alibi, seed: int, max_q, max_k, scale, wl, wr, softcap,
             dropout_p, deterministic, impl):
    """-> dq, dk, dv (like q, k, v; contiguous). dout and dlse may be None (that output was unused)."""
    if dout is None:
        dout = torch.zeros_like(out)
    # Gradients arriving from autograd can be expanded views (stride 0, e.g. out.sum()); the kernels index dO with
    # a unit head-dim stride and dLSE with a unit row stride.
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    if dlse is not None and dlse.stride(-1) != 1:
        dlse = dlse.contiguous()
    if fa3_bwd_wanted(q, k, v, cu_q, wl, wr, softcap, alibi, dropout_p, deterministic, impl):
        from flashscale.kernels.attention_bwd import bwd_delta
        from flashscale.kernels.attention_fa3_bwd import attention_fa3_bwd

        PATHS["bwd", "fa3"] += 1
        delta = bwd_delta(out, dout, lse, dlse)  # dLSE folds into delta
        return attention_fa3_bwd(dout, q.contiguous(), k.contiguous(), v.contiguous(), out, lse, causal=wr == 0,
                                 softmax_scale=scale, delta=delta)
    if use_triton(q, impl):
        from flashscale.kernels.attention_bwd import attention_bwd

        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        dq_kernel = deterministic or fa2_dq_kernel_wanted(q, cu_q, wr, impl)
        PATHS["bwd", "fa2_dq" if dq_kernel else "fa2_atomic"] += 1
        attention_bwd(dout, q, k, v, out, lse, dq, dk, dv, dlse=dlse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                      max_seqlen_q=max_q, max_seqlen_k=max_k, softmax_scale=scale, window=(wl, wr), softcap=softcap,
                      alibi_slopes=alibi, dropout_p=dropout_p, seed=seed, deterministic=dq_kernel)
        return dq, dk, dv
    # FA2's backward formulas in plain PyTorch (autograd cannot run inside a custom op's kernel).
    PATHS["bwd", "reference"] += 1
    with torch.autocast(q.device.type, enabled=False):
        grads = attention_bwd_ref(dout, q, k, v, out, lse, dlse=dlse, **_ref_kwargs(
            cu_q, cu_k, alibi, seed, max_q, max_k, scale, wl, wr, softcap, dropout_p))
    return tuple(g.contiguous() for g in grads)


class AttentionFunction(torch.autograd.Function):
    """Eager autograd: apply(q, k, v, cu_q, cu_k, alibi, seed, max_q, max_k, scale, wl, wr, softcap,
    dropout_p, deterministic, impl) -> (out, lse)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, alibi, seed, max_q, max_k, scale, wl, wr, softcap, dropout_p,
                deterministic, impl):
        out, lse = fwd_impl(q, k, v, cu_q, cu_k, alibi, seed, max_q, max_k, scale, wl, wr, softcap, dropout_p, impl)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.extra = (cu_q, cu_k, alibi, seed, max_q, max_k, scale, wl, wr, softcap, dropout_p, deterministic, impl)
        # An unused lse must arrive as None, not as materialized zeros: its gradient costs a read and a
        # different kernel variant.
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = bwd_impl(dout, q, k, v, out, lse, dlse, *ctx.extra)
        return (dq, dk, dv) + (None,) * 13


# ---- torch.compile: custom ops ----

@torch.library.custom_op("flashscale::attention_fwd", mutates_args=())
def attention_fwd_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None,
                     alibi_slopes: Tensor | None, seed: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                     softmax_scale: float, window_left: int, window_right: int, softcap: float, dropout_p: float,
                     deterministic: bool, impl: str) -> tuple[Tensor, Tensor]:
    """-> out, lse as fwd_impl. `deterministic` is for the backward."""
    return fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int(seed), max_seqlen_q, max_seqlen_k,
                    softmax_scale, window_left, window_right, softcap, dropout_p, impl)


@attention_fwd_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seed, max_seqlen_q, max_seqlen_k, softmax_scale,
      window_left, window_right, softcap, dropout_p, deterministic, impl):
    return (q.new_empty(q.shape), q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32))


@torch.library.custom_op("flashscale::attention_bwd", mutates_args=())
def attention_bwd_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dlse: Tensor | None,
                     cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None, alibi_slopes: Tensor | None,
                     seed: Tensor, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, window_left: int,
                     window_right: int, softcap: float, dropout_p: float, deterministic: bool,
                     impl: str) -> tuple[Tensor, Tensor, Tensor]:
    """-> dq, dk, dv as bwd_impl."""
    return bwd_impl(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int(seed), max_seqlen_q,
                    max_seqlen_k, softmax_scale, window_left, window_right, softcap, dropout_p, deterministic, impl)


@attention_bwd_op.register_fake
def _(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seed, max_seqlen_q, max_seqlen_k,
      softmax_scale, window_left, window_right, softcap, dropout_p, deterministic, impl):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "alibi_slopes", "seed", "max_seqlen_q", "max_seqlen_k", "softmax_scale",
         "window_left", "window_right", "softcap", "dropout_p", "deterministic", "impl")


def _setup_context(ctx, inputs, output):
    q, k, v, *rest = inputs
    a = dict(zip(_ARGS, rest))
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, a["cu_seqlens_q"], a["cu_seqlens_k"], a["alibi_slopes"], a["seed"])
    ctx.scalars = tuple(a[n] for n in _ARGS[4:])
    ctx.set_materialize_grads(False)  # as AttentionFunction


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k, alibi, seed = ctx.saved_tensors
    if dout is None:  # only lse was used
        dout = torch.zeros_like(out)
    dq, dk, dv = attention_bwd_op(dout, q, k, v, out, lse, dlse, cu_q, cu_k, alibi, seed, *ctx.scalars)
    return (dq, dk, dv) + (None,) * len(_ARGS)


attention_fwd_op.register_autograd(_backward, setup_context=_setup_context)
