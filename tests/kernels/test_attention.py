"""The Triton attention kernels (forward and all gradients) against the float64 reference, on CPU.

Runs the real kernels under TRITON_INTERPRET=1 (tests/conftest.py sets it without CUDA) through the
public op with impl="triton", at the smallest shapes that still exercise the tails: seqlen 1, 17 and
127 with 16-row blocks, Sq != Sk both ways, GQA/MQA, padded head dims. Tolerance: attention_checks.
"""

from __future__ import annotations

import pytest
import torch

try:
    from .attention_checks import assert_close_rule, randn, run_all
except ImportError:  # tests/kernels is not a package
    from attention_checks import assert_close_rule, randn, run_all

from flashscale.kernels.attention_bwd import attention_bwd
from flashscale.kernels.attention_fwd import attention_fwd
from flashscale.kernels.attention_tune import BwdConfig, FwdConfig
from flashscale.ops import attention
from flashscale.reference.attention import attention_bwd_ref, attention_ref

DTYPES = [torch.float16, torch.float32]


# (B, Sq, Sk, H, Hkv, D): seqlen 1; MQA with a ragged tail and head dim 40 (padded to 64); Sq < Sk GQA;
# Sq > Sk, whose causal diagonal leaves the first rows with no key at all.
SHAPES = [(1, 1, 1, 2, 2, 16), (2, 17, 17, 2, 1, 40), (1, 20, 37, 4, 2, 24), (1, 37, 20, 2, 2, 16)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "fp32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shapes(shape, causal, dtype):
    B, Sq, Sk, H, Hkv, D = shape
    q, k, v = randn(B, Sq, H, D, dtype=dtype), randn(B, Sk, Hkv, D, dtype=dtype), randn(B, Sk, Hkv, D, dtype=dtype)
    res = run_all(q, k, v, causal=causal)
    assert_close_rule(res)
    if causal and Sq > Sk:  # rows before the diagonal see nothing: zeros, -inf LSE, zero gradients
        empty = Sq - Sk
        out, lse, dq = res["ours"][0], res["ours"][1], res["ours"][2]
        assert torch.all(out[:, :empty] == 0) and torch.all(lse[:, :, :empty] == float("-inf"))
        assert torch.all(dq[:, :empty] == 0)


@pytest.mark.parametrize("causal", [pytest.param(False, marks=pytest.mark.slow), True], ids=["full", "causal"])
def test_seqlen_127(causal):
    """Eight 16-row blocks with a 15-row tail: the unmasked middle loop and both masked edges all run."""
    q, k, v = (randn(1, 127, 2, 32, dtype=torch.float16) for _ in range(3))
    assert_close_rule(run_all(q, k, v, causal=causal))


FEATURES = {
    "window_both": dict(window=(5, 3)),
    "window_left_causal": dict(window=(8, -1), causal=True),
    "window_right_only": dict(window=(-1, 4)),
    "softcap": dict(softcap=3.0, causal=True),
    "alibi": dict(alibi_slopes="h", causal=True),
    "alibi_per_batch": dict(alibi_slopes="bh", window=(6, 6)),
    "dropout": dict(dropout_p=0.25, seed=1234),
    "dropout_causal": dict(dropout_p=0.1, seed=7, causal=True),
    "scale": dict(softmax_scale=0.3),
    "everything": dict(window=(9, -1), causal=True, softcap=2.5, alibi_slopes="h", dropout_p=0.2, seed=99,
                       softmax_scale=0.4),
}


def _feature_kwargs(spec: dict, B: int, H: int) -> dict:
    kw = dict(spec)
    if kw.get("alibi_slopes") == "h":
        kw["alibi_slopes"] = torch.rand(H) * 0.5
    elif kw.get("alibi_slopes") == "bh":
        kw["alibi_slopes"] = torch.rand(B, H) * 0.5
    return kw


# Every feature in fp16; in fp32 the all-features case, the rest with --runslow.
_FEATURE_CASES = [pytest.param(f, torch.float16, id=f"{f}-fp16") for f in FEATURES] + [
    pytest.param(f, torch.float32, id=f"{f}-fp32", marks=() if f == "everything" else pytest.mark.slow)
    for f in FEATURES]


@pytest.mark.parametrize("feature,dtype", _FEATURE_CASES)
def test_features(feature, dtype):
    B, Sq, Sk, H, Hkv, D = 2, 19, 30, 2, 1, 24
    q, k, v = randn(B, Sq, H, D, dtype=dtype), randn(B, Sk, Hkv, D, dtype=dtype), randn(B, Sk, Hkv, D, dtype=dtype)
    assert_close_rule(run_all(q, k, v, **_feature_kwargs(FEATURES[feature], B, H)))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic_dq", "deterministic"])
def test_gradient_through_lse(deterministic):
    """lse is differentiable: dlse folds into the backward's delta (delta - dlse)."""
    q, k, v = randn(1, 18, 2, 16, dtype=torch.float32), randn(1, 18, 2, 16, dtype=torch.float32), \
        randn(1, 18, 2, 16, dtype=torch.float32)
    assert_close_rule(run_all(q, k, v, dlse=True, causal=True, deterministic=deterministic))


def _varlen(lens_q, lens_k, H, Hkv, D, dtype):
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = randn(int(cu_q[-1]), H, D, dtype=dtype)
    k, v = randn(int(cu_k[-1]), Hkv, D, dtype=dtype), randn(int(cu_k[-1]), Hkv, D, dtype=dtype)
    return q, k, v, dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))


@pytest.mark.parametrize("causal,dtype", [(True, torch.float16), (False, torch.float32),
                                          pytest.param(False, torch.float16, marks=pytest.mark.slow),
                                          pytest.param(True, torch.float32, marks=pytest.mark.slow)],
                         ids=["causal-fp16", "full-fp32", "full-fp16", "causal-fp32"])
def test_varlen(causal, dtype):
    """Packed batch with an empty query sequence, a length-1 one, an empty key sequence, Sq != Sk."""
    q, k, v, cu = _varlen([0, 1, 17, 5, 3], [3, 1, 20, 5, 0], 4, 2, 16, dtype)
    res = run_all(q, k, v, causal=causal, **cu)
    assert_close_rule(res)
    assert torch.all(res["ours"][0][-3:] == 0)  # the last sequence has no keys


def test_varlen_features():
    q, k, v, cu = _varlen([7, 18, 1], [9, 18, 4], 2, 2, 32, torch.float16)
    kw = dict(window=(4, -1), causal=True, alibi_slopes=torch.rand(3, 2), dropout_p=0.3, seed=5, softcap=4.0)
    assert_close_rule(run_all(q, k, v, **cu, **kw))


@pytest.mark.parametrize("fwd_cfg,bwd_cfg,deterministic", [
    (FwdConfig(block_m=32, block_n=16), BwdConfig(block_m=16, block_n=32), True),
    (FwdConfig(block_m=16, block_n=32, tma=True), BwdConfig(block_m=32, block_n=16), True),
    (FwdConfig(block_m=16, block_n=16), BwdConfig(block_m=16, block_n=32, d_split=2), False),
    (FwdConfig(block_m=16, block_n=16), BwdConfig(block_m=32, block_n=16, d_split=2), True),
], ids=["bm32_bn16", "bm16_bn32_tma", "dsplit2_atomic_dq", "dsplit2_deterministic"])
def test_block_configs(fwd_cfg, bwd_cfg, deterministic):
    """Unequal block sizes (band edges that cut blocks differently), the TMA path (descriptors are
    emulated by the interpreter) with a padded head dim and rows past the end of the sequence, and the
    dK/dV kernel split over the head dim (d_split=2: slices 0-31 and 32-63 of the padded 64, the second
    one ragged at D = 40), with dQ from its atomics or from the deterministic kernel."""
    B, Sq, Sk, H, Hkv, D = 1, 37, 50, 2, 1, 40
    dtype = torch.float32
    q, k, v = (torch.randn(B, S, h, D, dtype=dtype) for S, h in ((Sq, H), (Sk, Hkv), (Sk, Hkv)))
    kw = dict(softmax_scale=D ** -0.5, window=(11, 0), softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=0)
    out, lse = torch.empty_like(q), torch.empty(B, H, Sq)
    attention_fwd(q, k, v, out, lse, config=fwd_cfg, **kw)
    do = torch.randn_like(q)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    attention_bwd(do, q, k, v, out, lse, dq, dk, dv, config=bwd_cfg, dq_config=fwd_cfg, deterministic=deterministic,
                  **kw)
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    ref = attention_ref(qd, kd, vd, causal=True, window=(11, -1), softmax_scale=D ** -0.5)
    grads = torch.autograd.grad(ref, (qd, kd, vd), do.double())
    for a, b in zip((out, dq, dk, dv), (ref, *grads)):
        # float32 kernels vs the float64 oracle: a few float32 roundings of the largest term
        assert (a.double() - b).abs().max() <= 64 * torch.finfo(torch.float32).eps * b.abs().max()


def test_deterministic_is_bitwise_reproducible():
    q, k, v = (randn(1, 33, 2, 16, dtype=torch.float16) for _ in range(3))
    do = torch.randn_like(q)
    runs = []
    for _ in range(2):
        out = attention(q, k, v, causal=True, deterministic=True, impl="triton")
        runs.append(torch.autograd.grad(out, (q, k, v), do))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_dropout_seed_controls_the_mask():
    q, k, v = (randn(1, 16, 2, 16, dtype=torch.float32, grad=False) for _ in range(3))
    a = attention(q, k, v, dropout_p=0.5, seed=1, impl="triton")
    b = attention(q, k, v, dropout_p=0.5, seed=1, impl="triton")
    c = attention(q, k, v, dropout_p=0.5, seed=2, impl="triton")
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(3)
    d = attention(q, k, v, dropout_p=0.5, impl="reference")
    torch.manual_seed(3)
    e = attention(q, k, v, dropout_p=0.5, impl="triton")  # seed=None: drawn from torch's generator
    assert (d - e).abs().max() <= 16 * torch.finfo(torch.float32).eps * d.abs().max()


def test_reference_path_matches_kernel_path():
    """impl="auto" on CPU is the reference; it computes the same function as the kernels."""
    q, k, v = (randn(2, 9, 2, 8, dtype=torch.float32) for _ in range(3))
    a = attention(q, k, v, causal=True, window=(3, -1), softcap=1.5)
    b = attention(q, k, v, causal=True, window=(3, -1), softcap=1.5, impl="triton")
    assert (a - b).abs().max() <= 16 * torch.finfo(torch.float32).eps * a.abs().max()
    ga = torch.autograd.grad(a.sum(), (q, k, v))
    gb = torch.autograd.grad(b.sum(), (q, k, v))
    for x, y in zip(ga, gb):
        assert (x - y).abs().max() <= 64 * torch.finfo(torch.float32).eps * x.abs().max()


def test_noncontiguous_inputs():
    """Strided q/k/v (a KV-cache slice, a transposed projection) go to the kernels without copies."""
    base = torch.randn(1, 24, 3, 2, 16)
    q = base[:, :, 0]  # (1, 24, 2, 16) with a stride-3 head axis
    cache = torch.randn(1, 40, 2, 16)
    k, v = cache[:, :21], cache.flip(1)[:, :21].contiguous()
    out = attention(q, k, v, causal=True, impl="triton")
    ref = attention_ref(q.double(), k.double(), v.double(), causal=True)
    assert (out.double() - ref).abs().max() <= 16 * torch.finfo(torch.float32).eps * ref.abs().max()


def test_float64_runs_on_the_reference():
    q, k, v = (torch.randn(1, 5, 2, 8, dtype=torch.float64) for _ in range(3))
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    ref, ref_lse = attention_ref(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse.float())


@pytest.mark.parametrize("kw", [
    dict(causal=True, softcap=2.0, alibi_slopes=torch.rand(2) * 0.5, dropout_p=0.3, seed=11),
    dict(window=(3, 2), cu_seqlens_q=torch.tensor([0, 0, 6, 7], dtype=torch.int32),
         cu_seqlens_k=torch.tensor([0, 4, 13, 13], dtype=torch.int32), max_seqlen_q=6, max_seqlen_k=9),
], ids=["dense_features", "varlen_window"])
def test_reference_backward_is_autograd(kw):
    """The explicit FA2 backward of the reference (the CPU backward) equals autograd through the reference."""
    varlen = "cu_seqlens_q" in kw
    qs, ks = ((7, 2, 8), (13, 1, 8)) if varlen else ((2, 6, 2, 8), (2, 9, 1, 8))
    q = torch.randn(*qs, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(*ks, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out, lse = attention_ref(q, k, v, return_lse=True, **kw)
    do, dl = torch.randn_like(out), torch.randn_like(lse)
    auto = torch.autograd.grad((out, lse), (q, k, v), (do, dl))
    ours = attention_bwd_ref(do, q, k, v, out.detach(), lse.detach(), dlse=dl, **kw)
    for a, b in zip(ours, auto):
        assert (a - b).abs().max() <= 64 * torch.finfo(torch.float64).eps * b.abs().max()


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 9000])
def test_scale_cast_matches_torchs_two_ops(n):
    """The Hopper backward's dQ epilogue (kernels.attention_bwd.scale_cast): (x * scale).to(dtype) in one kernel,
    bitwise torch's two ops (float32 product, round to nearest even), ragged last block, empty input."""
    from flashscale.kernels.attention_bwd import scale_cast

    x = randn(n, dtype=torch.float32) * 300  # products past fp16's normal range round as torch rounds them
    got = scale_cast(x, 128 ** -0.5, torch.float16)
    assert got.dtype == torch.float16 and got.shape == x.shape
    assert torch.equal(got, (x * 128 ** -0.5).to(torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        scale_cast(torch.zeros(4, 4).t(), 1.0, torch.float16)


@pytest.mark.parametrize("with_dlse", [False, True])
def test_bwd_delta_is_rowsum_of_do_times_o(with_dlse):
    """The backward's pre-pass (kernels.attention_bwd.bwd_delta, FA2's and the Hopper backward's): rowsum(dO * O)
    - dLSE in float32 like lse, dense and packed varlen (against the same sums in float32 PyTorch), with a ragged
    tail (Sq = 37, 16- and 64-row blocks) and an empty sequence."""
    from flashscale.kernels.attention_bwd import bwd_delta

    B, S, H, D = 2, 37, 3, 40
    o, do = randn(B, S, H, D, dtype=torch.float16), randn(B, S, H, D, dtype=torch.float16)
    lse = torch.randn(B, H, S)
    dlse = torch.randn(B, H, S) if with_dlse else None
    got = bwd_delta(o, do, lse, dlse)
    want = torch.einsum("bshd,bshd->bhs", do.float(), o.float()) - (dlse if with_dlse else 0)
    assert got.dtype == torch.float32 and got.shape == lse.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    cu = torch.tensor([0, 5, 5, 37], dtype=torch.int32)  # lengths 5, 0, 32
    ov, dov = o[0], do[0]  # (T, H, D) packed
    lse_v = torch.randn(H, S)
    dlse_v = torch.randn(H, S) if with_dlse else None
    got_v = bwd_delta(ov, dov, lse_v, dlse_v, cu_seqlens_q=cu, max_seqlen_q=32)
    want_v = (do[0].float() * o[0].float()).sum(-1).T - (dlse_v if with_dlse else 0)
    torch.testing.assert_close(got_v, want_v, rtol=1e-5, atol=1e-5)
