"""FlashAttention-3-style backward for Hopper (sm_90) in Gluon: TMA, mbarriers, wgmma, P and dS from registers.

Same semantics as the FA2 backward (kernels.attention_bwd) for the dense layout without extras:
q, o, do (B, Sq, H, D), k, v (B, Sk, Hkv, D), H % Hkv == 0, lse (B, H, Sq) natural log (-inf: a row that sees
no key), causal aligned bottom-right (query i sees key n iff n <= i + Sk - Sq). Returns dq, dk, dv.

FA3BwdConfig(ws=True) runs the warp-specialized variant instead (kernels.attention_fa3_bwd_ws): the same math
in the same 8 warps, with a TMA producer warp (Q/dO ring of `stages`, LSE/delta) and a dQ writer partition
that takes dQ from shared memory and adds it into the float32 buffer: by one TMA reduce-add a step
(dq_tma=True, the default; FA3's way), or by red.global.add.v4 from dq_warps warps.

Files: attention_fa3_bwd_config.py (FA3BwdConfig, the default and tuning configs, smem_bytes, config_error),
attention_fa3_bwd_kernel.py (the single-partition Gluon kernel, and the design both kernels follow in its module
docstring), attention_fa3_bwd_ws.py (the warp-specialized kernel); this module checks the inputs, launches,
compiles ahead of time, and re-exports the names that callers import from it.
"""

from __future__ import annotations

import functools

import torch

try:
    import triton
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed triton
    pass

from flashscale.kernels.attention_bwd import bwd_delta, scale_cast
from flashscale.kernels import launch as L
from flashscale.kernels.attention_fa3 import HEAD_DIMS, LOG2E, SMEM_LIMIT, tile_layout, unsupported  # noqa: F401
from flashscale.kernels.attention_fa3_bwd_config import (DEFAULT_CONFIGS, DQ_TMA_WS, NUM_WARPS, PLAIN_CONFIGS,
                                                         TUNING_CONFIGS, FA3BwdConfig, config_error, smem_bytes)
from flashscale.kernels.attention_fa3_bwd_kernel import HAS_GLUON
from flashscale.kernels.attention_tune import tma_ready

if HAS_GLUON:
    from flashscale.kernels.attention_fa3_bwd_kernel import _fa3_bwd_kernel, _kv_block

# Names tests, benchmarks, ops.attention_op and attention_fa3_bwd_ws import from here, kept importable since the
# split into attention_fa3_bwd_config / attention_fa3_bwd_kernel (the Gluon ones where Gluon is there).
__all__ = [
    "DEFAULT_CONFIGS", "DQ_TMA_WS", "HAS_GLUON", "HEAD_DIMS", "NUM_WARPS", "PLAIN_CONFIGS", "SMEM_LIMIT",
    "TUNING_CONFIGS", "FA3BwdConfig", "attention_fa3_bwd", "compile_sm90", "config_error", "smem_bytes",
    "unsupported_bwd",
]
if HAS_GLUON:
    __all__ += ["_fa3_bwd_kernel", "_kv_block"]


def unsupported_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why attention_fa3_bwd cannot take these inputs (non-contiguous ones are copied), or None."""
    why = unsupported(q, k, v, need_contiguous=False)
    if why is None and q.shape[1] * q.shape[2] * q.shape[3] >= 2 ** 31:
        why = f"Sq * H * D = {q.shape[1] * q.shape[2] * q.shape[3]}: dQ offsets are int32 (< 2^31)"
    return why


def _bwd_unsupported(q, k, v, o, do, lse) -> str | None:
    why = unsupported_bwd(q, k, v)
    if why is not None:
        return why
    if o.shape != q.shape or do.shape != q.shape or o.dtype != q.dtype or do.dtype != q.dtype:
        return f"o and do must be like q {tuple(q.shape)} {q.dtype}"
    if lse.shape != (q.shape[0], q.shape[2], q.shape[1]) or lse.dtype != torch.float32:
        return f"lse must be float32 (B, H, Sq) = {(q.shape[0], q.shape[2], q.shape[1])}, got {tuple(lse.shape)}"
    return None


def attention_fa3_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                      lse: torch.Tensor, *, causal: bool = False, softmax_scale: float | None = None,
                      config: FA3BwdConfig | None = None, delta: torch.Tensor | None = None):
    """(dq, dk, dv) of attention_fa3_fwd / the FA2 forward for the incoming do (see the module docstring).
    delta: rowsum(do * o), float32 (B, H, Sq), if the caller already has it."""
    why = _bwd_unsupported(q, k, v, o, do, lse)
    if why is not None:
        raise ValueError(f"attention_fa3_bwd: {why}")
    # TMA reads from 16-byte aligned bases (unsupported_bwd checked q, k, v): a misaligned view of o / dO is copied
    q, k, v, o, do = (tma_ready(t) for t in (q, k, v, o, do))
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if B == 0 or Sq == 0 or H == 0 or Sk == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    scale = softmax_scale if softmax_scale is not None else D ** -0.5
    cfg = config or DEFAULT_CONFIGS[D]
    bad = config_error(D, cfg)
    if bad is not None:
        raise ValueError(f"attention_fa3_bwd: {cfg}: {bad}")
    delta = (bwd_delta(o, do, lse) if delta is None else delta).contiguous()
    lse = lse.contiguous()
    dq32 = torch.zeros((B, Sq, H, D), device=q.device, dtype=torch.float32)
    q_lay, kv_lay = tile_layout(cfg.block_m, D, q.dtype), tile_layout(cfg.block_n, D, q.dtype)

    # with the backward's launch cache on (launch.BWD_ENABLED), unchecked construction: _bwd_unsupported checked
    # the inputs (and o / dO were realigned above); otherwise the checked one, as before session 26
    make = functools.partial(L.tensor_desc, TensorDescriptor) if L.BWD_ENABLED else TensorDescriptor

    def desc(t, S, heads, rows, lay, cols=D):
        return make(t, [B, S, heads * D], [S * heads * D, heads * D, 1], [1, rows, cols], lay)

    dq_n = D // cfg.dq_split  # dq_tma: the float32 dQ buffer's TMA boxes, one dQ piece wide
    grid = (triton.cdiv(Sk, cfg.block_n), B * Hkv)
    args = (desc(q, Sq, H, cfg.block_m, q_lay), desc(k, Sk, Hkv, cfg.block_n, kv_lay),
            desc(v, Sk, Hkv, cfg.block_n, kv_lay), desc(do, Sq, H, cfg.block_m, q_lay),
            desc(dk, Sk, Hkv, cfg.block_n, kv_lay), desc(dv, Sk, Hkv, cfg.block_n, kv_lay), lse, delta,
            desc(dq32, Sq, H, cfg.block_m, tile_layout(cfg.block_m, dq_n, torch.float32), dq_n) if cfg.dq_tma
            else dq32, lse.stride(0), lse.stride(1), H, Sq, Sk, float(scale), float(scale) * LOG2E)
    key = (cfg, D, H // Hkv, bool(causal), q.dtype)  # what fixes the constexprs and the descriptors' boxes
    L.launch(_kernel(cfg), grid, args, _constexprs(D, H // Hkv, bool(causal), cfg), key, bwd=True)
    return scale_cast(dq32, scale, q.dtype), dk, dv


def _kernel(cfg: FA3BwdConfig):
    if cfg.ws:
        from flashscale.kernels.attention_fa3_bwd_ws import _fa3_bwd_ws_kernel

        return _fa3_bwd_ws_kernel
    return _fa3_bwd_kernel


def _constexprs(head_dim: int, group: int, causal: bool, cfg: FA3BwdConfig) -> dict:
    c = {"GROUP": group, "HEAD_DIM": head_dim, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "CAUSAL": causal,
         "KV_WM": cfg.warps(cfg.block_n)[0], "DQ_WM": cfg.warps(cfg.block_m)[0]}
    if cfg.ws:
        c.update({"STAGES": cfg.stages, "DQ_STAGES": cfg.dq_stages, "DQ_WARPS": cfg.dq_warps, "DQ_TMA": cfg.dq_tma,
                  "DQ_SPLIT": cfg.dq_split, "SS_DKV": cfg.ss_dkv, "DO_SINGLE": cfg.do_single,
                  "EARLY_STATS": cfg.early_stats, "ONE_END_BAR": cfg.one_end_bar,
                  "PRODUCER_REGS": cfg.producer_regs, "WRITER_REGS": cfg.writer_regs})
    else:
        c["RED_V2"] = cfg.red_v2
        c["DQ_SPLIT"] = cfg.dq_split
    c["num_warps"] = NUM_WARPS
    return c


def compile_sm90(head_dim: int, causal: bool, *, group: int = 1, dtype: torch.dtype = torch.bfloat16,
                 config: FA3BwdConfig | None = None):
    """Ahead-of-time compile for sm_90 (no GPU needed): triton's CompiledKernel, for tests and tools."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = config or DEFAULT_CONFIGS[head_dim]
    bad = config_error(head_dim, cfg)
    if bad is not None:
        raise ValueError(f"compile_sm90: {cfg}: {bad}")
    ty = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]

    def desc(rows, t=ty, dt=dtype, cols=head_dim):
        return f"tensordesc<{t}[1,{rows},{cols}],{tile_layout(rows, cols, dt)!r}>"

    signature = {"q_desc": desc(cfg.block_m), "k_desc": desc(cfg.block_n), "v_desc": desc(cfg.block_n),
                 "do_desc": desc(cfg.block_m), "dk_desc": desc(cfg.block_n), "dv_desc": desc(cfg.block_n),
                 "LSE": "*fp32", "DELTA": "*fp32",
                 "DQ": desc(cfg.block_m, "fp32", torch.float32, head_dim // cfg.dq_split) if cfg.dq_tma else "*fp32",
                 "stride_lb": "i32", "stride_lh": "i32", "H": "i32",
                 "seqlen_q": "i32", "seqlen_k": "i32", "sm_scale": "fp32", "qk_scale": "fp32"}
    constexprs = _constexprs(head_dim, group, bool(causal), cfg)
    signature.update({name: "constexpr" for name in constexprs})
    src = GluonASTSource(fn=_kernel(cfg), signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS})
