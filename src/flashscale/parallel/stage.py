"""One pipeline rank's share of a Llama: its model chunks (contiguous runs of layers), the embedding on
the rank holding chunk 0 and the final norm + LM head on the rank holding the last chunk.

Parameter names stay the single model's (`layers` is a ModuleDict keyed by the global layer index),
so "layers.7.mlp.up_proj.weight" means the same tensor at every layout. The forward of a chunk repeats
Llama.forward's loop (embedding, RoPE, blocks with activation checkpointing, norm, head) because a
pipeline runs it piecewise; the blocks themselves are the model's own modules.

Parameter-management hooks (ZeRO, data.py) wrap every unit: "embed", "layers.<i>", "norm" (the final
norm), "head" (lm_head). Shapes: B batch, S sequence (S/tp per rank with sequence parallelism), E hidden,
Vl local vocab.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from flashscale.models.llama import Llama, document_spans


class UnitHooks(Protocol):
    def pre_forward(self, key: str) -> None: ...

    def post_forward(self, key: str, out: torch.Tensor) -> torch.Tensor: ...


class PipelineStage(nn.Module):
    """chunks: this rank's model chunks as (global chunk id, list of global layer indices), in order.
    num_chunks: chunks over the whole pipeline. tied_head_copy: the head's weight is a copy of the
    first stage's tied embedding (separate parameter; the mesh's `embed` axis sums their gradients)."""

    def __init__(self, model: Llama, chunks: list[tuple[int, list[int]]], num_chunks: int):
        super().__init__()
        self.config = model.config
        self.chunk_ids = [c for c, _ in chunks]
        self.chunk_layers = [list(layers) for _, layers in chunks]
        self.num_chunks = num_chunks
        self.has_embed = 0 in self.chunk_ids
        self.has_head = num_chunks - 1 in self.chunk_ids
        self.embed_tokens = model.embed_tokens if self.has_embed else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for layers in self.chunk_layers for i in layers})
        self.norm = model.norm if self.has_head else None
        self.lm_head = model.lm_head if self.has_head else None
        self.tied_head_copy = False
        if self.has_head and self.config.tie_word_embeddings and not self.has_embed:
            # The head lives on another rank than the embedding: give it its own parameter, kept equal
            # to the embedding by summing their gradients (Megatron's embedding group).
            self.lm_head.weight = nn.Parameter(model.embed_tokens.weight.detach().clone())
            self.tied_head_copy = True
        self.register_buffer("inv_freq", model.inv_freq.detach().clone(), persistent=False)
        self.checkpointing = "none"  # "none" | "full" | "attention"
        self.document_masking = model.document_masking  # attention within documents (models.llama docstring)
        self.checkpoint_layers: set[int] | None = None  # None: all layers
        self.sequence_parallel = False
        self.tp_size = 1
        self.vocab_range = (0, self.config.vocab_size)
        self.hooks: UnitHooks | None = None

    # ------------------------------------------------------------------------------------------------
    def unit_keys(self, chunk: int) -> list[str]:
        """The parameter units of local chunk `chunk` in forward order."""
        keys = ["embed"] if self.chunk_ids[chunk] == 0 else []
        keys += [f"layers.{i}" for i in self.chunk_layers[chunk]]
        # The final norm and the head are separate units: a tied head copy must be a unit of exactly the
        # embedding's size, so both shard it alike over dp and their gradient shards can be summed.
        return keys + (["norm", "head"] if self.chunk_ids[chunk] == self.num_chunks - 1 else [])

    def unit_params(self, key: str) -> list[tuple[str, nn.Parameter]]:
        if key == "embed":
            return [("embed_tokens.weight", self.embed_tokens.weight)]
        if key == "norm":
            return [(f"norm.{n}", p) for n, p in self.norm.named_parameters()]
        if key == "head":
            tied = self.embed_tokens.weight if self.embed_tokens is not None else None
            return [("embed_tokens.weight" if p is tied else f"lm_head.{n}", p)
                    for n, p in self.lm_head.named_parameters()]
        return [(f"{key}.{n}", p) for n, p in self.layers[key.split(".")[1]].named_parameters()]

    def rope(self, seq_len: int, dtype: torch.dtype, positions: torch.Tensor | None = None):
        """cos, sin (1 or B, S, 1, D) for positions 0..S-1 or the given (B, S): Llama.rope on this stage's copy of
        inv_freq."""
        if positions is None:
            positions = torch.arange(seq_len, device=self.inv_freq.device)[None]  # (1, S)
        return Llama.rope(self, positions, dtype)

    def _unit(self, key: str, fn, *args):
        h = self.hooks
        if h is None:
            return fn(*args)
        h.pre_forward(key)
        return h.post_forward(key, fn(*args))

    def _block(self, i: int, x: torch.Tensor, cos, sin, cu_seqlens=None) -> torch.Tensor:
        block = self.layers[str(i)]
        mode = self.checkpointing
        if mode == "none" or not (self.training and torch.is_grad_enabled()) or \
                (self.checkpoint_layers is not None and i not in self.checkpoint_layers):
            return block(x, cos, sin, None, i, cu_seqlens)
        if mode == "full":
            return checkpoint(block, x, cos, sin, None, i, cu_seqlens, use_reentrant=False)
        # "attention": keep only the attention sub-layer's input; its activations are recomputed
        x = x + checkpoint(lambda h: block.self_attn(block.input_layernorm(h), cos, sin, None, i, cu_seqlens), x,
                           use_reentrant=False)
        return x + block.mlp(block.post_attention_layernorm(x))

    def forward_chunk(self, chunk: int, x: torch.Tensor, seq_len: int,
                      ids: torch.Tensor | None = None) -> torch.Tensor:
        """Local chunk `chunk`: ids (B, S) -> ... -> hidden (B, S or S/tp, E) or local logits (B, S, Vl)
        float32 on the last chunk. seq_len: the full sequence length S. ids: this micro-batch's token ids (B, S),
        which every stage holds: with document_masking the document spans come from them."""
        cu_seqlens = positions = None
        if self.document_masking:
            if ids is None:
                raise ValueError("document_masking: forward_chunk needs the micro-batch's token ids (ids=)")
            cu_seqlens, positions = document_spans(ids, self.config.eos_token_id)
        if self.chunk_ids[chunk] == 0:
            x = self._unit("embed", self.embed_tokens, x)  # (B, S or S/tp, E)
        cos, sin = self.rope(seq_len, x.dtype, positions)
        for i in self.chunk_layers[chunk]:
            x = self._unit(f"layers.{i}", self._block, i, x, cos, sin, cu_seqlens)
        if self.chunk_ids[chunk] == self.num_chunks - 1:
            x = self._unit("norm", self.norm, x)  # (B, S, E): gathered / entered into the tp region
            x = self._unit("head", lambda h: self.lm_head(h).float(), x)  # (B, S, Vl)
        return x

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Whole-model forward on a rank that holds every chunk (pp == 1): logits (B, S, V) float32,
        gathered over the tp axis (for evaluation; training uses the vocab-parallel loss instead)."""
        if len(self.chunk_ids) != self.num_chunks:
            raise RuntimeError("PipelineStage.forward needs the whole model on this rank (pp == 1); with "
                               "pipeline parallelism use ParallelEngine.eval_loss")
        x = input_ids
        for c in range(len(self.chunk_ids)):
            x = self.forward_chunk(c, x, input_ids.shape[1], ids=input_ids)
        if self.tp_size > 1:
            x = self._gather_vocab(x)
        return x[..., : self.config.vocab_size]

    def _gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        axis = self.lm_head.axis
        B = logits.shape[0]
        out = torch.empty((axis.size * B,) + tuple(logits.shape[1:]), dtype=logits.dtype, device=logits.device)
        axis.all_gather_into(out, logits.contiguous(), what="gather logits over vocab")
        return torch.cat(out.split(B), dim=-1)  # (B, S, tp * Vl): padded columns at the end
