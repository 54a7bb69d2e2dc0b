"""ParallelConfig: the layout of one training run over (pp, dp, tp) and how each axis behaves.

Defaults are written once, here. Validation that needs only the config happens in __post_init__;
checks against the world size and the model (heads, layers) live in mesh.validate_layout, which runs
before any process group exists, so a bad layout fails on every rank instead of hanging.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved")
CHECKPOINTING = ("none", "full", "attention")


def _positive_int(name: str, value, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ParallelConfig.{name} must be a positive int{' or None' if allow_none else ''}, "
                         f"got {value!r}")


@dataclass(kw_only=True)
class ParallelConfig:
    # Axis sizes. dp=None: whatever the world size leaves after tp and pp (world // (tp * pp)).
    dp: int | None = None
    tp: int = 1
    pp: int = 1
    # ZeRO stage: 0 replicated optimizer, 1 sharded optimizer states, 2 + sharded gradients,
    # 3 + sharded parameters (gathered per layer just in time).
    zero: int = 1
    schedule: str = "1f1b"  # pipeline schedule: "gpipe" | "1f1b" | "interleaved"
    virtual_stages: int = 1  # model chunks per pipeline rank; > 1 only with schedule="interleaved"
    # Explicit pipeline split: layers per model chunk (pp * virtual_stages entries, each >= 1).
    # None: balanced automatically, the embedding and the head counted by their FLOPs.
    stage_layers: list[int] | None = None
    sequence_parallel: bool = False  # norms/residuals sharded along the sequence over the tp axis
    # Pipeline micro-batches per step. None: train_step's micro_batches (the trainer's accumulation).
    micro_batches: int | None = None
    activation_checkpointing: str = "none"  # "none" | "full" (whole block) | "attention" (attn only)
    # Layers (global indices) the checkpointing applies to; None: every layer ("selective per layer").
    checkpoint_layers: list[int] | None = None
    # Gradient buffers: "float32" (accumulation and reductions in fp32, as Megatron-LM does for bf16) or
    # "param" (the compute dtype: the ZeRO paper's 2-byte accounting, half the gradient memory).
    grad_dtype: str = "float32"
    backend: str | None = None  # "gloo" | "nccl"; None: nccl on CUDA, gloo on CPU
    timeout_s: float = 600.0  # a collective waiting longer raises, naming the rank and the operation
    zero3_prefetch: bool = True  # ZeRO-3: gather the next layer while this one computes

    def __post_init__(self) -> None:
        _positive_int("dp", self.dp, allow_none=True)
        _positive_int("tp", self.tp)
        _positive_int("pp", self.pp)
        _positive_int("virtual_stages", self.virtual_stages)
        _positive_int("micro_batches", self.micro_batches, allow_none=True)
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"ParallelConfig.zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"ParallelConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError(f"ParallelConfig.virtual_stages={self.virtual_stages} needs schedule='interleaved', "
                             f"got schedule={self.schedule!r}")
        if self.activation_checkpointing not in CHECKPOINTING:
            raise ValueError(f"ParallelConfig.activation_checkpointing must be one of {CHECKPOINTING}, "
                             f"got {self.activation_checkpointing!r}")
        if self.grad_dtype not in ("float32", "param"):
            raise ValueError(f"ParallelConfig.grad_dtype must be 'float32' or 'param', got {self.grad_dtype!r}")
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"ParallelConfig.backend must be 'gloo', 'nccl' or None, got {self.backend!r}")
        if not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise ValueError(f"ParallelConfig.timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        if self.stage_layers is not None:
            self.stage_layers = list(self.stage_layers)
            for n in self.stage_layers:
                if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                    raise ValueError(f"ParallelConfig.stage_layers entries must be ints >= 1, got {self.stage_layers!r}")
            if len(self.stage_layers) != self.pp * self.virtual_stages:
                raise ValueError(f"ParallelConfig.stage_layers has {len(self.stage_layers)} entries; it needs "
                                 f"pp * virtual_stages = {self.pp * self.virtual_stages}")
        if self.checkpoint_layers is not None:
            self.checkpoint_layers = list(self.checkpoint_layers)
            if any(not isinstance(i, int) or i < 0 for i in self.checkpoint_layers):
                raise ValueError(f"ParallelConfig.checkpoint_layers must be layer indices >= 0, "
                                 f"got {self.checkpoint_layers!r}")

    @property
    def num_chunks(self) -> int:
        """Model chunks over the whole pipeline (pp * virtual_stages)."""
        return self.pp * self.virtual_stages
