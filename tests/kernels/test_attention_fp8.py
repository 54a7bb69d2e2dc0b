"""FP8 attention on CPU: the kernel (interpreter) against the emulation, the emulation against float64
within an analytic bound, the API's errors, and the training recipe's gradients."""

from __future__ import annotations

import math

import pytest
import torch

from flashscale.kernels.attention_fp8 import Fp8Config
from flashscale.ops import attention, attention_fp8, attention_fp8_quantized, quantize_fp8
from flashscale.reference.attention import attention_ref
from flashscale.reference.attention_fp8 import attention_fp8_ref, hadamard_ref, random_signs

TILE = Fp8Config(block_m=16, block_n=16, num_warps=4, num_stages=1)


# (B, Sq, Sk, H, Hkv, D): ragged tails, GQA/MQA, Sq != Sk both ways (causal rows with no key at all)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 33, 40, 2, 1, 16), (2, 40, 33, 4, 2, 32), (1, 20, 37, 2, 2, 16)],
                         ids=lambda s: "x".join(map(str, s)))
def test_kernel_matches_emulation(shape, causal):
    B, Sq, Sk, H, Hkv, D = shape
    q = torch.randn(B, Sq, H, D, dtype=torch.float16)
    k, v = (torch.randn(B, Sk, Hkv, D, dtype=torch.float16) for _ in range(2))
    x = quantize_fp8(q, k, v, block_m=32, block_n=32, impl="triton")
    args = (x.q8, x.k8, x.v8, x.q_descale, x.k_descale, x.v_descale)
    kw = dict(causal=causal, block_m=32, block_n=32, out_dtype=torch.float32, return_lse=True, config=TILE)
    out, lse = attention_fp8_quantized(*args, impl="triton", **kw)
    ref, ref_lse = attention_fp8_quantized(*args, impl="emulation", **kw)
    # same roundings, same tile order: only fp32 summation order differs
    assert torch.allclose(out, ref, rtol=0, atol=1e-5 * ref.abs().max())
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse)) and torch.allclose(lse[fin], ref_lse[fin], atol=1e-5)
    if causal and Sq > Sk:  # rows before the diagonal see nothing: zeros, never NaN
        assert torch.all(out[:, :Sq - Sk] == 0)


@pytest.mark.parametrize("impl", ["triton", "emulation"])
def test_v_keys_permuted_round_trip(impl):
    """quantize_fp8(..., v_key_perm=True): V^T's keys permuted within 32-key groups (the Gluon kernel's v_perm order,
    whole groups, zero padding), bitwise the natural layout permuted (the Triton pre-pass writes it, the reference
    permutes after); attention_fp8_quantized(..., v_key_perm=True) restores the order for the Triton kernel and the
    emulation: the same output as the natural tensors'."""
    from flashscale.reference.attention_fp8 import permute_v_keys, unpermute_v_keys, v_key_of_slot

    B, S, H, Hkv, D = 2, 45, 4, 2, 16  # 45 keys: one whole 32-key group and a ragged one
    q = torch.randn(B, S, H, D, dtype=torch.float16)
    k, v = (torch.randn(B, S, Hkv, D, dtype=torch.float16) for _ in range(2))
    xn = quantize_fp8(q, k, v, block_m=16, block_n=16, impl=impl)
    xp = quantize_fp8(q, k, v, block_m=16, block_n=16, impl=impl, v_key_perm=True)
    assert xp.v_key_perm and not xn.v_key_perm and xp.v8.shape[-1] == 64 and xn.v8.shape[-1] == 48
    assert torch.equal(xp.v8.view(torch.uint8), permute_v_keys(xn.v8, S).view(torch.uint8))
    assert any(v_key_of_slot(j) != j for j in range(32))  # a real permutation, so the test can fail
    assert not torch.equal(xp.v8[..., :S].view(torch.uint8), xn.v8[..., :S].view(torch.uint8))
    assert torch.equal(unpermute_v_keys(xp.v8, S).view(torch.uint8), xn.v8.view(torch.uint8))
    kw = dict(causal=True, block_m=16, block_n=16, out_dtype=torch.float32, impl=impl,
              config=TILE if impl == "triton" else None)
    assert torch.equal(attention_fp8_quantized(*xp.args(), v_key_perm=True, **kw),
                       attention_fp8_quantized(*xn.args(), **kw))
    with pytest.raises(ValueError, match="whole 32-key groups"):
        attention_fp8_quantized(*xp.args()[:2], xp.v8[..., :48], *xp.args()[3:], v_key_perm=True, **kw)
    with pytest.raises(TypeError, match="v_key_perm must be a bool"):
        quantize_fp8(q, k, v, v_key_perm=1)


def _bound(q, k, v, scale):
    """Worst-case error of the FP8 forward, from e4m3's relative step u = 2^-4 (round to nearest, 3
    mantissa bits) on q, k, v and P: a score moves by at most eps = scale * (2u + u^2) * sum|q_i k_i|,
    so every softmax weight by a factor within e^(+-2 eps); V and P roundings add u * max|v| each; the
    bf16 output adds 2^-9 relative. Subnormal terms are far below these for N(0, 1) inputs."""
    u = 2.0 ** -4
    qd, kd, vd = (t.double() for t in (q, k, v))
    kd = kd.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    eps = scale * (2 * u + u * u) * torch.einsum("bqhd,bkhd->bhqk", qd.abs(), kd.abs()).amax()
    vmax = vd.abs().max()
    return ((math.exp(2 * eps) - 1) + 2 * u) * vmax + 2.0 ** -9 * vmax


@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
@pytest.mark.parametrize("block_quant", [False, True], ids=["tensor", "block"])
def test_emulation_within_analytic_bound(hadamard, block_quant):
    q, k, v = torch.randn(1, 64, 2, 32), torch.randn(1, 80, 1, 32), torch.randn(1, 80, 1, 32)
    out = attention_fp8_ref(q, k, v, causal=True, hadamard=hadamard, block_quant=block_quant, block_m=32,
                            block_n=32, out_dtype=torch.float32)
    ref = attention_ref(q.double(), k.double(), v.double(), causal=True)
    err = (out.double() - ref).abs()
    assert err.max() <= _bound(q, k, v, 32 ** -0.5)
    # and the typical error is FP8's, not exact: between 1e-3 and 0.1 of the outputs' RMS
    rel = err.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
    assert 1e-3 < rel < 0.1


def test_hadamard_leaves_exact_attention_unchanged():
    q, k, v = (torch.randn(1, 20, 2, 64, dtype=torch.float64) for _ in range(3))
    s = random_signs(64, 11).double()
    a = attention_ref(q, k, v, causal=True)
    b = attention_ref(hadamard_ref(q, s), hadamard_ref(k, s), v, causal=True)
    assert torch.allclose(a, b, atol=1e-12)


def test_api_emulation_and_fp8_flag():
    q, k, v = (torch.randn(1, 24, 2, 16, dtype=torch.bfloat16) for _ in range(3))
    out = attention_fp8(q, k, v, causal=True, seed=3)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert torch.equal(out, attention_fp8(q, k, v, causal=True, seed=3))  # deterministic
    assert torch.equal(attention(q, k, v, causal=True, fp8=True), attention_fp8(q, k, v, causal=True))
    assert not torch.equal(out, attention(q, k, v, causal=True))  # it really is the FP8 path


def _bad(fn, exc, *words):
    with pytest.raises(exc) as e:
        fn()
    for w in words:
        assert w in str(e.value), str(e.value)


def test_api_errors():
    q, k, v = (torch.randn(1, 8, 2, 16, dtype=torch.bfloat16) for _ in range(3))
    _bad(lambda: attention_fp8(q.double(), k, v), TypeError, "q.dtype")
    _bad(lambda: attention_fp8(q[0], k, v), ValueError, "q must be 4-D")
    _bad(lambda: attention_fp8(q, k[..., :8], v), ValueError, "k must be")
    _bad(lambda: attention_fp8(*(torch.randn(1, 8, 2, 48) for _ in range(3))), ValueError, "head_dim", "48")
    _bad(lambda: attention_fp8(torch.randn(1, 8, 3, 16), torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)),
         ValueError, "multiple of k/v's heads")
    _bad(lambda: attention_fp8(q, k, v, softmax_scale=-1.0), ValueError, "softmax_scale")
    _bad(lambda: attention_fp8(q, k, v, causal=1), TypeError, "causal")
    _bad(lambda: attention_fp8(q, k, v, hadamard="yes"), TypeError, "hadamard")
    _bad(lambda: attention_fp8(q, k, v, seed=-1), ValueError, "seed")
    _bad(lambda: attention_fp8(q, k, v, impl="cuda"), ValueError, "impl")
    _bad(lambda: attention_fp8(q, k, v, impl="fa3"), ValueError, "impl='fa3' cannot take", "Hopper GPU")
    _bad(lambda: quantize_fp8(q, k, v, block_m=48), ValueError, "block_m", "48")
    _bad(lambda: attention(q, k, v, fp8=True, window=(4, 0)), ValueError, "window")
    x = quantize_fp8(q, k, v, block_m=16, block_n=16)
    good = (x.q8, x.k8, x.v8, x.q_descale, x.k_descale, x.v_descale)
    kw = dict(block_m=16, block_n=16)
    attention_fp8_quantized(*good, **kw)  # the good call works
    _bad(lambda: attention_fp8_quantized(q, *good[1:], **kw), TypeError, "q8.dtype", "float8_e4m3fn")
    _bad(lambda: attention_fp8_quantized(*good[:2], x.k8, *good[3:], **kw), ValueError, "v8 must be transposed")
    _bad(lambda: attention_fp8_quantized(*good[:3], x.q_descale[..., :0], *good[4:], **kw), ValueError, "q_descale")
    _bad(lambda: attention_fp8_quantized(*good[:4], x.k_descale.double(), good[5], **kw), TypeError, "k_descale")
    _bad(lambda: attention_fp8_quantized(*good[:5], torch.cat([x.v_descale] * 2, -1), **kw), ValueError,
         "v_descale", "one scale per block")


def test_training_recipe_gradients():
    """FP8 forward, bf16 backward recomputed from the saved inputs: for the same dO the gradients are
    the bf16 path's, hence within the bf16 path's own error against float64 (here: identical)."""
    B, S, H, Hkv, D = 1, 24, 4, 2, 16
    q = torch.randn(B, S, H, D).bfloat16()
    k, v = (torch.randn(B, S, Hkv, D).bfloat16() for _ in range(2))
    w = torch.randn(B, S, H, D, dtype=torch.float64)  # a linear loss: dO = w for every path

    def grads(fn, dtype):
        ts = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = fn(*ts)
        return out, torch.autograd.grad((out.double() * w).sum(), ts)

    out8, g8 = grads(lambda a, b, c: attention_fp8(a, b, c, causal=True), torch.bfloat16)
    out16, g16 = grads(lambda a, b, c: attention(a, b, c, causal=True), torch.bfloat16)
    out64, g64 = grads(lambda a, b, c: attention_ref(a, b, c, causal=True), torch.float64)
    assert not torch.equal(out8, out16)  # the forward is the FP8 one
    for a, b, ref in zip(g8, g16, g64):
        e_recipe = (a.double() - ref).abs().max()
        e_bf16 = (b.double() - ref).abs().max()
        assert e_recipe <= e_bf16 + 1e-12


def test_quantization_blocks_follow_the_gluon_kernel_only_on_hopper(monkeypatch):
    """attention_fp8 quantizes K/V in the blocks the Gluon kernel's default config reads (D 128: 256 rows, V^T's
    keys permuted) only where that kernel runs (sm_90); elsewhere the 128-row default in natural order."""
    import importlib

    from flashscale.kernels import attention_fa3_fp8 as fa3
    from flashscale.kernels import attention_tune

    mod = importlib.import_module("flashscale.ops.attention_fp8")  # the module (the package exports the function)

    q = torch.zeros(1, 8, 2, 128)
    monkeypatch.setattr(mod, "_use_kernel", lambda t, impl: True)
    assert mod._kernel_layout(q, False, "auto") == (128, False)  # a CPU tensor: no sm_90
    monkeypatch.setattr(attention_tune, "capability", lambda device: (9, 0))
    expected = (256, True) if fa3.HAS_GLUON else (128, False)
    assert mod._kernel_layout(q, False, "auto") == mod._kernel_layout(q, True, "auto") == expected
    assert mod._kernel_layout(q[..., :64], False, "auto") == (128, False)  # D 64's default: 128-key tiles
    assert mod._kernel_layout(q, False, "triton") == (128, False)  # impl="triton": the Triton FP8 kernel
