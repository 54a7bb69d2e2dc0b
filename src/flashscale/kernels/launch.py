"""Launch a compiled Triton/Gluon kernel again without Triton's per-call binding (host time of short calls).

`kernel[grid](*args, **constexprs)` binds every argument, computes its specialization and a cache key, and
looks the compiled kernel up, on each call: about a third of the ~0.1 ms of Python an eager FA3 forward spends
on the host (benchmarks/attention_host.py --profile, docs/attention_fa3.md session 24). Calls that take less GPU
time than that leave the GPU idle between them. `launch` does the lookup once per specialization:

    launch(kernel, grid, args, constexprs, static_key)

The first call with a given key goes through `kernel[grid]` (compiling if needed) and keeps the CompiledKernel
it returns; later calls hand the same arguments straight to its launcher. The key is `static_key` (whatever
fixes the constexprs and the descriptors' block shapes and layouts: the caller's config) plus `spec_key(args)`:
for every argument what Triton's binder specializes it on (ints: equal to 1, divisible by 16, 32- or 64-bit;
tensors: dtype and 16-byte alignment; descriptors: the base's dtype), a superset of native_specialize_impl's
distinctions (tests/kernels/test_launch.py checks that), plus the device. Under the interpreter, with a launch
hook set (profilers: Triton's hook chains not empty), on the first call, or while ENABLED is off
(FLASHSCALE_LAUNCH_CACHE=0), it is exactly `kernel[grid](*args, **constexprs)`.
"""

from __future__ import annotations

import os

import torch
import triton
from triton import knobs

_CACHE: dict = {}
# On by default since its first GPU run (session 25, gpu_pending.sh next25): the FA3 forward + API GPU tests with it
# on (216 passed), and the eager call's host time 0.11-0.16 -> 0.09-0.11 ms (benchmarks/attention_host.py).
# FLASHSCALE_LAUNCH_CACHE=0 turns it off (every call through kernel[grid]).
_ENV = os.environ.get("FLASHSCALE_LAUNCH_CACHE", "1")
if _ENV not in ("0", "1"):
    raise ValueError(f"FLASHSCALE_LAUNCH_CACHE={_ENV!r}: takes 1 (launch compiled kernels from a per-specialization "
                     "cache, the default) or 0 (always through kernel[grid])")
ENABLED = _ENV == "1"
# The backward's launches through the cache too (the Hopper backward's three: delta, shared with FA2's backward, the
# Gluon kernel and the dQ cast), its descriptors built unchecked. Session 27 on the H200: its GPU tests pass with it
# on (63), and the d128 causal 1k backward's queued-call time 0.71-0.89 ms -> 0.54 ms = the kernel's own (the host
# had been the bottleneck there; benchmarks/results/attention-host-bwd-h200.json). On by default since;
# FLASHSCALE_LAUNCH_CACHE_BWD=0 sends the backward through kernel[grid] with checked descriptors.
_ENV_BWD = os.environ.get("FLASHSCALE_LAUNCH_CACHE_BWD", "1")
if _ENV_BWD not in ("0", "1"):
    raise ValueError(f"FLASHSCALE_LAUNCH_CACHE_BWD={_ENV_BWD!r}: takes 1 (the Hopper backward's launches through the "
                     "cache too, the default) or 0 (through kernel[grid])")
BWD_ENABLED = _ENV_BWD == "1"


def _arg_key(a):
    if isinstance(a, bool) or a is None:
        return a
    if isinstance(a, int):
        return (a == 1, a % 16 == 0, -2**31 <= a < 2**31, a < 2**63)
    if isinstance(a, float):
        return float
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    base = getattr(a, "base", None)  # a host TensorDescriptor: its block shape / layout come with static_key
    if isinstance(base, torch.Tensor):
        return ("desc", base.dtype)
    raise TypeError(f"launch: cannot key an argument of type {type(a).__name__}; use kernel[grid] for it")


def spec_key(args) -> tuple:
    """What the binder specializes `args` on (see the module docstring)."""
    return tuple(_arg_key(a) for a in args)


def _watched(hook) -> bool:
    """Whether a launch hook would see anything: Triton 3.6's are HookChains, empty unless a profiler adds one
    (an empty chain is what kernel[grid] calls, twice a launch, with metadata built for it)."""
    return hook is not None and getattr(hook, "calls", True) != []


def launch(kernel, grid, args: tuple, constexprs: dict, static_key, *, bwd: bool = False) -> None:
    """kernel[grid](*args, **constexprs), with the binding done once per (static_key, spec_key(args), device).
    bwd: a launch of the Hopper backward's, cached only while BWD_ENABLED as well."""
    if not ENABLED or (bwd and not BWD_ENABLED) or not isinstance(kernel, triton.runtime.JITFunction) \
            or _watched(knobs.runtime.launch_enter_hook) or _watched(knobs.runtime.launch_exit_hook):
        kernel[grid](*args, **constexprs)  # the interpreter, or someone watching launches
        return
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    key = (kernel, static_key, spec_key(args), device)
    hit = _CACHE.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **constexprs)
        tail = tuple(constexprs[name] for name in kernel.arg_names[len(args):])  # the constexpr parameters
        _CACHE[key] = (compiled, tail)
        return
    compiled, tail = hit
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    compiled.run(grid[0], g1, g2, driver.get_current_stream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *args, *tail)


def tensor_desc(cls, base: torch.Tensor, shape, strides, block_shape, layout):
    """cls(base, shape, strides, block_shape, layout) (a Gluon host TensorDescriptor) without its __post_init__
    checks, a few microseconds a descriptor, for callers whose inputs passed the same checks already (base and
    strides 16-byte aligned, shape positive, last stride 1, a power-of-two block, an NVMMA layout).
    tests/kernels/test_launch.py checks it equals the checked construction."""
    d = object.__new__(cls)
    d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding = base, shape, strides, block_shape, layout, "zero"
    return d
