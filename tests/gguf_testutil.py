"""Writes small llama.cpp-style GGUF files for tests, the way llama.cpp's convert_hf_to_gguf.py does:
its tensor names, its RoPE row permutation of attn_q/attn_k, its metadata keys (via gguf.GGUFWriter)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from flashscale.models import Llama

_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down"}
_GLOBAL = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py), applied to HF q_proj/k_proj rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(ours: str) -> str:
    parts = ours.split(".")
    if parts[0] == "layers":
        return f"blk.{parts[1]}.{_LAYER['.'.join(parts[2:-1])]}.{parts[-1]}"
    return f"{_GLOBAL[parts[0]]}.{parts[-1]}"


def byte_level_vocab(texts: list[str], vocab_size: int):
    """A trained byte-level BPE (tokenizers) and its (tokens, merges, types) as GGUF lists."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    import json

    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if t in ("<|endoftext|>", "<|im_start|>") else 1 for t in tokens]
    return tok, tokens, merges, types


def write_llama_gguf(path: Path, model: Llama, *, qtype: str = "F32", tokenizer: dict | None = None,
                     arch: str = "llama", extra_tensors: dict[str, np.ndarray] | None = None,
                     skip: tuple[str, ...] = ()) -> Path:
    """`model` as llama.cpp would write it. qtype applies to 2-D weights (norms stay F32).
    tokenizer: {"model": "gpt2", "tokens": [...], "merges": [...], "types": [...], "pre": ...} or None."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    if tokenizer is not None:
        w.add_tokenizer_model(tokenizer["model"])
        if "pre" in tokenizer:
            w.add_tokenizer_pre(tokenizer["pre"])
        w.add_token_list(tokenizer["tokens"])
        w.add_token_types(tokenizer["types"])
        if "merges" in tokenizer:
            w.add_token_merges(tokenizer["merges"])
        if "scores" in tokenizer:
            w.add_token_scores(tokenizer["scores"])
        for key in ("bos", "eos"):
            if f"{key}_id" in tokenizer:
                getattr(w, f"add_{key}_token_id")(tokenizer[f"{key}_id"])
        if "add_bos" in tokenizer:
            w.add_add_bos_token(tokenizer["add_bos"])
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings or name in skip:
            continue
        arr = t.detach().float().numpy().copy()
        if ".q_proj." in name:
            arr = llamacpp_permute(arr, cfg.num_attention_heads)
        elif ".k_proj." in name:
            arr = llamacpp_permute(arr, cfg.num_key_value_heads)
        if arr.ndim == 2 and qtype != "F32":
            q = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(gguf_name(name), gguf.quants.quantize(arr, q), raw_dtype=q)
        else:
            w.add_tensor(gguf_name(name), arr)
    for name, arr in (extra_tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def quantized_reference(model: Llama, qtype: str) -> dict[str, torch.Tensor]:
    """Our state dict after the round trip through gguf.quants (what a loader must reproduce)."""
    q = gguf.GGMLQuantizationType[qtype]
    out = {}
    for name, t in model.state_dict().items():
        arr = t.detach().float().numpy()
        if arr.ndim == 2 and qtype != "F32":
            arr = gguf.quants.dequantize(gguf.quants.quantize(arr, q), q)
        out[name] = torch.from_numpy(np.array(arr, dtype=np.float32))
    return out
