"""ParallelEngine: the trainer's Engine protocol (flashscale.train.engine) over a (pp, dp, tp) mesh.

Applied to a built single-device Llama from outside, in this order:
  1. mesh       layout validated against the world size and the model, process groups per axis
  2. pipeline   the layers split into pp * virtual_stages chunks; this rank keeps its chunks (others freed)
  3. tensor     Megatron TP (+ sequence parallelism) on the kept modules, slicing the full weights
  4. placement  onto this rank's device, still float32
  5. data       ZeRO units: flat buffers in the compute dtype (bf16 on GPU) cast from exact fp32
                masters, reduction hooks, AdamW on this rank's shard
  6. schedule   per micro-batch count, the pipeline plan (pipeline.build_plan), cached

A step: micro-batches through the pipeline schedule (each loss scaled by 1/(m * dp), so the dp sum of
gradients is the global-batch mean), reductions overlapped with backward, partial-gradient sums,
one world all-reduce of [loss, squared grad norm], clipping as torch.nn.utils.clip_grad_norm_ does,
AdamW on the shard, masters rounded into the parameters. World size 1 runs exactly this code; every
collective returns early at axis size 1.
"""

from __future__ import annotations

from pathlib import Path

import torch

from flashscale.models.config import LlamaConfig
from flashscale.models.llama import Llama
from flashscale.parallel import checkpoint as pckpt
from flashscale.parallel.config import ParallelConfig
from flashscale.parallel.data import FlatUnit, ZeroData
from flashscale.parallel.loss import vocab_parallel_cross_entropy
from flashscale.parallel.mesh import ParallelMesh
from flashscale.parallel.pipeline import (Action, PipelineExecutor, build_plan, explicit_partition, partition_layers,
                                          schedule_orders)
from flashscale.parallel.stage import PipelineStage
from flashscale.parallel.tensor import apply_tensor_parallel
from flashscale.train.engine import OptimConfig, resolve_dtype

__all__ = ["ParallelConfig", "ParallelEngine", "parallel_engine_factory"]


class ParallelEngine:
    """model_config: the Llama to train. model: an initialized full Llama (float32, CPU) to start from
    (e.g. the trainer's, or models.checkpoint.load_hf's); None: built here with init_weights(seed).
    mesh: None -> ParallelMesh.from_env (torchrun). dtype: compute dtype ("bfloat16" on GPU); masters
    and AdamW states are float32 either way; gradients as parallel_config.grad_dtype says."""

    def __init__(self, model_config: LlamaConfig, parallel_config: ParallelConfig | None = None,
                 optim_config: OptimConfig | None = None, *, model: Llama | None = None,
                 mesh: ParallelMesh | None = None, seed: int = 0, device: str | torch.device | None = None,
                 dtype: str | torch.dtype = "float32"):
        if not isinstance(model_config, LlamaConfig):
            raise TypeError(f"model_config must be a LlamaConfig, got {type(model_config).__name__}")
        self.model_config = model_config
        self.config = pc = parallel_config if parallel_config is not None else ParallelConfig()
        if not isinstance(pc, ParallelConfig):
            raise TypeError(f"parallel_config must be a ParallelConfig, got {type(pc).__name__}")
        self.optim_config = optim_config if optim_config is not None else OptimConfig()
        self.dtype = resolve_dtype(dtype)
        self.grad_dtype = self.dtype if pc.grad_dtype == "param" else torch.float32
        if model is not None and model.config.to_hf_dict() != model_config.to_hf_dict():
            raise ValueError("model.config differs from model_config")
        # 1. mesh
        self.mesh = mesh if mesh is not None else ParallelMesh.from_env(pc, model_config, device=device)
        m = self.mesh
        self.device = m.device
        # 2. pipeline split (the full model is built/given on the CPU in float32; this rank keeps its part)
        if model is None:
            model = Llama(model_config).init_weights(seed)
        ckpt_mode = pc.activation_checkpointing
        if ckpt_mode == "none":
            ckpt_mode = getattr(model, "activation_checkpointing", "none")
        parts = explicit_partition(pc.stage_layers) if pc.stage_layers else partition_layers(model_config, pc.num_chunks)
        self.partition = parts
        mine = [(c, parts[c]) for c in range(pc.num_chunks) if c % m.pp_size == m.pp_rank]
        stage = PipelineStage(model, mine, pc.num_chunks)
        del model
        # 3. tensor (+ sequence) parallel
        sp = pc.sequence_parallel and m.tp_size > 1
        specs = apply_tensor_parallel(stage, m, sequence_parallel=sp, tied_head_copy=stage.tied_head_copy)
        stage.sequence_parallel, stage.tp_size = sp, m.tp_size
        stage.checkpointing = ckpt_mode
        stage.checkpoint_layers = set(pc.checkpoint_layers) if pc.checkpoint_layers is not None else None
        # 4. placement (float32 still: the ZeRO units keep these exact values as masters and cast the
        # compute copy; buffers such as RoPE's inv_freq stay float32)
        stage.to(self.device)
        # 5. ZeRO units (forward order of hook keys, chunk by chunk: ZeRO-3 prefetches along it)
        order = [stage.unit_keys(c) for c in range(len(stage.chunk_ids))]
        keys = [k for ks in order for k in ks]
        groups = {k: stage.unit_params(k) for k in keys}
        alias, uses = {}, {}
        if stage.has_embed and stage.has_head and model_config.tie_word_embeddings:
            # One parameter used by the first and the last unit: one unit holding both (pp == 1). With
            # virtual stages they sit in different chunks, run by separate backward calls: it then
            # accumulates twice a micro-batch.
            groups.pop("embed")  # the head's unit holds the shared weight (named embed_tokens.weight)
            keys.remove("embed")
            alias = {"embed": "head"}
            uses = {"embed_tokens.weight": 2 if pc.num_chunks > 1 else 1}
        units = [FlatUnit(k, groups[k], specs, m, pc.zero, self.dtype, self.grad_dtype, uses) for k in keys]
        self.zero_data = ZeroData(units, m, zero=pc.zero, optim_config=self.optim_config,
                                  forward_order=order, prefetch=pc.zero3_prefetch, alias=alias)
        if pc.zero >= 2:
            stage.hooks = self.zero_data
        self.model = stage
        self._plans: dict[int, list] = {}
        # NCCL creates a group's communicator at its first call, which must then involve every rank of
        # the group; the pipeline's first batched send/recv involves two. A collective on it first.
        m.pp.barrier("pipeline group warm-up")

    # ------------------------------------------------------------------------------------- layout
    @property
    def dp_rank(self) -> int:
        return self.mesh.dp_rank

    @property
    def dp_size(self) -> int:
        return self.mesh.dp_size

    def layout(self) -> dict:
        c = self.config
        return {"pp": self.mesh.pp_size, "dp": self.mesh.dp_size, "tp": self.mesh.tp_size, "zero": c.zero,
                "schedule": c.schedule, "virtual_stages": c.virtual_stages, "partition": self.partition,
                "sequence_parallel": c.sequence_parallel, "dtype": str(self.dtype).removeprefix("torch.")}

    def optimizer_step(self) -> int:
        for st in self.zero_data.optimizer.state.values():
            if "step" in st:
                return int(st["step"])
        return 0

    def barrier(self) -> None:
        self.mesh.world.barrier("engine barrier")

    def _plan(self, m: int):
        if m not in self._plans:
            pc = self.config
            orders = schedule_orders(pc.schedule, self.mesh.pp_size, pc.virtual_stages, m)
            self._plans[m] = build_plan(orders, pc.num_chunks)[self.mesh.pp_rank]
        return self._plans[m]

    def _autocast(self):
        if self.dtype == torch.float32:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.dtype)

    def _check_batch(self, x: torch.Tensor, y: torch.Tensor, m: int) -> None:
        if x.dim() != 2 or x.shape != y.shape:
            raise ValueError(f"x and y must be (batch, seq_len) of one shape; got {tuple(x.shape)}, {tuple(y.shape)}")
        if not isinstance(m, int) or m < 1 or x.shape[0] % m:
            raise ValueError(f"micro_batches={m!r} must be a positive int dividing this rank's batch of {x.shape[0]}")
        if self.model.sequence_parallel and x.shape[1] % self.mesh.tp_size:
            raise ValueError(f"sequence parallelism needs seq_len divisible by tp={self.mesh.tp_size}, got {x.shape[1]}")

    # ---------------------------------------------------------------------------------------- run
    def _run(self, x: torch.Tensor, y: torch.Tensor, m: int, *, train: bool) -> torch.Tensor:
        """Runs the pipeline over m micro-batches; returns this rank's sum of micro-batch mean losses
        (non-zero only on the last stage)."""
        stage, mesh = self.model, self.mesh
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        xs, ys = x.chunk(m), y.chunk(m)
        seq = x.shape[1]
        scale = 1.0 / (m * mesh.dp_size)
        saved: dict = {}
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        last = stage.num_chunks - 1
        v0, v1 = stage.vocab_range

        def forward(c, mb, inp):
            nonlocal total
            cid = stage.chunk_ids[c]
            if cid == 0:
                inp = xs[mb]
            elif train:
                inp = inp.detach().requires_grad_()
            with self._autocast():
                out = stage.forward_chunk(c, inp, seq, ids=xs[mb])
            if cid == last:
                loss = vocab_parallel_cross_entropy(out, ys[mb], vocab_start=v0, vocab_stop=v1, axis=mesh.tp)
                total = total + loss.detach()
                if train:
                    saved[(c, mb)] = (inp, loss * scale)
                return None
            if train:
                saved[(c, mb)] = (inp, out)
            return out

        def backward(c, mb, grad):
            inp, out = saved.pop((c, mb))
            torch.autograd.backward(out, grad)
            return inp.grad if stage.chunk_ids[c] != 0 else None

        b_mb = x.shape[0] // m
        s_local = seq // mesh.tp_size if stage.sequence_parallel else seq
        plan = self._plan(m) if train else self._forward_plan(m)
        PipelineExecutor(mesh, plan, stage.chunk_ids).run(
            forward, backward, activation_shape=(b_mb, s_local, self.model_config.hidden_size),
            dtype=self.dtype, device=self.device)
        return total

    def _forward_plan(self, m: int):
        key = -m
        if key not in self._plans:
            p, v = self.mesh.pp_size, self.config.virtual_stages  # forward only: micro-batch by micro-batch
            orders = [[Action("F", k * p + r, mb) for mb in range(m) for k in range(v)] for r in range(p)]
            self._plans[key] = build_plan(orders, self.config.num_chunks)[self.mesh.pp_rank]
        return self._plans[key]

    def train_step(self, x: torch.Tensor, y: torch.Tensor, *, lr: float, micro_batches: int = 1,
                   max_grad_norm: float | None = None) -> dict:
        m = self.config.micro_batches or micro_batches
        self._check_batch(x, y, m)
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm={max_grad_norm!r}: expected a float > 0 or None")
        mesh, zd = self.mesh, self.zero_data
        self.model.train()
        zd.begin_step(m)
        local_loss = self._run(x, y, m, train=True)
        zd.finish_backward()
        # One world all-reduce: the loss (counted on the last stage's tp rank 0 of every dp rank) and
        # the squared norm (each element on its owner).
        counts = mesh.is_last_stage and mesh.tp_rank == 0
        both = torch.stack([local_loss if counts else torch.zeros_like(local_loss), zd.local_grad_sq()])
        mesh.world.all_reduce(both, what="loss and gradient-norm all-reduce")
        loss = both[0] / (m * mesh.dp_size)
        norm = both[1].sqrt()
        coef = None
        if max_grad_norm is not None:  # torch.nn.utils.clip_grad_norm_'s formula, so runs compare exactly
            coef = torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0)
        zd.step(lr, coef)
        return {"loss": loss, "grad_norm": norm}

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor, micro_batches: int = 1) -> torch.Tensor:
        """Mean loss of (x, y) (the same batch on every rank); returned on every rank."""
        self._check_batch(x, y, micro_batches)
        was = self.model.training
        self.model.eval()
        try:
            local = self._run(x, y, micro_batches, train=False)
        finally:
            self.model.train(was)
        mesh = self.mesh
        counts = mesh.is_last_stage and mesh.tp_rank == 0 and mesh.dp_rank == 0
        out = local if counts else torch.zeros_like(local)
        mesh.world.all_reduce(out, what="eval loss all-reduce")
        return out / micro_batches

    # -------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """This rank's optimizer range of every unit (masters, AdamW moments): loads back only at the
        same layout. save()/load() write and read layout-independent checkpoints."""
        zd = self.zero_data
        units = {}
        for key, u in zd.units.items():
            st = [{k: zd.optimizer.state[p][k].detach().clone() for k in ("exp_avg", "exp_avg_sq")}
                  if p in zd.optimizer.state else None for *_, p in u.pieces]
            units[key] = {"master": u.master.detach().clone(), "pieces": st}
        return {"layout": self.layout(), "rank": self.mesh.rank, "step": self.optimizer_step(), "units": units}

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("layout") != self.layout() or sd.get("rank") != self.mesh.rank:
            raise ValueError(f"engine state of layout {sd.get('layout')} rank {sd.get('rank')} cannot load into "
                             f"{self.layout()} rank {self.mesh.rank}; use save()/load() to reshard")
        zd = self.zero_data
        moments = {}
        with torch.no_grad():
            for key, st in sd["units"].items():
                u = zd.units[key]
                u.master.copy_(st["master"])
                for (*_, p), ps in zip(u.pieces, st["pieces"]):
                    if ps is not None:
                        moments[p] = ps
        # through AdamW's own loader: it puts "step" where the (fused or not) implementation wants it
        opt_sd = zd.optimizer.state_dict()
        params = [p for g in zd.optimizer.param_groups for p in g["params"]]
        opt_sd["state"] = {i: {"step": torch.tensor(float(sd["step"])), **{k: v.clone() for k, v in moments[p].items()}}
                           for i, p in enumerate(params) if p in moments}
        zd.optimizer.load_state_dict(opt_sd)
        zd.masters_to_params()

    def save(self, directory: Path) -> None:
        pckpt.save_sharded(self, directory)

    def load(self, directory: Path) -> None:
        pckpt.load_into(self.zero_data, pckpt.ShardedReader(directory), self.model_config)

    def export_hf(self, out_dir: str | Path, *, dtype=None, tokenizer=None) -> None:
        """Collective: writes the trained model as an HF directory (rank 0 assembles it through a
        temporary sharded checkpoint beside out_dir, on a file system every rank shares)."""
        import shutil

        out = Path(out_dir)
        tmp = out.with_name(f".{out.name}.sharded-tmp")
        self.save(tmp)
        if self.mesh.rank == 0:
            pckpt.export_hf(tmp, out, dtype=dtype, tokenizer=tokenizer)
            shutil.rmtree(tmp, ignore_errors=True)
        self.barrier()

    def memory_bytes(self) -> dict[str, int]:
        return self.zero_data.memory_bytes()


def parallel_engine_factory(parallel_config: ParallelConfig, *, mesh: ParallelMesh | None = None):
    """An engine_factory for flashscale.train.Trainer: (model, optim_config, device=, dtype=, compile=)."""
    def factory(model, optim_config, *, device=None, dtype="float32", compile=False):
        if compile:
            raise ValueError("train.compile is not supported with the parallel engine yet")
        return ParallelEngine(model.config, parallel_config, optim_config, model=model, mesh=mesh,
                              device=device, dtype=dtype)
    return factory
