"""Throughput and hardware metrics: tokens/s, model FLOPs utilization (MFU), peak memory.

MFU follows PaLM (appendix B): achieved model FLOPs / peak FLOPs, with the training FLOPs per token
6N + 12·L·h·s (LlamaConfig.flops_per_token). Recomputation (activation checkpointing) is not counted:
MFU measures useful work, not work done.
"""

from __future__ import annotations

import resource
import sys

import torch

# Dense bf16 tensor-core peak (no sparsity) by device-name fragment, first match wins.
# H100/H200 SXM: 989.4 TFLOP/s (NVIDIA datasheets); A100: 312.
PEAK_BF16_FLOPS = (("H200", 989e12), ("H100", 989e12), ("GH200", 989e12), ("A100", 312e12))


def peak_flops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> float | None:
    """The device's dense peak FLOP/s for `dtype` matmuls, or None when unknown (CPU, other GPUs)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, flops in PEAK_BF16_FLOPS:
        if fragment in name:
            # Hopper/Ampere run float32 matmuls at the TF32 rate at best, half of bf16: report MFU
            # against the bf16 peak anyway (the convention), so fp32 runs read honestly low.
            return flops
    return None


def mfu(flops_per_token: float, tokens_per_s: float, peak: float | None) -> float | None:
    if peak is None or tokens_per_s <= 0:
        return None
    return flops_per_token * tokens_per_s / peak


def peak_memory_bytes(device: torch.device | str) -> int:
    """Peak memory so far: CUDA's max allocated on a GPU, the process's peak RSS on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # macOS reports bytes, Linux KiB


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt_mfu(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
