"""QuantLinear: construction from GPTQ / AWQ / float, state_dict round trip, the CPU path, dtype moves,
replace_linears on the foundation's Llama, and (GPU) a quantized Llama through the kernels."""

import pytest
import torch
from torch import nn

from flashscale.kernels.w4a16_pack import to_gptq
from flashscale.models.config import LlamaConfig
from flashscale.models.llama import Llama
from flashscale.quant.qlinear import QuantLinear, replace_linears
from flashscale.reference.w4a16 import dequantize_w4

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


def _linear(k, n, bias, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
    return lin


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("group_size", [32, -1])
def test_from_float_is_round_to_nearest(sym, group_size):
    lin = _linear(128, 48, bias=True)
    q = QuantLinear.from_float(lin, group_size=group_size, sym=sym)
    w = dequantize_w4(q.packed()).t()  # (N, K)
    g = 128 if group_size == -1 else group_size
    scales = q.scales.float().repeat_interleave(g, 0).t()  # (N, K)
    err = (w - lin.weight).abs()
    # the nearest grid point (the float16 rounding of the scale can push the end of the range a hair
    # past the last code) ...
    assert (err <= scales * (0.5 + 8 * 2.0**-11) + 1e-6).all()
    assert err.mean() < scales.mean() / 3  # ... not merely a bounded one
    x = torch.randn(3, 128)
    torch.testing.assert_close(q(x), nn.functional.linear(x, w, q.bias.float()), rtol=1e-5, atol=1e-5)


def test_state_dict_roundtrip_and_repack():
    q = QuantLinear.from_float(_linear(64, 32, bias=True), group_size=32, sym=False)
    sd = q.state_dict()
    assert set(sd) == {"qweight", "qzeros", "scales", "g_idx", "bias"}
    fresh = QuantLinear(64, 32, group_size=32, bias=True, checkpoint_format="gptq_v2")
    fresh.load_state_dict(sd)
    x = torch.randn(4, 64)
    assert torch.equal(fresh(x), q(x))  # the load hook repacked the kernel layout


def test_packed_is_one_object_until_the_buffers_change():
    """packed() hands out the same PackedW4 while pk_* are unchanged (the wgmma kernel keeps its TMA
    descriptors on it), and a fresh one after repack() or a load; never a stale one."""
    q = QuantLinear.from_float(_linear(64, 32, bias=False), group_size=32)
    p = q.packed()
    assert q.packed() is p and q.half().packed() is p  # int buffers: dtype moves keep them
    q.repack()
    p2 = q.packed()
    assert p2 is not p and p2.qweight is q.pk_qweight and torch.equal(p2.qweight, p.qweight)
    fresh = QuantLinear(64, 32, group_size=32, bias=False, checkpoint_format="gptq_v2")
    p3 = fresh.packed()
    fresh.load_state_dict(q.state_dict())
    assert fresh.packed() is not p3 and torch.equal(fresh.packed().qweight, p2.qweight)


def test_from_gptq_v1_and_awq_match_v2():
    torch.manual_seed(3)
    k, n, g = 64, 32, 16
    codes = torch.randint(0, 16, (k, n))
    zeros = torch.randint(1, 16, (k // g, n))
    scales = (torch.rand(k // g, n) * 0.02 + 0.001).half()
    gi = torch.arange(k) // g
    v2 = QuantLinear.from_gptq(**to_gptq(codes, zeros, scales, gi, checkpoint_format="gptq_v2"),
                               checkpoint_format="gptq_v2")
    v1 = QuantLinear.from_gptq(**to_gptq(codes, zeros, scales, gi, checkpoint_format="gptq"),
                               checkpoint_format="gptq")
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    qw = torch.zeros(k, n // 8, dtype=torch.int64)
    qz = torch.zeros(k // g, n // 8, dtype=torch.int64)
    for c in range(n // 8):
        for i in range(8):
            qw[:, c] |= codes[:, 8 * c + order[i]] << (4 * i)
            qz[:, c] |= zeros[:, 8 * c + order[i]] << (4 * i)
    wrap = lambda t: torch.where(t >= 2**31, t - 2**32, t).to(torch.int32)  # noqa: E731
    awq = QuantLinear.from_awq(qweight=wrap(qw), qzeros=wrap(qz), scales=scales)
    x = torch.randn(2, k)
    assert torch.equal(v1(x), v2(x)) and torch.equal(awq(x), v2(x))


def test_act_order_g_idx_and_dtype_moves():
    torch.manual_seed(4)
    k, n, g = 64, 16, 16
    codes = torch.randint(0, 16, (k, n))
    zeros = torch.full((k // g, n), 8)
    scales = (torch.rand(k // g, n) * 0.02 + 0.001).half()
    gi = (torch.arange(k) // g)[torch.randperm(k)]
    q = QuantLinear.from_gptq(**to_gptq(codes, zeros, scales, gi), checkpoint_format="gptq_v2")
    assert q.pk_perm is not None
    w = (codes.double() - 8) * scales.double()[gi]  # (K, N)
    x = torch.randn(3, k, dtype=torch.float64)
    torch.testing.assert_close(q(x), x @ w)
    before = q.scales.clone()
    q.to(torch.bfloat16)
    assert q.scales.dtype == torch.float16 and torch.equal(q.scales, before)  # never rounded by a dtype cast


def test_errors():
    with pytest.raises(NotImplementedError):
        QuantLinear(64, 32, bits=3)
    with pytest.raises(ValueError, match="group_size"):
        QuantLinear(64, 32, group_size=48)
    with pytest.raises(ValueError, match="multiples of 8"):
        QuantLinear(60, 32)
    with pytest.raises(TypeError, match="nn.Linear"):
        QuantLinear.from_float(nn.Conv1d(4, 4, 1))
    q = QuantLinear.from_float(_linear(64, 32, bias=False), group_size=32)
    with pytest.raises(ValueError, match="group_size"):
        QuantLinear.from_gptq(qweight=q.qweight, qzeros=q.qzeros, scales=q.scales, group_size=64)


def _tiny_llama(**kw):
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw)
    return Llama(cfg).init_weights(seed=0)


def _quantized_state(model, group_size=64, skip=("lm_head",)):
    state = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name not in skip:
            q = QuantLinear.from_float(mod, group_size=group_size, sym=False)
            state.update({f"model.{name}.{k}": v for k, v in q.state_dict().items() if k != "bias"})
    return state


def _dequantized_copy(model, qmodel):
    """The float model whose linears carry the quantized model's dequantized weights."""
    ref = _tiny_llama()
    ref.load_state_dict(model.state_dict())
    for name, mod in qmodel.named_modules():
        if isinstance(mod, QuantLinear):
            ref.get_submodule(name).weight.data.copy_(dequantize_w4(mod.packed()).t())
    return ref


def test_replace_linears_on_llama():
    model = _tiny_llama()
    state = _quantized_state(model)
    qmodel = _tiny_llama()
    names = replace_linears(qmodel, state, checkpoint_format="gptq_v2")
    assert len(names) == 2 * 7 and "layers.0.self_attn.q_proj" in names and "lm_head" not in names
    assert isinstance(qmodel.layers[1].mlp.down_proj, QuantLinear)
    ref = _dequantized_copy(model, qmodel)
    ids = torch.randint(0, 256, (2, 12))
    torch.testing.assert_close(qmodel(ids), ref(ids), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="does not"):
        replace_linears(_tiny_llama(), {"model.layers.9.mlp.up_proj.qweight": state["model.layers.0.mlp.up_proj.qweight"]})


def _sdpa(q, k, v, *, causal=False, softmax_scale=None):
    """(B, S, H, D) attention through torch SDPA (Sq == Sk here: top-left causal is bottom-right)."""
    o = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=causal, scale=softmax_scale, enable_gqa=True)
    return o.transpose(1, 2)


@pytest.mark.gpu
def test_gpu_quantized_llama_logits_match_dequantized_reference(monkeypatch):
    """Logits through the W4A16 kernels equal the dequantized-weights model (cuBLAS) within bf16 noise:
    the kernel's error against the float32 model is at most twice the bf16 reference's. Attention is torch
    SDPA in all three models, so only the linears differ."""
    import flashscale.models.llama as llama_mod

    monkeypatch.setattr(llama_mod, "attention", _sdpa)
    from flashscale.kernels.w4a16 import precompile, set_autotune

    set_autotune(False)  # one config a bucket: one compile each, done in parallel here
    precompile([dict(m=m, k=1024, n=1024, group_size=128, dtype="bfloat16", act_order=False, bias=False)
                for m in (1, 40)], all_candidates=False)
    torch.manual_seed(0)
    cfg = dict(vocab_size=1024, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
               num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
    model = Llama(LlamaConfig(**cfg)).init_weights(seed=0)
    state = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name != "lm_head":
            q = QuantLinear.from_float(mod, group_size=128, sym=False)
            state.update({f"{name}.{k}": v for k, v in q.state_dict().items()})
    qmodel = Llama(LlamaConfig(**cfg)).init_weights(seed=0)
    replace_linears(qmodel, state, checkpoint_format="gptq_v2")
    ref32 = Llama(LlamaConfig(**cfg)).init_weights(seed=0)
    for name, mod in qmodel.named_modules():
        if isinstance(mod, QuantLinear):
            ref32.get_submodule(name).weight.data.copy_(dequantize_w4(mod.packed()).t())
    ref32 = ref32.cuda().float()
    ref16 = Llama(LlamaConfig(**cfg)).cuda()
    ref16.load_state_dict(ref32.state_dict())
    ref16 = ref16.to(torch.bfloat16)
    qmodel = qmodel.cuda().to(torch.bfloat16)
    try:
        for m in (1, 40):  # decode-like (GEMV) and prefill-like (tensor cores)
            ids = torch.randint(0, 1024, (1, m), device="cuda")
            with torch.no_grad():
                want = ref32(ids)
                e16 = ((ref16(ids) - want).norm() / want.norm()).item()
                ek = ((qmodel(ids) - want).norm() / want.norm()).item()
            assert ek <= 2 * e16 + 1e-3, (m, ek, e16)
    finally:
        set_autotune(True)
