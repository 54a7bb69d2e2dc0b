"""Where the Triton kernels run: compiled for a CUDA GPU, or on CPU tensors under Triton's interpreter (the tests).

Triton reads TRITON_INTERPRET when a kernel is decorated, so it has to be set before the kernel modules are
imported (tests/conftest.py does it on machines without CUDA). A CPU tensor handed to a kernel compiled for the GPU
fails in Triton's launcher with a message about pointers; the entry points check first and raise NeedsInterpreter,
which names the argument and what it takes. It is a ValueError (bad input), and its own class so that a test run on a
GPU machine can tell "this test is written for the interpreter" from a real failure (tests/conftest.py).
"""

from __future__ import annotations

import os

import torch


class NeedsInterpreter(ValueError):
    """A Triton kernel got a CPU tensor while kernels compile for the GPU (TRITON_INTERPRET unset)."""


def interpreting() -> bool:
    """True when Triton runs kernels under its interpreter (TRITON_INTERPRET a true value, as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on", "y")


def require_launchable(t: torch.Tensor, name: str, what: str) -> None:
    """Raise NeedsInterpreter unless `t` (argument `name` of `what`) can reach a Triton kernel: a CUDA tensor, or any
    tensor under the interpreter."""
    if not t.is_cuda and not interpreting():
        raise NeedsInterpreter(f"{what}: {name} is on {t.device}; the Triton kernels take CUDA tensors, or CPU tensors "
                               f"under Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported)")
