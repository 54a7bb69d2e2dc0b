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

The W4A16 GEMV and decode kernels can also use the wait: with l2_prefetch (opt-in) each program first asks for
its own range of packed weights to be brought into L2 (`cp.async.bulk.prefetch.L2`, a few instructions a
program; the weights are never written, so reading them early is safe), then waits. Measured on the H200
(docs/w4a16_decode.md, round 6): PDL alone gains nothing in the Llama-3-8B decode step (its kernels already fill
97 % of the step) and the prefetch makes it 35 % slower (it competes with the running GEMV for HBM).

Under Triton's interpreter and on GPUs before sm_90 the flags are ignored (plain launches, same results).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from flashscale.kernels.interpreter import interpreting

_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("flashscale_pdl", default=False)
_L2: contextvars.ContextVar[bool] = contextvars.ContextVar("flashscale_pdl_l2", default=False)
_TRIGGER: contextvars.ContextVar[bool] = contextvars.ContextVar("flashscale_pdl_trigger", default=False)
_PRE_L2: contextvars.ContextVar[int] = contextvars.ContextVar("flashscale_pdl_pre_l2", default=0)


@contextlib.contextmanager
def pdl(enabled: bool = True, *, l2_prefetch: bool = False, trigger: bool = False, pre_l2: int = 0):
    """Within the block, PDL-aware kernels (kernels.decode, the W4A16 GEMV/decode kernels at M <= 16) launch with
    programmatic dependent launch where the device supports it; l2_prefetch: the W4A16 ones prefetch their
    weights into L2 before waiting; trigger: the accumulating ring GEMV (w4a16_addmm_) lets the next kernel launch
    once all its programs run (by default it never does: the next grid launches when it ends); pre_l2: it asks L2
    for that many more items' packed words before it waits (0..8)."""
    for name, val in (("enabled", enabled), ("l2_prefetch", l2_prefetch), ("trigger", trigger)):
        if not isinstance(val, bool):
            raise TypeError(f"pdl({name}) takes a bool, got {val!r}")
    if not isinstance(pre_l2, int) or isinstance(pre_l2, bool) or not 0 <= pre_l2 <= 8:
        raise ValueError(f"pdl(pre_l2) takes an int 0..8, got {pre_l2!r}")
    tokens = (_ON.set(enabled), _L2.set(enabled and l2_prefetch), _TRIGGER.set(enabled and trigger),
              _PRE_L2.set(pre_l2 if enabled else 0))
    try:
        yield
    finally:
        _ON.reset(tokens[0])
        _L2.reset(tokens[1])
        _TRIGGER.reset(tokens[2])
        _PRE_L2.reset(tokens[3])


def supported(device: torch.device) -> bool:
    """Whether a programmatic dependent launch can run on `device`: CUDA sm_90+, not interpreted."""
    if device.type != "cuda" or interpreting():
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def active(device: torch.device) -> bool:
    """Whether a launch on `device` now should use PDL: inside pdl(), where supported()."""
    return _ON.get() and supported(device)


def trigger_active() -> bool:
    """Whether PDL launches of the accumulating ring GEMV now trigger their dependents early."""
    return _TRIGGER.get()


def pre_l2_items() -> int:
    """Items past its ring the accumulating ring GEMV asks of L2 before its PDL wait."""
    return _PRE_L2.get()


def l2_prefetch_active() -> bool:
    """Whether PDL launches now also prefetch their weights into L2 (meaningful where active() holds)."""
    return _L2.get()


def launch_options(on: bool, l2_prefetch: bool = False) -> dict:
    """Keyword arguments of a PDL-aware kernel launch: the kernel's PDL (and L2PF) constexprs and Triton's launch
    option."""
    if not on:
        return {}
    return {"PDL": True, "launch_pdl": True, **({"L2PF": True} if l2_prefetch else {})}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """The first statement of a PDL-aware kernel (see the module doc); nothing when PDL is off."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def l2_prefetch_rows(pk_ptr, frag0, stride_pn, w0, w1, n_frag, enable, NB: tl.constexpr):
    """Ask for words [w0, w1) of packed fragment rows frag0 .. frag0 + NB - 1 (those < n_frag; nothing unless
    enable) to be brought into L2: one `cp.async.bulk.prefetch.L2.global` a row. Its operands must be warp-uniform,
    so ptxas loops over the distinct values a warp holds: one request a row keeps that loop at <= NB turns (a
    request a thread made it 32). w0, w1 and the row stride must be multiples of 4 words (16 bytes)."""
    frag = frag0 + tl.arange(0, NB)
    ptrs = pk_ptr + frag.to(tl.int64) * stride_pn + w0
    nbytes = ((w1 - w0) * 4 + frag * 0).to(tl.int32)
    on = ((frag < n_frag) & (w1 > w0) & enable).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r,r", [ptrs, nbytes, on], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def l2_prefetch_lines(ptrs, on):
    """Ask L2 for the 128-byte line holding each of ptrs where on (int32, nonzero): `prefetch.global.L2`, one a
    thread and element; no register waits on it."""
    tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                              "=r,l,r", [ptrs, on], dtype=tl.int32, is_pure=False, pack=1)
