"""The public functional API. Each op validates its inputs and dispatches: CUDA -> kernel, CPU -> reference."""

from flashscale.ops.attention import attention

__all__ = ["attention"]
