"""Programmatic dependent launch (PDL, sm_90+) for the batch-1 decode step's kernels.

A decode step is ~230 launches of kernels that each run for a few microseconds; between two of them the GPU
idles for the next grid's launch and ramp. With PDL a kernel launched with the programmatic-serialization
attribute may start (its programs resident, waiting) while its predecessor still runs; `gdc_wait` then blocks
until the predecessor has finished and its writes are visible. Every kernel here runs

    gdc_wait(); gdc_launch_dependents()     # first thing, before any load or store

so nothing it reads or writes is touched before the previous kernel is done (the W4A16 split-K workspace and
tickets are shared between consecutive GEMVs), a kernel completes only after its predecessor did (the chain stays
ordered through kernels that need nothing from their direct predecessor), and at most one grid waits ahead (its
successor may launch only once it is running). Kernels launched without the attribute (cuBLAS, torch's own)
serialize as usual around these.

    with pdl():                  # launches of PDL-aware kernels inside use it, where the device supports it
        decoder.step()

Under Triton's interpreter and on GPUs before sm_90 the flag is ignored (plain launches, same results).
"""

from __future__ import annotations

import contextlib
import contextvars
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("flashscale_pdl", default=False)


@contextlib.contextmanager
def pdl(enabled: bool = True):
    """Within the block, PDL-aware kernels (kernels.decode, the W4A16 GEMV/decode kernels at M <= 16) launch with
    programmatic dependent launch where the device supports it."""
    if not isinstance(enabled, bool):
        raise TypeError(f"pdl(enabled) takes a bool, got {enabled!r}")
    token = _ON.set(enabled)
    try:
        yield
    finally:
        _ON.reset(token)


def active(device: torch.device) -> bool:
    """Whether a launch on `device` now should use PDL: inside pdl(), on CUDA sm_90+, not interpreted."""
    if not _ON.get() or device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(on: bool) -> dict:
    """Keyword arguments of a PDL-aware kernel launch: the kernel's PDL constexpr and Triton's launch option."""
    return {"PDL": True, "launch_pdl": True} if on else {}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """The first statement of a PDL-aware kernel (see the module doc); nothing when PDL is off."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
