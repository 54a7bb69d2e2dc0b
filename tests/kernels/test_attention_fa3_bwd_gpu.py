"""The FA3-style Gluon backward (kernels.attention_fa3_bwd) on an sm_90 GPU against the float64 reference,
directly (every tuning config, the warp-specialized ones included; those also against the plain kernel) and through ops.attention (impl="fa3", with a dLSE term, and the automatic
pick), with the tolerance rule of the other attention tests (attention_checks.assert_close_rule)."""

from __future__ import annotations

import pytest
import torch

try:
    from .attention_checks import assert_close_rule, randn, run_all
except ImportError:  # tests/kernels is not a package
    from attention_checks import assert_close_rule, randn, run_all

from flashscale.reference.attention import attention_ref

bwd = pytest.importorskip("flashscale.kernels.attention_fa3_bwd")
fwd = pytest.importorskip("flashscale.kernels.attention_fa3")
pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and bwd.HAS_GLUON


def _grads_of(q, k, v, do, causal, cast):
    qq, kk, vv = (t.detach().to(cast).requires_grad_() for t in (q, k, v))
    o, lse = attention_ref(qq, kk, vv, causal=causal, return_lse=True, upcast=False)
    return (o, lse, *torch.autograd.grad(o, (qq, kk, vv), do.to(cast)))


# (B, Sq, Sk, H, Hkv, D, causal)
CASES = [
    (2, 1000, 1000, 4, 2, 128, False),  # ragged last blocks, GQA
    (2, 1000, 1000, 4, 2, 128, True),
    (1, 384, 700, 4, 4, 64, True),  # Sq < Sk: bottom-right diagonal
    (1, 700, 384, 4, 1, 64, True),  # Sq > Sk: leading rows see no key (lse -inf), MQA
    (1, 512, 512, 8, 8, 64, False),
    (1, 129, 1, 2, 1, 256, False),  # one key
    (1, 1000, 777, 4, 2, 256, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:6])) + ("_causal" if c[6] else ""))
def test_fa3_bwd_every_config(case):
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    B, Sq, Sk, H, Hkv, D, causal = case
    torch.manual_seed(0)
    q = torch.randn(B, Sq, H, D, dtype=torch.bfloat16, device=CUDA)
    k = torch.randn(B, Sk, Hkv, D, dtype=torch.bfloat16, device=CUDA)
    v = torch.randn(B, Sk, Hkv, D, dtype=torch.bfloat16, device=CUDA)
    do = torch.randn(B, Sq, H, D, dtype=torch.bfloat16, device=CUDA)
    oracle = _grads_of(q, k, v, do, causal, torch.float64)
    base = _grads_of(q, k, v, do, causal, torch.bfloat16)
    out, lse = fwd.attention_fa3_fwd(q, k, v, causal=causal)
    for name, cfg in bwd.TUNING_CONFIGS[D].items():
        dq, dk, dv = bwd.attention_fa3_bwd(do, q, k, v, out, lse, causal=causal, config=cfg)
        torch.cuda.synchronize()
        try:
            assert_close_rule({"ours": (out, lse, dq, dk, dv), "oracle": oracle, "base": base})
        except AssertionError as e:
            raise AssertionError(f"config {name}: {e}") from None


WS = [(D, name) for D, cfgs in bwd.TUNING_CONFIGS.items() for name, cfg in cfgs.items() if cfg.ws]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D,name", WS, ids=[f"d{d}_{n}" for d, n in WS])
def test_fa3_bwd_ws_matches_the_plain_kernel(D, name, causal):
    """The warp-specialized variant does the plain kernel's math in the same order: dK and dV bit for bit equal to
    the plain kernel's with the same tiles; dQ equal up to the order of the float32 atomics (then a bf16 cast).
    GQA (G = 3), ragged Sq, Sq != Sk, enough steps to wrap the Q/dO ring many times."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    ws = bwd.TUNING_CONFIGS[D][name]
    plain = bwd.FA3BwdConfig(block_n=ws.block_n, block_m=ws.block_m)
    torch.manual_seed(1)
    B, Sq, Sk, H, Hkv = 2, 1111, 1000, 6, 2
    q = torch.randn(B, Sq, H, D, dtype=torch.bfloat16, device=CUDA)
    k = torch.randn(B, Sk, Hkv, D, dtype=torch.bfloat16, device=CUDA)
    v = torch.randn(B, Sk, Hkv, D, dtype=torch.bfloat16, device=CUDA)
    do = torch.randn(B, Sq, H, D, dtype=torch.bfloat16, device=CUDA)
    out, lse = fwd.attention_fa3_fwd(q, k, v, causal=causal)
    dq0, dk0, dv0 = bwd.attention_fa3_bwd(do, q, k, v, out, lse, causal=causal, config=plain)
    dq1, dk1, dv1 = bwd.attention_fa3_bwd(do, q, k, v, out, lse, causal=causal, config=ws)
    torch.cuda.synchronize()
    assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1)
    torch.testing.assert_close(dq1.float(), dq0.float(), rtol=1.6e-2, atol=1e-3)


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_ops_attention_fa3_backward_with_dlse(D, causal):
    """impl='fa3' runs the Gluon forward and backward; a loss on the LSE too (delta - dLSE)."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    q = randn(2, 600, 4, D, dtype=torch.bfloat16, device=CUDA)
    k = randn(2, 600, 2, D, dtype=torch.bfloat16, device=CUDA)
    v = randn(2, 600, 2, D, dtype=torch.bfloat16, device=CUDA)
    assert_close_rule(run_all(q, k, v, dlse=True, impl="fa3", causal=causal))


def test_auto_takes_the_gluon_backward_at_head_dim_256(monkeypatch):
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from flashscale.ops import attention_op

    calls = []
    real = bwd.attention_fa3_bwd
    monkeypatch.setattr(bwd, "attention_fa3_bwd", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q = randn(1, 2048, 2, 256, dtype=torch.bfloat16, device=CUDA)  # causal d256: from 2048 (FA2 ahead below)
    assert attention_op.fa3_bwd_wanted(q, q, q, None, -1, 0, 0.0, None, 0.0, False, "auto")
    assert not attention_op.fa3_bwd_wanted(q, q, q, None, -1, 0, 0.0, None, 0.0, True, "auto")  # deterministic
    assert_close_rule(run_all(q, q.detach().clone().requires_grad_(), q.detach().clone().requires_grad_(),
                              impl="auto", causal=True))
    assert calls, "auto did not take the Gluon backward at head_dim 256"


def test_auto_backward_rule_by_head_dim_causal_and_length():
    """ops.attention's auto backward takes the Gluon kernel only in the cells where it measured faster
    (attention_op.FA3_BWD_AUTO_MIN_SEQLEN_Q): every head dim, causal or not, from 512 query rows; the same when
    auto gave the forward to fa3 ("auto_fa3"), forced only by "fa3"."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from flashscale.ops import attention_op

    def wanted(D, S, causal, impl="auto"):
        q = torch.empty(1, S, 2, D, dtype=torch.bfloat16, device=CUDA)
        return attention_op.fa3_bwd_wanted(q, q, q, None, -1, 0 if causal else -1, 0.0, None, 0.0, False, impl)

    for D in (64, 128, 256):
        for causal in (False, True):
            assert wanted(D, 512, causal) and wanted(D, 16384, causal) and not wanted(D, 511, causal)
    assert not wanted(128, 511, False, impl="auto_fa3") and wanted(128, 512, False, impl="auto_fa3")
    assert wanted(128, 128, True, impl="fa3")  # forced


@pytest.mark.parametrize("D", [64, 128, 256])
def test_fa3_bwd_through_the_launch_cache(D, monkeypatch):
    """The backward's three launches (delta, the Gluon kernel, the dQ cast) through kernels.launch
    (FLASHSCALE_LAUNCH_CACHE_BWD=1): shapes that share a cache entry one after another (the second and later calls
    skip Triton's binder), causal and not, GQA, ragged lengths, Sq = 1 (an integer Triton specializes on). dK / dV
    bitwise those of the uncached launches, dQ up to the order of its float32 reductions."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from flashscale.kernels import launch as L

    monkeypatch.setattr(L, "ENABLED", True)
    torch.manual_seed(2)
    for B, Sq, Sk, H, Hkv, causal in ((2, 1000, 1000, 4, 2, False), (1, 777, 1200, 4, 4, True),
                                      (2, 1024, 1024, 4, 2, False), (1, 1, 300, 2, 1, False),
                                      (2, 1000, 1000, 4, 2, True)):
        q = torch.randn(B, Sq, H, D, dtype=torch.bfloat16, device=CUDA)
        k = torch.randn(B, Sk, Hkv, D, dtype=torch.bfloat16, device=CUDA)
        v = torch.randn(B, Sk, Hkv, D, dtype=torch.bfloat16, device=CUDA)
        do = torch.randn(B, Sq, H, D, dtype=torch.bfloat16, device=CUDA)
        out, lse = fwd.attention_fa3_fwd(q, k, v, causal=causal)
        monkeypatch.setattr(L, "BWD_ENABLED", False)
        dq0, dk0, dv0 = bwd.attention_fa3_bwd(do, q, k, v, out, lse, causal=causal)
        monkeypatch.setattr(L, "BWD_ENABLED", True)
        for _ in range(2):  # the first may fill the cache, the second takes it
            dq1, dk1, dv1 = bwd.attention_fa3_bwd(do, q, k, v, out, lse, causal=causal)
            torch.cuda.synchronize()
            assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1), (B, Sq, Sk, H, Hkv, causal)
            torch.testing.assert_close(dq1.float(), dq0.float(), rtol=1.6e-2, atol=1e-3)


def test_fa3_bwd_takes_misaligned_o_and_do():
    """o and dO that are contiguous views off a 16-byte boundary (TMA's requirement) are copied, not read misaligned:
    the same gradients as from aligned copies."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    torch.manual_seed(3)
    shape = (1, 300, 2, 128)
    q, k, v, do = (torch.randn(shape, dtype=torch.bfloat16, device=CUDA) for _ in range(4))
    out, lse = fwd.attention_fa3_fwd(q, k, v, causal=True)
    n = out.numel()
    o_mis = torch.empty(n + 1, dtype=torch.bfloat16, device=CUDA)[1:].view(shape).copy_(out)
    do_mis = torch.empty(n + 1, dtype=torch.bfloat16, device=CUDA)[1:].view(shape).copy_(do)
    assert o_mis.data_ptr() % 16 and do_mis.data_ptr() % 16 and o_mis.is_contiguous()
    dq0, dk0, dv0 = bwd.attention_fa3_bwd(do, q, k, v, out, lse, causal=True)
    dq1, dk1, dv1 = bwd.attention_fa3_bwd(do_mis, q, k, v, o_mis, lse, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1)
    torch.testing.assert_close(dq1.float(), dq0.float(), rtol=1.6e-2, atol=1e-3)
