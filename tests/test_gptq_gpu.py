"""GPTQ on a GPU: the column loop replayed from CUDA graphs (gptq._ColumnGraphs) gives the eager loop's
results bit for bit, and the Hessian of bf16 activations on TF32 tensor cores equals the float32 GEMM's."""

import pytest
import torch

from flashscale.quant.gptq import HessianAccumulator, gptq_quantize

pytestmark = pytest.mark.gpu


def _inputs(t, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mix = torch.randn(k, k, device="cuda", generator=g) / k ** 0.5
    return torch.randn(t, k, device="cuda", generator=g) @ mix + 0.1 * torch.randn(t, k, device="cuda", generator=g)


@pytest.mark.parametrize("k, group, act_order, static, grid", [
    (512, -1, False, False, "hessian"), (512, 128, False, False, "hessian"), (512, 64, True, False, "hessian"),
    (384, 32, False, False, "minmax"), (320, 64, False, False, "mse"),  # 320: a partial last lazy block
    (512, 256, False, False, "minmax"), (512, 64, True, True, "hessian")])  # static groups: eager path
def test_column_graphs_are_the_eager_loop(monkeypatch, k, group, act_order, static, grid):
    x = _inputs(4096, k)
    acc = HessianAccumulator(k, device="cuda")
    acc.add_batch(x)
    w = torch.randn(96, k, device="cuda") * 0.02
    kw = dict(bits=4, group_size=group, sym=False, act_order=act_order, static_groups=static, grid_search=grid)
    monkeypatch.setenv("FLASHSCALE_GPTQ_GRAPHS", "1")
    a = gptq_quantize(w, acc.H, **kw)
    a2 = gptq_quantize(w, acc.H, **kw)  # the graphs built by the first call, replayed
    monkeypatch.setenv("FLASHSCALE_GPTQ_GRAPHS", "0")
    b = gptq_quantize(w, acc.H, **kw)
    for r in (a, a2):
        assert torch.equal(r.qweight.codes, b.qweight.codes)
        assert torch.equal(r.qweight.scales, b.qweight.scales) and torch.equal(r.qweight.zeros, b.qweight.zeros)
        assert r.loss == b.loss


def test_bf16_hessian_on_tf32_is_the_float32_gemm():
    x = _inputs(8192, 256).bfloat16()
    acc = HessianAccumulator(256, device="cuda")
    acc.add_batch(x)
    ref = 2.0 / 8192 * (x.double().t() @ x.double())
    assert torch.get_float32_matmul_precision() == "highest"  # restored after the TF32 GEMM
    err = (acc.H.double() - ref).abs().max() / ref.abs().max()
    assert err < 1e-6, err  # float32 sums of exact products (TF32 holds bf16's 8 bits)
