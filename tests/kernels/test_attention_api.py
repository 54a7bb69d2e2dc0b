"""ops.attention's contract: every validation error, the custom op (opcheck, torch.compile without graph
breaks), autocast, and the reference path as the CPU default. No kernel launches except where named."""

from __future__ import annotations

import sys

import pytest
import torch

from flashscale.ops import attention
from flashscale.ops.attention_op import attention_bwd_op, attention_fwd_op
from flashscale.reference.attention import attention_ref


def _qkv(B=1, S=4, H=2, Hkv=2, D=8, dtype=torch.float32, **kw):
    return (torch.randn(B, S, H, D, dtype=dtype, **kw), torch.randn(B, S, Hkv, D, dtype=dtype, **kw),
            torch.randn(B, S, Hkv, D, dtype=dtype, **kw))


def _cu(*lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


CASES = {
    "q_not_tensor": (lambda q, k, v: attention(q.tolist(), k, v), TypeError, "q must be a torch.Tensor"),
    "int_dtype": (lambda q, k, v: attention(q.long(), k.long(), v.long()), TypeError, "q.dtype must be"),
    "dtype_mismatch": (lambda q, k, v: attention(q, k.double(), v), TypeError, r"k.dtype \(torch.float64\) must match"),
    "rank": (lambda q, k, v: attention(q[0], k[0], v[0]), ValueError, "q must be 4-D"),
    "v_shape": (lambda q, k, v: attention(q, k, v[:, :3]), ValueError, "v must have k's shape"),
    "head_dim_mismatch": (lambda q, k, v: attention(q, k[..., :4].contiguous(), v[..., :4].contiguous()),
                          ValueError, "k's head_dim"),
    "head_dim_unsupported": (lambda q, k, v: attention(*(t[..., :6].contiguous() for t in (q, k, v))), ValueError,
                             "head_dim must be a multiple of 8"),
    "head_dim_too_big": (lambda q, k, v: attention(*(torch.randn(1, 2, 1, 264) for _ in range(3))), ValueError,
                         r"in \[8, 256\]; got 264"),
    "noncontiguous_last_dim": (lambda q, k, v: attention(torch.randn(1, 4, 2, 16)[..., ::2], k, v), ValueError,
                               "q must have a contiguous last"),
    "gqa_heads": (lambda q, k, v: attention(torch.randn(1, 4, 3, 8), k, v), ValueError,
                  r"q's heads \(3\) must be a multiple of k/v's heads \(2\)"),
    "batch_mismatch": (lambda q, k, v: attention(torch.randn(2, 4, 2, 8), k, v), ValueError, "k's batch"),
    "window_type": (lambda q, k, v: attention(q, k, v, window=(1,)), ValueError, "window must be"),
    "window_value": (lambda q, k, v: attention(q, k, v, window=(-2, 0)), ValueError, "window must be"),
    "causal_right_window": (lambda q, k, v: attention(q, k, v, causal=True, window=(4, 2)), ValueError,
                            "causal=True fixes the right window"),
    "softcap": (lambda q, k, v: attention(q, k, v, softcap=-1.0), ValueError, "softcap must be"),
    "dropout": (lambda q, k, v: attention(q, k, v, dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
    "seed": (lambda q, k, v: attention(q, k, v, dropout_p=0.1, seed=-3), ValueError, "seed must be"),
    "scale": (lambda q, k, v: attention(q, k, v, softmax_scale=float("nan")), ValueError, "softmax_scale must be"),
    "alibi_dtype": (lambda q, k, v: attention(q, k, v, alibi_slopes=torch.ones(2, dtype=torch.float64)), TypeError,
                    "alibi_slopes must be a float32"),
    "alibi_shape": (lambda q, k, v: attention(q, k, v, alibi_slopes=torch.ones(3)), ValueError,
                    r"alibi_slopes must have shape \(2,\) or \(1, 2\)"),
    "impl": (lambda q, k, v: attention(q, k, v, impl="cuda"), ValueError, "impl must be one of"),
    "impl_triton_fp64": (lambda q, k, v: attention(q.double(), k.double(), v.double(), impl="triton"), ValueError,
                         "float64 runs on impl='reference'"),
    "max_seqlen_dense": (lambda q, k, v: attention(q, k, v, max_seqlen_q=4), ValueError,
                         "max_seqlen_q/k belong to the packed varlen layout"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_validation_errors(case):
    fn, exc, match = CASES[case]
    with pytest.raises(exc, match=match):
        fn(*_qkv())


def _packed(lens_q=(3, 1), lens_k=(2, 4), H=2, D=8):
    return (torch.randn(sum(lens_q), H, D), torch.randn(sum(lens_k), H, D), torch.randn(sum(lens_k), H, D),
            _cu(*lens_q), _cu(*lens_k))


VARLEN_CASES = {
    "rank": (lambda q, k, v, cq, ck: attention(q[None], k[None], v[None], cu_seqlens_q=cq, cu_seqlens_k=ck),
             ValueError, "q must be 3-D"),
    "one_cu_missing": (lambda q, k, v, cq, ck: attention(q, k, v, cu_seqlens_q=cq), ValueError,
                       "must be given together"),
    "cu_dtype": (lambda q, k, v, cq, ck: attention(q, k, v, cu_seqlens_q=cq.long(), cu_seqlens_k=ck), TypeError,
                 "cu_seqlens_q must be int32"),
    "cu_not_monotone": (lambda q, k, v, cq, ck: attention(q, k, v, cu_seqlens_q=torch.tensor([0, 3, 2, 4],
                        dtype=torch.int32), cu_seqlens_k=_cu(2, 2, 2)), ValueError, "never decrease"),
    "cu_total": (lambda q, k, v, cq, ck: attention(q, k, v, cu_seqlens_q=_cu(3, 2), cu_seqlens_k=ck), ValueError,
                 r"cu_seqlens_q\[-1\] must equal the number of packed tokens 4"),
    "cu_lengths_differ": (lambda q, k, v, cq, ck: attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=_cu(1, 1, 4)),
                          ValueError, "same length"),
    "cu_2d": (lambda q, k, v, cq, ck: attention(q, k, v, cu_seqlens_q=cq[None], cu_seqlens_k=ck), ValueError,
              "must be 1-D"),
    "max_seqlen_short": (lambda q, k, v, cq, ck: attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck,
                         max_seqlen_q=2), ValueError, r"max_seqlen_q=2 is shorter than the longest sequence"),
    "max_seqlen_type": (lambda q, k, v, cq, ck: attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck,
                        max_seqlen_k=2.5), ValueError, "max_seqlen_k must be a non-negative int"),
}


@pytest.mark.parametrize("case", list(VARLEN_CASES))
def test_varlen_validation_errors(case):
    fn, exc, match = VARLEN_CASES[case]
    with pytest.raises(exc, match=match):
        fn(*_packed())


def test_devices_must_match():
    q, k, v = _qkv()
    meta = torch.empty_like(k, device="meta")
    with pytest.raises(ValueError, match="k is on meta but q is on cpu"):
        attention(q, meta, v)
    cq, ck = _cu(4), _cu(4)
    with pytest.raises(ValueError, match="cu_seqlens_q is on meta"):
        attention(q[0], k[0], v[0], cu_seqlens_q=cq.to("meta"), cu_seqlens_k=ck)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        attention(*_qkv(), impl="triton")


@pytest.mark.parametrize("kw, match", [
    (dict(window=(4, 0), causal=True), "sliding windows"),
    (dict(softcap=30.0), "softcap=30.0"),
    (dict(alibi_slopes=torch.ones(2)), "alibi_slopes"),
    (dict(dropout_p=0.1), "dropout_p=0.1"),
    (dict(softmax_scale=-0.5), "softmax_scale=-0.5: fa3 takes a scale > 0"),
    (dict(), "fa3 needs a Hopper GPU"),  # every feature fine: the device is what is missing
])
def test_fa3_refuses_what_it_cannot_run_naming_it(kw, match):
    q, k, v = _qkv(S=8, D=64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="impl='fa3' cannot take this call: .*" + match):
        attention(q, k, v, impl="fa3", **kw)


def test_fa3_refuses_head_dims_and_fp32_and_takes_varlen():
    q, k, v = _qkv(S=8, D=64)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        attention(q, k, v, impl="fa3")
    q, k, v = _qkv(S=8, D=32, dtype=torch.float16)
    with pytest.raises(ValueError, match="head_dim=32"):
        attention(q, k, v, impl="fa3")
    cu = _cu(8)
    with pytest.raises(ValueError, match="head_dim=32"):
        attention(q[0], k[0], v[0], cu_seqlens_q=cu, cu_seqlens_k=cu, impl="fa3")
    # the packed layout itself is no longer a reason: only the missing GPU is
    q, k, v = _qkv(S=8, D=64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="impl='fa3' cannot take this call: fa3 needs a Hopper GPU"):
        attention(q[0], k[0], v[0], cu_seqlens_q=_cu(3, 5), cu_seqlens_k=_cu(3, 5), impl="fa3")


def test_fa3_auto_rule(monkeypatch):
    """impl="auto" takes the fa3 forward on a GPU where it measured faster (head_dims 64, 128 and 256 from 512 query
    rows since session 26); FLASHSCALE_FA3=1 everywhere it applies, =0 never; other values are an error."""
    from types import SimpleNamespace

    from flashscale.ops.attention import _auto_wants_fa3

    gpu = lambda d: SimpleNamespace(is_cuda=True, shape=(1, 1, 1, d))  # noqa: E731
    monkeypatch.delenv("FLASHSCALE_FA3", raising=False)
    assert [_auto_wants_fa3(gpu(128), s) for s in (1, 511, 512, 16384)] == [False, False, True, True]
    assert [_auto_wants_fa3(gpu(256), s) for s in (256, 511, 512, 2048)] == [False, False, True, True]
    assert [_auto_wants_fa3(gpu(64), s) for s in (256, 511, 512, 2048)] == [False, False, True, True]
    assert not _auto_wants_fa3(gpu(96), 16384)  # not a head dim of the fast path
    assert not _auto_wants_fa3(SimpleNamespace(is_cuda=False, shape=(1, 1, 1, 128)), 4096)
    monkeypatch.setenv("FLASHSCALE_FA3", "1")
    assert _auto_wants_fa3(gpu(64), 1)
    monkeypatch.setenv("FLASHSCALE_FA3", "0")
    assert not _auto_wants_fa3(gpu(128), 16384)
    monkeypatch.setenv("FLASHSCALE_FA3", "yes")
    with pytest.raises(ValueError, match="FLASHSCALE_FA3='yes': takes 1"):
        attention(*_qkv(), impl="auto")


def test_auto_fa3_forward_keeps_autos_backward_rule(monkeypatch):
    """When auto gives the forward to fa3, the backward is still auto's choice (impl "auto_fa3"), not forced as by
    impl="fa3": until 2026-12-02 the forward's choice forced the Hopper backward into every such cell (d128 from
    1k, d64 from 2k), where FA2's measured up to 1.7x faster. Recorded through the real autograd path on the CPU
    (kernels replaced by the reference); then the two rules themselves, on a stand-in for a GPU tensor."""
    import importlib
    from types import SimpleNamespace

    A = importlib.import_module("flashscale.ops.attention")
    op = importlib.import_module("flashscale.ops.attention_op")
    seen = []
    real_fwd, real_bwd = op.fwd_impl, op.bwd_impl

    def fwd(*a):
        seen.append(("fwd", a[-1]))
        return real_fwd(*a[:-1], "reference")

    def bwd(*a):
        seen.append(("bwd", a[-1]))
        return real_bwd(*a[:-1], "reference")

    monkeypatch.setattr(op, "fwd_impl", fwd)
    monkeypatch.setattr(op, "bwd_impl", bwd)
    monkeypatch.setattr(A, "_auto_takes_fa3", lambda *a, **kw: True)
    monkeypatch.setattr(A, "fa3_unsupported", lambda *a, **kw: None)
    for impl, expect in (("auto", "auto_fa3"), ("fa3", "fa3")):
        seen.clear()
        q, k, v = _qkv(D=64, requires_grad=True)
        attention(q, k, v, causal=True, impl=impl).sum().backward()
        assert seen == [("fwd", expect), ("bwd", expect)], (impl, seen)
        ref = attention_ref(q.detach(), k.detach(), v.detach(), causal=True)
        torch.testing.assert_close(attention(q, k, v, causal=True, impl=impl).detach(), ref)

    bwd_mod = importlib.import_module("flashscale.kernels.attention_fa3_bwd")
    monkeypatch.setattr(bwd_mod, "unsupported_bwd", lambda *a: None)
    monkeypatch.delenv("FLASHSCALE_FA3", raising=False)
    gpu = lambda S, D: SimpleNamespace(is_cuda=True, shape=(1, S, 2, D))  # noqa: E731

    def fa3_bwd(S, D, causal, impl):
        return op.fa3_bwd_wanted(gpu(S, D), None, None, None, -1, 0 if causal else -1, 0.0, None, 0.0, False, impl)

    assert fa3_bwd(256, 64, True, "fa3") and fa3_bwd(128, 128, False, "fa3")  # forced
    assert not fa3_bwd(256, 64, True, "auto_fa3") and not fa3_bwd(511, 128, False, "auto_fa3")
    for impl in ("auto", "auto_fa3"):  # the measured rule, FA3_BWD_AUTO_MIN_SEQLEN_Q: every cell from 512
        for d in (64, 128, 256):
            for causal in (False, True):
                assert [fa3_bwd(s, d, causal, impl) for s in (511, 512, 16384)] == [False, True, True], (d, causal)
        assert not fa3_bwd(4096, 96, False, impl)  # unmeasured head dim
    assert not fa3_bwd(16384, 128, False, "triton")

    def dq_kernel(S, D, causal, cu=None, impl="auto"):
        return op.fa2_dq_kernel_wanted(gpu(S, D), cu, 0 if causal else -1, impl)

    assert dq_kernel(512, 64, True) and dq_kernel(512, 128, True) and dq_kernel(512, 256, False)
    assert [dq_kernel(s, 64, False) for s in (1024, 2048)] == [False, True]
    assert not dq_kernel(16384, 128, False) and not dq_kernel(4096, 96, True)  # unmeasured head dim: atomics
    assert not dq_kernel(4096, 64, True, cu=_cu(4096)) and not dq_kernel(4096, 64, True, impl="reference")
    assert not op.fa2_dq_kernel_wanted(SimpleNamespace(is_cuda=False, shape=(1, 4096, 2, 64)), None, 0, "triton")


def test_paths_count_the_kernels_that_ran():
    """attention_op.PATHS counts which implementation each forward and backward ran (what benchmarks/attention.py
    records per row): the FA2 kernels under the interpreter with atomic dQ or, deterministic, the dQ kernel; the
    reference; the CPU inference path through SDPA. (Named kernel launches: the interpreter's tiny FA2 calls; on a
    GPU machine, where nothing is interpreted, the FA2 lines run on the GPU.)"""
    from flashscale.ops.attention_op import PATHS

    def ran(**kw):
        before = PATHS.copy()
        dev = "cuda" if kw.get("impl") == "triton" and torch.cuda.is_available() else "cpu"
        q, k, v = _qkv(S=5, D=16, requires_grad=kw.pop("grad", True), device=dev)
        out = attention(q, k, v, causal=True, **kw)
        if out.requires_grad:
            out.sum().backward()
        return dict(PATHS - before)

    assert ran(impl="triton") == {("fwd", "fa2"): 1, ("bwd", "fa2_atomic"): 1}
    assert ran(impl="triton", deterministic=True) == {("fwd", "fa2"): 1, ("bwd", "fa2_dq"): 1}
    assert ran(impl="reference") == {("fwd", "reference"): 1, ("bwd", "reference"): 1}
    assert ran(grad=False) == {("fwd", "sdpa_cpu"): 1}  # CPU inference, plain case
    assert ran() == {("fwd", "reference"): 1, ("bwd", "reference"): 1}  # CPU training: the reference


def test_fa3_auto_takes_varlen_by_its_measured_rule(monkeypatch):
    """impl="auto" sends the packed varlen layout to the fa3 forward where the H200 measured it faster (its GPU
    tests passed there: ops.attention.FA3_AUTO_VARLEN); with the flag off it keeps varlen on FA2, FLASHSCALE_FA3=1
    included; a bad FLASHSCALE_FA3 raises either way."""
    import importlib
    from types import SimpleNamespace

    A = importlib.import_module("flashscale.ops.attention")  # the module (flashscale.ops.attention is the function)

    gpu = SimpleNamespace(is_cuda=True, shape=(1, 1, 128))
    assert A.FA3_AUTO_VARLEN is True
    monkeypatch.setenv("FLASHSCALE_FA3", "")
    assert A._auto_takes_fa3(gpu, 16384, varlen=True) and A._auto_takes_fa3(gpu, 16384, varlen=False)
    assert not A._auto_takes_fa3(gpu, 512, varlen=True)  # short: FA2 measured faster
    # varlen's own measured rule (FA3_AUTO_VARLEN_MIN_SEQLEN_Q): by head dim and causality
    assert A._auto_takes_fa3(gpu, 900, varlen=True) and not A._auto_takes_fa3(gpu, 400, varlen=False)
    assert not A._auto_takes_fa3(gpu, 900, varlen=True, causal=True) and A._auto_takes_fa3(gpu, 2000, True, True)
    d64 = SimpleNamespace(is_cuda=True, shape=(1, 1, 64))
    assert A._auto_takes_fa3(d64, 4000, varlen=True) and not A._auto_takes_fa3(d64, 4000, varlen=True, causal=True)
    assert A._auto_takes_fa3(d64, 8000, varlen=True, causal=True)
    monkeypatch.setenv("FLASHSCALE_FA3", "0")
    assert not A._auto_takes_fa3(gpu, 16384, varlen=True)
    monkeypatch.setattr(A, "FA3_AUTO_VARLEN", False)
    for mode in ("", "1"):
        monkeypatch.setenv("FLASHSCALE_FA3", mode)
        assert A._auto_takes_fa3(gpu, 16384, varlen=False)  # dense: as before
        assert not A._auto_takes_fa3(gpu, 16384, varlen=True)
    monkeypatch.setenv("FLASHSCALE_FA3", "yes")
    with pytest.raises(ValueError, match="FLASHSCALE_FA3='yes'"):
        A._auto_takes_fa3(gpu, 16384, varlen=True)


def test_fa3_opt_in_on_cpu_keeps_the_cpu_path(monkeypatch):
    monkeypatch.setenv("FLASHSCALE_FA3", "1")
    q, k, v = _qkv(B=2, S=7, H=4, Hkv=2, D=64)
    torch.testing.assert_close(attention(q, k, v, causal=True), attention_ref(q, k, v, causal=True))


def test_cpu_default_is_the_reference():
    q, k, v = _qkv(B=2, S=7, H=4, Hkv=2, D=16)
    out, lse = attention(q, k, v, causal=True, window=(2, -1), return_lse=True)
    ref, ref_lse = attention_ref(q, k, v, causal=True, window=(2, -1), return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    assert out.is_contiguous() and lse.shape == (2, 4, 7)


def test_opcheck_custom_ops():
    """Schema, fake (meta) implementations and autograd registration, checked by torch.library.opcheck."""
    q, k, v = _qkv(B=1, S=5, H=2, Hkv=1, D=8, requires_grad=True)
    seed = torch.tensor(3, dtype=torch.int64)
    args = (q, k, v, None, None, torch.rand(2), seed, 5, 5, 0.3, 2, 0, 1.5, 0.2, False, "reference")
    torch.library.opcheck(attention_fwd_op, args)
    out, lse = attention_fwd_op(*args)
    cu = _cu(3, 2)
    vq, vk, vv = (torch.randn(5, 2, 8) for _ in range(3))
    torch.library.opcheck(attention_fwd_op, (vq, vk, vv, cu, cu, None, seed, 3, 3, 0.3, -1, -1, 0.0, 0.0, True,
                                             "reference"))
    bargs = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
             torch.randn_like(lse), None, None, None, seed, 5, 5, 0.3, -1, 0, 0.0, 0.0, True, "reference")
    torch.library.opcheck(attention_bwd_op, bargs)


def test_torch_compile_has_no_graph_break():
    """fullgraph=True fails on any graph break; aot_eager traces forward and backward through the fakes."""
    q, k, v = _qkv(B=2, S=6, H=4, Hkv=2, D=16, requires_grad=True)

    def f(q, k, v):
        return attention(q, k, v, causal=True, softcap=5.0, dropout_p=0.1).square().sum()

    torch.manual_seed(0)
    eager = f(q, k, v)
    g_eager = torch.autograd.grad(eager, (q, k, v))
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.manual_seed(0)  # the dropout seed is drawn from the generator, in the graph
    out = compiled(q, k, v)
    g = torch.autograd.grad(out, (q, k, v))
    assert torch.allclose(out, eager)
    for a, b in zip(g, g_eager):
        assert torch.allclose(a, b)


def test_autocast_runs_in_the_autocast_dtype():
    q, k, v = _qkv(B=1, S=5, H=2, Hkv=2, D=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(q, k.bfloat16(), v, impl="reference")  # mixed inputs are what autocast hands over
        with torch.no_grad():
            fast = attention(q, k.bfloat16(), v)  # auto on the CPU, inference: torch's SDPA
    assert out.dtype == fast.dtype == torch.bfloat16
    ref = attention_ref(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert torch.equal(out, ref)
    torch.testing.assert_close(fast, ref, rtol=2e-2, atol=2e-2)  # bf16 rounding of another algorithm


@pytest.mark.parametrize("causal, Sq, Sk, H, Hkv", [(True, 7, 7, 4, 2), (False, 5, 9, 4, 1), (True, 1, 6, 2, 2),
                                                   (False, 6, 6, 2, 2)])
def test_cpu_auto_path_matches_the_reference(causal, Sq, Sk, H, Hkv):
    """impl='auto' on the CPU runs torch's SDPA for plain inference (causal only at Sq == Sk; the rest,
    e.g. decode's Sq=1 < Sk, and anything that needs gradients stay on the reference)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, Sq, H, 16, generator=g)
    k = torch.randn(2, Sk, Hkv, 16, generator=g)
    v = torch.randn(2, Sk, Hkv, 16, generator=g)
    with torch.no_grad():
        got = attention(q, k, v, causal=causal)
    torch.testing.assert_close(got, attention_ref(q, k, v, causal=causal), rtol=1e-5, atol=1e-6)
    qg = q.clone().requires_grad_()
    assert torch.equal(attention(qg, k, v, causal=causal), attention_ref(q, k, v, causal=causal))  # training path


def test_empty_inputs():
    q, k, v = _qkv(B=0, S=4)
    assert attention(q, k, v).shape == q.shape
    q, k, v = (torch.randn(1, 0, 2, 8) for _ in range(3))
    out, lse = attention(q, k, v, return_lse=True)
    assert out.shape == q.shape and lse.shape == (1, 2, 0)


def test_eager_calls_skip_the_custom_op(monkeypatch):
    """Eager calls go through the autograd.Function: custom-op dispatch costs more host time than a short
    kernel runs (see ops/attention_op.py); only torch.compile needs the op."""
    import importlib

    api = importlib.import_module("flashscale.ops.attention")  # the module (the package exports the function)

    def refuse(*args, **kwargs):
        raise AssertionError("eager attention went through the custom op")

    monkeypatch.setattr(api, "attention_fwd_op", refuse)
    q, k, v = _qkv(B=1, S=5, H=2, Hkv=1, D=8, requires_grad=True)
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    torch.autograd.grad((out, lse), (q, k, v), (torch.randn_like(out), torch.randn_like(lse)))


def test_cu_seqlens_values_checked_once_per_tensor_version(monkeypatch):
    """A model calls attention once a layer with one cu_seqlens: its values are read (a host sync) on the first
    call only; a tensor changed in place is read, and refused, again."""
    q, k, v = (torch.randn(7, 2, 16, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    reads = []
    real = torch.Tensor.tolist

    def tolist(t):  # count the reads of the validation only (the CPU reference reads the offsets too)
        if sys._getframe(1).f_code.co_name == "_check_cu_seqlens":
            reads.append(t.numel())
        return real(t)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    first = attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    n = len(reads)
    again = attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert n >= 1 and len(reads) == n and torch.equal(first, again)
    cu[1] = 9  # in place: now decreasing
    with pytest.raises(ValueError, match="never decrease"):
        attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    other = torch.tensor([0, 3, 7], dtype=torch.int32)  # equal values, another tensor: read once more
    attention(q, k, v, causal=True, cu_seqlens_q=other, cu_seqlens_k=other)
    assert len(reads) > n
    with torch.inference_mode():  # inference tensors keep no version counter: read on every call, no error
        cu_inf = torch.tensor([0, 3, 7], dtype=torch.int32)
        n = len(reads)
        for _ in range(2):
            assert torch.equal(attention(q, k, v, causal=True, cu_seqlens_q=cu_inf, cu_seqlens_k=cu_inf), first)
        assert len(reads) >= n + 2


def test_capability_traces_under_compile_without_the_lru_cache_warning():
    """ops.attention's Hopper decision reads the device's capability (cached: it runs on every launch); under
    torch.compile the uncached call is traced, so compiling a model does not warn about an lru_cache wrapper."""
    import warnings

    from flashscale.kernels.attention_tune import capability

    x = torch.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(lambda t: t + capability(t.device)[0], backend="eager", fullgraph=True)(x)
    assert torch.equal(out, x + capability(x.device)[0])
    assert not [w for w in caught if "lru_cache" in str(w.message)]
