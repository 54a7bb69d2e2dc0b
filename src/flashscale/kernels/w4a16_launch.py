"""W4A16 launchers: one launch of the GEMM, GEMV or decode kernel for a PackedW4, a config and a split (its
arguments, workspace and grid), and _launch, which sends a config to its kernel (the ring and wgmma kernels through
their own modules). Apart from the dispatcher (w4a16.py), which picks the config, and from the plans
(w4a16_configs.py), which size the launch.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton

from flashscale.kernels.pdl import l2_prefetch_active, launch_options
from flashscale.kernels.w4a16_common import MAGIC_ONE, split_k_slices, split_k_workspace
from flashscale.kernels.w4a16_configs import (DecodeConfig, GemmConfig, GemvConfig, _interpreting, _is_ring, _is_strip,
                                              _is_wgmma, decode_grid)
from flashscale.kernels.w4a16_gemm import w4a16_gemm_kernel
from flashscale.kernels.w4a16_gemv import w4a16_decode_kernel, w4a16_gemv_kernel
from flashscale.kernels.w4a16_pack import PackedW4


def _common_args(x2d: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, y: torch.Tensor):
    perm = p.perm if p.perm is not None else p.sz  # any int32 pointer when unused
    b = bias if bias is not None else y
    return perm, b


def _launch_gemm(x2d, p: PackedW4, bias, y, cfg: GemmConfig, split_k: int) -> None:
    m, k = x2d.shape
    n = p.out_features
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
    # a workspace even without split-K (then untouched): the pointer types are part of the compiled variant
    ws, cnt = split_k_workspace(x2d.device, max(m * n, tiles) if split_k > 1 else 1)
    if cfg.slices:
        ws = split_k_slices(x2d.device, split_k * m * n if split_k > 1 else 1)
    perm, b = _common_args(x2d, p, bias, y)
    n_pad = p.sz.shape[1]
    w4a16_gemm_kernel[(tiles, split_k)](
        x2d, p.qweight, p.sz, perm, y, b, ws, cnt,
        m, n, k, x2d.stride(0), y.stride(0), p.qweight.stride(0), p.sz.stride(0), MAGIC_ONE, split_k,
        G=p.group_size, HAS_PERM=p.perm is not None, HAS_BIAS=bias is not None,
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, GROUP=cfg.group,
        EVEN_K=k % cfg.bk == 0, EVEN_N=n_pad % cfg.bn == 0, SLICES=cfg.slices,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def _launch_gemv(x2d, p: PackedW4, bias, y, cfg: GemvConfig, split_k: int, probe: int = 0,
                 pdl: bool = False) -> None:
    k = x2d.shape[1]
    n = p.out_features
    bk = 64 * cfg.kt
    ws, cnt = split_k_workspace(x2d.device, n if split_k > 1 else 1)
    if cfg.slices:
        ws = split_k_slices(x2d.device, split_k * n if split_k > 1 else 1)
    perm, b = _common_args(x2d, p, bias, y)
    n_pad = p.sz.shape[1]
    w4a16_gemv_kernel[(triton.cdiv(n, cfg.bn), split_k)](
        x2d, p.qweight, p.sz, perm, y, b, ws, cnt,
        n, k, p.qweight.stride(0), p.sz.stride(0), MAGIC_ONE, split_k,
        G=p.group_size, HAS_PERM=p.perm is not None, HAS_BIAS=bias is not None,
        BN=cfg.bn, KT=cfg.kt, EVEN_K=k % bk == 0, EVEN_N=n_pad % cfg.bn == 0,
        PREFETCH=cfg.prefetch, SLICES=cfg.slices, PROBE=probe, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch_options(pdl, l2_prefetch_active()),
    )


def x_words(x2d: torch.Tensor, p: PackedW4) -> torch.Tensor:
    """x (M, K) 16-bit -> (M, K / 2) int32 words of two inputs, as the decode kernels load it: act-order
    gathered once (pairs of inputs are loaded as one word), rows word-aligned."""
    if p.perm is not None:
        x2d = x2d[:, p.perm.long()]
    if x2d.stride(1) != 1 or x2d.stride(0) % 2 or x2d.data_ptr() % 4:
        x2d = x2d.clone(memory_format=torch.contiguous_format)
    return x2d.view(torch.int32)


def _launch_decode(x2d, p: PackedW4, bias, y, cfg: DecodeConfig, per_sm: int, probe: int = 0,
                   pdl: bool = False) -> None:
    m, k = x2d.shape
    n = p.out_features
    xw = x_words(x2d, p)
    progs, items, steps, cmax = decode_grid(x2d, p, cfg, per_sm)
    bm = 8 if m <= 8 else 16
    tiles = triton.cdiv(n, cfg.bn)
    ws = split_k_slices(x2d.device, max(tiles * cmax * cfg.bn * bm, progs))
    _, cnt = split_k_workspace(x2d.device, tiles)
    b = bias if bias is not None else y
    w4a16_decode_kernel[(progs,)](
        xw, p.qweight, p.sz, y, b, ws, cnt,
        m, n, k, xw.stride(0), y.stride(0), p.qweight.stride(0), p.sz.stride(0), steps, items, cmax,
        G=p.group_size, HAS_BIAS=bias is not None, BF16=x2d.dtype == torch.bfloat16, BN=cfg.bn, KT=cfg.kt, BM=bm,
        EVEN_K=k % (64 * cfg.kt) == 0, EVEN_N=p.sz.shape[1] % cfg.bn == 0, PREFETCH=cfg.prefetch,
        ASM=cfg.asm and not _interpreting(), PROBE=probe, num_warps=cfg.num_warps, num_stages=1,
        **launch_options(pdl, l2_prefetch_active()),
    )


def _launch(x2d, p: PackedW4, bias, y, cfg, split: int, pdl: bool = False) -> None:
    """pdl: programmatic dependent launch (kernels.pdl) for the GEMV, decode and ring kernels (the ring kernel loads
    its first items' weight words before it waits); the GEMMs and the strip kernel ignore it (they launch plainly,
    which serializes as usual)."""
    if _is_wgmma(cfg):
        from flashscale.kernels.w4a16_wgmma import w4a16_wgmma

        w4a16_wgmma(x2d, p, bias, replace(cfg, split_k=split) if split else cfg, out=y)
    elif _is_strip(cfg):  # no split, no PDL: it launches plainly, as the GEMMs do
        from flashscale.kernels.w4a16_strip import launch

        launch(x2d, p, bias, y, cfg)
    elif _is_ring(cfg):
        from flashscale.kernels.w4a16_ring import launch

        launch(x2d, p, bias, y, cfg, split, pdl=pdl)
    elif isinstance(cfg, DecodeConfig):
        _launch_decode(x2d, p, bias, y, cfg, split, pdl=pdl)
    elif isinstance(cfg, GemvConfig):
        _launch_gemv(x2d, p, bias, y, cfg, split, pdl=pdl)
    else:
        _launch_gemm(x2d, p, bias, y, cfg, split)
