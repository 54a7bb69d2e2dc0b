"""The public functional API. Each op validates its inputs and dispatches: CUDA -> kernel, CPU -> reference."""

from flashscale.ops.attention import attention
from flashscale.ops.attention_fp8 import attention_fp8, attention_fp8_quantized, quantize_fp8

__all__ = ["attention", "attention_fp8", "attention_fp8_quantized", "quantize_fp8"]
