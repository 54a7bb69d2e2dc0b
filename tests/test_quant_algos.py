"""RTN, GPTQ and AWQ on single layers and a single block (CPU, small shapes)."""

import copy
import math

import pytest
import torch

from flashscale.models import Llama, preset
from flashscale.quant.awq import AWQConfig, awq_block, awq_scale_block, search_clip
from flashscale.quant.calibrate import rope_for
from flashscale.quant.gptq import HessianAccumulator, gptq_quantize
from flashscale.quant.rtn import dequantize, quantize_rtn


def _correlated_inputs(t: int, k: int, seed: int = 0) -> torch.Tensor:
    """(T, K) activations with strong cross-channel correlation and a few outlier channels, the
    structure of real LLM activations that GPTQ's error feedback exploits."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k // 8, k, generator=g)  # low-rank: channels are mixtures of k/8 factors
    x = torch.randn(t, k // 8, generator=g) @ mix / math.sqrt(k // 8) + 0.1 * torch.randn(t, k, generator=g)
    x[:, :3] *= 8.0
    return x


def _rtn_reference(w, bits, group, sym):
    """Group-by-group loop implementation of the grid, straight from its definition."""
    n, k = w.shape
    g = k if group == -1 else group
    maxq = 2 ** bits - 1
    out = torch.empty_like(w)
    for r in range(n):
        for j in range(0, k, g):
            v = w[r, j:j + g]
            lo, hi = min(float(v.min()), 0.0), max(float(v.max()), 0.0)
            if sym:
                hi = max(abs(lo), hi)
                lo = -hi if lo < 0 else lo
            s = (hi - lo) / maxq
            s = float(torch.tensor(s).half())  # scales are stored as fp16
            z = (maxq + 1) / 2 if sym else round(-lo / ((hi - lo) / maxq))
            q = torch.clamp(torch.round(v / s) + z, 0, maxq)
            out[r, j:j + g] = (q - z) * s
    return out


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group,sym", [(-1, True), (32, False), (16, True)])
def test_rtn_matches_its_definition(bits, group, sym):
    w = torch.randn(6, 64) * 0.05
    q = quantize_rtn(w, bits=bits, group_size=group, sym=sym)
    assert q.codes.dtype == torch.uint8 and int(q.codes.max()) < 2 ** bits
    assert q.scales.shape == q.zeros.shape == ((1 if group == -1 else 64 // group), 6)
    torch.testing.assert_close(q.dequantize(), _rtn_reference(w, bits, group, sym), rtol=0, atol=1e-7)
    assert torch.equal(q.scales, q.scales.half().float())
    if sym:
        assert bool((q.zeros == 2 ** (bits - 1)).all())


def test_rtn_bad_input_is_named():
    with pytest.raises(ValueError, match="bits=5 is not supported"):
        quantize_rtn(torch.randn(4, 64), bits=5, group_size=32, sym=True)
    with pytest.raises(ValueError, match="group_size=48 is not supported"):
        quantize_rtn(torch.randn(4, 64), bits=4, group_size=48, sym=True)
    with pytest.raises(ValueError, match="proj: group_size=64 does not divide its 96 input features"):
        quantize_rtn(torch.randn(4, 96), bits=4, group_size=64, sym=True, name="proj")
    w = torch.randn(4, 64)
    w[1, 3] = float("nan")
    with pytest.raises(ValueError, match="layers.3.mlp.up_proj: the weight holds 1 NaN/Inf"):
        quantize_rtn(w, bits=4, group_size=32, sym=True, name="layers.3.mlp.up_proj")


def test_hessian_accumulator_is_a_running_mean():
    x = torch.randn(3, 50, 16)
    acc = HessianAccumulator(16)
    lin = torch.nn.Linear(16, 4)
    h = acc.hook(lin)
    for part in x.split(1):
        lin(part)
    h.remove()
    flat = x.reshape(-1, 16)
    torch.testing.assert_close(acc.H, 2 * flat.T @ flat / flat.shape[0], rtol=1e-5, atol=1e-6)
    assert acc.nsamples == 150


@pytest.mark.parametrize("group,act_order,static", [(-1, False, False), (32, False, False), (32, True, False),
                                                    (32, True, True), (128, True, False)])
def test_gptq_beats_rtn_on_correlated_inputs(group, act_order, static):
    n, k = 64, 256
    x = _correlated_inputs(2048, k)
    w = torch.randn(n, k) * 0.05
    H = 2 * x.T @ x / x.shape[0]
    res = gptq_quantize(w, H, bits=4, group_size=group, sym=False, act_order=act_order, static_groups=static)
    rtn = quantize_rtn(w, bits=4, group_size=group, sym=False)
    err_gptq = (x @ (res.weight - w).T).pow(2).mean()
    err_rtn = (x @ (rtn.dequantize() - w).T).pow(2).mean()
    assert err_rtn / err_gptq >= 1.3, (float(err_rtn), float(err_gptq))
    # the returned weight is exactly what the codes and grid say
    q = res.qweight
    assert torch.equal(res.weight, dequantize(q.codes, q.scales, q.zeros, q.g_idx))
    g = k if group == -1 else group
    counts = torch.bincount(q.g_idx.long(), minlength=k // g)
    assert bool((counts == g).all())  # every group holds exactly G columns
    if static or not act_order:
        assert torch.equal(q.g_idx, (torch.arange(k) // g).to(torch.int32))
    elif group != -1:
        assert q.desc_act  # groups follow the Hessian order, not the column order
        # the first group holds the columns with the largest diag(H): the outlier channels among them
        assert set(range(3)) <= set(torch.nonzero(q.g_idx == 0).flatten().tolist())


def test_gptq_dead_inputs_and_dampening_retries():
    k = 64
    x = _correlated_inputs(512, k)
    x[:, 10] = 0  # a channel no token activates
    H = 2 * x.T @ x / x.shape[0]
    w = torch.randn(8, k)
    res = gptq_quantize(w, H, bits=4, group_size=32, sym=True)
    assert bool((res.weight[:, 10] == 0).all())  # dead columns are zeroed, as in the paper's code
    assert res.damp == 0.01

    # an indefinite H (eigenvalue -5% of the mean diagonal): 1% dampening fails, 10% factorizes
    q, _ = torch.linalg.qr(torch.randn(k, k, dtype=torch.float64))
    eig = torch.linspace(0.5, 2.0, k, dtype=torch.float64)
    eig[0] = -0.05 * float(eig.mean())
    H_bad = (q @ torch.diag(eig) @ q.T).float()
    res = gptq_quantize(w, H_bad, bits=4, group_size=32, sym=True, name="layers.7.self_attn.q_proj")
    assert res.damp == pytest.approx(0.1)

    eig[0] = -20.0 * float(eig.abs().mean())  # beyond any dampening
    with pytest.raises(ValueError, match=r"layers\.7\.self_attn\.q_proj: the Hessian is not positive definite"):
        gptq_quantize(w, (q @ torch.diag(eig) @ q.T).float(), bits=4, group_size=32, sym=True,
                      name="layers.7.self_attn.q_proj")
    H_nan = H.clone()
    H_nan[3, 3] = float("nan")
    with pytest.raises(ValueError, match="layers.2.mlp.down_proj: the Hessian holds NaN/Inf"):
        gptq_quantize(w, H_nan, bits=4, group_size=32, sym=True, name="layers.2.mlp.down_proj")


def test_gptq_v1_zeros_stay_positive():
    # all-positive rows would get zero point 0 on an asymmetric grid; v1 files cannot store that
    w = torch.rand(16, 64) + 0.1
    x = _correlated_inputs(256, 64)
    res = gptq_quantize(w, 2 * x.T @ x / 256, bits=4, group_size=32, sym=False, v1_zeros=True)
    assert int(res.qweight.zeros.min()) >= 1
    assert int(quantize_rtn(w, bits=4, group_size=32, sym=False).zeros.min()) == 0


def _outlier_block(kv_heads: int):
    cfg = preset("tiny", intermediate_size=192, num_key_value_heads=kv_heads)
    model = Llama(cfg).init_weights(seed=1).eval()
    block = model.layers[0]
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a few large norm weights: outlier activation channels, as in real LLMs
        block.input_layernorm.weight[torch.randperm(64, generator=g)[:4]] = 15.0
        block.post_attention_layernorm.weight[torch.randperm(64, generator=g)[:4]] = 15.0
    x = torch.randn(8, 64, 64, generator=g)  # (B, S, E)
    cos, sin = rope_for(model, 64, torch.float32, "cpu")
    return block, x, cos, sin


@pytest.mark.parametrize("kv_heads", [4, 2])
@torch.no_grad()
def test_awq_scales_leave_the_float_block_unchanged(kv_heads):
    block, x, cos, sin = _outlier_block(kv_heads)
    ref = block(x, cos, sin)
    scaled = copy.deepcopy(block)
    found = awq_scale_block(scaled, x, cos, sin, AWQConfig(bits=4, group_size=32))
    expected = {"input_layernorm", "post_attention_layernorm", "mlp.up_proj"}
    if kv_heads == 4:  # MHA: v's outputs feed o one to one; under GQA that group is skipped
        expected.add("self_attn.v_proj")
    assert set(found) == expected
    assert any(float(s.std()) > 0.05 for s in found.values())  # scales were found, not all ones
    assert not torch.equal(scaled.input_layernorm.weight, block.input_layernorm.weight)
    out = scaled(x, cos, sin)
    assert float((out - ref).abs().max() / ref.abs().max()) < 1e-6


@torch.no_grad()
def test_awq_beats_rtn_on_outlier_channels():
    block, x, cos, sin = _outlier_block(2)
    ref = block(x, cos, sin)
    awq = copy.deepcopy(block)
    records = awq_block(awq, x, cos, sin, AWQConfig(bits=4, group_size=32))
    assert len(records) == 7 and all(r.bits == 4 and not r.sym for r in records.values())
    rtn = copy.deepcopy(block)
    for mod in rtn.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.weight.copy_(quantize_rtn(mod.weight, bits=4, group_size=32, sym=False).dequantize())
    err_awq = float((awq(x, cos, sin) - ref).pow(2).mean())
    err_rtn = float((rtn(x, cos, sin) - ref).pow(2).mean())
    assert err_rtn / err_awq >= 1.5, (err_rtn, err_awq)


def test_awq_clip_never_worse_than_no_clip():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 64, generator=g) * 0.02
    w[:, 5] *= 30  # a heavy-tailed column: the grid wastes its range on it unless clipped
    x = torch.randn(300, 64, generator=g)
    cfg = AWQConfig(bits=4, group_size=32)
    lo, best = search_clip(w, x, cfg)  # (N, NG) each: AutoAWQ's ±max clip
    assert torch.equal(lo, -best)
    org = w.reshape(32, 2, 32).abs().amax(-1)
    assert best.shape == (32, 2) and bool((best <= org + 1e-7).all()) and bool((best < org).any())
    # "range": both ends of [min, max] shrunk by the same factor, never beyond the weights' own range
    lo, hi = search_clip(w, x, AWQConfig(bits=4, group_size=32, clip_mode="range"))
    wg = w.reshape(32, 2, 32)
    p_lo, p_hi = lo / wg.amin(-1), hi / wg.amax(-1)
    torch.testing.assert_close(p_lo, p_hi)
    assert bool((p_hi <= 1).all()) and bool((p_hi > 0.5).all()) and bool((p_hi < 1).any())


def test_gptq_sink_weight_adds_the_first_tokens_to_the_hessian(monkeypatch):
    """sink_weight=w: each window's first token counts w times in H (H_w - H_1 = (w - 1)·2·Σ x₀x₀ᵀ / T)."""
    import flashscale.quant.api as api

    block, x, cos, sin = _outlier_block(2)
    seen = {}

    def capture(w, H, **kw):
        seen.setdefault(kw["name"], []).append(H.clone())
        return gptq_quantize(w, H, **kw)

    monkeypatch.setattr(api, "gptq_quantize", capture)
    for weight in (1.0, 32.0):
        cfg = api.QuantizeConfig(method="gptq", group_size=32, sink_weight=weight)
        api.gptq_block_fn(cfg)(copy.deepcopy(block), x, cos, sin, "b")
    h = block.input_layernorm(x)  # (B, S, E): the q/k/v group's inputs
    extra = 31.0 * 2 * h[:, 0].T @ h[:, 0] / (x.shape[0] * x.shape[1])
    h1, h32 = seen["b.q_proj"]  # q_proj's uniform Hessian (k/v's is weighted by attention: test_quant_weighting)
    torch.testing.assert_close(h32 - h1, extra, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="sink_weight=0.5 must be a number >= 1"):
        api.QuantizeConfig(sink_weight=0.5)
    with pytest.raises(ValueError, match="sink_weight=2.0 is a GPTQ option"):
        api.QuantizeConfig(method="awq", sink_weight=2.0)


def _gptq_algorithm1(w, H, bits, group, sym, act_order, percdamp=0.01):
    """GPTQ as the paper's Algorithm 1 spells it, in float64 and without lazy batches: every column's
    error updates all later columns at once, so a group's grid (IST-DASLab's Quantizer: range holding
    0, asymmetric zero round(-min/s), fp16 scale) is fitted on fully updated columns. Returns the
    dequantized weight in the original column order."""
    n, k = w.shape
    maxq = 2 ** bits - 1
    W, H = w.double().clone(), H.double().clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = torch.argsort(torch.diag(H), descending=True, stable=True) if act_order else torch.arange(k)
    W, H = W[:, perm], H[perm][:, perm]
    H += percdamp * torch.diag(H).mean() * torch.eye(k, dtype=torch.float64)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)

    def fit(cols):
        lo = torch.clamp(cols.min(1).values, max=0.0)
        hi = torch.clamp(cols.max(1).values, min=0.0)
        if sym:
            hi = torch.maximum(lo.abs(), hi)
            lo = torch.where(lo < 0, -hi, lo)
        s = (hi - lo) / maxq
        z = torch.full_like(s, (maxq + 1) / 2) if sym else torch.round(-lo / s)
        return s.half().double(), z

    g = k if group == -1 else group
    Q = torch.empty_like(W)
    for i in range(k):
        if i % g == 0:
            s, z = fit(W[:, i:i + g])
        q = (torch.clamp(torch.round(W[:, i] / s) + z, 0, maxq) - z) * s
        Q[:, i] = q
        err = (W[:, i] - q) / U[i, i]
        W[:, i:] -= err[:, None] * U[i, i:][None, :]
    return Q[:, torch.argsort(perm)]


@pytest.mark.parametrize("group,act_order,sym", [(-1, False, False), (32, False, False), (32, True, False),
                                                 (64, True, True), (256, False, True)])
def test_gptq_is_the_papers_algorithm(group, act_order, sym):
    """Our lazy-batched float32 GPTQ against Algorithm 1 in float64: the same weights. A rounding that
    lands on the other side of a half-step (float32 vs float64) flips one code and, through the error
    feedback, the rest of its row, so a few rows may differ; nearly all must be equal to the bit."""
    n, k = 96, 256
    x = _correlated_inputs(1024, k, seed=3)
    x[:, 7] = 0.0  # a dead input column
    w = torch.randn(n, k) * 0.05
    H = 2 * x.T @ x / x.shape[0]
    ours = gptq_quantize(w, H, bits=4, group_size=group, sym=sym, act_order=act_order, block_size=32).weight
    ref = _gptq_algorithm1(w, H, bits=4, group=group, sym=sym, act_order=act_order).float()
    same_rows = (ours == ref).all(1).float().mean().item()
    assert same_rows >= 0.95, f"only {same_rows:.1%} of the rows match Algorithm 1"
    assert torch.all(ours[:, 7] == 0)


def test_awq_clip_both_is_the_better_of_max_and_range():
    from flashscale.quant.rtn import fake_quantize, grid

    g = torch.Generator().manual_seed(1)
    w = torch.randn(24, 64, generator=g) * 0.02 + 0.01  # off-centre rows: asymmetric grids
    w[:, 3] *= 25
    x = torch.randn(400, 64, generator=g)

    def err(lo, hi):  # (N, NG): each group's partial-output error, as search_clip scores it
        wg = w.reshape(24, 2, 32)
        cur = torch.maximum(torch.minimum(wg, hi[..., None]), lo[..., None])
        s, z = grid(cur, bits=3, sym=False)
        q = fake_quantize(cur, s[..., None], z[..., None], 3)
        xg = x.reshape(-1, 2, 32).transpose(0, 1)  # (NG, T, G)
        return (torch.bmm(xg, (q - wg).permute(1, 2, 0))).pow(2).mean(1).t()

    e = {m: err(*search_clip(w, x, AWQConfig(bits=3, group_size=32, clip_mode=m))) for m in ("max", "range", "both")}
    assert bool((e["both"] <= torch.minimum(e["max"], e["range"]) * (1 + 1e-5)).all())
    assert bool((e["range"] < e["max"]).any()) and bool((e["max"] < e["range"]).any())  # each wins somewhere
    with pytest.raises(ValueError, match="clip_mode='sym' takes one of"):
        AWQConfig(clip_mode="sym")


def test_awq_clip_gram_is_the_brute_force_search_over_tokens():
    """search_clip scores a clip by d_gᵀ H_g d_g (clip_gram): the same choice as computing every token's partial
    output error directly, over all tokens with clip_tokens=0 and over the evenly spaced sample otherwise."""
    from flashscale.quant.awq import clip_gram
    from flashscale.quant.rtn import fake_quantize, grid

    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 64, generator=g) * 0.02 + 0.005
    w[:, 7] *= 20
    x = torch.randn(2, 300, 64, generator=g)
    x[..., 7] *= 0.1  # the outlier weight meets a weak input: clipping it pays
    tw = torch.rand(2, 300, generator=g) + 0.5

    def brute(xs, m, cfg):  # (N, NG) lo/hi by an explicit loop over the candidates, every token's output error
        wg = w.reshape(16, 2, 32)
        best, lo_b, hi_b = None, None, None
        for i in range(int(cfg.max_shrink * cfg.clip_grid)):
            p = 1 - i / cfg.clip_grid
            hi = wg.abs().amax(-1) * p
            cur = torch.maximum(torch.minimum(wg, hi[..., None]), -hi[..., None])
            s, z = grid(cur, bits=cfg.bits, sym=False)
            d = (fake_quantize(cur, s[..., None], z[..., None], cfg.bits) - wg).double()  # (N, NG, G)
            per_tok = torch.einsum("tkg,nkg->tnk", xs.reshape(-1, 2, 32).double(), d).pow(2)  # (T, N, NG)
            err = (per_tok * m.reshape(-1, 1, 1).double()).mean(0)
            if best is None:
                best, lo_b, hi_b = err, -hi, hi
            else:
                better = err < best
                best, lo_b, hi_b = torch.where(better, err, best), torch.where(better, -hi, lo_b), torch.where(better, hi, hi_b)
        return lo_b, hi_b

    for tokens in (0, 100):
        cfg = AWQConfig(bits=3, group_size=32, clip_tokens=tokens)
        step = 1 if tokens == 0 else 600 // tokens
        lo, hi = search_clip(w, x, cfg, tw)
        want_lo, want_hi = brute(x.reshape(-1, 64)[::step], tw.reshape(-1)[::step], cfg)
        torch.testing.assert_close(hi, want_hi.float())
        torch.testing.assert_close(lo, want_lo.float())
    h = clip_gram(x, 32, 0, tw)
    xs = x.reshape(-1, 2, 32)
    torch.testing.assert_close(h, torch.einsum("tkg,tkh,t->kgh", xs, xs, tw.reshape(-1)) / 600, rtol=1e-5, atol=1e-6)
    assert not torch.equal(search_clip(w, x, AWQConfig(bits=3, group_size=32, clip_tokens=0))[1],
                           search_clip(w, x, AWQConfig(bits=3, group_size=32, clip_tokens=20))[1])
    lo, hi = search_clip(w, x, AWQConfig(bits=4, group_size=-1, clip_tokens=0))  # per-channel: one (K, K) Gram
    assert lo.shape == hi.shape == (16, 1) and bool((hi <= w.abs().amax(-1, keepdim=True)).all())
    with pytest.raises(ValueError, match="clip_tokens=-1 must be a positive int \\(or 0"):
        AWQConfig(clip_tokens=-1)
