"""flashscale.ops.attention_fp8: FlashAttention-3's FP8 forward (e4m3, block quantization, Hadamard).

    out = attention_fp8(q, k, v, causal=True)                # bf16 in, quantizes itself, bf16 out
    x = quantize_fp8(q, k, v)                                # the pre-pass alone (Fp8QKV)
    out = attention_fp8_quantized(x.q8, x.k8, x.v8, x.q_descale, x.k_descale, x.v_descale, causal=True)

Layouts: q (B, Sq, H, D), k/v (B, Sk, Hkv, D) with H % Hkv == 0 (GQA/MQA); D a power of 2 in [16, 256]
(64, 128 and 256 are the tuned sizes). Pre-quantized: q8 (B, Sq, H, D), k8 (B, Sk, Hkv, D) e4m3, v8
TRANSPOSED (B, Hkv, D, Sk_pad >= Sk) e4m3 (the FP8 tensor cores' K-major layout, see kernels/hadamard.py), its
keys in natural order or, with v_key_perm=True, permuted within 32-key groups (reference.attention_fp8.permute_v_keys:
the order the Gluon kernel's v_perm configs read, which quantize_fp8 writes at no cost); descales float32
(B, H, ceil(Sq / block_m)) and (B, Hkv, ceil(Sk / block_n)), dequantized x = x8 * descale.
Causal is aligned bottom-right. Forward only in FP8: attention_fp8 is differentiable through the
training recipe below, attention_fp8_quantized is not.

Dispatch (impl="auto"): CUDA with compute capability 9.x -> the Gluon FA3-style kernel
(kernels.attention_fa3_fp8: TMA, ping-pong warpgroups, FP8 wgmma; 1.1 PFLOP/s at d256 on the H200) where it
takes the inputs, else the Triton kernel (kernels.attention_fp8); anything else -> the emulation
(flashscale.reference.attention_fp8, the same roundings in plain PyTorch). impl="fa3" / "triton" force a
kernel ("triton" also runs on CPU under TRITON_INTERPRET=1, for tests); impl="emulation" the reference.

Training recipe (docs/attention_fp8.md): when q, k or v require grad, the forward is the FP8 path and the
backward recomputes the bf16 FlashAttention-2 forward (out, LSE) from the saved bf16 inputs and runs its
backward: the gradients are the bf16 path's for the incoming dO, at the cost of one extra bf16 forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashscale.kernels.interpreter import require_launchable
from flashscale.reference.attention_fp8 import (DEFAULT_BLOCK_M, DEFAULT_BLOCK_N, E4M3, Fp8Inputs,
                                                attention_fp8_quantized_ref, padded_len, permute_v_keys,
                                                quantize_qkv_ref, unpermute_v_keys)

_IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_IMPLS = ("auto", "fa3", "triton", "emulation")


@dataclass(frozen=True, kw_only=True)
class Fp8QKV:
    """The pre-pass's output, in the kernel's layout: q8 (B, Sq, H, D), k8 (B, Sk, Hkv, D), v8 transposed
    (B, Hkv, D, Sk_pad) e4m3 (v_key_perm: its keys permuted within 32-key groups); descales float32 (B, H, nq) /
    (B, Hkv, nk); the quantization blocks."""

    q8: torch.Tensor
    k8: torch.Tensor
    v8: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    block_m: int
    block_n: int
    v_key_perm: bool = False

    def args(self) -> tuple:
        """(q8, k8, v8, q_descale, k_descale, v_descale): attention_fp8_quantized's positional arguments."""
        return self.q8, self.k8, self.v8, self.q_descale, self.k_descale, self.v_descale


def _use_kernel(t: torch.Tensor, impl: str, name: str = "q") -> bool:
    from flashscale.kernels.attention_tune import capability  # kernels load on first use

    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}; got {impl!r}")
    if impl == "emulation":
        return False
    if impl == "triton":
        require_launchable(t, name, "attention_fp8(impl='triton')")
        return True
    if impl == "fa3":  # the pre-pass then runs its Triton kernel; attention_fp8_quantized asks the Gluon
        # kernel whether it takes the inputs and says why not
        if not t.is_cuda or capability(t.device)[0] != 9:
            raise ValueError(f"impl='fa3' cannot take these inputs: fa3 fp8 needs a Hopper GPU (compute "
                             f"capability 9.x); the tensors are on {t.device}")
        return True
    return t.is_cuda and capability(t.device)[0] == 9


def _check_block(name: str, b) -> int:
    if not isinstance(b, int) or isinstance(b, bool) or b < 16 or b > 256 or b & (b - 1):
        raise ValueError(f"{name} must be a power of 2 in [16, 256]; got {b!r}")
    return b


def _check_shapes(q, k, v_like_k, names=("q", "k", "v")) -> tuple[int, int, int, int, int, int]:
    for n, t in zip(names, (q, k, v_like_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{n} must be a torch.Tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{n} must be 4-D; got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{n} is on {t.device} but {names[0]} is on {q.device}")
    B, Sq, H, D = q.shape
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"{names[1]} must be (batch={B}, seqlen_k, kv_heads, head_dim={D}); got {tuple(k.shape)}")
    Sk, Hkv = k.shape[1], k.shape[2]
    if D < 16 or D > 256 or D & (D - 1):
        raise ValueError(f"head_dim must be a power of 2 in [16, 256] (64, 128, 256 are tuned); got {D}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"q's heads ({H}) must be a multiple of k/v's heads ({Hkv}) (GQA/MQA)")
    return B, Sq, H, D, Sk, Hkv


def _scale(softmax_scale, D: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be a finite float > 0 or None; got {softmax_scale!r}")
    return float(softmax_scale)


def quantize_fp8(q, k, v, *, hadamard: bool = True, block_quant: bool = True, seed: int = 0,
                 block_m: int = DEFAULT_BLOCK_M, block_n: int = DEFAULT_BLOCK_N, impl: str = "auto",
                 v_key_perm: bool = False) -> Fp8QKV:
    """The pre-pass: random-sign Hadamard on Q and K (hadamard=True; the same seeded signs for both, so
    Q K^T is unchanged), then e4m3 with one scale per block_m rows of Q / block_n rows of K and V per head
    (block_quant=False: one scale a tensor, FA3's baseline). V comes back transposed, with v_key_perm=True its keys
    permuted within 32-key groups (the Gluon kernel's v_perm order; pass the flag on to attention_fp8_quantized)."""
    _check_shapes(q, k, v)
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}; got {tuple(v.shape)}")
    for n, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _IN_DTYPES:
            raise TypeError(f"{n}.dtype must be bfloat16, float16 or float32; got {t.dtype}")
    block_m, block_n = _check_block("block_m", block_m), _check_block("block_n", block_n)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an int in [0, 2**63); got {seed!r}")
    if not isinstance(v_key_perm, bool):
        raise TypeError(f"v_key_perm must be a bool; got {type(v_key_perm).__name__}")
    if _use_kernel(q, impl):
        from flashscale.kernels.hadamard import hadamard_quant  # kernels load on first use

        pt = not block_quant
        q8, qd = hadamard_quant(q, block=block_m, hadamard=hadamard, seed=seed, per_tensor=pt)
        k8, kd = hadamard_quant(k, block=block_n, hadamard=hadamard, seed=seed, per_tensor=pt)
        v8, vd = hadamard_quant(v, block=block_n, hadamard=False, transpose=True, per_tensor=pt, key_perm=v_key_perm)
        return Fp8QKV(q8=q8, k8=k8, v8=v8, q_descale=qd, k_descale=kd, v_descale=vd, block_m=block_m,
                      block_n=block_n, v_key_perm=v_key_perm)
    x = quantize_qkv_ref(q, k, v, hadamard=hadamard, block_quant=block_quant, seed=seed, block_m=block_m,
                         block_n=block_n)
    sp = padded_len(k.shape[1])
    vt = torch.zeros((*x.v8.shape[:1], x.v8.shape[2], x.v8.shape[3], sp), dtype=E4M3, device=v.device)
    vt[..., :k.shape[1]] = x.v8.permute(0, 2, 3, 1)  # (B, Hkv, D, Sk): the kernel's layout
    if v_key_perm:
        vt = permute_v_keys(vt, k.shape[1])
    return Fp8QKV(q8=x.q8, k8=x.k8, v8=vt, q_descale=x.q_descale, k_descale=x.k_descale, v_descale=x.v_descale,
                  block_m=block_m, block_n=block_n, v_key_perm=v_key_perm)


def attention_fp8_quantized(q8, k8, v8, q_descale, k_descale, v_descale, *, causal: bool = False,
                            softmax_scale: float | None = None, block_m: int = DEFAULT_BLOCK_M,
                            block_n: int = DEFAULT_BLOCK_N, out_dtype: torch.dtype = torch.bfloat16,
                            return_lse: bool = False, impl: str = "auto", config=None, v_key_perm: bool = False):
    """FP8 attention on pre-quantized inputs (layouts in the module docstring). Returns out (B, Sq, H, D)
    in out_dtype [, lse (B, H, Sq) float32]. softmax_scale defaults to 1/sqrt(head_dim). Not differentiable.
    config: a kernels.attention_fa3_fp8.FA3Fp8Config or a kernels.attention_fp8.Fp8Config (the kernel it picks;
    tiles dividing the blocks) for tests and tuning. v_key_perm: v8's keys are permuted within 32-key groups
    (quantize_fp8(..., v_key_perm=True)); the Gluon kernel reads them so, the other paths restore the order first."""
    if not isinstance(v8, torch.Tensor):
        raise TypeError(f"v8 must be a torch.Tensor; got {type(v8).__name__}")
    B, Sq, H, D, Sk, Hkv = _check_shapes(q8, k8, v8.transpose(-1, -2) if v8.dim() == 4 else v8,
                                         names=("q8", "k8", "v8"))
    for n, t in (("q8", q8), ("k8", k8), ("v8", v8)):
        if t.dtype != E4M3:
            raise TypeError(f"{n}.dtype must be torch.float8_e4m3fn; got {t.dtype}")
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"{n} must have a contiguous last dimension (stride 1); got stride {t.stride(-1)}")
    if not isinstance(v_key_perm, bool):
        raise TypeError(f"v_key_perm must be a bool; got {type(v_key_perm).__name__}")
    min_cols = padded_len(Sk, 32) if v_key_perm else Sk
    if v8.shape[0] != B or v8.shape[1] != Hkv or v8.shape[2] != D or v8.shape[3] < min_cols:
        raise ValueError(f"v8 must be transposed (batch={B}, kv_heads={Hkv}, head_dim={D}, seqlen_k_padded>="
                         f"{min_cols}{', whole 32-key groups with v_key_perm' if v_key_perm else ''}) "
                         f"(quantize_fp8's layout); got {tuple(v8.shape)}")
    block_m, block_n = _check_block("block_m", block_m), _check_block("block_n", block_n)
    for n, t, shape in (("q_descale", q_descale, (B, H, -(-Sq // block_m))),
                        ("k_descale", k_descale, (B, Hkv, -(-Sk // block_n))),
                        ("v_descale", v_descale, (B, Hkv, -(-Sk // block_n)))):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise TypeError(f"{n} must be a float32 tensor; got {getattr(t, 'dtype', type(t).__name__)}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{n} must have shape {shape} (one scale per block); got {tuple(t.shape)}")
        if t.device != q8.device:
            raise ValueError(f"{n} is on {t.device} but q8 is on {q8.device}")
    if out_dtype not in _IN_DTYPES:
        raise TypeError(f"out_dtype must be bfloat16, float16 or float32; got {out_dtype}")
    scale = _scale(softmax_scale, D)
    if _use_kernel(q8, impl, "q8") and impl in ("auto", "fa3"):
        from flashscale.kernels import attention_fa3_fp8 as fa3

        fa3_config = config if isinstance(config, fa3.FA3Fp8Config) else None
        why = (fa3.unsupported(q8, k8, v8, q_descale, k_descale, v_descale, causal=bool(causal), block_m=block_m,
                               block_n=block_n, out_dtype=out_dtype, config=fa3_config, v_key_perm=v_key_perm)
               if config is None or fa3_config is not None else "config is a Triton Fp8Config")
        if why is None:
            out, lse = fa3.attention_fa3_fp8_fwd(q8, k8, v8, q_descale, k_descale, v_descale, causal=bool(causal),
                                                 softmax_scale=scale, block_m=block_m, block_n=block_n,
                                                 out_dtype=out_dtype, config=fa3_config, v_key_perm=v_key_perm)
            return (out, lse) if return_lse else out
        if impl == "fa3":
            raise ValueError(f"impl='fa3' cannot take these inputs: {why}; use impl='auto' or 'triton'")
    if v_key_perm:  # the Triton kernel and the emulation read V^T's keys in natural order
        v8 = unpermute_v_keys(v8, Sk)
    if _use_kernel(q8, impl, "q8"):
        from flashscale.kernels.attention_fp8 import attention_fp8_fwd

        out = torch.empty((B, Sq, H, D), dtype=out_dtype, device=q8.device)
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q8.device)
        attention_fp8_fwd(q8, k8, v8, q_descale, k_descale, v_descale, out, lse, causal=bool(causal),
                          softmax_scale=scale, block_m=block_m, block_n=block_n, config=config)
    else:
        x = Fp8Inputs(q8=q8, k8=k8, v8=v8[..., :Sk].permute(0, 3, 1, 2), q_descale=q_descale,
                      k_descale=k_descale, v_descale=v_descale, block_m=block_m, block_n=block_n)
        tile = config.block_n if config is not None else min(block_n, 128)
        out, lse = attention_fp8_quantized_ref(x, causal=bool(causal), softmax_scale=scale, tile_n=tile,
                                               out_dtype=out_dtype, return_lse=True)
    return (out, lse) if return_lse else out


def _kernel_layout(q: torch.Tensor, causal: bool, impl: str) -> tuple[int, bool]:
    """(K/V quantization block, V^T's keys permuted) for the Gluon kernel's default config on these inputs (what
    the pre-pass should write); (DEFAULT_BLOCK_N, False) where another path runs."""
    if impl not in ("auto", "fa3") or not _use_kernel(q, impl):
        return DEFAULT_BLOCK_N, False
    from flashscale.kernels import attention_fa3_fp8 as fa3
    from flashscale.kernels.attention_tune import capability

    D = q.shape[-1]
    if D not in fa3.HEAD_DIMS or not fa3.HAS_GLUON or capability(q.device)[0] != 9:  # the Gluon kernel: Hopper only
        return DEFAULT_BLOCK_N, False
    block_n = fa3.quant_block_n(D, causal)
    return block_n, fa3.default_config(D, block_n, causal).v_perm


def _fp8_forward(q, k, v, causal, scale, hadamard, block_quant, seed, impl):
    block_n, key_perm = _kernel_layout(q, causal, impl)
    x = quantize_fp8(q, k, v, hadamard=hadamard, block_quant=block_quant, seed=seed, impl=impl, block_n=block_n,
                     v_key_perm=key_perm)
    out_dtype = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.float32
    return attention_fp8_quantized(*x.args(), causal=causal, softmax_scale=scale, block_m=x.block_m,
                                   block_n=x.block_n, out_dtype=out_dtype, impl=impl, v_key_perm=x.v_key_perm)


class Fp8AttentionFunction(torch.autograd.Function):
    """Forward: the FP8 path. Backward: recompute the bf16 FlashAttention-2 forward (out, LSE) from the
    saved inputs, then its backward (kernels on CUDA, the reference on CPU): the bf16 path's gradients."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, hadamard, block_quant, seed, impl):
        ctx.save_for_backward(q, k, v)
        ctx.causal, ctx.scale = causal, scale
        return _fp8_forward(q, k, v, causal, scale, hadamard, block_quant, seed, impl)

    @staticmethod
    def backward(ctx, dout):
        from flashscale.ops.attention_op import bwd_impl, fwd_impl

        q, k, v = ctx.saved_tensors
        Sq, Sk = q.shape[1], k.shape[1]
        right = 0 if ctx.causal else -1
        common = (None, None, None, 0, Sq, Sk, ctx.scale, -1, right, 0.0, 0.0)
        out, lse = fwd_impl(q, k, v, *common, "auto")  # the bf16 forward: P for the backward is its own
        dq, dk, dv = bwd_impl(dout.to(q.dtype), q, k, v, out, lse, None, *common, False, "auto")
        return dq, dk, dv, None, None, None, None, None, None


def attention_fp8(q, k, v, *, causal: bool = False, softmax_scale: float | None = None, hadamard: bool = True,
                  block_quant: bool = True, seed: int = 0, impl: str = "auto") -> torch.Tensor:
    """FP8 attention from bf16 (or fp16/fp32) q (B, Sq, H, D), k/v (B, Sk, Hkv, D): quantize (Hadamard on
    Q and K with `seed`'s signs, block or per-tensor e4m3), attend in FP8, return out like q (bf16 for
    bf16 input; fp32 input gives fp32). Differentiable via the training recipe (module docstring)."""
    _check_shapes(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    for n, flag in (("hadamard", hadamard), ("block_quant", block_quant)):
        if not isinstance(flag, bool):
            raise TypeError(f"{n} must be a bool; got {type(flag).__name__}")
    scale = _scale(softmax_scale, q.shape[-1])
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return Fp8AttentionFunction.apply(q, k, v, causal, scale, hadamard, block_quant, seed, impl)
    return _fp8_forward(q, k, v, causal, scale, hadamard, block_quant, seed, impl)
