"""The device mesh: one object owns the (pp, dp, tp) layout, the process group of every axis and the
collectives run over them.

Rank order: tp fastest, then dp, then pp (rank = (pp_rank * dp + dp_rank) * tp + tp_rank), so a tensor-
parallel group sits on neighbouring GPUs of one node (NVLink) and pipeline stages span nodes.

Every collective goes through an `Axis`, which returns early at size 1 (world size 1 runs the same code
with no process group at all) and turns a backend failure or timeout into a CollectiveError that names
the rank, its mesh coordinates, the operation and the axis, so a hang becomes a readable error.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from flashscale.models.config import LlamaConfig
from flashscale.parallel.config import ParallelConfig


# torch 2.13 renamed the flat-tensor collectives (the old names warn); torch 2.4-2.12 have only those.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class CollectiveError(RuntimeError):
    """A collective or point-to-point operation failed or timed out on this rank."""


def validate_layout(config: ParallelConfig, world_size: int,
                    model_config: LlamaConfig | None = None) -> tuple[int, int, int]:
    """(pp, dp, tp) for `world_size` ranks, or a ValueError saying why the layout cannot work.

    Pure: runs before any process group exists, so every rank fails the same way instead of hanging.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    tp, pp = config.tp, config.pp
    if config.dp is None:
        if world_size % (tp * pp):
            raise ValueError(f"world size {world_size} is not divisible by tp * pp = {tp} * {pp}; "
                             f"the layout needs world_size = pp * dp * tp")
        dp = world_size // (tp * pp)
    else:
        dp = config.dp
        if pp * dp * tp != world_size:
            raise ValueError(f"world size {world_size} != pp * dp * tp = {pp} * {dp} * {tp} = {pp * dp * tp}; "
                             f"launch {pp * dp * tp} processes or change the layout")
    if model_config is not None:
        c = model_config
        if c.num_attention_heads % tp:
            raise ValueError(f"num_attention_heads={c.num_attention_heads} is not divisible by tp={tp}")
        g = c.num_key_value_heads
        if g % tp and tp % g:
            raise ValueError(f"num_key_value_heads={g} and tp={tp}: one must divide the other (kv heads are "
                             f"split when tp <= {g}, replicated tp/{g} times when tp > {g})")
        if c.intermediate_size % tp:
            raise ValueError(f"intermediate_size={c.intermediate_size} is not divisible by tp={tp}")
        chunks = pp * config.virtual_stages
        if chunks > c.num_hidden_layers:
            raise ValueError(f"pp * virtual_stages = {pp} * {config.virtual_stages} = {chunks} pipeline chunks "
                             f"but the model has only {c.num_hidden_layers} layers (each chunk needs >= 1)")
        if config.stage_layers is not None and sum(config.stage_layers) != c.num_hidden_layers:
            raise ValueError(f"ParallelConfig.stage_layers={config.stage_layers} sums to {sum(config.stage_layers)}, "
                             f"the model has {c.num_hidden_layers} layers")
        if config.checkpoint_layers is not None and any(i >= c.num_hidden_layers for i in config.checkpoint_layers):
            raise ValueError(f"ParallelConfig.checkpoint_layers={config.checkpoint_layers} names a layer >= "
                             f"num_hidden_layers={c.num_hidden_layers}")
    return pp, dp, tp


class _Pending:
    """An async collective's handle whose wait() reports failures like the sync path."""

    def __init__(self, axis: "Axis", what: str, works: list):
        self.axis, self.what, self.works = axis, what, works

    def wait(self) -> None:
        for w in self.works:
            self.axis._guard(self.what, w.wait)
        self.works = []


@dataclass(eq=False)
class Axis:
    """One mesh axis as seen from this rank: its size, this rank's index on it and its group."""

    name: str
    size: int
    rank: int
    ranks: tuple[int, ...]  # global ranks of this rank's group, in axis order
    group: object = None  # None when size == 1 (no collective is ever issued)
    mesh: "ParallelMesh" = field(default=None, repr=False)

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def _guard(self, what: str, fn):
        try:
            return fn()
        except Exception as e:  # backend errors are RuntimeError/DistBackendError; keep the cause chained
            m = self.mesh
            raise CollectiveError(
                f"rank {m.rank} (pp={m.pp_rank}, dp={m.dp_rank}, tp={m.tp_rank}): {what} over the {self.name} "
                f"axis (ranks {list(self.ranks)}) failed (timeout {m.timeout_s:g}s): {e}") from e

    def _run(self, what: str, op, async_op: bool):
        if async_op:
            work = self._guard(what, lambda: op(async_op=True))
            return _Pending(self, what, [work])
        self._guard(what, lambda: op(async_op=False))
        return None

    def all_reduce(self, t: torch.Tensor, *, op=dist.ReduceOp.SUM, async_op: bool = False, what: str = "all_reduce"):
        if self.size == 1:
            return _Pending(self, what, []) if async_op else None
        return self._run(what, lambda async_op: dist.all_reduce(t, op=op, group=self.group, async_op=async_op),
                         async_op)

    def all_gather_into(self, out: torch.Tensor, inp: torch.Tensor, *, async_op: bool = False,
                        what: str = "all_gather"):
        """out (size * n,) <- every rank's inp (n,), concatenated in axis order along dim 0."""
        if self.size == 1:
            if out.data_ptr() != inp.data_ptr():
                out.copy_(inp)
            return _Pending(self, what, []) if async_op else None
        return self._run(what, lambda async_op: _all_gather_flat(out, inp, group=self.group,
                                                                     async_op=async_op), async_op)

    def reduce_scatter_into(self, out: torch.Tensor, inp: torch.Tensor, *, async_op: bool = False,
                            what: str = "reduce_scatter"):
        """out (n,) <- the sum over ranks of this rank's chunk of inp (size * n,)."""
        if self.size == 1:
            if out.data_ptr() != inp.data_ptr():
                out.copy_(inp)
            return _Pending(self, what, []) if async_op else None
        return self._run(what, lambda async_op: _reduce_scatter_flat(out, inp, group=self.group,
                                                                        async_op=async_op), async_op)

    def barrier(self, what: str = "barrier") -> None:
        if self.size > 1:
            # An all-reduce of one element, not dist.barrier: it honours the group's timeout on every backend.
            self.all_reduce(torch.zeros(1, device=self.mesh.device), what=what)


class ParallelMesh:
    """Axes pp, dp, tp (+ world, the kv-head replica groups and the tied-embedding groups)."""

    def __init__(self, config: ParallelConfig, model_config: LlamaConfig | None = None, *,
                 rank: int = 0, world_size: int = 1, device: torch.device | str = "cpu"):
        self.config = config
        self.pp_size, self.dp_size, self.tp_size = validate_layout(config, world_size, model_config)
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.backend = (dist.get_backend() if world_size > 1 and dist.is_initialized() else
                        config.backend or ("nccl" if self.device.type == "cuda" else "gloo"))
        self.timeout_s = float(config.timeout_s)
        tp, dp = self.tp_size, self.dp_size
        self.tp_rank = rank % tp
        self.dp_rank = (rank // tp) % dp
        self.pp_rank = rank // (tp * dp)
        if world_size > 1 and not dist.is_initialized():
            raise RuntimeError("ParallelMesh with world_size > 1 needs torch.distributed initialized first "
                               "(use ParallelMesh.from_env under torchrun)")
        timeout = datetime.timedelta(seconds=self.timeout_s)
        # kv heads: split across tp when tp <= G, else each replicated over tp // G neighbouring tp ranks.
        g = model_config.num_key_value_heads if model_config is not None else tp
        self.kv_replicas = tp // g if tp > g else 1
        tied = bool(model_config is not None and model_config.tie_word_embeddings)

        def families():
            # Every group of every axis, in one fixed order: new_group must be called by all ranks alike.
            P, D, T = self.pp_size, self.dp_size, self.tp_size
            r = self.global_rank
            yield "pp", [[r(p, d, t) for p in range(P)] for d in range(D) for t in range(T)]
            yield "dp", [[r(p, d, t) for d in range(D)] for p in range(P) for t in range(T)]
            yield "tp", [[r(p, d, t) for t in range(T)] for p in range(P) for d in range(D)]
            k = self.kv_replicas
            yield "kv", [[r(p, d, t) for t in range(j * k, (j + 1) * k)]
                         for p in range(P) for d in range(D) for j in range(T // k)]
            yield "embed", ([[r(0, d, t), r(P - 1, d, t)] for d in range(D) for t in range(T)]
                            if tied and P > 1 else [[r(0, d, t)] for d in range(D) for t in range(T)])
            yield "world", [list(range(world_size))]

        self.axes: dict[str, Axis] = {}
        for name, groups in families():
            mine = next((g for g in groups if rank in g), [rank])
            handle = None
            for ranks in groups:
                if len(ranks) > 1 and world_size > 1:
                    h = dist.new_group(ranks, timeout=timeout) if name != "world" else dist.group.WORLD
                    if ranks == mine:
                        handle = h
            self.axes[name] = Axis(name, len(mine), mine.index(rank), tuple(mine), handle, self)

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def from_env(cls, config: ParallelConfig, model_config: LlamaConfig | None = None, *,
                 device: str | torch.device | None = None) -> "ParallelMesh":
        """The mesh of a torchrun launch (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
        environment). Validates the layout before touching the network; world size 1 without torchrun
        needs no process group."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        validate_layout(config, world, model_config)  # fail fast, identically on every rank
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", local)  # one GPU a process, picked by torchrun's local rank
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = config.backend or ("nccl" if device.type == "cuda" else "gloo")
        if backend == "nccl" and device.type != "cuda":
            raise ValueError(f"ParallelConfig.backend='nccl' needs a CUDA device, got device={device}")
        if world > 1 and not dist.is_initialized():
            kw = {"device_id": device} if device.type == "cuda" else {}
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=config.timeout_s), **kw)
        if dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        return cls(config, model_config, rank=rank, world_size=world, device=device)

    def global_rank(self, pp_rank: int, dp_rank: int, tp_rank: int) -> int:
        return (pp_rank * self.dp_size + dp_rank) * self.tp_size + tp_rank

    def destroy(self) -> None:
        """Frees this mesh's subgroups (the default group stays: the launcher owns it)."""
        if self.world_size > 1 and dist.is_initialized():
            seen = set()
            for ax in self.axes.values():
                if ax.group is not None and ax.name != "world" and id(ax.group) not in seen:
                    seen.add(id(ax.group))
                    dist.destroy_process_group(ax.group)
        self.axes = {}

    # ---- axes and predicates -------------------------------------------------------------------------
    @property
    def pp(self) -> Axis:
        return self.axes["pp"]

    @property
    def dp(self) -> Axis:
        return self.axes["dp"]

    @property
    def tp(self) -> Axis:
        return self.axes["tp"]

    @property
    def kv(self) -> Axis:
        """The tp ranks holding the same replicated kv head (size 1 unless tp > num_key_value_heads)."""
        return self.axes["kv"]

    @property
    def embed(self) -> Axis:
        """The first and last pipeline stage of this (dp, tp) column when the embeddings are tied."""
        return self.axes["embed"]

    @property
    def world(self) -> Axis:
        return self.axes["world"]

    @property
    def pp_enabled(self) -> bool:
        return self.pp_size > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp_size > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def stage_global_rank(self, pp_rank: int) -> int:
        """Global rank of pipeline stage `pp_rank` in this rank's (dp, tp) column."""
        return self.global_rank(pp_rank, self.dp_rank, self.tp_rank)

    def describe(self) -> str:
        return (f"rank {self.rank}/{self.world_size}: pp {self.pp_rank}/{self.pp_size}, dp {self.dp_rank}/"
                f"{self.dp_size}, tp {self.tp_rank}/{self.tp_size}")

    def __repr__(self) -> str:
        return f"ParallelMesh(pp={self.pp_size}, dp={self.dp_size}, tp={self.tp_size}, rank={self.rank})"
