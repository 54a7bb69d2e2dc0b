"""Learning-rate schedule: linear warmup, then cosine decay to a floor (GPT-3, Chinchilla, Llama).

The schedule is a pure function of the step, so a checkpoint's step number is the whole scheduler state.
"""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """LR of optimizer step `step` (0-based) of `total_steps`.

    Warmup: lr * (step + 1) / warmup_steps for the first warmup_steps steps (the first step already
    moves; step warmup_steps - 1 reaches lr). Then cosine from lr to min_lr, reaching min_lr at the
    last step.
    """
    if step < 0 or total_steps <= 0:
        raise ValueError(f"step={step}, total_steps={total_steps}: expected step >= 0, total_steps > 0")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = total_steps - warmup_steps - 1
    if decay_steps <= 0:
        return lr
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
