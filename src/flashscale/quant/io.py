"""Quantized model directories: write ours in the GPTQ or AWQ layout, read ours and theirs.

A directory is what transformers / AutoGPTQ / GPTQModel / AutoAWQ / vLLM read:
    config.json            the HF Llama config + "quantization_config"
    quantize_config.json   (GPTQ formats) the same settings, AutoGPTQ/GPTQModel's own file
    model.safetensors      quantized linears as model.layers.N.self_attn.q_proj.{qweight,qzeros,scales[,g_idx]}
                           (pack.py), everything else (embeddings, norms, biases, lm_head) in float16
    tokenizer.json (+ tokenizer_config.json, ...) copied beside, when given
Writes are atomic: a temporary directory beside the target, fsynced, renamed over it; a failure leaves
no directory that looks complete.

Reading accepts AutoGPTQ's (quantize_config.json only, any *.safetensors file name, e.g.
gptq_model-4bit-128g.safetensors), GPTQModel's (checkpoint_format gptq_v2) and AutoAWQ's (GEMM,
quant_config.json or config.json) layouts. Quantized linears become flashscale.quant.qlinear.QuantLinear
(the W4A16 kernel on CUDA) when it accepts the weight, else nn.Linear holding the dequantized weight.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from flashscale.models.config import LlamaConfig
from flashscale.models.llama import Llama, rope_inv_freq
from flashscale.quant.pack import pack_awq, pack_gptq, unpack_awq, unpack_gptq
from flashscale.quant.rtn import QuantizedWeight, check_bits

QUANT_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
_IGNORED = ("rotary_emb.inv_freq",)  # buffers some exporters store; recomputed here


def _hf(name: str) -> str:
    return name if name == "lm_head.weight" else f"model.{name}"


def quantization_config(cfg, checkpoint_format: str) -> dict:
    """The quantization_config dict for config.json (transformers' GPTQConfig / AwqConfig fields)."""
    meta = {"quantizer": ["flashscale:0.1.0"], "method": cfg.method}
    if getattr(cfg, "sink_weight", 1.0) != 1.0:
        meta["sink_weight"] = cfg.sink_weight
    if checkpoint_format == "awq":
        return {"quant_method": "awq", "bits": cfg.bits, "group_size": cfg.group_size, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": None, "meta": meta}
    return {"quant_method": "gptq", "bits": cfg.bits, "group_size": cfg.group_size, "desc_act": bool(cfg.act_order),
            "sym": bool(cfg.sym), "static_groups": bool(cfg.static_groups), "true_sequential": True,
            "damp_percent": cfg.damp_percent, "checkpoint_format": checkpoint_format, "lm_head": False, "meta": meta}


def _fsync_dir(d: Path) -> None:
    for p in d.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())


def save_quantized(qmodel, out_dir: str | os.PathLike, *, checkpoint_format: str | None = None, tokenizer=None,
                   tokenizer_dir: str | os.PathLike | None = None, dtype: torch.dtype = torch.float16,
                   overwrite: bool = False) -> Path:
    """Writes a QuantizedModel (api.quantize_model's result) as a quantized HF directory.

    checkpoint_format: "gptq" (v1, zero - 1), "gptq_v2" or "awq" (default: the one it was quantized
    for). tokenizer: a tokenizers.Tokenizer to save as tokenizer.json; tokenizer_dir: a directory whose
    tokenizer files are copied (either or neither). dtype: of the non-quantized tensors.
    """
    model, records, cfg = qmodel.model, qmodel.records, qmodel.config
    fmt = checkpoint_format or cfg.checkpoint_format
    if fmt not in ("gptq", "gptq_v2", "awq"):
        raise ValueError(f"checkpoint_format={fmt!r} is not supported; takes 'gptq', 'gptq_v2' or 'awq'")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"output directory {str(out)!r} exists; remove it or pass overwrite=True")
    # everything is packed before anything is written: a packing error leaves nothing behind
    tensors: dict[str, torch.Tensor] = {}
    for name, r in records.items():
        packed = pack_awq(r, name=name) if fmt == "awq" else pack_gptq(r, checkpoint_format=fmt, name=name)
        tensors.update({f"model.{name}.{k}": v for k, v in packed.items()})
    quantized = {f"{n}.weight" for n in records}
    for name, t in model.state_dict().items():
        if name in quantized or (name == "lm_head.weight" and model.config.tie_word_embeddings):
            continue
        t = t.detach().cpu()
        tensors[_hf(name)] = (t.to(dtype) if t.is_floating_point() else t).contiguous()
    config = model.config.to_hf_dict()
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    config["quantization_config"] = quantization_config(cfg, fmt)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if fmt != "awq":
            qc = {k: v for k, v in config["quantization_config"].items() if k != "meta"}
            (tmp / "quantize_config.json").write_text(json.dumps(qc, indent=2) + "\n")
        if tokenizer is not None:
            tokenizer.save(str(tmp / "tokenizer.json"))
        if tokenizer_dir is not None:
            for f in TOKENIZER_FILES:
                src = Path(tokenizer_dir) / f
                if src.is_file() and not (tmp / f).exists():
                    shutil.copyfile(src, tmp / f)
        _fsync_dir(tmp)
        if out.exists():  # overwrite: the old directory goes only once the new one is complete
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# --------------------------------------------------------------------------------------------- read

def read_quantization_config(directory: str | os.PathLike) -> dict | None:
    """The normalized quantization settings of a directory, or None if it is not quantized:
    {"method": "gptq"|"awq", "format": "gptq"|"gptq_v2"|"awq", "bits", "group_size", "sym", "desc_act"}."""
    d = Path(directory)
    raw = None
    cfg_path = d / "config.json"
    if cfg_path.is_file():
        raw = json.loads(cfg_path.read_text()).get("quantization_config")
    for fname in ("quantize_config.json", "quant_config.json"):
        if raw is None and (d / fname).is_file():
            raw = json.loads((d / fname).read_text())
    if raw is None:
        return None
    method = str(raw.get("quant_method", "awq" if "w_bit" in raw or "version" in raw else "gptq")).lower()
    if method == "gptq":
        fmt = str(raw.get("checkpoint_format", raw.get("format", "gptq"))).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"{d}: GPTQ checkpoint_format {fmt!r} is not supported; reads 'gptq' and 'gptq_v2'")
        out = {"method": "gptq", "format": fmt, "bits": int(raw["bits"]), "group_size": int(raw.get("group_size", -1)),
               "sym": bool(raw.get("sym", True)), "desc_act": bool(raw.get("desc_act", False))}
    elif method == "awq":
        version = str(raw.get("version", raw.get("format", "gemm"))).lower()
        if version != "gemm":
            raise ValueError(f"{d}: AWQ version {version!r} is not supported; reads the GEMM layout")
        out = {"method": "awq", "format": "awq", "bits": int(raw.get("bits", raw.get("w_bit", 4))),
               "group_size": int(raw.get("group_size", raw.get("q_group_size", 128))),
               "sym": not bool(raw.get("zero_point", True)), "desc_act": False}
        if out["bits"] != 4:
            raise ValueError(f"{d}: AWQ GEMM checkpoints are 4-bit, this one says bits={out['bits']}")
    else:
        raise ValueError(f"{d}: quant_method {method!r} is not supported; reads 'gptq' and 'awq'")
    check_bits(out["bits"])
    return out


def is_quantized_dir(directory: str | os.PathLike) -> bool:
    d = Path(directory)
    return d.is_dir() and read_quantization_config(d) is not None


def _tensor_files(d: Path) -> list[Path]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        return sorted({d / f for f in json.loads(index.read_text())["weight_map"].values()})
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {str(d)!r} (.bin checkpoints are not read)")
    return files


def read_quantized(directory: str | os.PathLike) -> tuple[LlamaConfig, dict, dict[str, QuantizedWeight], dict[str, torch.Tensor]]:
    """(model config, quantization settings, our linear name -> QuantizedWeight, our name -> float tensor)."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"quantized model directory {str(d)!r} does not exist")
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"{str(d)!r} has no config.json")
    qcfg = read_quantization_config(d)
    if qcfg is None:
        raise ValueError(f"{str(d)!r} is not a quantized checkpoint (no quantization_config in config.json, "
                         "no quantize_config.json / quant_config.json)")
    config = LlamaConfig.from_hf_dict(json.loads((d / "config.json").read_text()))
    raw: dict[str, torch.Tensor] = {}
    for f in _tensor_files(d):
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                raw[k] = sf.get_tensor(k)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    floats: dict[str, torch.Tensor] = {}
    for k, t in raw.items():
        if k.endswith(_IGNORED):
            continue
        name = k.removeprefix("model.")
        stem, _, leaf = name.rpartition(".")
        if leaf in QUANT_SUFFIXES:
            groups.setdefault(stem, {})[leaf] = t
        else:
            floats[name] = t
    records = {}
    for stem, ts in groups.items():
        if qcfg["format"] == "awq":
            records[stem] = unpack_awq(ts, group_size=qcfg["group_size"], name=stem)
        else:
            records[stem] = unpack_gptq(ts, bits=qcfg["bits"], checkpoint_format=qcfg["format"],
                                        group_size=qcfg["group_size"], sym=qcfg["sym"], name=stem)
    return config, qcfg, records, floats


def runtime_linear(qw: QuantizedWeight, bias: torch.Tensor | None, *, dtype: torch.dtype, device,
                   kernel: bool | None = None) -> nn.Module:
    """A module computing x @ dequant(qw)ᵀ + bias: QuantLinear when available and it takes this weight
    (kernel=None: if it can; True: must; False: never), else nn.Linear with the dequantized weight."""
    if kernel is not False:
        try:
            from flashscale.quant.qlinear import QuantLinear
        except ImportError:
            if kernel:
                raise
            QuantLinear = None
        if QuantLinear is not None:
            try:
                t = pack_gptq(qw, checkpoint_format="gptq_v2")
                mod = QuantLinear.from_gptq(qweight=t["qweight"], qzeros=t["qzeros"], scales=t["scales"],
                                            g_idx=t["g_idx"], bias=bias, bits=qw.bits, group_size=qw.group_size,
                                            checkpoint_format="gptq_v2")
                return mod.to(device)
            except (ValueError, NotImplementedError, TypeError):
                if kernel:
                    raise
    n, k = qw.shape
    lin = nn.Linear(k, n, bias=bias is not None, device="meta")
    lin.weight = nn.Parameter(qw.dequantize(dtype).to(device), requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias.to(device, dtype), requires_grad=False)
    return lin


@torch.no_grad()
def load_quantized(directory: str | os.PathLike, *, device="cpu", dtype: torch.dtype = torch.float32,
                   kernel: bool | None = None) -> Llama:
    """A quantized directory (ours or AutoGPTQ/GPTQModel/AutoAWQ's) -> Llama (eval mode) whose
    quantized linears are runtime_linear()s."""
    config, _qcfg, records, floats = read_quantized(directory)
    with torch.device("meta"):
        model = Llama(config)
    model.to_empty(device=device).to(dtype)
    model.inv_freq = rope_inv_freq(config).to(device)  # float32 whatever the model's dtype, as HF keeps it
    params = dict(model.named_parameters())
    expected = set(params) - {f"{n}.weight" for n in records} - {f"{n}.bias" for n in records}
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing = sorted(expected - set(floats))
    unknown = sorted(n for n in records if f"{n}.weight" not in params)
    unexpected = sorted(set(floats) - set(params))
    if missing or unknown or unexpected:
        raise ValueError(f"{directory}: tensors do not match a Llama of this config: missing {missing[:5]}, "
                         f"unexpected {(unknown + unexpected)[:5]}")
    for name, t in floats.items():
        if name.rpartition(".")[0] in records:
            continue  # a quantized linear's bias: given to its module below
        p = params[name]
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{directory}: {name} has shape {tuple(t.shape)}, the config implies {tuple(p.shape)}")
        p.copy_(t.to(p.dtype))
    for name, qw in records.items():
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, leaf)
        if qw.shape != (old.out_features, old.in_features):
            raise ValueError(f"{directory}: {name} is {qw.shape[0]}x{qw.shape[1]}, the config implies "
                             f"{old.out_features}x{old.in_features}")
        if (old.bias is not None) != (f"{name}.bias" in floats):
            raise ValueError(f"{directory}: {name}.bias is {'missing' if old.bias is not None else 'unexpected'} "
                             "for this config (attention_bias / mlp_bias)")
        setattr(parent, leaf, runtime_linear(qw, floats.get(f"{name}.bias"), dtype=dtype, device=device, kernel=kernel))
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()
