"""Uniform integer quantization of linear weights: the shared grid (scale, zero point) and RTN.

A weight W (N, K) (N output rows, K input columns, nn.Linear's layout) is cut along K into groups of
`group_size` columns (or one group: the whole row, group_size=-1). Each (row, group) gets a scale s and
an integer zero point z, and an element is stored as the code q = clamp(round(w / s) + z, 0, 2^b - 1)
and read back as (q - z) * s. This is the grid AutoGPTQ/GPTQModel and AutoAWQ use, so the codes pack
unchanged into their checkpoint formats (flashscale.quant.pack):

- asymmetric: the range [min(w, 0), max(w, 0)] spans the 2^b - 1 steps, z = round(-min / s);
- symmetric: s = 2·max|w| / (2^b - 1) and z = 2^(b-1) (the formats store a zero point either way).

Scales are rounded to float16 as soon as they are found, so what GPTQ's error feedback and the
evaluation see is exactly what the checkpoint (fp16 scales) stores.

Shapes: N output features, K input features, G group size, NG = K / G groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_BITS = (2, 3, 4, 8)
# -1 is a whole row (per-channel). Powers of two keep every group inside one GPTQ lazy block of 128
# columns or aligned to its start, which gptq.py relies on when it fits a group's grid.
SUPPORTED_GROUP_SIZES = (-1, 16, 32, 64, 128, 256, 512, 1024)
_FP16_MIN_SCALE = 2.0 ** -24  # the smallest positive float16 (subnormal): a scale never rounds to 0
_FP16_MAX = 65504.0


def check_bits(bits: int) -> int:
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits={bits!r} is not supported; takes one of {SUPPORTED_BITS}")
    return bits


def check_group_size(group_size: int, in_features: int | None = None, *, name: str = "weight") -> int:
    """Validates `group_size` (and that it divides `in_features` when given); returns the effective
    group size (in_features for -1)."""
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size not in SUPPORTED_GROUP_SIZES:
        raise ValueError(f"group_size={group_size!r} is not supported; takes one of {SUPPORTED_GROUP_SIZES} "
                         "(-1: one group per row)")
    if in_features is None:
        return group_size
    if group_size == -1:
        return in_features
    if in_features % group_size:
        raise ValueError(f"{name}: group_size={group_size} does not divide its {in_features} input features; "
                         f"use a group size that divides {in_features} or -1")
    return group_size


@dataclass(kw_only=True)
class QuantizedWeight:
    """Integer codes and their grid for one linear weight (N, K), in the GPTQ orientation.

    Dequantized: W[n, k] = (codes[n, k] - zeros[g_idx[k], n]) * scales[g_idx[k], n].
    """

    codes: torch.Tensor  # (N, K) uint8, in [0, 2^bits)
    scales: torch.Tensor  # (NG, N) float32, each value exactly a float16
    zeros: torch.Tensor  # (NG, N) int32, in [0, 2^bits] (2^bits only when read from a v1 checkpoint)
    g_idx: torch.Tensor  # (K,) int32, the group of each input column (not monotone under act-order)
    bits: int
    group_size: int  # -1: one group per row
    sym: bool

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # (N, K)

    @property
    def desc_act(self) -> bool:
        """True when g_idx is not the plain k // G layout (act-order without static groups)."""
        return not torch.equal(self.g_idx.cpu(), default_g_idx(self.shape[1], self.group_size))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.codes, self.scales, self.zeros, self.g_idx).to(dtype)

    def to(self, device) -> "QuantizedWeight":
        return QuantizedWeight(codes=self.codes.to(device), scales=self.scales.to(device),
                               zeros=self.zeros.to(device), g_idx=self.g_idx.to(device), bits=self.bits,
                               group_size=self.group_size, sym=self.sym)


def default_g_idx(in_features: int, group_size: int) -> torch.Tensor:
    """(K,) int32 k // G (all zeros for a whole-row group)."""
    g = in_features if group_size == -1 else group_size
    return (torch.arange(in_features) // g).to(torch.int32)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """codes (N, K), scales/zeros (NG, N), g_idx (K,) -> float32 (N, K).

    (q - z) is a small integer and s a float16 value, so the float32 product is exact: the result is
    the same to the bit whatever order or precision a reader multiplies in, once rounded to fp16.
    """
    g = g_idx.long()
    s = scales.float()[g].t()  # (N, K)
    z = zeros.float()[g].t()
    return (codes.float() - z) * s


def grid(w: torch.Tensor, *, bits: int, sym: bool, v1_zeros: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid of each row of `w` (..., G) over its last dim -> scale (...) float32, zero (...) float32
    (an integer value).

    v1_zeros: keep the zero point >= 1 (asymmetric only), because the GPTQ v1 layout stores zero - 1
    and a 0 would wrap (AutoGPTQ writes 0xFFFFFFFF into the whole word). A row that would get z = 0
    (all its values >= 0 up to rounding) is given z = 1 and the scale that still reaches its maximum.
    """
    maxq = 2 ** bits - 1
    w = w.float()
    zero_t = torch.zeros((), device=w.device)
    xmin = torch.minimum(w.amin(-1), zero_t)  # the range always holds 0, so z is a valid code
    xmax = torch.maximum(w.amax(-1), zero_t)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    empty = (xmin == 0) & (xmax == 0)  # an all-zero row: any grid reads back zeros; AutoGPTQ's choice
    xmin = torch.where(empty, -1.0, xmin)
    xmax = torch.where(empty, 1.0, xmax)
    scale = (xmax - xmin) / maxq
    if sym:
        zero = torch.full_like(scale, (maxq + 1) / 2)
    else:
        zero = torch.round(-xmin / scale)
        if v1_zeros:
            low = zero < 1
            scale = torch.where(low, xmax / (maxq - 1), scale)
            zero = torch.where(low, torch.ones_like(zero), zero)
    scale = round_scale(scale)
    return scale, zero


def grid_mse(w: torch.Tensor, *, bits: int, sym: bool, v1_zeros: bool = False, norm: float = 2.4,
             steps: int = 100, max_shrink: float = 0.8, col_weight: torch.Tensor | None = None,
             chunk_elements: int = 1 << 25) -> tuple[torch.Tensor, torch.Tensor]:
    """`grid` with the range shrink search of the GPTQ reference quantizer (`Quantizer(mse=True)`):
    the range [min, max] scaled by p = 1, 1 - 1/steps, ... down to 1 - max_shrink (exclusive), keeping
    per row the p with the least Σ |q(w) - w|^norm (each column's term times col_weight, broadcast
    against w's trailing dims, when given); ties keep the larger p. Same return as `grid`; p = 1 is
    `grid` itself, so the search never scores worse than plain min/max on that error.

    The candidates are scored in batches of about chunk_elements / w.numel() at once: GPTQ fits a grid
    at every group boundary, and one small kernel launch per candidate made that the slow part on a GPU
    (SmolLM2 4-bit g64: 27 -> 127 s with 79 candidates a fit, 2026-12-01)."""
    w = w.float()
    cw = None if col_weight is None else col_weight.to(w.device, torch.float32)
    ps = [1.0 - i / steps for i in range(int(max_shrink * steps))]  # p = 1 first: `grid` itself
    per = max(1, chunk_elements // max(1, w.numel()))
    best = best_scale = best_zero = None
    for c0 in range(0, len(ps), per):
        p = torch.tensor(ps[c0:c0 + per], device=w.device, dtype=torch.float32).view(-1, *([1] * w.ndim))
        # the range of p·w is p·[min, max]: its grid is the shrunk one, rounded as `grid` rounds
        scale, zero = grid(w[None] * p, bits=bits, sym=sym, v1_zeros=v1_zeros)  # (P, ...)
        e = (fake_quantize(w[None], scale[..., None], zero[..., None], bits) - w[None]).abs().pow(norm)
        err = (e if cw is None else e * cw).sum(-1)  # (P, ...)
        val, idx = err.min(0)  # the first (largest p) of equal errors
        sc, ze = scale.gather(0, idx[None])[0], zero.gather(0, idx[None])[0]
        if best is None:
            best, best_scale, best_zero = val, sc, ze
        else:
            better = val < best
            best = torch.where(better, val, best)
            best_scale = torch.where(better, sc, best_scale)
            best_zero = torch.where(better, ze, best_zero)
    return best_scale, best_zero


def round_scale(scale: torch.Tensor) -> torch.Tensor:
    """float32 -> the nearest float16 value (kept in float32), clamped away from 0 and overflow."""
    if not bool(torch.isfinite(scale).all()) or float(scale.max()) > _FP16_MAX:
        raise ValueError(f"a quantization scale of {float(scale.max()):.4g} does not fit in float16 "
                         "(weights larger than ~1e6 in magnitude, or NaN/Inf)")
    return scale.clamp_min(_FP16_MIN_SCALE).half().float()


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """w (..., G), scale/zero broadcastable to it -> float codes clamp(round(w / s) + z, 0, 2^b - 1)."""
    return torch.clamp(torch.round(w / scale) + zero, 0, 2 ** bits - 1)


def fake_quantize(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Quantize and read back: (q - z) * s, float32."""
    return (quantize_codes(w.float(), scale, zero, bits) - zero) * scale


def fake_quantize_groups(w: torch.Tensor, *, bits: int, group_size: int, sym: bool) -> torch.Tensor:
    """RTN round trip of w (N, K) with its own per-group grid -> float32 (N, K). AWQ's inner loop."""
    n, k = w.shape
    g = check_group_size(group_size, k)
    wg = w.float().reshape(n, k // g, g)  # (N, NG, G)
    scale, zero = grid(wg, bits=bits, sym=sym)
    return fake_quantize(wg, scale[..., None], zero[..., None], bits).reshape(n, k)


def check_finite(w: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(w).all()):
        bad = int((~torch.isfinite(w)).sum())
        raise ValueError(f"{name}: the weight holds {bad} NaN/Inf value(s); refusing to quantize it")


def quantize_rtn(weight: torch.Tensor, *, bits: int, group_size: int, sym: bool, v1_zeros: bool = False,
                 name: str = "weight") -> QuantizedWeight:
    """Round-to-nearest of a linear weight (N, K) with a grid per (row, group)."""
    check_bits(bits)
    if weight.ndim != 2:
        raise ValueError(f"{name}: takes a 2-D (out_features, in_features) weight, got shape {tuple(weight.shape)}")
    n, k = weight.shape
    g = check_group_size(group_size, k, name=name)
    check_finite(weight, name)
    wg = weight.float().reshape(n, k // g, g)  # (N, NG, G)
    scale, zero = grid(wg, bits=bits, sym=sym, v1_zeros=v1_zeros)  # (N, NG)
    codes = quantize_codes(wg, scale[..., None], zero[..., None], bits).reshape(n, k)
    return QuantizedWeight(codes=codes.to(torch.uint8), scales=scale.t().contiguous(),
                           zeros=zero.t().to(torch.int32).contiguous(), g_idx=default_g_idx(k, group_size).to(weight.device),
                           bits=bits, group_size=group_size, sym=sym)
