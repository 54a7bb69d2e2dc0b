"""The Llama architecture as HF transformers defines it, single-device: RMSNorm, RoPE (with Llama-3
frequency scaling), SwiGLU MLP, GQA, optional tied embeddings and biases.

Module names follow HF's (embed_tokens, layers.N.self_attn.q_proj, ...) without the "model." prefix,
so checkpoints map by a prefix. Parallelism is applied from outside (flashscale.parallel); this file
never imports torch.distributed.

Shapes: B batch, S sequence (this call), T total cached length, H query heads, G kv heads, D head_dim,
E hidden size, V vocab, N documents.

Document masking (Megatron's reset_attention_mask + reset_position_ids): with `cu_seqlens` (int32 (N + 1,), the
document boundaries over the B * S tokens flattened row by row; `document_spans` cuts at every eos token and row
end) attention runs in the varlen layout, a token sees only earlier tokens of its own document, and RoPE positions
restart at 0 in each (`positions`). `model.document_masking = True` makes forward compute both from
config.eos_token_id; the engines compute them outside a compiled forward (nonzero has a data-dependent size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from flashscale.models.config import LlamaConfig
from flashscale.ops import attention


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # HF order: normalize in float32, cast back, then scale in the input dtype.
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """(D/2,) inverse frequencies, with Llama-3 scaling when config.rope_scaling asks for it."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rs = config.rope_scaling
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_ctx = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_ctx / lo, old_ctx / hi
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, S, H, D); cos/sin (B or 1, S, 1, D)."""
    return x * cos + rotate_half(x) * sin


def document_spans(input_ids: torch.Tensor, eos_id: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids (B, S) -> (cu_seqlens int32 (N + 1,), positions int64 (B, S)): documents end after every eos_id
    token and at every row's end; positions count from 0 within each document. One host sync (the count N)."""
    if eos_id is None:
        raise ValueError("document_masking needs config.eos_token_id (the token that ends a document)")
    if input_ids.dim() != 2 or input_ids.is_floating_point():
        raise ValueError(f"input_ids must be (batch, seq_len) integer ids; got {input_ids.dtype} "
                         f"{tuple(input_ids.shape)}")
    if not isinstance(eos_id, int) or isinstance(eos_id, bool) or eos_id < 0:
        raise ValueError(f"eos_id must be a token id (int >= 0); got {eos_id!r}")
    B, S = input_ids.shape
    ends = torch.cat([input_ids[:, :-1] == eos_id, torch.ones_like(input_ids[:, :1], dtype=torch.bool)], dim=1)
    cut = torch.nonzero(ends.flatten()).flatten() + 1  # (N,): exclusive ends over the flattened tokens
    cu_seqlens = torch.cat([cut.new_zeros(1), cut]).to(torch.int32)
    # a token starts a document at its row's start or right after an eos; positions count from the last start
    starts = torch.cat([torch.ones_like(ends[:, :1]), ends[:, :-1]], dim=1)
    t = torch.arange(S, device=input_ids.device).expand(B, S)
    positions = t - torch.cummax(torch.where(starts, t, torch.zeros_like(t)), dim=1).values
    return cu_seqlens, positions


@dataclass
class KVCache:
    """A contiguous per-layer cache: k/v (B, T_max, G, D). `length` tokens are filled."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    length: int = 0

    @classmethod
    def empty(cls, config: LlamaConfig, batch: int, max_len: int, *, device=None, dtype=None) -> "KVCache":
        shape = (batch, max_len, config.num_key_value_heads, config.head_dim)
        n = config.num_hidden_layers
        return cls([torch.zeros(shape, device=device, dtype=dtype) for _ in range(n)],
                   [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n)])

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = (config.num_attention_heads,
                                                        config.num_key_value_heads, config.head_dim)
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(self, x, cos, sin, cache: KVCache | None = None, layer: int = 0, cu_seqlens=None):
        B, S, _ = x.shape
        # -1 for heads, not n_heads: a tensor-parallel wrapper shards the projections and the head count.
        q = self.q_proj(x).view(B, S, -1, self.head_dim)  # (B, S, H, D)
        k = self.k_proj(x).view(B, S, -1, self.head_dim)  # (B, S, G, D)
        v = self.v_proj(x).view(B, S, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            t0 = cache.length
            cache.k[layer][:, t0:t0 + S] = k
            cache.v[layer][:, t0:t0 + S] = v
            k, v = cache.k[layer][:, :t0 + S], cache.v[layer][:, :t0 + S]  # (B, T, G, D)
        if cu_seqlens is not None:  # documents packed row by row: (B * S, heads, D), causal within each
            out = attention(q.reshape(B * S, -1, self.head_dim), k.reshape(B * S, -1, self.head_dim),
                            v.reshape(B * S, -1, self.head_dim), causal=True, cu_seqlens_q=cu_seqlens,
                            cu_seqlens_k=cu_seqlens, max_seqlen_q=S, max_seqlen_k=S)  # S bounds every document
        else:
            out = attention(q, k, v, causal=True)  # bottom-right causal: right for prefill and decode alike
        return self.o_proj(out.reshape(B, S, -1))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        e, f, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(e, f, bias=bias)
        self.up_proj = nn.Linear(e, f, bias=bias)
        self.down_proj = nn.Linear(f, e, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, cache: KVCache | None = None, layer: int = 0, cu_seqlens=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, cu_seqlens)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """forward(input_ids (B, S)) -> logits (B, S, V) in float32."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        # "none" | "full" (every block) | "attention" (only the attention sub-layer's inputs kept)
        self.activation_checkpointing = "none"
        # attention within documents (cut at config.eos_token_id), positions restarting in each (module docstring)
        self.document_masking = False

    def init_weights(self, seed: int | None = None) -> "Llama":
        """HF's initialization: normal(0, initializer_range) for linears/embeddings, ones for norms.
        Drawn on the device the model lives on (a seed gives the same weights on every CPU, and on
        every GPU of one kind, not across the two): a model built under `with torch.device("cuda")`
        initializes in seconds where an 8B one on the CPU takes minutes."""
        dev = self.embed_tokens.weight.device
        gen = torch.Generator(device=dev).manual_seed(seed) if seed is not None else None
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                w = torch.empty(m.weight.shape, device=dev).normal_(0.0, std, generator=gen)
                with torch.no_grad():
                    m.weight.copy_(w)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
        self.inv_freq.copy_(rope_inv_freq(self.config).to(self.inv_freq.device))
        return self

    def rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """positions (B or 1, S) -> cos, sin (B or 1, S, 1, D)."""
        freqs = positions[..., None].float() * self.inv_freq.float()  # (B, S, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, :, None, :], emb.sin().to(dtype)[:, :, None, :]

    def document_spans(self, input_ids: torch.Tensor) -> dict:
        """{} unless document_masking is on; else forward's cu_seqlens / positions for these ids."""
        if not self.document_masking:
            return {}
        return dict(zip(("cu_seqlens", "positions"), document_spans(input_ids, self.config.eos_token_id)))

    def forward(self, input_ids: torch.Tensor, *, cache: KVCache | None = None,
                positions: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
                hidden_only: bool = False) -> torch.Tensor:
        B, S = input_ids.shape
        start = cache.length if cache is not None else 0
        if cache is not None and start + S > cache.capacity:
            raise ValueError(f"KV cache holds {cache.capacity} tokens; {start} + {S} requested")
        if cu_seqlens is None and self.document_masking and cache is None:
            cu_seqlens, doc_positions = document_spans(input_ids, self.config.eos_token_id)
            positions = doc_positions if positions is None else positions
        if cu_seqlens is not None and cache is not None:
            raise ValueError("cu_seqlens (document masking) is for training / scoring whole sequences, not with a "
                             "KV cache")
        if positions is None:
            positions = torch.arange(start, start + S, device=input_ids.device)[None]  # (1, S)
        x = self.embed_tokens(input_ids)  # (B, S, E)
        cos, sin = self.rope(positions, x.dtype)
        for i, block in enumerate(self.layers):
            if self.activation_checkpointing == "full" and self.training and cache is None:
                x = checkpoint(block, x, cos, sin, None, i, cu_seqlens, use_reentrant=False)
            elif self.activation_checkpointing == "attention" and self.training and cache is None:
                x = x + checkpoint(lambda h, b=block, i=i: b.self_attn(b.input_layernorm(h), cos, sin, None, i,
                                                                     cu_seqlens), x, use_reentrant=False)
                x = x + block.mlp(block.post_attention_layernorm(x))
            else:
                x = block(x, cos, sin, cache, i, cu_seqlens)
        if cache is not None:
            cache.length = start + S
        x = self.norm(x)
        if hidden_only:
            return x
        return self.lm_head(x).float()  # (B, S, V)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean next-token cross-entropy. logits (B, S, V), targets (B, S)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=ignore_index)
