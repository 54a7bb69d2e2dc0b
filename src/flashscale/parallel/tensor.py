"""Megatron-style tensor parallelism (and sequence parallelism), applied from outside to a built Llama.

Per transformer block, one all-reduce forward and one backward per sub-layer:

    x ─ ParallelRMSNorm ─ copy_to_tp ─┬ q_proj ┐ (column: heads split)             ┌ o_proj (row) ─ reduce_from_tp ─ + x
                                      ├ k_proj ┼─ attention on this rank's heads ──┘
                                      └ v_proj ┘
    x ─ ParallelRMSNorm ─ copy_to_tp ─┬ gate_proj ┐ (column: ffn split)  ─ down_proj (row) ─ reduce_from_tp ─ + x
                                      └ up_proj   ┘

The region entry lives in the norm (one copy_to_tp for q, k and v together, not three all-reduces in
backward). With sequence parallelism the residual stream is split along the sequence: the entry
becomes an all-gather, the exit a reduce-scatter, and norms work on 1/tp of the tokens.

Embedding and LM head are split along the vocabulary, padded to a multiple of tp (padded rows stay zero:
no token maps to them and the loss masks their logits). KV heads are split when tp <= kv heads and
replicated tp/kv times otherwise; replicas sum their gradients over the mesh's `kv` axis.

Every parameter gets a ShardSpec: which slice of which logical (single-device) tensor it holds, which
axis its gradient must be summed over, and whether this rank owns it (counts it in the grad norm and
writes it to checkpoints). Shapes: B batch, S sequence, E hidden, V vocab, F ffn, D head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from flashscale.models.llama import RMSNorm
from flashscale.parallel.comm import copy_to_tp, gather_from_sp, reduce_from_tp, reduce_scatter_to_sp
from flashscale.parallel.mesh import Axis, ParallelMesh


@dataclass(frozen=True, kw_only=True)
class ShardSpec:
    """How a local parameter maps to its logical tensor: local.narrow(dim, 0, stop - start) equals
    logical.narrow(dim, start, stop - start); rows past that (vocab padding) are zeros."""

    logical_name: str
    logical_shape: tuple[int, ...]
    dim: int | None = None  # None: the whole logical tensor (replicated or not tensor-parallel)
    start: int = 0
    stop: int = 0
    local_len: int = 0
    grad_sync: str | None = None  # mesh axis whose ranks hold partial grads to be summed: "tp", "kv", "embed"
    owner: bool = True  # counted once in the global grad norm and written once to checkpoints

    def local_from_logical(self, logical: torch.Tensor) -> torch.Tensor:
        """This rank's (padded) local tensor cut from the full logical tensor."""
        if self.dim is None:
            return logical.clone()
        part = logical.narrow(self.dim, self.start, self.stop - self.start)
        pad = self.local_len - (self.stop - self.start)
        if pad:
            shape = list(part.shape)
            shape[self.dim] = pad
            part = torch.cat([part, part.new_zeros(shape)], dim=self.dim)
        return part.contiguous()

    def valid_local(self, local: torch.Tensor) -> torch.Tensor:
        return local if self.dim is None else local.narrow(self.dim, 0, self.stop - self.start)


class ParallelRMSNorm(RMSNorm):
    """RMSNorm whose output enters a tensor-parallel region: copy_to_tp (replicated stream) or an
    all-gather along the sequence (sequence parallel). Same parameter name as RMSNorm."""

    def __init__(self, dim: int, eps: float, axis: Axis, sequence_parallel: bool):
        super().__init__(dim, eps)
        self.axis, self.sequence_parallel = axis, sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S or S/tp, E) -> (B, S, E)
        y = super().forward(x)
        return gather_from_sp(y, self.axis, 1) if self.sequence_parallel else copy_to_tp(y, self.axis)


class ColumnParallelLinear(nn.Linear):
    """Output features split across tp: weight (out/tp, in). With enter=False the input is already in
    the tp region (the preceding ParallelRMSNorm entered it once for every projection sharing it)."""

    def __init__(self, in_features: int, out_local: int, *, bias: bool, axis: Axis,
                 enter: bool = False, sequence_parallel: bool = False):
        super().__init__(in_features, out_local, bias=bias)
        self.axis, self.enter, self.sequence_parallel = axis, enter, sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.enter:
            x = gather_from_sp(x, self.axis, 1) if self.sequence_parallel else copy_to_tp(x, self.axis)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Input features split across tp: weight (out, in/tp); partial outputs summed (all-reduce) or
    reduce-scattered along the sequence (sequence parallel); the bias is added once, after."""

    def __init__(self, in_local: int, out_features: int, *, bias: bool, axis: Axis, sequence_parallel: bool):
        super().__init__()
        self.axis, self.sequence_parallel = axis, sequence_parallel
        self.weight = nn.Parameter(torch.empty(out_features, in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, in/tp) -> (B, S or S/tp, out)
        y = F.linear(x, self.weight)
        y = reduce_scatter_to_sp(y, self.axis, 1) if self.sequence_parallel else reduce_from_tp(y, self.axis)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + local) of the (padded) vocabulary on this rank; ids elsewhere give zeros
    and the all-reduce (or sequence reduce-scatter) adds the one rank that holds each id: exact."""

    def __init__(self, local_rows: int, dim: int, *, start: int, axis: Axis, sequence_parallel: bool):
        super().__init__()
        self.start, self.axis, self.sequence_parallel = start, axis, sequence_parallel
        self.weight = nn.Parameter(torch.empty(local_rows, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, S) -> (B, S or S/tp, E)
        if self.axis.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(local.masked_fill(~inside, 0), self.weight)  # (B, S, E)
        out = out.masked_fill(~inside[..., None], 0.0)
        return reduce_scatter_to_sp(out, self.axis, 1) if self.sequence_parallel else reduce_from_tp(out, self.axis)


def vocab_split(vocab_size: int, tp: int, tp_rank: int) -> tuple[int, int, int]:
    """(start, stop, local_rows) of this rank's vocabulary slice; the vocab is padded to tp * local_rows."""
    local = -(-vocab_size // tp)
    start = min(tp_rank * local, vocab_size)
    return start, min(vocab_size, start + local), local


def _copy_slice(dst: torch.Tensor, src: torch.Tensor, spec: ShardSpec) -> None:
    with torch.no_grad():
        dst.copy_(spec.local_from_logical(src.detach()).to(dst.dtype))


def apply_tensor_parallel(model: nn.Module, mesh: ParallelMesh, *, sequence_parallel: bool = False,
                          tied_head_copy: bool = False) -> dict[str, ShardSpec]:
    """Shards a Llama (or a pipeline stage of one: `embed_tokens`, `norm`, `lm_head` may be None and
    `layers` a ModuleDict keyed by global layer index) in place over the mesh's tp axis.

    Returns {local parameter name: ShardSpec}. At tp == 1 the modules keep their classes except the
    vocab-parallel ones (identical math) and every spec is the whole tensor. `tied_head_copy`: this
    stage's lm_head is a copy of the first stage's tied embedding (pipeline parallel)."""
    cfg = model.config
    tp, r, ax = mesh.tp_size, mesh.tp_rank, mesh.tp
    if sequence_parallel and tp == 1:
        sequence_parallel = False  # nothing to split
    sp_sync = "tp" if sequence_parallel else None  # replicated params computing on 1/tp of the tokens
    specs: dict[str, ShardSpec] = {}
    t0 = r == 0

    def spec(name, logical, **kw):
        specs[name] = ShardSpec(logical_name=kw.pop("logical_name", name), logical_shape=tuple(logical.shape), **kw)

    def rows(name, w, start, stop, local_len=None, **kw):
        spec(name, w, dim=0, start=start, stop=stop, local_len=local_len or stop - start, **kw)

    def norm(parent, attr, prefix):
        old: RMSNorm = getattr(parent, attr)
        new = ParallelRMSNorm(old.weight.shape[0], old.eps, ax, sequence_parallel)
        spec(f"{prefix}.weight", old.weight, grad_sync=sp_sync, owner=t0)
        _copy_slice(new.weight, old.weight, specs[f"{prefix}.weight"])
        setattr(parent, attr, new)

    def column(parent, attr, prefix, start, stop, *, grad_sync=None, owner=True):
        old: nn.Linear = getattr(parent, attr)
        new = ColumnParallelLinear(old.in_features, stop - start, bias=old.bias is not None, axis=ax)
        for pname in ("weight", "bias"):
            p = getattr(old, pname)
            if p is not None:
                rows(f"{prefix}.{pname}", p, start, stop, grad_sync=grad_sync, owner=owner)
                _copy_slice(getattr(new, pname), p, specs[f"{prefix}.{pname}"])
        setattr(parent, attr, new)

    def row(parent, attr, prefix, start, stop):
        old: nn.Linear = getattr(parent, attr)
        new = RowParallelLinear(stop - start, old.out_features, bias=old.bias is not None, axis=ax,
                                sequence_parallel=sequence_parallel)
        spec(f"{prefix}.weight", old.weight, dim=1, start=start, stop=stop, local_len=stop - start)
        _copy_slice(new.weight, old.weight, specs[f"{prefix}.weight"])
        if old.bias is not None:
            spec(f"{prefix}.bias", old.bias, grad_sync=sp_sync, owner=t0)
            _copy_slice(new.bias, old.bias, specs[f"{prefix}.bias"])
        setattr(parent, attr, new)

    D, H, G, Fi = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
    hl = H // tp
    if tp <= G:
        g0, g1, kv_sync, kv_owner = r * (G // tp), (r + 1) * (G // tp), None, True
    else:  # each kv head replicated over `rep` neighbouring tp ranks (validate_layout: tp % G == 0)
        rep = tp // G
        g0, g1, kv_sync, kv_owner = r // rep, r // rep + 1, "kv", r % rep == 0
    layers = model.layers.items() if isinstance(model.layers, nn.ModuleDict) else enumerate(model.layers)
    for idx, block in layers:
        pre = f"layers.{idx}"
        a, m = block.self_attn, block.mlp
        norm(block, "input_layernorm", f"{pre}.input_layernorm")
        column(a, "q_proj", f"{pre}.self_attn.q_proj", r * hl * D, (r + 1) * hl * D)
        column(a, "k_proj", f"{pre}.self_attn.k_proj", g0 * D, g1 * D, grad_sync=kv_sync, owner=kv_owner)
        column(a, "v_proj", f"{pre}.self_attn.v_proj", g0 * D, g1 * D, grad_sync=kv_sync, owner=kv_owner)
        row(a, "o_proj", f"{pre}.self_attn.o_proj", r * hl * D, (r + 1) * hl * D)
        a.n_heads, a.n_kv_heads = hl, g1 - g0  # informational: the forward infers heads from shapes
        norm(block, "post_attention_layernorm", f"{pre}.post_attention_layernorm")
        fl = Fi // tp
        column(m, "gate_proj", f"{pre}.mlp.gate_proj", r * fl, (r + 1) * fl)
        column(m, "up_proj", f"{pre}.mlp.up_proj", r * fl, (r + 1) * fl)
        row(m, "down_proj", f"{pre}.mlp.down_proj", r * fl, (r + 1) * fl)

    vstart, vstop, vlocal = vocab_split(cfg.vocab_size, tp, r)
    embed = getattr(model, "embed_tokens", None)
    head = getattr(model, "lm_head", None)
    shared = embed is not None and head is not None and head.weight is embed.weight
    if embed is not None:
        new = VocabParallelEmbedding(vlocal, cfg.hidden_size, start=vstart, axis=ax,
                                     sequence_parallel=sequence_parallel)
        tied_sync = "embed" if cfg.tie_word_embeddings and mesh.pp_size > 1 else None
        rows("embed_tokens.weight", embed.weight, vstart, vstop, local_len=vlocal, grad_sync=tied_sync)
        _copy_slice(new.weight, embed.weight, specs["embed_tokens.weight"])
        model.embed_tokens = new
    if getattr(model, "norm", None) is not None:
        norm(model, "norm", "norm")
    if head is not None:
        new = ColumnParallelLinear(cfg.hidden_size, vlocal, bias=False, axis=ax)
        if shared:  # one parameter, already sharded as the embedding
            new.weight = model.embed_tokens.weight
        else:
            kw = dict(logical_name="embed_tokens.weight", grad_sync="embed", owner=False) if tied_head_copy else {}
            rows("lm_head.weight", head.weight, vstart, vstop, local_len=vlocal, **kw)
            _copy_slice(new.weight, head.weight, specs["lm_head.weight"])
        model.lm_head = new
    model.vocab_range = (vstart, vstop)  # the loss masks columns past stop - start (padding)
    return specs
