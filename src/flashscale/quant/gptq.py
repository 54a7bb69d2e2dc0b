"""GPTQ (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers"): quantize a linear weight column by column, feeding each column's rounding error into
the columns not yet quantized through the inverse Hessian of the layer's reconstruction loss.

For the loss ||W X - Q X||² over calibration inputs X (K, tokens) the Hessian is H = 2 X Xᵀ, shared by
every output row, so rows are independent given H: layers that read the same input (q/k/v, gate/up)
can be quantized in one call on their concatenated rows, which is how the runner does it.

Algorithm (the paper's Algorithm 1, with AutoGPTQ's conventions where the paper leaves a choice):
- dead inputs (H_ii = 0, a column no calibration token ever activates): H_ii := 1 and the column of W is
  set to 0, since nothing measured depends on it;
- dampening λ = percdamp · mean(diag H) added to the diagonal; if a Cholesky factorization fails, retry
  with a larger λ (×10 each time, up to λ = mean(diag H)), then a ValueError naming the layer;
- U = Cholesky(H⁻¹) upper, so row i of U holds the update coefficients of column i (eq. 5 of the paper);
- lazy batches of `block_size` columns: errors update the rest of the block at once, the columns to the
  right of the block with one GEMM per block;
- act-order: columns in order of descending diag(H) (most activated first); g_idx records each
  column's group. Groups are contiguous in quantization order unless static_groups, which fits every
  group's grid on the original columns before any update (g_idx = k // G, cheaper to serve).

A group's grid is fitted when its first column comes up, on the columns as updated so far (inside the
current lazy block, from the block's running copy: the reference implementation reads the stale matrix
there, a small deviation from the paper it did not intend).

Shapes: N output rows, K input columns, T tokens, B the lazy block size.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

import torch
from torch import nn

from flashscale.quant.rtn import (QuantizedWeight, check_bits, check_finite, check_group_size, grid,
                                  grid_mse, quantize_codes)

GRID_SEARCHES = ("minmax", "mse", "hessian")
DAMP_GROWTH = 10.0  # each retry multiplies the dampening by this, up to the mean diagonal itself


class HessianAccumulator:
    """Running H = 2/T Σ x xᵀ over every input row seen, in float32 (T: tokens so far).

    The running mean keeps H's magnitude independent of the sample count (only its conditioning matters
    to GPTQ, as the dampening is relative), and float32 accumulation keeps bf16 activations exact enough.
    bf16/fp16 activations on a GPU are multiplied on TF32 tensor cores: TF32 holds their 7/10 mantissa bits
    exactly, so the products and the float32 sums are those of a float32 GEMM, at ~8x its speed (the
    down_proj Hessian of an 8B block is 108 TFLOP: ~2 s in float32). Per-token weights are applied in
    float32 first, so that factor alone is rounded to TF32's 10 bits (relative 2^-11).
    With `cross=True` it also keeps R = 2/T Σ (x_f - x) xᵀ, x_f the float model's input for the same
    token (add_batch's x_float): what gptq_quantize's `shift` takes to aim at the float outputs.
    """

    def __init__(self, in_features: int, *, device=None, name: str = "layer", cross: bool = False):
        self.name = name
        self.in_features = in_features
        self.H = torch.zeros(in_features, in_features, dtype=torch.float32, device=device)  # (K, K)
        self.R = torch.zeros_like(self.H) if cross else None  # (K, K): rows index x_f - x, columns x
        self.nsamples = 0

    def add_batch(self, x: torch.Tensor, weight: torch.Tensor | None = None,
                  x_float: torch.Tensor | None = None) -> None:
        """x (..., K): every leading index is one input row (a token). weight (...), optional: a
        non-negative weight per token, H += 2/T Σ w_t x_t x_tᵀ (T still counts tokens, so weights of
        mean 1 keep H's scale; api.py weights k/v's tokens by the attention they receive).
        x_float (..., K): the float model's input for the same tokens (required with cross=True)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{self.name}: input has {x.shape[-1]} features, expected {self.in_features}")
        if weight is not None and weight.shape != x.shape[:-1]:
            raise ValueError(f"{self.name}: token weights of shape {tuple(weight.shape)} do not match the "
                             f"input's tokens {tuple(x.shape[:-1])}")
        if (x_float is None) != (self.R is None):
            raise ValueError(f"{self.name}: x_float is given exactly when the accumulator has cross=True")
        if x_float is not None and x_float.shape != x.shape:
            raise ValueError(f"{self.name}: x_float of shape {tuple(x_float.shape)} does not match x {tuple(x.shape)}")
        exact_tf32 = x.dtype in (torch.bfloat16, torch.float16) and self.H.is_cuda
        x = x.reshape(-1, self.in_features).to(self.H.device, torch.float32)  # (T, K)
        t = x.shape[0]
        if t == 0:
            return
        decay = self.nsamples / (self.nsamples + t)
        self.H *= decay
        self.nsamples += t
        xw = x
        if weight is not None:
            w = weight.reshape(-1, 1).to(self.H.device, torch.float32)  # (T, 1)
            if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
                raise ValueError(f"{self.name}: token weights must be finite and >= 0")
            xw = x * w
        with _tf32(exact_tf32):
            self.H.addmm_(x.t(), xw, alpha=2.0 / self.nsamples)
        if self.R is not None:  # x_f - x is no 16-bit value: a float32 GEMM
            d = x_float.reshape(-1, self.in_features).to(self.H.device, torch.float32) - x  # (T, K)
            self.R *= decay
            self.R.addmm_(d.t(), xw, alpha=2.0 / self.nsamples)

    def hook(self, module: nn.Module) -> torch.utils.hooks.RemovableHandle:
        """Registers a forward hook on `module` (a linear) that feeds its inputs here."""
        return module.register_forward_hook(lambda _m, args, _out: self.add_batch(args[0].detach()))


@contextlib.contextmanager
def _tf32(enabled: bool):
    """float32 matmuls on TF32 tensor cores inside the block when enabled (restored after)."""
    if not enabled:
        yield
        return
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


@dataclass(kw_only=True)
class GPTQResult:
    qweight: QuantizedWeight
    weight: torch.Tensor  # (N, K) float32, the dequantized weight (exactly qweight.dequantize())
    loss: float  # Σ (w - q)² / U_ii² / 2: the paper's estimate of the layer's output error
    damp: float  # the dampening fraction that factorized


def inverse_hessian_cholesky(H: torch.Tensor, *, percdamp: float, name: str) -> tuple[torch.Tensor, float]:
    """H (K, K) -> (U upper with Uᵀ U = (H + λI)⁻¹, the percdamp used). H is not modified."""
    mean_diag = float(torch.diag(H).mean())
    if not math.isfinite(mean_diag):
        raise ValueError(f"{name}: the Hessian holds NaN/Inf (the calibration activations reaching this layer "
                         "are not finite); check the model's weights and inputs")
    idx = torch.arange(H.shape[0], device=H.device)
    damp = percdamp
    tried = []
    while True:
        Hd = H.clone()
        Hd[idx, idx] += damp * mean_diag
        L, info = torch.linalg.cholesky_ex(Hd)
        del Hd  # (K, K) float32 copies add up (0.8 GB each for K = 14336): keep at most three alive
        if int(info) == 0:
            Hinv = torch.cholesky_inverse(L)
            del L
            U, info = torch.linalg.cholesky_ex(Hinv, upper=True)
            del Hinv
            if int(info) == 0 and bool(torch.isfinite(U).all()):
                return U, damp
        tried.append(damp)
        if damp >= 1.0:
            raise ValueError(f"{name}: the Hessian is not positive definite even with dampening "
                             f"{', '.join(f'{d:g}' for d in tried)} x mean(diag H); the layer's calibration "
                             "inputs are degenerate (too few tokens, or constant/duplicated features)")
        damp = min(damp * DAMP_GROWTH, 1.0)


def target_weight(W: torch.Tensor, H: torch.Tensor, R: torch.Tensor, *, percdamp: float, name: str) -> torch.Tensor:
    """W* = W + W R (H + λI)⁻¹ (N, K) with λ = percdamp · mean(diag H): the weight whose outputs on the
    quantized inputs best match W's on the float inputs (gptq_quantize's `shift`)."""
    K = H.shape[0]
    lam = percdamp * float(torch.diag(H).mean())
    Hd = H + lam * torch.eye(K, device=H.device, dtype=H.dtype)
    L, info = torch.linalg.cholesky_ex(Hd)
    if int(info) != 0:
        raise ValueError(f"{name}: the Hessian with dampening {percdamp:g} x mean(diag H) is not positive "
                         "definite; the float-target correction needs it (try a larger damp_percent)")
    # (H + λI) is symmetric: W R (H + λI)⁻¹ = ((H + λI)⁻¹ Rᵀ Wᵀ)ᵀ
    return W + torch.cholesky_solve((W @ R).t(), L).t()


def _column_step(W1: torch.Tensor, Q1: torch.Tensor, Err1: torch.Tensor, U1: torch.Tensor, i: int,
                 scale: torch.Tensor, zero: torch.Tensor, bits: int) -> None:
    """Quantize column i of the lazy block W1 (N, B) with the grid (scale, zero) (N,), its code into Q1, its
    error over U_ii into Err1, and feed the error into the block's later columns (eq. 5, lazily batched).
    The loop runs K times a layer, ~850k times for an 8B model: on a GPU its cost is kernel launches, so
    it is as few ops as possible, in place where it can be (and replayed from a CUDA graph: _ColumnGraphs)."""
    w = W1[:, i]  # (N,)
    q = quantize_codes(w, scale, zero, bits)
    Q1[:, i] = q
    torch.div(w - (q - zero) * scale, U1[i, i], out=Err1[:, i])
    W1[:, i:].addr_(Err1[:, i], U1[i, i:], alpha=-1.0)  # (N, B - i)


def _graphs_enabled() -> bool:
    """FLASHSCALE_GPTQ_GRAPHS=0 runs the column loop eagerly on a GPU too (same kernels, same results)."""
    v = os.environ.get("FLASHSCALE_GPTQ_GRAPHS", "1")
    if v not in ("0", "1"):
        raise ValueError(f"FLASHSCALE_GPTQ_GRAPHS={v!r} takes 0 or 1")
    return v == "1"


class _ColumnGraphs:
    """CUDA graphs of _column_step over the columns [a, b) of a lazy block of `count` columns and N rows,
    on static buffers: one replay launches what ~10 launches a column did (an 8B block quantizes 35k columns:
    ~2 s of launch overhead). Built once per (device, N, count, bits, a, b) and kept for the process (the
    shapes repeat every block); the kernels are the eager ones, so the results are bitwise the same."""

    _cache: dict[tuple, "_ColumnGraphs"] = {}
    MAX = 16  # buffer sets kept (each holds its graphs); a new shape past that drops the oldest

    def __init__(self, device: torch.device, n: int, count: int, bits: int):
        self.bits = bits
        f32 = dict(device=device, dtype=torch.float32)
        self.W1, self.Q1, self.Err1 = (torch.zeros(n, count, **f32) for _ in range(3))
        self.U1 = torch.eye(count, **f32)
        self.scale, self.zero = torch.ones(n, **f32), torch.zeros(n, **f32)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    @classmethod
    def get(cls, device: torch.device, n: int, count: int, bits: int) -> "_ColumnGraphs":
        key = (str(device), n, count, bits)
        if key not in cls._cache:
            if len(cls._cache) >= cls.MAX:
                cls._cache.pop(next(iter(cls._cache)))
            cls._cache[key] = cls(device, n, count, bits)
        return cls._cache[key]

    def _steps(self, a: int, b: int) -> None:
        for j in range(a, b):
            _column_step(self.W1, self.Q1, self.Err1, self.U1, j, self.scale, self.zero, self.bits)

    def replay(self, a: int, b: int, scale: torch.Tensor, zero: torch.Tensor) -> None:
        """Columns [a, b) of the buffers with grid (scale, zero) (N,)."""
        g = self.graphs.get((a, b))
        if g is None:  # warm up on a side stream, then capture (torch.cuda.graphs' recipe); this runs the steps
            # on the buffers once more, so their contents are saved around it
            saved = [t.clone() for t in (self.W1, self.Q1, self.Err1)]
            side = torch.cuda.Stream(self.W1.device)
            side.wait_stream(torch.cuda.current_stream(self.W1.device))
            with torch.cuda.stream(side):
                self._steps(a, b)
            torch.cuda.current_stream(self.W1.device).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self._steps(a, b)
            for t, v in zip((self.W1, self.Q1, self.Err1), saved):
                t.copy_(v)
            self.graphs[(a, b)] = g
        self.scale.copy_(scale)
        self.zero.copy_(zero)
        g.replay()


def gptq_quantize(weight: torch.Tensor, H: torch.Tensor, *, bits: int, group_size: int, sym: bool,
                  act_order: bool = False, static_groups: bool = False, percdamp: float = 0.01,
                  block_size: int = 128, v1_zeros: bool = False, grid_search: str = "minmax",
                  shift: torch.Tensor | None = None, name: str = "layer") -> GPTQResult:
    """GPTQ of weight (N, K) given its Hessian H (K, K). Runs on weight's device; math in float32.
    grid_search: how each (row, group) grid is fitted when its group comes up (GRID_SEARCHES):
    "minmax" the range [min, max] (the paper's runs); "mse" the reference quantizer's range-shrink
    search (`Quantizer(mse=True)`: least Σ |q(w) - w|^2.4, rtn.grid_mse); "hessian" the same search
    scored by GPTQ's own cost of each column's rounding, Σ_j (q_j - w_j)² / [U_jj]², U the Cholesky
    factor of H⁻¹ (eq. 3 of the paper: what the error of column j costs once the columns after it are
    updated), so a range is only shrunk where the clipped columns are cheap to get wrong.
    shift (K, K), optional: R = 2/T Σ (x_f - x) xᵀ (HessianAccumulator(cross=True)). The objective
    becomes the float model's output, Σ_t ||Q x_t - W x_f,t||² (GPTAQ's asymmetric calibration, Li et al.
    2025) instead of Σ_t ||(Q - W) x_t||²: with the ridge λ||Q - W||² of the dampening its minimizer is
    W* = W + W R (H + λI)⁻¹, and Σ_t ||Q x_t - W x_f,t||² = ||(Q - W*) X||² + const, so GPTQ on W*
    minimizes it exactly (the error of earlier layers is compensated here, not only carried)."""
    check_bits(bits)
    if weight.ndim != 2 or H.shape != (weight.shape[1], weight.shape[1]):
        raise ValueError(f"{name}: weight {tuple(weight.shape)} and Hessian {tuple(H.shape)} do not match "
                         "(takes weight (N, K) and H (K, K))")
    if not (0.0 < percdamp <= 1.0):
        raise ValueError(f"percdamp={percdamp!r} must be in (0, 1]")
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size={block_size!r} must be a positive int")
    n, k = weight.shape
    G = check_group_size(group_size, k, name=name)
    if group_size != -1 and block_size % G and G % block_size:
        raise ValueError(f"block_size={block_size} and group_size={group_size}: one must divide the other, so "
                         "each group's grid is fitted on up-to-date columns")
    check_finite(weight, name)

    if grid_search not in GRID_SEARCHES:
        raise ValueError(f"grid_search={grid_search!r} is not supported; takes one of {GRID_SEARCHES}")
    W = weight.detach().to(device=H.device, dtype=torch.float32).clone()  # (N, K)
    H = H.to(torch.float32).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0

    if shift is not None:
        if shift.shape != H.shape:
            raise ValueError(f"{name}: shift {tuple(shift.shape)} must be (K, K) like H {tuple(H.shape)}")
        W = target_weight(W, H, shift.to(H.device, torch.float32), percdamp=percdamp, name=name)
        W[:, dead] = 0.0

    W_orig = W  # the columns in their own order, for static groups
    perm = None
    if act_order:
        perm = torch.argsort(torch.diag(H), descending=True, stable=True)  # stable: ties keep column order
        W = W[:, perm]
        H = H[perm][:, perm]

    U, damp_used = inverse_hessian_cholesky(H, percdamp=percdamp, name=name)
    del H
    cost = torch.diag(U).pow(-2) if grid_search == "hessian" else None  # (K,) in quantization order

    def fit(w, col_cost=None):
        """grid of w (..., G) by grid_search; col_cost (G,) or broadcastable: each column's cost."""
        if grid_search == "minmax":
            return grid(w, bits=bits, sym=sym, v1_zeros=v1_zeros)
        if grid_search == "mse":
            return grid_mse(w, bits=bits, sym=sym, v1_zeros=v1_zeros)
        return grid_mse(w, bits=bits, sym=sym, v1_zeros=v1_zeros, norm=2.0, col_weight=col_cost)

    static_scale = static_zero = None
    if static_groups and group_size != -1:
        # (N, NG) grids fitted on the original, un-updated columns
        orig_cost = None
        if cost is not None:
            orig_cost = cost if perm is None else cost[torch.argsort(perm)]
            orig_cost = orig_cost.reshape(k // G, G)
        static_scale, static_zero = fit(W_orig.reshape(n, k // G, G), orig_cost)
    del W_orig

    codes = torch.empty(n, k, dtype=torch.uint8, device=W.device)  # (N, K), in quantization order
    losses = torch.zeros(n, device=W.device)
    group_scales: list[torch.Tensor] = []  # (N,) each: the grid of group j in quantization order
    group_zeros: list[torch.Tensor] = []
    scale = zero = None
    if group_size == -1:
        scale, zero = fit(W, cost)  # (N,)
    if static_scale is not None:  # the (original) group of each quantization position, as ints: no syncs
        orig_group = ((perm if perm is not None else torch.arange(k)).cpu() // G).tolist()

    graphs = W.is_cuda and static_scale is None and _graphs_enabled()
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        count = i2 - i1
        cols = None if not graphs else _ColumnGraphs.get(W.device, n, count, bits)
        if cols is None:
            W1 = W[:, i1:i2].clone()  # (N, B)
            Q1 = torch.empty_like(W1)  # float codes
            Err1 = torch.empty_like(W1)
            U1 = U[i1:i2, i1:i2]  # (B, B)
        else:  # the graphs' static buffers
            W1, Q1, Err1, U1 = cols.W1, cols.Q1, cols.Err1, cols.U1
            W1.copy_(W[:, i1:i2])
            U1.copy_(U[i1:i2, i1:i2])
        i = 0
        while i < count:  # segments of columns that share one grid
            col = i1 + i
            end = count if group_size == -1 or static_scale is not None else min(count, i + G - col % G)
            if static_scale is None and group_size != -1 and col % G == 0:
                # the group's columns as updated so far (see the module docstring)
                cols_g = W1[:, i:i + G] if i + G <= count else W[:, col:col + G]
                scale, zero = fit(cols_g, None if cost is None else cost[col:col + G])
                group_scales.append(scale)
                group_zeros.append(zero)
            if cols is not None:
                cols.replay(i, end, scale, zero)
            else:
                for j in range(i, end):
                    if static_scale is not None:
                        og = orig_group[i1 + j]
                        scale, zero = static_scale[:, og], static_zero[:, og]
                    _column_step(W1, Q1, Err1, U1, j, scale, zero, bits)
            i = end
        codes[:, i1:i2] = Q1.to(torch.uint8)
        losses += Err1.pow(2).sum(1)
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]  # the block's accumulated updates to the columns right of it
    del W, U

    # back to the original column order; g_idx: the group of each original column
    arange = torch.arange(k, device=codes.device)
    if perm is not None:
        invperm = torch.argsort(perm)
        codes = codes[:, invperm].contiguous()
        pos = invperm  # the quantization position of each original column
    else:
        pos = arange
    if group_size == -1:
        g_idx = torch.zeros(k, dtype=torch.int32, device=codes.device)
        scales, zeros = scale[None], zero[None]  # (1, N)
    elif static_scale is not None:
        g_idx = (arange // G).to(torch.int32)
        scales, zeros = static_scale.t(), static_zero.t()  # (NG, N)
    else:
        g_idx = (pos // G).to(torch.int32)  # groups are contiguous in quantization order
        scales, zeros = torch.stack(group_scales), torch.stack(group_zeros)  # (NG, N)
    qw = QuantizedWeight(codes=codes, scales=scales.contiguous(), zeros=zeros.to(torch.int32).contiguous(),
                         g_idx=g_idx, bits=bits, group_size=group_size, sym=sym)
    return GPTQResult(qweight=qw, weight=qw.dequantize(), loss=float(losses.sum()) / 2.0, damp=damp_used)
