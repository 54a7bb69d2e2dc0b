"""flashscale.ops.w4a16_linear: y = x @ W + b with W a 4-bit PackedW4 (GPTQ / AWQ, repacked once).

Dispatch: CUDA tensors -> the Triton kernels (flashscale.kernels.w4a16: GEMV at one token, tensor-core
GEMM otherwise); CPU tensors -> the reference (dequantize, then F.linear). impl="triton" forces the
kernels, which on a CPU run under Triton's interpreter (TRITON_INTERPRET=1, as the tests set it).
"""

from __future__ import annotations

import torch

from flashscale.kernels.w4a16_pack import PackedW4
from flashscale.reference.w4a16 import w4a16_linear_ref

IMPLS = (None, "reference", "triton", "gemv", "gemm")


def _check(x: torch.Tensor, packed: PackedW4, bias: torch.Tensor | None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(packed, PackedW4):
        raise TypeError(f"packed must be a PackedW4 (flashscale.kernels.w4a16_pack), got {type(packed).__name__}")
    if x.dim() < 1 or x.shape[-1] != packed.in_features:
        raise ValueError(f"x must have shape (..., {packed.in_features}) (in_features); got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if x.device != packed.device:
        raise ValueError(f"x is on {x.device} but the packed weight is on {packed.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (packed.out_features,):
            shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"bias must have shape ({packed.out_features},) (out_features); got {shape}")
        if bias.device != x.device:
            raise ValueError(f"bias is on {bias.device} but x is on {x.device}")


def w4a16_linear(x: torch.Tensor, packed: PackedW4, bias: torch.Tensor | None = None, *,
                 impl: str | None = None) -> torch.Tensor:
    """x (..., K) -> (..., N) in x's dtype: x @ dequant(packed) + bias, accumulated in float32.

    impl: None (CUDA -> kernels, CPU -> reference), "reference", "triton" (kernels, chosen by M),
    "gemv" / "gemm" (that kernel). The kernels take float16 or bfloat16 x.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; expected one of {IMPLS}")
    _check(x, packed, bias)
    if impl is None:
        impl = "triton" if x.is_cuda else "reference"
    if impl == "reference":
        return w4a16_linear_ref(x, packed, bias)
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"the W4A16 kernels take float16 or bfloat16 x, got {x.dtype}; use impl='reference'")
    g, k = packed.group_size, packed.in_features
    if g != k and g % 16:
        raise ValueError(f"the W4A16 kernels take group sizes that are multiples of 16 (32, 64, 128, ...) or one "
                         f"group per row; this weight has group size {g} with in_features={k}")
    from flashscale.kernels.w4a16 import w4a16_matmul  # imported late: Triton reads TRITON_INTERPRET then

    x2d = x.reshape(-1, x.shape[-1])
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    y = w4a16_matmul(x2d, packed, bias, kernel=None if impl == "triton" else impl)
    return y.reshape(*x.shape[:-1], packed.out_features)
