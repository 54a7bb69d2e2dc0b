"""The training loop: data, LR schedule, logging, validation and checkpoints around an Engine.

The Engine (engine.py) owns the model, the optimizer and the step; everything else is here, so the
parallel package plugs in its engine through `engine_factory` and reuses this loop unchanged.

Exact resume: the state a step depends on is the engine's (float32 master weights, AdamW moments and
step counts), the sampler's (epoch, position), the step number (the LR is a pure function of it) and
the RNG states. A checkpoint holds all of them, written atomically (checkpoint.py), so a run killed at
any moment and resumed from its newest complete checkpoint computes the same steps on the same
batches in the same order: on the CPU in float32 the per-step losses are bitwise equal (for the same
intra-op thread count); on CUDA they are equal with train.deterministic (deterministic kernels, fixed
cuBLAS workspace). A run under train.time_budget is the exception: its schedule follows the clock.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from flashscale.data.sampler import BatchSampler
from flashscale.models.config import LlamaConfig
from flashscale.models.llama import Llama, lm_loss
from flashscale.train import checkpoint as ckpt
from flashscale.train.config import Config, config_from_dict, diff
from flashscale.train.engine import Engine, OptimConfig, SingleDeviceEngine
from flashscale.train.logger import RunLogger
from flashscale.train.metrics import mfu, peak_flops, peak_memory_bytes
from flashscale.train.schedule import lr_at
from flashscale.train.setup import Data, prepare, configure_cpu, seed_everything, set_deterministic, val_batches

# engine_factory(model, optim_config, device=, dtype=, compile=) -> Engine
EngineFactory = Callable[..., Engine]


@dataclass
class TrainResult:
    steps: int  # optimizer steps completed in total (resumed runs count the earlier ones)
    steps_run: int  # of which this call ran
    tokens: int  # tokens trained on in total
    seconds: float  # wall time of this call's steps (validation and checkpoints excluded)
    tokens_per_s: float
    mfu: float | None
    loss: float | None  # mean loss of the last log interval
    val_loss: float | None
    val_ppl: float | None
    losses: list[float] = field(default_factory=list)  # per-step losses of this call, step start+1 ...
    checkpoint: Path | None = None


class Trainer:
    """Trainer(config, out_dir=...).fit(resume=None | "auto" | path) -> TrainResult.

    out_dir: log.jsonl, tensorboard/, checkpoints/ (unless checkpoint.dir), config.json.
    engine_factory: builds the engine from the initialized float32 model (default SingleDeviceEngine).
    quiet: nothing on the console (log.jsonl and TensorBoard are still written).
    on_step(step, record): called after every step with the step's {"loss", "grad_norm", "lr"};
    tests use it to kill a run at a chosen step.
    """

    def __init__(self, config: Config, *, out_dir: str | Path | None = None,
                 engine_factory: EngineFactory | None = None, progress: bool = True, quiet: bool = False,
                 rank: int = 0, world_size: int = 1, dp_rank: int | None = None, dp_size: int | None = None,
                 on_step: Callable[[int, dict], None] | None = None):
        if not isinstance(config, Config):
            raise TypeError(f"config must be a flashscale.train.config.Config, got {type(config).__name__}")
        self.config = config
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.engine_factory = engine_factory or SingleDeviceEngine
        self.progress, self.quiet = progress, quiet
        self.rank, self.world_size = rank, world_size
        # Data-parallel coordinates pick this process's share of the batch; tensor/pipeline-parallel
        # peers share a dp_rank and so see the same batch. Default: every process is a dp rank.
        self.dp_rank = rank if dp_rank is None else dp_rank
        self.dp_size = world_size if dp_size is None else dp_size
        self.is_main = rank == 0
        self.on_step = on_step
        self.data: Data | None = None
        self.model_config: LlamaConfig | None = None
        self.engine: Engine | None = None
        self.device: torch.device | None = None

    @property
    def ckpt_dir(self) -> Path | None:
        if self.config.checkpoint.dir is not None:
            return Path(self.config.checkpoint.dir).expanduser()
        return self.out_dir / "checkpoints" if self.out_dir is not None else None

    # --------------------------------------------------------------------------------------- setup
    def setup(self) -> None:
        """Data, model and engine (idempotent). Seeds before the model is initialized."""
        if self.engine is not None:
            return
        c = self.config
        if c.train.batch_size % (c.train.micro_batches * self.dp_size):
            raise ValueError(f"train.batch_size={c.train.batch_size} must be divisible by micro_batches "
                             f"({c.train.micro_batches}) x data-parallel ranks ({self.dp_size})")
        if c.checkpoint.every and self.ckpt_dir is None:
            raise ValueError("checkpoint.every > 0 needs an output directory (--out) or checkpoint.dir")
        self.device, self.data, self.model_config = prepare(c)
        if c.train.deterministic:
            set_deterministic(self.device)
        configure_cpu()
        seed_everything(c.train.seed)
        model = Llama(self.model_config).init_weights(seed=c.train.seed)
        model.activation_checkpointing = c.train.activation_checkpointing
        model.document_masking = c.train.document_masking
        optim = OptimConfig(weight_decay=c.train.weight_decay, betas=c.train.betas, eps=c.train.eps)
        self.engine = self.engine_factory(model, optim, device=self.device, dtype=c.train.dtype,
                                          compile=c.train.compile)
        self.sampler = BatchSampler(len(self.data.train), seq_len=c.data.seq_len,
                                    batch_size=c.train.batch_size // self.dp_size, seed=c.train.seed,
                                    rank=self.dp_rank, world_size=self.dp_size)
        self.val_set = val_batches(self.data.val, seq_len=c.data.seq_len,
                                   batch_size=c.train.batch_size // c.train.micro_batches,
                                   max_batches=c.log.eval_batches * c.train.micro_batches)

    @property
    def model(self) -> torch.nn.Module:
        self.setup()
        return self.engine.model

    # ------------------------------------------------------------------------------------- resume
    def _resume(self, resume: str | Path | None, log: Callable[[str], None]) -> int:
        if resume is None:
            return 0
        if str(resume) == "auto" and self.ckpt_dir is None:
            raise ValueError("resume='auto' needs an output directory (--out) or checkpoint.dir to look in")
        path = ckpt.resolve_resume(resume, self.ckpt_dir)
        if path is None:
            log(f"resume=auto: no complete checkpoint in {self.ckpt_dir} yet; starting from step 0")
            return 0
        state = ckpt.read_trainer_state(path)
        try:
            saved = config_from_dict(state["config"], where=f"{path}/{ckpt.TRAINER_FILE}")
            changed = diff(saved, self.config)
        except (KeyError, ValueError, TypeError):
            changed = ["(unreadable config)"]
        if changed:
            log(f"[yellow]resuming with config changes: {', '.join(changed)} (the loss sequence will differ "
                f"from the original run's)[/yellow]")
        self.engine.load(path / ckpt.ENGINE_DIR)
        self.sampler.load_state_dict(state["sampler"])
        ckpt.load_rng(path)
        log(f"resumed from {path} (step {state['step']})")
        return int(state["step"])

    def _save(self, step: int, tokens: int) -> Path:
        # Single writer. A multi-process engine needs every rank's engine.save into the same temporary
        # folder before rank 0 renames it: flashscale.parallel wraps this with its barriers.
        state = {"tokens": tokens, "sampler": self.sampler.state_dict(), "config": self.config.to_dict(),
                 "world_size": self.world_size, "model_config": self.model_config.to_hf_dict()}
        return ckpt.save_checkpoint(self.ckpt_dir, step, save_engine=self.engine.save, trainer_state=state,
                                    keep=self.config.checkpoint.keep)

    # --------------------------------------------------------------------------------- validation
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Mean loss over the fixed validation windows, and its perplexity."""
        self.setup()
        eval_loss = getattr(self.engine, "eval_loss", None)  # a parallel engine evaluates its own way
        model = self.engine.model
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        try:
            for x, y in self.val_set:
                if eval_loss is not None:
                    loss = eval_loss(x, y)
                else:
                    loss = lm_loss(model(x.to(self.device)), y.to(self.device))
                total += float(loss) * y.numel()
                count += y.numel()
        finally:
            model.train(was_training)
        mean = total / count
        return {"val_loss": mean, "val_ppl": math.exp(min(mean, 80.0))}

    # ---------------------------------------------------------------------------------------- fit
    def fit(self, resume: str | Path | None = None) -> TrainResult:
        self.setup()
        c, t = self.config, self.config.train
        if self.is_main and self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "config.json").write_text(_json(self.config.to_dict()))
        if self.is_main and self.ckpt_dir is not None:
            ckpt.clear_incomplete(self.ckpt_dir)
        notes: list[str] = []
        start = self._resume(resume, notes.append)
        tokens_per_step = t.batch_size * c.data.seq_len
        peak = peak_flops(self.device)
        peak = peak * self.world_size if peak is not None else None  # MFU of the whole job
        flops_per_token = self.model_config.flops_per_token(c.data.seq_len)
        logger = RunLogger(self.out_dir, jsonl=c.log.jsonl, tensorboard=c.log.tensorboard, total_steps=t.steps,
                           start_step=start, progress=self.progress, enabled=self.is_main, quiet=self.quiet)
        result = TrainResult(steps=start, steps_run=0, tokens=start * tokens_per_step, seconds=0.0,
                             tokens_per_s=0.0, mfu=None, loss=None, val_loss=None, val_ppl=None)
        pending: list[torch.Tensor] = []  # this interval's loss tensors: read once a log step (one sync)
        last_norm = None
        with logger:
            for n in notes:
                logger.note(n)
            if start >= t.steps:
                logger.note(f"checkpoint is at step {start} >= train.steps={t.steps}: nothing to train")
            t_fit, paused = time.perf_counter(), 0.0  # paused: validation and checkpoint time, not training

            def train_time() -> float:
                return time.perf_counter() - t_fit - paused

            mark, steps_interval = 0.0, 0  # training time at the last log, steps since
            planned = t.steps  # the schedule's length: train.steps, or re-estimated under a time budget
            for step in range(start, t.steps):
                if t.time_budget is not None and step - start >= 2:
                    per_step = train_time() / (step - start)
                    planned = min(t.steps, step + max(1, round((t.time_budget - train_time()) / per_step)))
                lr = lr_at(step, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps, total_steps=planned)
                x, y = self.sampler.next_batch(self.data.train)  # (B, S) each, this rank's share
                out = self.engine.train_step(x, y, lr=lr, micro_batches=t.micro_batches,
                                             max_grad_norm=t.max_grad_norm)
                done = step + 1
                pending.append(out["loss"])
                last_norm = out["grad_norm"]
                steps_interval += 1
                if self.on_step is not None:
                    self.on_step(done, {"lr": lr, **out})
                last = done == t.steps or (t.time_budget is not None and train_time() >= t.time_budget)
                if done % c.log.every == 0 or last:
                    losses = torch.stack(pending).float().cpu().tolist()  # waits for the device
                    pending.clear()
                    now = train_time()
                    tps = steps_interval * tokens_per_step / (now - mark)
                    mark, steps_interval = now, 0
                    result.losses.extend(losses)
                    rec = {"step": done, "loss": sum(losses) / len(losses), "lr": lr,
                           "grad_norm": float(last_norm), "tokens": done * tokens_per_step,
                           "tokens_per_s": tps, "mfu": mfu(flops_per_token, tps, peak),
                           "peak_mem": peak_memory_bytes(self.device), "time": time.time()}
                    logger.log(rec)
                    result.loss = rec["loss"]
                t_pause = time.perf_counter()
                if c.log.eval_every and done % c.log.eval_every == 0 and not last:
                    logger.log({"step": done, **self.validate()})
                if c.checkpoint.every and (done % c.checkpoint.every == 0 or last):
                    result.checkpoint = self._save(done, done * tokens_per_step)
                logger.advance(done, total=done if last else planned)
                paused += time.perf_counter() - t_pause
                result.steps, result.steps_run = done, result.steps_run + 1
                if last:
                    break
            result.seconds = mark
            result.tokens = result.steps * tokens_per_step
            ran_tokens = result.steps_run * tokens_per_step
            result.tokens_per_s = ran_tokens / result.seconds if result.seconds > 0 else 0.0
            result.mfu = mfu(flops_per_token, result.tokens_per_s, peak)
            val = self.validate()
            result.val_loss, result.val_ppl = val["val_loss"], val["val_ppl"]
            if result.steps_run:
                logger.log({"step": result.steps, **val})
        return result


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=1) + "\n"
