"""kernels.launch: the key of its compiled-kernel cache distinguishes every argument Triton's binder would
specialize differently (else a call could run a kernel compiled for another specialization), the unchecked
descriptor equals the checked one, and under the interpreter a launch is the plain kernel[grid] call."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from flashscale.kernels import launch as L

INTS = [0, 1, 2, 15, 16, 17, 32, 48, 1000, 1024, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**32, 2**40 + 3]


def _native(a):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    return native_specialize_impl(BaseBackend, a, False, True, True)


def test_spec_key_separates_what_triton_specializes():
    for a, b in itertools.combinations(INTS, 2):
        if _native(a) != _native(b):
            assert L.spec_key([a]) != L.spec_key([b]), (a, b, _native(a), _native(b))
    t = torch.zeros(64, dtype=torch.float32)
    views = [t, t[1:], t[4:], t.to(torch.float16), t.to(torch.int32)]
    for a, b in itertools.combinations(views, 2):
        if _native(a) != _native(b):
            assert L.spec_key([a]) != L.spec_key([b])
    assert L.spec_key([t, 16, 2.5]) == L.spec_key([t.clone(), 32, 0.1])  # same specialization: one entry


def test_spec_key_refuses_what_it_cannot_key():
    with pytest.raises(TypeError, match="str"):
        L.spec_key(["x"])


def test_tensor_desc_equals_checked_construction():
    gl_hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from flashscale.kernels.attention_fa3 import tile_layout
    q = torch.zeros(2, 256, 4, 64, dtype=torch.bfloat16)
    args = (q, [2, 256, 256], [256 * 256, 256, 1], [1, 128, 64], tile_layout(128, 64, q.dtype))
    fast = L.tensor_desc(gl_hopper.TensorDescriptor, *args)
    assert type(fast) is gl_hopper.TensorDescriptor and fast == gl_hopper.TensorDescriptor(*args)
    assert _native(fast) == _native(gl_hopper.TensorDescriptor(*args))


@triton.jit
def _axpy(X, Y, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(Y + offs, a * tl.load(X + offs, mask=m) + tl.load(Y + offs, mask=m), mask=m)


def test_launch_runs_the_kernel(monkeypatch):
    # On the CPU (interpreter) this is the kernel[grid] path; on a GPU the second and third calls take the cache
    monkeypatch.setattr(L, "ENABLED", True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for n in (100, 100, 64, 1):
        x, y = torch.arange(n, dtype=torch.float32, device=dev), torch.ones(n, dtype=torch.float32, device=dev)
        L.launch(_axpy, (triton.cdiv(n, 32), ), (x, y, 2.0, n), {"BLOCK": 32}, "axpy")
        assert torch.equal(y.cpu(), 2 * torch.arange(n, dtype=torch.float32) + 1)


def test_backward_launches_follow_their_own_switch(monkeypatch):
    # bwd=True launches (the Hopper backward's) take the cache only while BWD_ENABLED as well: with it off, every
    # call is kernel[grid] and nothing is cached
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setattr(L, "ENABLED", True)
    monkeypatch.setattr(L, "BWD_ENABLED", False)
    monkeypatch.setattr(L, "_CACHE", {})
    for n in (100, 100):
        x, y = torch.arange(n, dtype=torch.float32, device=dev), torch.ones(n, dtype=torch.float32, device=dev)
        L.launch(_axpy, (triton.cdiv(n, 32), ), (x, y, 2.0, n), {"BLOCK": 32}, "axpy_bwd", bwd=True)
        assert torch.equal(y.cpu(), 2 * torch.arange(n, dtype=torch.float32) + 1)
    assert L._CACHE == {}
    monkeypatch.setattr(L, "BWD_ENABLED", True)
    for n in (100, 100):
        x, y = torch.arange(n, dtype=torch.float32, device=dev), torch.ones(n, dtype=torch.float32, device=dev)
        L.launch(_axpy, (triton.cdiv(n, 32), ), (x, y, 2.0, n), {"BLOCK": 32}, "axpy_bwd", bwd=True)
        assert torch.equal(y.cpu(), 2 * torch.arange(n, dtype=torch.float32) + 1)
    assert (len(L._CACHE) == 1) == (dev == "cuda")  # the interpreter never caches


def test_watched_hooks():
    from triton import knobs
    assert not L._watched(None) and not L._watched(knobs.runtime.launch_enter_hook)  # Triton's default: empty
    chain = type(knobs.runtime.launch_enter_hook)()
    chain.add(print)
    assert L._watched(chain) and L._watched(print)


def test_env_switch_is_checked():
    r = subprocess.run([sys.executable, "-c", "import flashscale.kernels.launch"], capture_output=True, text=True,
                       env={**os.environ, "FLASHSCALE_LAUNCH_CACHE": "yes"})
    assert r.returncode != 0 and "FLASHSCALE_LAUNCH_CACHE='yes'" in r.stderr
    r = subprocess.run([sys.executable, "-c", "import flashscale.kernels.launch as L; print(L.BWD_ENABLED)"],
                       capture_output=True, text=True, env={**os.environ, "FLASHSCALE_LAUNCH_CACHE_BWD": "on"})
    assert r.returncode != 0 and "FLASHSCALE_LAUNCH_CACHE_BWD='on'" in r.stderr
    env = {k: v for k, v in os.environ.items() if k != "FLASHSCALE_LAUNCH_CACHE_BWD"}
    r = subprocess.run([sys.executable, "-c", "import flashscale.kernels.launch as L; print(L.BWD_ENABLED)"],
                       capture_output=True, text=True, env=env)
    assert r.stdout.strip() == "True"  # on by default since session 27's GPU run
    r = subprocess.run([sys.executable, "-c", "import flashscale.kernels.launch as L; print(L.BWD_ENABLED)"],
                       capture_output=True, text=True, env={**env, "FLASHSCALE_LAUNCH_CACHE_BWD": "0"})
    assert r.stdout.strip() == "False"
