"""The step engine: what the trainer drives. An Engine owns the model, the optimizer and one training
step (forward, backward, gradient accumulation, clipping, AdamW); the trainer owns data, the LR
schedule, logging, evaluation and checkpoints. flashscale.parallel plugs its own engine in here.

Precision scheme of SingleDeviceEngine (one scheme, chosen for its memory arithmetic):

- dtype float32: parameters, gradients and AdamW states in float32; no autocast.
- dtype bfloat16 (mixed precision as Megatron-LM and DeepSpeed do it): the model's parameters and
  gradients are bf16 (2 + 2 bytes a parameter: bf16 matmuls read the weights directly, no per-step
  cast, and activations are bf16), while the optimizer holds a float32 master copy of every parameter
  and float32 Adam moments (4 + 8 bytes): 16 bytes a parameter, the ZeRO paper's count that the
  parallel engine shards. Why masters: a bf16 weight has 8 mantissa bits, so an update smaller than
  1/256 of the weight rounds to nothing; late in training (small LR) most updates are that small, and
  a bf16-only AdamW stalls. Micro-batch gradients are accumulated into float32 master gradients (a bf16
  running sum would lose the same bits). The step runs on the masters; the result is cast back into
  the bf16 parameters. The forward runs under torch.autocast(bf16) on CUDA and CPU alike, so the ops
  autocast keeps in float32 (softmax, log-softmax, norms, reductions) stay float32; the model's logits
  and the loss are float32.

The model handed in is cast by the engine: a float32 model given for a bf16 run keeps its exact
float32 values as the masters (no rounding at initialization).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from flashscale.models.llama import lm_loss

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@runtime_checkable
class Engine(Protocol):
    """The trainer's view of a step engine (single device here; data/tensor/pipeline parallel in
    flashscale.parallel)."""

    model: nn.Module

    def train_step(self, x: torch.Tensor, y: torch.Tensor, *, lr: float, micro_batches: int,
                   max_grad_norm: float | None) -> dict:
        """x, y (B, S) LongTensors: this rank's share of the global batch. Returns {"loss": mean loss
        over the global batch (all data-parallel ranks), "grad_norm": global gradient norm before
        clipping}, each a 0-dim float32 tensor (`.item()` waits for the device)."""
        ...

    def state_dict(self) -> dict: ...
    # Optional: eval_loss(x, y) -> 0-dim tensor, the mean loss of a batch without gradients. The trainer's
    # validation calls it when the engine has it (a sharded model cannot be called as a whole), else it
    # calls engine.model(x).

    def load_state_dict(self, sd: dict) -> None: ...

    def save(self, directory: Path) -> None:
        """Writes this rank's files (model master weights, optimizer state) into `directory`."""
        ...

    def load(self, directory: Path) -> None: ...


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW's hyper-parameters except the learning rate, which the trainer sets every step."""

    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype={dtype}: expected torch.float32 or torch.bfloat16")
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def param_groups(named: list[tuple[str, torch.Tensor]], weight_decay: float) -> list[dict]:
    """Decay matrices and embeddings; not norm weights or biases (1-D): decaying a norm's gain toward
    0 fights the normalization it exists for (GPT-3, Chinchilla, nanoGPT do the same)."""
    decay = [p for _, p in named if p.dim() >= 2]
    no_decay = [p for _, p in named if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


class SingleDeviceEngine:
    """AdamW on one device; the precision scheme is in this module's docstring.

    model: a flashscale Llama (any nn.Module whose forward(x) gives (B, S, V) logits works).
    compile: torch.compile the model's forward (CUDA; on CPU it works but rarely pays back its compile
    time).
    """

    def __init__(self, model: nn.Module, optim_config: OptimConfig | None = None, *,
                 device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                 compile: bool = False):
        self.optim_config = optim_config if optim_config is not None else OptimConfig()
        if not isinstance(self.optim_config, OptimConfig):
            raise TypeError(f"optim_config must be an OptimConfig, got {type(optim_config).__name__}")
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype)
        self.model = model
        # Named parameters (shared ones, e.g. tied embeddings, once: named_parameters deduplicates).
        self.names = [n for n, _ in model.named_parameters()]
        model.to(device=self.device)
        self.params = [p for _, p in model.named_parameters()]
        if self.dtype == torch.float32:
            _cast_params(self.params, torch.float32)
            self.masters = self.params  # the parameters are their own masters
        else:
            # Masters copied from the model as given (float32 values survive exactly), then the model is cast.
            self.masters = [p.detach().to(dtype=torch.float32, copy=True) for p in self.params]
            _cast_params(self.params, self.dtype)
        fused = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(
            param_groups(list(zip(self.names, self.masters)), self.optim_config.weight_decay),
            lr=0.0, betas=tuple(self.optim_config.betas), eps=self.optim_config.eps,
            fused=fused, foreach=None if fused else True)
        self._forward = torch.compile(model) if compile else model

    # ------------------------------------------------------------------------------------------ step
    def _spans(self, x: torch.Tensor) -> dict:
        """The document masking's cu_seqlens / positions (Llama.document_spans), computed here, outside a compiled
        forward: their count is data-dependent. {} for models without it or with it off."""
        spans = getattr(self.model, "document_spans", None)
        return spans(x) if spans is not None else {}

    def _autocast(self):
        if self.dtype == torch.float32:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.dtype)

    def train_step(self, x: torch.Tensor, y: torch.Tensor, *, lr: float, micro_batches: int = 1,
                   max_grad_norm: float | None = None) -> dict:
        if x.shape != y.shape or x.dim() != 2:
            raise ValueError(f"x and y must be (batch, seq_len) of one shape; got {tuple(x.shape)}, {tuple(y.shape)}")
        if micro_batches < 1 or x.shape[0] % micro_batches:
            raise ValueError(f"micro_batches={micro_batches} must divide the batch of {x.shape[0]} sequences")
        self.model.train()
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        mixed = self.dtype != torch.float32
        for m in self.masters:
            m.grad = None
        for p in self.params:
            p.grad = None
        total = torch.zeros((), device=self.device, dtype=torch.float32)
        for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):  # (B/m, S) each
            with self._autocast():
                logits = self._forward(xm, **self._spans(xm))  # (B/m, S, V) float32
            loss = lm_loss(logits, ym)  # equal-sized micro-batches: the mean of means is the batch mean
            (loss / micro_batches).backward()
            total += loss.detach()
            if mixed:
                self._accumulate_master_grads()
        grads = [m.grad for m in self.masters if m.grad is not None]
        if max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.masters, max_grad_norm, foreach=True)
        else:
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        if mixed:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.masters)  # round the masters into the bf16 weights
        return {"loss": total / micro_batches, "grad_norm": norm.detach().float()}

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean loss of a batch (B, S) under the training step's precision (autocast), no gradients."""
        was_training = self.model.training
        self.model.eval()
        try:
            with self._autocast():
                x = x.to(self.device)
                logits = self._forward(x, **self._spans(x))  # (B, S, V) float32
            return lm_loss(logits, y.to(self.device)).float()
        finally:
            self.model.train(was_training)

    def _accumulate_master_grads(self) -> None:
        """Adds this micro-batch's bf16 gradients into the float32 master gradients, then frees them."""
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                if p.grad is None:
                    continue
                if m.grad is None:
                    m.grad = p.grad.float()
                else:
                    m.grad.add_(p.grad)
                p.grad = None

    # ---------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """{"model": {name: float32 master tensor}, "optimizer": AdamW state}."""
        return {"model": {n: m.detach() for n, m in zip(self.names, self.masters)},
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        model_sd = sd["model"]
        missing = [n for n in self.names if n not in model_sd]
        unexpected = [n for n in model_sd if n not in self.names]
        if missing or unexpected:
            raise ValueError(f"engine state: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
        for n, m in zip(self.names, self.masters):
            t = model_sd[n]
            if tuple(t.shape) != tuple(m.shape):
                raise ValueError(f"engine state: tensor {n} has shape {tuple(t.shape)}, "
                                 f"the model wants {tuple(m.shape)}")
        with torch.no_grad():
            for n, m in zip(self.names, self.masters):
                m.copy_(model_sd[n])
            if self.dtype != torch.float32:
                torch._foreach_copy_(self.params, self.masters)
        self.optimizer.load_state_dict(sd["optimizer"])

    def save(self, directory: Path) -> None:
        """model.safetensors (float32 masters) + optimizer.pt + engine.json into `directory`."""
        from safetensors.torch import save_file

        directory = Path(directory)
        sd = self.state_dict()
        save_file({n: t.contiguous().cpu() for n, t in sd["model"].items()}, str(directory / "model.safetensors"))
        torch.save(sd["optimizer"], directory / "optimizer.pt")
        (directory / "engine.json").write_text(json.dumps(
            {"engine": type(self).__name__, "dtype": str(self.dtype).removeprefix("torch."),
             "optim": asdict(self.optim_config)}, indent=1))

    def load(self, directory: Path) -> None:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        directory = Path(directory)
        for name in ("model.safetensors", "optimizer.pt"):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"training checkpoint {directory} has no {name}")
        try:
            model_sd = load_file(str(directory / "model.safetensors"), device=str(self.device))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"training checkpoint {directory / 'model.safetensors'} is corrupt: {e}") from None
        try:
            optim_sd = torch.load(directory / "optimizer.pt", map_location=self.device, weights_only=True)
        except Exception as e:  # torch raises RuntimeError/UnpicklingError/EOFError on damage
            raise ValueError(f"training checkpoint {directory / 'optimizer.pt'} is corrupt: {e}") from None
        self.load_state_dict({"model": model_sd, "optimizer": optim_sd})


def _cast_params(params: list[nn.Parameter], dtype: torch.dtype) -> None:
    """Casts parameters in place, not buffers: RoPE's inv_freq must stay float32 (a bf16 inv_freq puts
    position errors of up to 0.4% into every rotation angle)."""
    with torch.no_grad():
        for p in params:
            if p.dtype != dtype:
                p.data = p.data.to(dtype)
