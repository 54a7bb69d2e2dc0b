"""Typed configuration of the Llama family, as HF transformers' LlamaConfig defines it, and presets.

The field names are HF's, so `config.json` maps one to one (`to_hf_dict` / `from_hf_dict`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(kw_only=True)
class LlamaConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None: same as num_attention_heads (MHA)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # HF's dict, e.g. {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    # "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}; None: plain RoPE.
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                    f"{self.num_attention_heads}; set head_dim explicitly"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads} (GQA groups)"
            )
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in ("llama3", "default", None):
                raise ValueError(f"rope_scaling type {kind!r} is not supported; supported: 'llama3', 'default'")

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def num_params(self, *, embeddings: bool = True) -> int:
        """Exact parameter count of the model this config builds."""
        h, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        if self.attention_bias:
            attn += self.q_dim + 2 * self.kv_dim + h
        mlp = 3 * h * f + (2 * f + h if self.mlp_bias else 0)
        layer = attn + mlp + 2 * h
        n = self.num_hidden_layers * layer + h  # + final norm
        if embeddings:
            n += v * h * (1 if self.tie_word_embeddings else 2)
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6N + 12·L·h·s (PaLM's count, attention included). N counts the output
        projection (a V x h matmul every token, tied or not) but not the input embedding (a lookup)."""
        n = self.num_params(embeddings=False) + self.vocab_size * self.hidden_size
        return 6.0 * n + 12.0 * self.num_hidden_layers * self.q_dim * seq_len

    def to_hf_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                 attention_dropout=0.0, pretraining_tp=1, use_cache=True)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        model_type = d.get("model_type", "llama")
        if model_type not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"config.json model_type={model_type!r} is not a Llama-family model")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json hidden_act={act!r}: only 'silu' (SwiGLU) is supported")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        for k in ("bos_token_id", "eos_token_id"):
            if isinstance(kwargs.get(k), list):
                kwargs[k] = kwargs[k][0] if kwargs[k] else None
        if model_type == "qwen2":
            kwargs.setdefault("attention_bias", True)
        return cls(**kwargs)


def _llama(**kw: Any) -> LlamaConfig:
    return LlamaConfig(**kw)


# Shapes of the family, smallest first. "tiny" is for tests; the large ones for benchmarks and planning.
PRESETS: dict[str, LlamaConfig] = {
    "tiny": _llama(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
    # Sized for `flashscale demo` on 2 CPU cores in minutes. For about the same CPU time, hidden 128 (255
    # steps) reached moby_dick perplexity 466, hidden 192 (150 steps) 575 (2026-11): with a few hundred
    # thousand tokens to learn from, a smaller model that sees more of them wins.
    "demo": _llama(vocab_size=4096, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                   tie_word_embeddings=True),
    "125M": _llama(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                   num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=1024,
                   tie_word_embeddings=True),
    "1B": _llama(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                 rope_theta=500000.0, tie_word_embeddings=True,
                 rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "llama2-7B": _llama(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096),
    "llama3-8B": _llama(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                        rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001),
    "llama3-70B": _llama(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
                         rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001),
}


def preset(name: str, **overrides: Any) -> LlamaConfig:
    """A copy of preset `name` with `overrides` applied."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)
