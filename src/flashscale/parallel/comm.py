"""Communication primitives of tensor and sequence parallelism as named autograd Functions.

Each pair is the transpose of the other (Megatron-LM, Shoeybi et al. 2019; sequence parallelism,
Korthikanti et al. 2022): what one does forward, its partner does backward.

    copy_to_tp         identity            | all-reduce          (enter a tp region, replicated input)
    reduce_from_tp     all-reduce          | identity            (leave a tp region, partial sums)
    gather_from_sp     all-gather along d  | reduce-scatter      (enter a tp region from sequence shards)
    reduce_scatter_to_sp  reduce-scatter   | all-gather          (leave a tp region into sequence shards)
    scatter_to_sp      keep own chunk      | all-gather          (enter sequence shards from replicated)
    gather_from_sp_replicated all-gather   | keep own chunk      (leave sequence shards, replicated grad)

Every one is the identity at axis size 1 and returns its input unchanged (no autograd node), so world
size 1 pays nothing. Sequence chunks are contiguous: rank r holds positions [r*S/n, (r+1)*S/n).
"""

from __future__ import annotations

import torch

from flashscale.parallel.mesh import Axis


def _all_reduce(x: torch.Tensor, axis: Axis, what: str) -> torch.Tensor:
    x = x.clone(memory_format=torch.contiguous_format)  # never in place: the caller may still hold x
    axis.all_reduce(x, what=what)
    return x


def _all_gather(x: torch.Tensor, axis: Axis, dim: int, what: str) -> torch.Tensor:
    # Collectives concatenate along dim 0 of contiguous memory: move `dim` to the front and back.
    xt = x.movedim(dim, 0).contiguous()  # (n_local, ...)
    out = torch.empty((axis.size * xt.shape[0],) + tuple(xt.shape[1:]), dtype=x.dtype, device=x.device)
    axis.all_gather_into(out, xt, what=what)
    return out.movedim(0, dim)


def _reduce_scatter(x: torch.Tensor, axis: Axis, dim: int, what: str) -> torch.Tensor:
    n = x.shape[dim]
    if n % axis.size:
        raise ValueError(f"sequence parallel: dim {dim} of size {n} is not divisible by the {axis.name} axis "
                         f"size {axis.size}")
    xt = x.movedim(dim, 0).contiguous()  # (n, ...)
    out = torch.empty((n // axis.size,) + tuple(xt.shape[1:]), dtype=x.dtype, device=x.device)
    axis.reduce_scatter_into(out, xt, what=what)
    return out.movedim(0, dim)


def _own_chunk(x: torch.Tensor, axis: Axis, dim: int) -> torch.Tensor:
    n = x.shape[dim]
    if n % axis.size:
        raise ValueError(f"sequence parallel: dim {dim} of size {n} is not divisible by the {axis.name} axis "
                         f"size {axis.size}")
    return x.narrow(dim, axis.rank * (n // axis.size), n // axis.size).contiguous()


class CopyToTP(torch.autograd.Function):
    """Forward identity, backward all-reduce: the input of a column-parallel region."""

    @staticmethod
    def forward(ctx, x, axis):
        ctx.axis = axis
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.axis, "copy_to_tp backward all-reduce"), None


class ReduceFromTP(torch.autograd.Function):
    """Forward all-reduce, backward identity: the output of a row-parallel region."""

    @staticmethod
    def forward(ctx, x, axis):
        return _all_reduce(x, axis, "reduce_from_tp all-reduce")

    @staticmethod
    def backward(ctx, g):
        return g, None


class GatherFromSP(torch.autograd.Function):
    """Forward all-gather of sequence shards, backward reduce-scatter (the input of a tp region when
    sequence parallel: every rank's column-parallel grad of the full sequence is a partial sum)."""

    @staticmethod
    def forward(ctx, x, axis, dim):
        ctx.axis, ctx.dim = axis, dim
        return _all_gather(x, axis, dim, "sequence-parallel all-gather")

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, ctx.axis, ctx.dim, "sequence-parallel backward reduce-scatter"), None, None


class ReduceScatterToSP(torch.autograd.Function):
    """Forward reduce-scatter into sequence shards, backward all-gather (the output of a row-parallel
    region when sequence parallel)."""

    @staticmethod
    def forward(ctx, x, axis, dim):
        ctx.axis, ctx.dim = axis, dim
        return _reduce_scatter(x, axis, dim, "sequence-parallel reduce-scatter")

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, ctx.axis, ctx.dim, "sequence-parallel backward all-gather"), None, None


class ScatterToSP(torch.autograd.Function):
    """Forward: keep this rank's sequence chunk of a replicated tensor; backward: all-gather."""

    @staticmethod
    def forward(ctx, x, axis, dim):
        ctx.axis, ctx.dim = axis, dim
        return _own_chunk(x, axis, dim)

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, ctx.axis, ctx.dim, "scatter_to_sp backward all-gather"), None, None


class GatherFromSPReplicated(torch.autograd.Function):
    """Forward all-gather; backward keeps this rank's chunk (the gathered tensor's consumers are
    replicated across tp, so every rank already holds the full gradient)."""

    @staticmethod
    def forward(ctx, x, axis, dim):
        ctx.axis, ctx.dim = axis, dim
        return _all_gather(x, axis, dim, "gather_from_sp_replicated all-gather")

    @staticmethod
    def backward(ctx, g):
        return _own_chunk(g, ctx.axis, ctx.dim), None, None


def copy_to_tp(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    return CopyToTP.apply(x, axis) if axis.size > 1 else x


def reduce_from_tp(x: torch.Tensor, axis: Axis) -> torch.Tensor:
    return ReduceFromTP.apply(x, axis) if axis.size > 1 else x


def gather_from_sp(x: torch.Tensor, axis: Axis, dim: int = 1) -> torch.Tensor:
    return GatherFromSP.apply(x, axis, dim) if axis.size > 1 else x


def reduce_scatter_to_sp(x: torch.Tensor, axis: Axis, dim: int = 1) -> torch.Tensor:
    return ReduceScatterToSP.apply(x, axis, dim) if axis.size > 1 else x


def scatter_to_sp(x: torch.Tensor, axis: Axis, dim: int = 1) -> torch.Tensor:
    return ScatterToSP.apply(x, axis, dim) if axis.size > 1 else x


def gather_from_sp_replicated(x: torch.Tensor, axis: Axis, dim: int = 1) -> torch.Tensor:
    return GatherFromSPReplicated.apply(x, axis, dim) if axis.size > 1 else x
