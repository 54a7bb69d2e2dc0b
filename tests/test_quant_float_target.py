"""GPTQ aimed at the float model's outputs (QuantizeConfig.float_target, gptq_quantize's shift): the
cross-term accumulation, the closed form W* = W + W R (H + λI)⁻¹, that GPTQ on W* minimizes the
asymmetric objective, and the runner's float stream (CPU, tiny shapes)."""

import pytest
import torch

from flashscale.models import Llama, preset
from flashscale.quant.api import quantize_model
from flashscale.quant.gptq import HessianAccumulator, gptq_quantize, target_weight
from flashscale.quant.rtn import quantize_rtn


def _correlated(t, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=g) / k ** 0.5 + torch.eye(k)
    return torch.randn(t, k, generator=g) @ mix  # (T, K)


def test_cross_accumulator_is_the_running_mean_of_the_difference():
    xf = _correlated(300, 24)
    x = xf + 0.1 * torch.randn(300, 24)
    w = torch.rand(300)
    acc = HessianAccumulator(24, cross=True)
    for a, b, c in zip(x.split(70), xf.split(70), w.split(70)):  # uneven last batch
        acc.add_batch(a, c, x_float=b)
    torch.testing.assert_close(acc.H, 2 * (x * w[:, None]).T @ x / 300, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(acc.R, 2 * (xf - x).T @ (x * w[:, None]) / 300, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="x_float is given exactly when"):
        acc.add_batch(x)
    with pytest.raises(ValueError, match="x_float is given exactly when"):
        HessianAccumulator(24).add_batch(x, x_float=xf)
    with pytest.raises(ValueError, match="does not match x"):
        acc.add_batch(x, x_float=xf[:, :5])


def test_target_weight_is_the_ridge_least_squares_solution():
    t, k, n = 500, 32, 12
    xf = _correlated(t, k, seed=1)
    x = xf + 0.2 * _correlated(t, k, seed=2)
    w = torch.randn(n, k, dtype=torch.float64)
    acc = HessianAccumulator(k, cross=True)
    acc.add_batch(x, x_float=xf)
    H, R = acc.H.double(), acc.R.double()
    damp = 0.01
    lam = damp * float(H.diag().mean())
    got = target_weight(w, H, R, percdamp=damp, name="t")
    # argmin over W' of 2/T Σ ||W' x - W x_f||² + λ ||W' - W||², by the normal equations
    X, XF = x.double(), xf.double()
    A = 2 * X.T @ X / t + lam * torch.eye(k, dtype=torch.float64)
    B = 2 * w @ XF.T @ X / t + lam * w
    # (H and R are sums in float32: ~1e-7 relative each, times the conditioning of H + λI)
    torch.testing.assert_close(got, torch.linalg.solve(A, B.T).T, rtol=1e-4, atol=1e-5)
    # the same float and quantized inputs: nothing to compensate, W* = W
    same = HessianAccumulator(k, cross=True)
    same.add_batch(xf, x_float=xf)
    assert torch.equal(same.R, torch.zeros_like(same.R))
    torch.testing.assert_close(target_weight(w.float(), same.H, same.R, percdamp=damp, name="t"), w.float())


def test_asymmetric_objective_splits_around_the_target():
    """Σ ||Q x - W x_f||² + λ||Q - W||² = ||(Q - W*) (H + λI)^½||² + a constant, for every Q: so GPTQ's
    damped objective on W* is the asymmetric one, exactly."""
    t, k, n = 400, 16, 6
    xf = _correlated(t, k, seed=3).double()
    x = xf + 0.3 * torch.randn(t, k, dtype=torch.float64)
    w = torch.randn(n, k, dtype=torch.float64)
    H = 2 * x.T @ x / t
    R = 2 * (xf - x).T @ x / t
    lam = 0.01 * float(H.diag().mean())
    ws = target_weight(w, H, R, percdamp=0.01, name="t")
    Hd = H + lam * torch.eye(k, dtype=torch.float64)

    def lhs(q):
        return float(2 * (x @ q.T - xf @ w.T).pow(2).sum() / t + lam * (q - w).pow(2).sum())

    def rhs(q):
        return float(((q - ws) @ Hd * (q - ws)).sum())

    consts = [lhs(q) - rhs(q) for q in (torch.randn(n, k, dtype=torch.float64) for _ in range(4))]
    assert max(consts) - min(consts) < 1e-9 * max(abs(c) for c in consts)


@pytest.mark.parametrize("group,act_order", [(-1, False), (32, False), (32, True)])
def test_float_target_compensates_upstream_error(group, act_order):
    """A linear whose inputs carry an upstream error (x = x_f + e): GPTQ with the shift gets far closer
    to the float output W x_f than plain GPTQ, which can only match W x."""
    t, k, n = 4096, 128, 48
    xf = _correlated(t, k, seed=4)
    mix = torch.eye(k) + 0.15 * torch.randn(k, k, generator=torch.Generator().manual_seed(5)) / k ** 0.5
    x = xf @ mix  # a systematic (linear) upstream error, as a quantized layer before this one makes
    w = torch.randn(n, k) * 0.05
    acc = HessianAccumulator(k, cross=True)
    acc.add_batch(x, x_float=xf)
    plain = gptq_quantize(w, acc.H, bits=4, group_size=group, sym=False, act_order=act_order)
    aimed = gptq_quantize(w, acc.H, bits=4, group_size=group, sym=False, act_order=act_order, shift=acc.R)
    rtn = quantize_rtn(w, bits=4, group_size=group, sym=False).dequantize()
    ref = xf @ w.T  # what the float model computes

    def err(q):
        return float((x @ q.T - ref).pow(2).mean())

    assert err(aimed.weight) < 0.5 * err(plain.weight) < 0.5 * err(rtn), \
        (err(aimed.weight), err(plain.weight), err(rtn))
    # the codes and grid still say exactly what the returned weight is
    assert torch.equal(aimed.weight, aimed.qweight.dequantize())


@torch.no_grad()
def test_runner_float_stream_and_resume(tmp_path):
    cfg = preset("tiny", intermediate_size=192, num_hidden_layers=3)
    calib = torch.randint(0, cfg.vocab_size, (6, 48), generator=torch.Generator().manual_seed(0))

    def model():
        return Llama(cfg).init_weights(seed=1).eval()

    ref = quantize_model(model(), "gptq", bits=3, group_size=32, calib_tokens=calib, device="cpu", float_target=True)
    plain = quantize_model(model(), "gptq", bits=3, group_size=32, calib_tokens=calib, device="cpu")
    # block 0 sees the float inputs either way: its q/k/v (the first group) are the same
    for name in ("layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj"):
        assert torch.equal(ref.records[name].codes, plain.records[name].codes)
    # later groups and blocks are aimed at the float outputs: they differ
    assert not torch.equal(ref.records["layers.2.mlp.down_proj"].codes, plain.records["layers.2.mlp.down_proj"].codes)

    # the float stream is a resume point too: a crash after block 1 and a restart give the same codes
    def crash(i, _s):
        if i == 1:
            raise RuntimeError("simulated crash")

    work = tmp_path / "work"
    with pytest.raises(RuntimeError, match="simulated crash"):
        quantize_model(model(), "gptq", bits=3, group_size=32, calib_tokens=calib, device="cpu", float_target=True,
                       work_dir=work, on_block_done=crash)
    res = quantize_model(model(), "gptq", bits=3, group_size=32, calib_tokens=calib, device="cpu", float_target=True,
                         work_dir=work)
    assert res.summary.resumed_blocks == 2
    for name, r in ref.records.items():
        assert torch.equal(res.records[name].codes, r.codes), name
        assert torch.equal(res.records[name].scales, r.scales), name
    with pytest.raises(ValueError, match="float_target=True is a GPTQ option"):
        quantize_model(model(), "awq", calib_tokens=calib, device="cpu", group_size=32, float_target=True)
