"""The GPTQ and AWQ checkpoint formats against independent implementations written here from the
formats' definitions and transcribed from the reference code (AutoGPTQ's QuantLinear.pack and its
torch dequantizer, AutoAWQ's WQLinear_GEMM packing and its dequantize_gemm)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from flashscale.models import Llama, preset
from flashscale.quant.gptq import gptq_quantize
from flashscale.quant.io import load_quantized, read_quantized
from flashscale.quant.pack import pack_awq, pack_gptq, unpack_awq, unpack_gptq
from flashscale.quant.rtn import QuantizedWeight, quantize_rtn


# ----------------------------------------------------------------------- references, from definitions

def stream_pack(values: np.ndarray, bits: int) -> np.ndarray:
    """(L, C) values -> (L·bits/32, C) uint32: column c is a little-endian bit stream, value i at
    stream bits [bits·i, bits·i + bits). One bit at a time."""
    length, cols = values.shape
    words = np.zeros((length * bits // 32, cols), dtype=np.uint64)
    for c in range(cols):
        for i in range(length):
            for j in range(bits):
                if (int(values[i, c]) >> j) & 1:
                    p = bits * i + j
                    words[p // 32, c] |= np.uint64(1 << (p % 32))
    return words.astype(np.uint32)


def autogptq_pack(intweight: np.ndarray, zeros: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """AutoGPTQ's QuantLinear.pack loops: intweight (K, N) codes, zeros (NG, N) integer zero points
    -> qweight (K·b/32, N), qzeros (NG, N·b/32), uint32 (the v1 layout: zeros stored minus one)."""
    intweight = intweight.astype(np.uint32)
    qweight = np.zeros((intweight.shape[0] // 32 * bits, intweight.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < qweight.shape[0]:
        if bits in (2, 4, 8):
            for j in range(i, i + (32 // bits)):
                qweight[row] |= intweight[j] << (bits * (j - i))
            i += 32 // bits
            row += 1
        else:  # 3 bits
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i))
            i += 10
            qweight[row] |= intweight[i] << 30
            row += 1
            qweight[row] |= (intweight[i] >> 2) & 1
            i += 1
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i) + 1)
            i += 10
            qweight[row] |= intweight[i] << 31
            row += 1
            qweight[row] |= (intweight[i] >> 1) & 0x3
            i += 1
            for j in range(i, i + 10):
                qweight[row] |= intweight[j] << (3 * (j - i) + 2)
            i += 10
            row += 1
    zeros = (zeros - 1).astype(np.uint32)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 32 * bits), dtype=np.uint32)
    i = col = 0
    while col < qzeros.shape[1]:
        if bits in (2, 4, 8):
            for j in range(i, i + (32 // bits)):
                qzeros[:, col] |= zeros[:, j] << (bits * (j - i))
            i += 32 // bits
            col += 1
        else:
            for j in range(i, i + 10):
                qzeros[:, col] |= zeros[:, j] << (3 * (j - i))
            i += 10
            qzeros[:, col] |= zeros[:, i] << 30
            col += 1
            qzeros[:, col] |= (zeros[:, i] >> 2) & 1
            i += 1
            for j in range(i, i + 10):
                qzeros[:, col] |= zeros[:, j] << (3 * (j - i) + 1)
            i += 10
            qzeros[:, col] |= zeros[:, i] << 31
            col += 1
            qzeros[:, col] |= (zeros[:, i] >> 1) & 0x3
            i += 1
            for j in range(i, i + 10):
                qzeros[:, col] |= zeros[:, j] << (3 * (j - i) + 2)
            i += 10
            col += 1
    return qweight, qzeros


def autogptq_dequantize(qweight, qzeros, scales, g_idx, bits, v2=False):
    """AutoGPTQ's torch dequantizer (qlinear_cuda_old, bits 2/4/8), fp16 arithmetic -> (K, N) fp16.
    v2 (GPTQModel): the stored zero points are the zero points (no + 1)."""
    wf = torch.arange(0, 32, bits, dtype=torch.int32)[None]
    dt = torch.int16 if bits == 8 else torch.int8
    zeros = torch.bitwise_right_shift(qzeros[:, :, None].expand(-1, -1, 32 // bits), wf[None]).to(dt)
    if not v2:
        zeros = zeros + 1
    zeros = torch.bitwise_and(zeros, 2 ** bits - 1).reshape(scales.shape)
    weight = torch.bitwise_right_shift(qweight[:, None, :].expand(-1, 32 // bits, -1), wf[..., None]).to(dt)
    weight = torch.bitwise_and(weight, 2 ** bits - 1).reshape(-1, weight.shape[-1])  # (K, N)
    g = g_idx.long()
    return scales[g] * (weight - zeros[g]).half()


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def autoawq_pack(intweight: torch.Tensor, zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAWQ's WQLinear_GEMM.from_linear packing loops: intweight (K, N), zeros (NG, N), 4 bits."""
    def pack(v):
        out = torch.zeros((v.shape[0], v.shape[1] // 8), dtype=torch.int32)
        for col in range(v.shape[1] // 8):
            for i in range(8):
                out[:, col] |= v[:, col * 8 + AWQ_ORDER[i]].to(torch.int32) << (i * 4)
        return out
    return pack(intweight), pack(zeros)


def autoawq_dequantize(qweight, qzeros, scales, group_size):
    """AutoAWQ's dequantize_gemm (awq/utils/packing_utils.py) -> (K, N) fp16."""
    shifts = torch.arange(0, 32, 4)
    iweights = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8)
    iweights = iweights.view(iweights.shape[0], -1)
    izeros = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8)
    izeros = izeros.view(izeros.shape[0], -1)
    order = torch.arange(iweights.shape[-1]).view(-1, 8)[:, AWQ_REVERSE_ORDER].reshape(-1)
    iweights, izeros = iweights[:, order] & 0xF, izeros[:, order] & 0xF
    scales = scales.repeat_interleave(group_size, dim=0)
    izeros = izeros.repeat_interleave(group_size, dim=0)
    return (iweights - izeros) * scales


def _as_int32(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a.astype(np.uint32).view(np.int32).copy())


def _random_qweight(n, k, bits, group, *, sym=False, act_order=False, seed=0) -> QuantizedWeight:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    if not act_order:
        return quantize_rtn(w, bits=bits, group_size=group, sym=sym, v1_zeros=not sym)
    x = torch.randn(4 * k, k, generator=g) * torch.linspace(0.1, 3, k)[torch.randperm(k, generator=g)]
    return gptq_quantize(w, 2 * x.T @ x, bits=bits, group_size=group, sym=sym, act_order=True, v1_zeros=not sym).qweight


# ------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_gptq_packing_is_bit_exact(bits, fmt):
    qw = _random_qweight(64, 64, bits, 32, act_order=True, seed=bits)
    packed = pack_gptq(qw, checkpoint_format=fmt)
    codes = qw.codes.t().numpy()  # (K, N)
    zeros = qw.zeros.numpy() - (1 if fmt == "gptq" else 0)
    assert torch.equal(packed["qweight"], _as_int32(stream_pack(codes, bits)))
    assert torch.equal(packed["qzeros"], _as_int32(stream_pack(zeros.T, bits).T))
    if fmt == "gptq":  # ... and the same bytes as AutoGPTQ's own packing loops
        ref_w, ref_z = autogptq_pack(codes, qw.zeros.numpy(), bits)
        assert torch.equal(packed["qweight"], _as_int32(ref_w)) and torch.equal(packed["qzeros"], _as_int32(ref_z))
    assert packed["scales"].dtype == torch.float16 and packed["g_idx"].dtype == torch.int32
    back = unpack_gptq(packed, bits=bits, checkpoint_format=fmt, sym=False)
    assert torch.equal(back.codes, qw.codes) and torch.equal(back.zeros, qw.zeros)
    assert torch.equal(back.g_idx, qw.g_idx) and torch.equal(back.scales, qw.scales)
    assert back.group_size == 32 and back.desc_act


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("act_order,static", [(False, False), (True, False), (True, True)])
def test_gptq_dequantizes_like_the_reference(bits, fmt, act_order, static):
    """Our dequantized weights equal AutoGPTQ's/GPTQModel's to the bit, with act-order g_idx and static groups."""
    g = torch.Generator().manual_seed(1)
    k, n = 128, 32
    w = torch.randn(n, k, generator=g) * 0.05
    x = torch.randn(512, k, generator=g) * torch.linspace(0.1, 3, k)[torch.randperm(k, generator=g)]
    qw = gptq_quantize(w, 2 * x.T @ x / 512, bits=bits, group_size=32, sym=False, act_order=act_order,
                       static_groups=static, v1_zeros=True).qweight
    p = pack_gptq(qw, checkpoint_format=fmt)
    ref = autogptq_dequantize(p["qweight"], p["qzeros"], p["scales"], p["g_idx"], bits, v2=fmt == "gptq_v2")
    ours = unpack_gptq(p, bits=bits, checkpoint_format=fmt).dequantize().t().half()  # (K, N)
    assert torch.equal(ours.view(torch.int16), ref.view(torch.int16))
    assert torch.equal(qw.dequantize().t().half(), ref)


def test_awq_packing_and_dequantization_match_autoawq():
    qw = _random_qweight(64, 128, 4, 32, sym=False, seed=5)
    p = pack_awq(qw)
    assert p["qweight"].shape == (128, 8) and p["qzeros"].shape == (4, 8) and p["scales"].shape == (4, 64)
    ref_w, ref_z = autoawq_pack(qw.codes.t(), qw.zeros)
    assert torch.equal(p["qweight"], ref_w) and torch.equal(p["qzeros"], ref_z)
    # nibble j of a word holds column AWQ_ORDER[j], from the definition
    word = int(p["qweight"][3, 1]) & 0xFFFFFFFF
    assert [(word >> (4 * j)) & 0xF for j in range(8)] == [int(qw.codes[8 + AWQ_ORDER[j], 3]) for j in range(8)]
    ref = autoawq_dequantize(p["qweight"], p["qzeros"], p["scales"], 32)
    back = unpack_awq(p)
    assert torch.equal(back.codes, qw.codes) and torch.equal(back.zeros, qw.zeros)
    assert torch.equal(back.dequantize().t().half().view(torch.int16), ref.view(torch.int16))


def test_format_errors_are_clear():
    qw = quantize_rtn(torch.rand(16, 64) + 0.1, bits=4, group_size=32, sym=False)  # zero points of 0
    with pytest.raises(ValueError, match="proj: a zero point of 0 cannot be stored in the GPTQ v1 layout"):
        pack_gptq(qw, name="proj")
    pack_gptq(qw, checkpoint_format="gptq_v2")  # v2 stores it
    with pytest.raises(ValueError, match="AWQ GEMM format stores 4-bit weights only"):
        pack_awq(_random_qweight(16, 64, 3, 32))
    with pytest.raises(ValueError, match="act-order weights"):
        pack_awq(_random_qweight(16, 64, 4, 32, act_order=True))
    with pytest.raises(ValueError, match=r"odd: cannot pack 48 values of 3 bits: takes a multiple of 32"):
        pack_gptq(_random_qweight(32, 48, 3, 16), name="odd")
    with pytest.raises(ValueError, match="checkpoint_format='marlin'"):
        pack_gptq(qw, checkpoint_format="marlin")


@pytest.mark.parametrize("layout,bits", [("autogptq", 4), ("autogptq", 3), ("autoawq", 4)])
@torch.no_grad()
def test_a_checkpoint_laid_out_by_the_reference_loads_in_ours(tmp_path, layout, bits):
    """An AutoGPTQ-style directory (quantize_config.json only, gptq_model-*.safetensors, tensors packed by
    AutoGPTQ's loops) or an AutoAWQ-style one (quant_config.json, WQLinear_GEMM packing), fp16 everything
    else, loads, and computes with exactly its weights."""
    cfg = preset("tiny", intermediate_size=192)
    model = Llama(cfg).init_weights(seed=4).eval()
    tensors, expected = {}, {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            if layout == "autogptq":
                qw = quantize_rtn(mod.weight, bits=bits, group_size=32, sym=True)
                qweight, qzeros = autogptq_pack(qw.codes.t().numpy(), qw.zeros.numpy(), bits)
                packed = {"qweight": _as_int32(qweight), "qzeros": _as_int32(qzeros), "g_idx": qw.g_idx}
            else:
                qw = quantize_rtn(mod.weight, bits=4, group_size=32, sym=False)
                qweight, qzeros = autoawq_pack(qw.codes.t(), qw.zeros)
                packed = {"qweight": qweight, "qzeros": qzeros}
            packed["scales"] = qw.scales.half()
            tensors.update({f"model.{name}.{k}": v for k, v in packed.items()})
            expected[name] = qw.dequantize()
    for name, t in model.state_dict().items():
        if not any(name == f"{q}.weight" for q in expected):
            tensors[name if name == "lm_head.weight" else f"model.{name}"] = t.half()
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    if layout == "autogptq":
        save_file(tensors, str(tmp_path / f"gptq_model-{bits}bit-32g.safetensors"), metadata={"format": "pt"})
        (tmp_path / "quantize_config.json").write_text(json.dumps(
            {"bits": bits, "group_size": 32, "damp_percent": 0.01, "desc_act": False, "static_groups": False,
             "sym": True, "true_sequential": True, "model_name_or_path": None, "model_file_base_name": None}))
        want = {"method": "gptq", "format": "gptq", "bits": bits, "group_size": 32, "sym": True, "desc_act": False}
    else:
        save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
        (tmp_path / "quant_config.json").write_text(json.dumps(
            {"zero_point": True, "q_group_size": 32, "w_bit": 4, "version": "GEMM"}))
        want = {"method": "awq", "format": "awq", "bits": 4, "group_size": 32, "sym": False, "desc_act": False}
    _, qcfg, records, _ = read_quantized(tmp_path)
    assert qcfg == want
    loaded = load_quantized(tmp_path, kernel=False)
    for name, w in expected.items():
        assert torch.equal(records[name].dequantize(), w)
        assert torch.equal(loaded.get_submodule(name).weight, w)
    # the same model by hand: fp16-rounded floats, the expected weights
    ref = Llama(cfg).eval()
    ref.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})
    for name, w in expected.items():
        ref.get_submodule(name).weight.copy_(w)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    assert torch.equal(loaded(x), ref(x))


def test_transformers_reads_our_quantization_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    from flashscale.quant.api import QuantizeConfig
    from flashscale.quant.io import quantization_config

    qc = quantization_config(QuantizeConfig(method="gptq", bits=4, group_size=32, sym=False, act_order=True), "gptq")
    c = transformers.GPTQConfig.from_dict(qc)
    assert (c.bits, c.group_size, c.desc_act, c.sym, c.format) == (4, 32, True, False, "gptq")
    qa = quantization_config(QuantizeConfig(method="awq", bits=4, group_size=128, checkpoint_format="awq"), "awq")
    a = transformers.AwqConfig.from_dict(qa)
    assert (a.bits, a.group_size, a.zero_point, a.format) == (4, 128, True, "gemm")
