"""W4A16 launchers: pick the kernel by M (tokens), the tile config by a cached autotune, the split-K.

    M == 1      w4a16_gemv.py   CUDA-core matrix-vector, split-K over the 132 SMs
    M >= 2      w4a16_gemm.py   tensor cores (swap AB, weights as the register operand); split-K
                                while the tiles cannot fill the machine (decode), tiles grow with M
    M <= 16     w4a16_gemv.py   w4a16_decode_kernel: mma.sync on packed-half dequantization, stream-K
                                over one persistent wave; extra autotune candidates of the M = 1 and
                                M <= 16 buckets (docs/w4a16_decode.md)
    M <= 8      w4a16_ring.py   the same math on a register ring of whole items; extra candidates of the
                                M = 1 and M <= 8 buckets (docs/w4a16_decode.md rounds 5 and 8)
    M >= 2      w4a16_wgmma.py  on Hopper (sm_90): the Gluon GEMM (TMA ring, warp-specialized producer,
                                register-A wgmma on in-register dequantization; 16-token tiles up to
                                M = 16); its configs join the autotune candidates of the bucket
                                (docs/w4a16_gemm.md, docs/w4a16_decode.md "Round 8")

Autotuning: the first call of a (kernel, M bucket, N, K, G, dtype, act-order) key on a GPU times the
candidate configs of its bucket (a handful, so few compiles) in CUDA graphs over copies of the weight
that pass the L2 (_time) and keeps the fastest for the process (tuned_configs() / load_tuned_configs() move the
table to and from a JSON file). Under CUDA-graph capture an untuned key takes its bucket's first candidate
without timing. Under Triton's interpreter (CPU tests) the first candidate runs, or the one passed as `config=`.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import torch
import triton
import triton.testing
from triton.runtime.errors import OutOfResources

from flashscale.kernels.interpreter import interpreting, require_launchable
from flashscale.kernels.pdl import active as pdl_active
from flashscale.kernels.pdl import l2_prefetch_active, launch_options, pre_l2_items, trigger_active
from flashscale.kernels.w4a16_common import MAGIC_ONE, split_k_slices, split_k_workspace
from flashscale.kernels.w4a16_gemm import w4a16_gemm_kernel
from flashscale.kernels.w4a16_gemv import w4a16_decode_kernel, w4a16_gemv_kernel
from flashscale.kernels.w4a16_pack import FRAG_K, PackedW4, pack_w4

if TYPE_CHECKING:
    from flashscale.kernels.w4a16_ring import RingConfig
    from flashscale.kernels.w4a16_wgmma import WgmmaConfig


@dataclass(frozen=True, kw_only=True)
class GemmConfig:
    bm: int  # tokens per tile (the MMA's n)
    bn: int  # output features per tile (the MMA's m; 64 per warpgroup)
    bk: int  # input features per step, a multiple of 64
    num_warps: int = 4
    num_stages: int = 3
    group: int = 8
    slices: bool = False  # split-K by per-split workspace slices + one ticket a tile (no per-element atomics)


@dataclass(frozen=True, kw_only=True)
class GemvConfig:
    bn: int  # output features per program, a multiple of 16
    kt: int  # 64-wide fragment columns per step (BK = 64 * kt)
    num_warps: int = 4
    num_stages: int = 2
    prefetch: int = 1  # steps of packed words in flight ahead of the one computed (register ring, 1 or 2)
    slices: bool = False  # split-K by per-split workspace slices + one ticket a program


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """w4a16_decode_kernel (M <= 16). Its runtime knob, programs per SM of the persistent grid, takes
    the place of the split factor in the tuner (split_k= of w4a16_matmul, "split_k" in the table)."""
    bn: int = 128  # output features per work item (16 a fragment, warps split them)
    kt: int = 2  # 64-wide columns per work item (inside one group)
    num_warps: int = 4
    prefetch: int = 1  # items of packed and scale words in flight ahead of the one computed (1 or 2)
    asm: bool = True  # inline PTX (mma.sync, packed-half dequant); off: the interpreter's emulation


# Candidates per M bucket, best guess first (the one taken untimed). Few on purpose: each is a compile.
# BK = 128 everywhere: with two fragment columns per step Triton keeps the dequantized tile in the
# wgmma A-fragment registers (BK = 64 made it convert through shared memory, seen in the sm_90 TTGIR);
# tiles of 128x128 tokens take 8 warps (4 spill the accumulator inside the loop).
# Decode buckets (16, 32) lead with slice-reduced split-K (docs/w4a16_decode.md): without per-element
# atomics the split can fill every SM with ~4 programs (the atomic budget held M=16 at split <= 2).
_GEMM_LARGE = [GemmConfig(bm=128, bn=128, bk=128, num_warps=8, num_stages=3),
               GemmConfig(bm=256, bn=128, bk=128, num_warps=8, num_stages=3),
               GemmConfig(bm=128, bn=128, bk=128, num_warps=8, num_stages=4)]
_GEMM_16 = [GemmConfig(bm=16, bn=64, bk=128, num_stages=4, slices=True),
            GemmConfig(bm=16, bn=64, bk=128, num_stages=6, slices=True),
            GemmConfig(bm=16, bn=128, bk=128, num_stages=4, slices=True),
            GemmConfig(bm=16, bn=128, bk=128, num_stages=4), GemmConfig(bm=16, bn=64, bk=128, num_stages=4)]
_GEMM_CANDIDATES: dict[int, list[GemmConfig]] = {
    # M 2, 3..4, 5..8 and 9..16 tuned apart (H200, session 29): one 2..16 bucket tuned at M = 16 kept configs 7-10 %
    # slower than the decode kernel at M = 2..4 (8192^2 M = 2 24.3 us against 21.7), and that decode config tuned at
    # M = 2 ran M = 8 at 29.0 us where the GEMM took 24.5 (a second token block from M = 9 changes it again)
    2: _GEMM_16,
    4: _GEMM_16,
    8: _GEMM_16,
    16: _GEMM_16,
    32: [GemmConfig(bm=32, bn=64, bk=128, num_stages=4, slices=True),
         GemmConfig(bm=32, bn=64, bk=128, num_stages=6, slices=True),
         GemmConfig(bm=32, bn=128, bk=128, num_stages=4), GemmConfig(bm=32, bn=64, bk=128, num_stages=4)],
    64: [GemmConfig(bm=64, bn=128, bk=128, num_stages=3), GemmConfig(bm=64, bn=128, bk=128, num_warps=8, num_stages=4),
         GemmConfig(bm=64, bn=64, bk=128, num_stages=4)],
    # no split-K past 32 tokens (choose_split_k): 64-row tiles keep enough programs for N = 4096
    128: [GemmConfig(bm=128, bn=128, bk=128, num_warps=8, num_stages=3),
          GemmConfig(bm=64, bn=128, bk=128, num_warps=8, num_stages=4), GemmConfig(bm=64, bn=64, bk=128, num_stages=4)],
    256: [GemmConfig(bm=128, bn=128, bk=128, num_warps=8, num_stages=3),
          GemmConfig(bm=64, bn=128, bk=128, num_warps=8, num_stages=4), GemmConfig(bm=64, bn=64, bk=128, num_stages=4)],
    2048: _GEMM_LARGE,
    # M > 2048 tuned apart from 257..2048: the best tile differs with the waves it makes (1024 tokens are 4 of
    # 256 rows, 3.4 waves of 132 at N = 14336; 4096 tokens 13.6)
    1 << 30: _GEMM_LARGE,
}
# GEMV: two steps of packed words in flight + slice-reduced split-K first (docs/w4a16_decode.md), the
# earlier one-step / atomic variants kept as candidates so the autotuner can still pick them.
_GEMV_CANDIDATES: list[GemvConfig] = [
    GemvConfig(bn=128, kt=2, prefetch=2, slices=True), GemvConfig(bn=256, kt=2, prefetch=2, slices=True),
    GemvConfig(bn=128, kt=2, slices=True),
    GemvConfig(bn=256, kt=2), GemvConfig(bn=128, kt=2), GemvConfig(bn=256, kt=1)]
# Decode-kernel candidates, after the proven ones (so an untimed call, e.g. under CUDA-graph capture or
# with autotuning off, keeps the old kernel until a GPU run has timed and checked these). sm_90 census
# (bf16, M <= 8; docs/w4a16_decode.md): bn256/4 warps 2.1 instructions a weight at 128 registers (4
# programs an SM, 64 KB in flight), bn128/2 warps the same per thread in half the tile, two items in
# flight at 255 registers (2 programs an SM), kt=1 for group size 64.
_DECODE_CANDIDATES: list[DecodeConfig] = [
    DecodeConfig(bn=256, kt=2), DecodeConfig(bn=128, kt=2, num_warps=2), DecodeConfig(bn=256, kt=2, prefetch=2),
    DecodeConfig(bn=256, kt=1, prefetch=2)]
_DECODE_WARPS_PER_SM = 16  # the persistent grid's default: 4 programs of 4 warps (128 registers allow 4)
_SLICE_PROGRAMS_PER_SM = 4  # resident programs an SM the slice split aims at (registers allow 4-5)

_TUNED: dict[tuple, dict] = {}  # key -> config fields + "split_k"
_AUTOTUNE = True
_ATOMIC_BUDGET = 1 << 18  # split-K adds M*N*splits values (and as many tickets) with atomics: cap that


def set_autotune(enabled: bool) -> None:
    """Off: every key takes its bucket's first candidate untimed (one compile a bucket: tests)."""
    global _AUTOTUNE
    _AUTOTUNE = bool(enabled)


_interpreting = functools.cache(interpreting)  # read once: Triton reads it when the kernels are decorated


@functools.cache
def _device_info(device: torch.device) -> tuple[str, int]:
    """(name, SM count); the interpreter gets 4 SMs so tiny CPU tests exercise split-K."""
    if device.type != "cuda":
        return "cpu", 4
    props = torch.cuda.get_device_properties(device)
    return props.name, props.multi_processor_count


def m_bucket(m: int) -> int:
    return next(b for b in _GEMM_CANDIDATES if m <= b)


def gemm_candidates(m: int) -> list[GemmConfig]:
    return list(_GEMM_CANDIDATES[m_bucket(m)])


def gemv_candidates(p: PackedW4) -> list[GemvConfig]:
    """GEMV steps must stay inside one group: BK divides G, or the row is a single group."""
    g, k = p.group_size, p.in_features
    ok = [c for c in _GEMV_CANDIDATES if g == k or g % (64 * c.kt) == 0]
    wide = [c for c in ok if c.kt > 1]  # fewer group updates per weight: take them when they fit
    return wide or ok


def decode_candidates(p: PackedW4) -> list[DecodeConfig]:
    """Work items must stay inside one group: G a multiple of 64 * kt, or one group per row."""
    g, k = p.group_size, p.in_features
    return [c for c in _DECODE_CANDIDATES if g == k or g % (64 * c.kt) == 0]


# The ring decode kernel (kernels.w4a16_ring, docs/w4a16_decode.md rounds 5 and 8) joins the M = 1 and M <= 8 buckets
# after every other kernel (an untimed call never runs it). On the H200 (session 29 probe) bn256 ring2 with the
# atomic fold took 15.8 us at 8192^2, M = 1, against the tuned GEMV's 18.8, bn128 ring2 atomic 7.9 against 8.4 at
# 4096^2; the slot fold (deterministic) 17.3 at 8192^2. The atomic ones sum split-K partials in arrival order, as
# the atomic GEMV candidates above do. Split = programs an SM (the measured best of each).
_RING_CANDIDATES = ((256, 2, True), (128, 3, True), (128, 4, False))  # (bn, programs an SM, atomic fold)


@functools.cache
def _ring_configs() -> tuple:
    from flashscale.kernels.w4a16_ring import RingConfig  # here: w4a16_ring imports this module

    return tuple(RingConfig(bn=bn, kt=2, num_warps=4, ring=2, per_sm=ps, atomic=at) for bn, ps, at in _RING_CANDIDATES)


def ring_candidates(p: PackedW4, m: int) -> list:
    """The ring kernel's configs for M tokens (M <= 8) and p's group size (an item, 128 inputs, inside a group)."""
    g, k = p.group_size, p.in_features
    if m > 8 or not (g == k or g % 128 == 0):
        return []
    return list(_ring_configs())


def _ring_refusal(what: str, x2d: torch.Tensor, p: PackedW4) -> str:
    return (f"{what} takes up to 8 tokens and a group size that is a multiple of 128 or one group per row; got "
            f"M={x2d.shape[0]}, group_size={p.group_size}, K={p.in_features}")


def _tune_key(kernel: str, bucket: int, x2d: torch.Tensor, p: PackedW4) -> tuple:
    """_tune's cache key of a call: kernel family, M bucket, the weight's shape, group and act-order, x's dtype, GPU."""
    return (kernel, bucket, p.out_features, p.in_features, p.group_size, str(x2d.dtype).removeprefix("torch."),
            "perm" if p.perm is not None else "noperm", _device_info(x2d.device)[0])


def _is_ring(cfg) -> bool:
    return hasattr(cfg, "ring")  # kernels.w4a16_ring.RingConfig (imported where used: it imports this module)


def choose_split_k(tiles: int, k_steps: int, num_sms: int, *, out_elems: int = 0, bm: int = 1) -> int:
    """Splits of K so tiles * splits is about two programs per SM, each split >= 2 steps; none for
    token tiles past 32 (prefill-sized tiles have enough programs, and their per-element atomics
    would cost more than the split gains: measured on the H200, 2026-11-29), and no more than the
    atomics budget allows (M*N*splits)."""
    if tiles >= num_sms or k_steps < 4 or bm > 32:
        return 1
    split = max(1, min(-(-2 * num_sms // tiles), k_steps // 2))
    if out_elems:
        split = min(split, max(1, _ATOMIC_BUDGET // out_elems))
    return split


def choose_split_k_slices(tiles: int, k_steps: int, num_sms: int, *, bm: int = 1, min_steps: int = 4) -> int:
    """Splits of K for slice-reduced split-K: tiles * splits up to _SLICE_PROGRAMS_PER_SM programs an SM
    (rounded down, so all are resident at once: one wave, no tail), each split >= min_steps steps (the
    prologue's first HBM latency is paid once a program). The reduction costs plain stores and one
    ticket a program, so there is no atomics budget; token tiles past 32 still take none."""
    if tiles * 2 > _SLICE_PROGRAMS_PER_SM * num_sms or bm > 32:
        return 1  # e.g. 448 tiles: a split of 2 would overfill the SMs (a second wave)
    return max(1, min(_SLICE_PROGRAMS_PER_SM * num_sms // tiles, k_steps // min_steps))


def _split_options(default: int, slices: bool = False, k_steps: int = 0, decode: bool = False) -> list[int]:
    """Split factors the autotuner times around the heuristic (a runtime argument: no recompiles);
    for the decode kernel, programs per SM: the default (16 warps an SM) and 8, 12, 24 warps' worth."""
    if decode:
        return sorted({max(1, default * w // 16) for w in (8, 12, 16, 24)})
    if slices:
        up = min(2 * default, max(1, k_steps // 2)) if k_steps else default
        return sorted({up, default, max(1, default // 2)}, reverse=True)
    return sorted({default, max(1, default // 2), max(1, default // 4)}, reverse=True)


def tuned_configs() -> dict[str, dict]:
    """The autotune table of this process (JSON-able): "kernel|M bucket|N|K|G|dtype|act|device" -> config."""
    return {"|".join(map(str, k)): dict(v) for k, v in _TUNED.items()}


def load_tuned_configs(table: dict[str, dict]) -> None:
    """Install a table from tuned_configs() (e.g. saved by a benchmark run) so no key is re-timed."""
    for k, v in table.items():
        kind, bucket, n, kk, g, dtype, act, dev = k.split("|")
        _TUNED[(kind, int(bucket), int(n), int(kk), int(g), dtype, act, dev)] = dict(v)


def ring_add_choices() -> dict[tuple, list]:
    """The accumulating ring GEMV's tuned keys of this process (w4a16_addmm_'s: one per shape and prologue kind)
    -> their candidate configs, the tuned one first: what a caller that times a whole decode step may pin
    (pin_config) in its place (not uneven shares, RingConfig.late: slower in the step, docs round 12)."""
    out = {}
    for key, fields in _TUNED.items():
        if str(key[0]).startswith("ring-add"):
            cur = dict(fields)
            split = cur.pop("split_k")
            tuned = _config_class(cur)(**cur)
            out[key] = [(tuned, split)] + [(c, c.per_sm) for c in _ring_configs() if c != tuned]
    return out


def pin_config(key: tuple, cfg, split: int) -> None:
    """Make `key`'s tuned choice (cfg, split): later calls of that key run it untimed."""
    _TUNED[key] = dict(asdict(cfg), split_k=split)


def _config_class(fields: dict):
    if "consumers" in fields:
        from flashscale.kernels.w4a16_wgmma import WgmmaConfig

        return WgmmaConfig
    if "ring" in fields:
        from flashscale.kernels.w4a16_ring import RingConfig

        return RingConfig
    return DecodeConfig if "asm" in fields else GemvConfig if "kt" in fields else GemmConfig


def _is_wgmma(cfg) -> bool:
    return hasattr(cfg, "consumers")  # kernels.w4a16_wgmma.WgmmaConfig (imported only where it can run)


# The Hopper GEMM of kernels.w4a16_wgmma joins automatic dispatch from M = 2: on the H200 it measured 1.06-2.3x the
# Triton GEMM of w4a16_gemm.py at M 64..4096 on every shape of the quick grid (benchmarks/results/w4a16-wgmma-h200.json,
# 2026-12-02), and with 16-token tiles it beat the decode kernels at M = 16 on 8192^2 and 4096^2 by 6-8 % (session 29,
# docs/w4a16_decode.md "Round 8"; at M = 1 it lost); the autotuner times all and keeps the fastest.
# FLASHSCALE_W4A16_WGMMA=0 leaves it out; =h2 times each config beside its packed 16-bit unpack twin
# (WgmmaConfig(h2=True), kernels/w4a16_h2.py: the same values, opt-in until the GPU grid says it wins); =vy beside
# its twin that writes y by 16-byte stores (WgmmaConfig(vec_y=True): the same bits, opt-in until measured).
WGMMA_ENV = "FLASHSCALE_W4A16_WGMMA"
WGMMA_MIN_M = 2


def _wgmma_mode() -> str:
    """FLASHSCALE_W4A16_WGMMA, checked: "", "0", "1", "h2" or "vy"."""
    mode = os.environ.get(WGMMA_ENV, "")
    if mode not in ("", "0", "1", "h2", "vy"):
        raise ValueError(f"{WGMMA_ENV}={mode!r}: takes 0 (never the wgmma GEMM), 1 / unset (an autotune candidate "
                         f"from M = {WGMMA_MIN_M} on sm_90), h2 (its configs and their packed 16-bit unpack twins) or "
                         f"vy (its configs and their 16-byte y store twins)")
    return mode


def wgmma_candidates(x2d: torch.Tensor, p: PackedW4, bias: torch.Tensor | None) -> list:
    """The wgmma GEMM's configs for this call, or [] where it cannot run (not sm_90, no Gluon, G = 32, ...)."""
    mode = _wgmma_mode()
    if mode == "0" or not x2d.is_cuda or _interpreting():
        return []
    from flashscale.kernels import w4a16_wgmma as wg

    return _wgmma_configs(x2d.shape[0], p, twin=mode) if wg.supported(x2d, p, bias) else []


def _wgmma_configs(m: int, p: PackedW4, twin: str = "") -> list:
    """M's bucket of w4a16_wgmma candidates that fit p's group size (kernels.w4a16_wgmma.config_error); with twin
    "h2" / "vy", each followed by its h2=True / vec_y=True twin (where that fits too)."""
    from flashscale.kernels import w4a16_wgmma as wg

    ok = [c for c in wg.candidates(m) if wg.config_error(c, p.group_size, p.in_features) is None]
    out = []
    for c in ok:
        t = wg.twin(c, twin) if twin in wg.TWINS else c
        out += [c] + ([t] if t != c and wg.config_error(t, p.group_size, p.in_features) is None else [])
    return out


def _common_args(x2d: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, y: torch.Tensor):
    perm = p.perm if p.perm is not None else p.sz  # any int32 pointer when unused
    b = bias if bias is not None else y
    return perm, b


def _gemm_split(x2d, p: PackedW4, cfg: GemmConfig) -> int:
    m, k = x2d.shape
    tiles = triton.cdiv(p.out_features, cfg.bn) * triton.cdiv(m, cfg.bm)
    k_steps = triton.cdiv(triton.cdiv(k, FRAG_K) * FRAG_K, cfg.bk)
    if cfg.slices:
        return choose_split_k_slices(tiles, k_steps, _device_info(x2d.device)[1], bm=cfg.bm)
    return choose_split_k(tiles, k_steps, _device_info(x2d.device)[1], out_elems=m * p.out_features, bm=cfg.bm)


def _gemv_split(x2d, p: PackedW4, cfg: GemvConfig) -> int:
    k = x2d.shape[1]
    k_steps = triton.cdiv(triton.cdiv(k, FRAG_K) * FRAG_K, 64 * cfg.kt)
    if cfg.slices:
        return choose_split_k_slices(triton.cdiv(p.out_features, cfg.bn), k_steps, _device_info(x2d.device)[1],
                                     min_steps=2 * cfg.prefetch)
    return choose_split_k(triton.cdiv(p.out_features, cfg.bn), k_steps, _device_info(x2d.device)[1],
                          out_elems=p.out_features)


def _k_steps(x2d, bk: int) -> int:
    return triton.cdiv(triton.cdiv(x2d.shape[1], FRAG_K) * FRAG_K, bk)


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


def stream_k_grid(k: int, n: int, bn: int, kt: int, per_sm: int, num_sms: int) -> tuple[int, int, int, int]:
    """(programs, items, steps per tile, workspace slots per tile) of a stream-K decode launch: items of bn
    outputs x 64 kt inputs, one persistent wave of per_sm programs an SM (the decode and ring kernels)."""
    tiles = triton.cdiv(n, bn)
    steps = triton.cdiv(triton.cdiv(k, FRAG_K) * FRAG_K, 64 * kt)
    items = tiles * steps
    progs = max(1, min(per_sm * num_sms, items))
    return progs, items, steps, triton.cdiv(steps, items // progs) + 1


def decode_grid(x2d, p: PackedW4, cfg: DecodeConfig, per_sm: int) -> tuple[int, int, int, int]:
    """stream_k_grid of the decode kernel on x2d's device."""
    return stream_k_grid(x2d.shape[1], p.out_features, cfg.bn, cfg.kt, per_sm, _device_info(x2d.device)[1])


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
    its first items' weight words before it waits); the GEMMs ignore it (they launch plainly, which serializes as
    usual)."""
    if _is_wgmma(cfg):
        from flashscale.kernels.w4a16_wgmma import w4a16_wgmma

        w4a16_wgmma(x2d, p, bias, replace(cfg, split_k=split) if split else cfg, out=y)
    elif _is_ring(cfg):
        from flashscale.kernels.w4a16_ring import launch

        launch(x2d, p, bias, y, cfg, split, pdl=pdl)
    elif isinstance(cfg, DecodeConfig):
        _launch_decode(x2d, p, bias, y, cfg, split, pdl=pdl)
    elif isinstance(cfg, GemvConfig):
        _launch_gemv(x2d, p, bias, y, cfg, split, pdl=pdl)
    else:
        _launch_gemm(x2d, p, bias, y, cfg, split)


RETIME_TOP = 3  # _tune times the fastest few trials again, RETIME_ROUNDS times each, interleaved
RETIME_ROUNDS = 3
WARM_MS = 50.0  # before those rounds, the leader runs this long: the clocks settle at their loaded level


TUNE_L2_PASSES = 2  # the tuner's weight copies together pass this many times the L2 (HBM-cold weights)
TUNE_MAX_COPIES = 32


def _weight_ring(p: PackedW4) -> list[PackedW4]:
    """p and copies of its packed weights and scales that together pass TUNE_L2_PASSES x the L2, for the tuner to
    cycle through: each launch then reads its weights from HBM, as in a decode step (a model's next linear is
    never in L2)."""
    nbytes = p.qweight.numel() * 4 + p.sz.numel() * 4
    l2 = getattr(torch.cuda.get_device_properties(p.device), "L2_cache_size", 0) or 60 << 20
    n = max(1, min(TUNE_MAX_COPIES, -(-TUNE_L2_PASSES * l2 // max(nbytes, 1))))
    return [p] + [replace(p, qweight=p.qweight.clone(), sz=p.sz.clone()) for _ in range(n - 1)]


TUNE_REPLAY_MS = 10.0  # a timed graph replay's length: long enough for the clocks to settle at their loaded level
TUNE_MAX_LAUNCHES = 1024


def _time(launch, c, s, ring=(), *, replay_ms: float | None = None, sync: bool = False,
          side_stream: bool = False) -> float:
    """ms a launch of (c, s): a CUDA graph of launches back to back, launch(c, s, w) over the weights w of ring in
    turn (launch(c, s) when ring is empty), about TUNE_REPLAY_MS of work a replay; one replay to warm, then the median
    of 5 replays queued back to back (events between them, one synchronize at the end: no idle gaps). Eager timing
    (do_bench) of a 5-20 us kernel measures the host's launch path as much as the kernel, and one weight stays
    in L2 at 4096x4096: the H200 once kept a 15 us config over an 8.5 us one that way (results/w4a16-h200.json,
    2026-12-02). Short replays with a synchronize between them (1 ms, until session 21) ran as bursts at boost
    clocks: at M 1024 they timed bm256 x bn64 as fast as the persistent bm256 x bn128 config (192-195 us both),
    where 60 ms of steady replays put them at 212-217 and 203 us (docs/w4a16_gemm.md, session 21). Falls back to
    do_bench where a graph cannot be captured. replay_ms (default TUNE_REPLAY_MS), sync (a synchronize after each
    replay) and side_stream (replays on a new stream) are do_bench_cudagraph's ways, for
    benchmarks/w4a16_tune_timing.py to compare one at a time."""
    calls = [functools.partial(launch, c, s, w) for w in ring] or [functools.partial(launch, c, s)]
    with torch.cuda.stream(torch.cuda.Stream() if side_stream else torch.cuda.current_stream()):
        return _time_graph(calls, TUNE_REPLAY_MS if replay_ms is None else replay_ms, sync)


def _time_graph(calls: list, replay_ms: float, sync: bool) -> float:
    try:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        calls[0]()
        end.record()
        end.synchronize()
        n = max(len(calls), min(TUNE_MAX_LAUNCHES, int(replay_ms / max(start.elapsed_time(end), 1e-3))))
        n = -(-n // len(calls)) * len(calls)
        for call in calls[1:]:  # each copy's first launch (allocation, descriptors) outside the capture
            call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(n):
                calls[i % len(calls)]()
        graph.replay()
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(10)]
        for i in range(5):
            marks[2 * i].record()
            graph.replay()
            marks[2 * i + 1].record()
            if sync:
                marks[2 * i + 1].synchronize()
        marks[-1].synchronize()
        return sorted(marks[2 * i].elapsed_time(marks[2 * i + 1]) / n for i in range(5))[2]
    except RuntimeError:
        torch.cuda.synchronize()
        return triton.testing.do_bench(calls[0], warmup=5, rep=25, return_mode="median")


def _tune(key: tuple, cands: list, split_of, launch, steps_of=lambda c: 0, ring=tuple) -> tuple[object, int]:
    """Fastest (config, split) for `key`, timed once per process over the candidates and a few split
    factors around the heuristic, the RETIME_TOP fastest timed again in RETIME_ROUNDS interleaved rounds and the
    best median kept;
    the first candidate with the heuristic split when timing is off or impossible (interpreter, CUDA-graph
    capture). launch(c, s[, w]) runs a trial (on weight w); ring() gives the weights _time cycles through, built
    only when a key is timed."""
    hit = _TUNED.get(key)
    if hit is not None:
        fields = dict(hit)
        split = fields.pop("split_k")
        return _config_class(fields)(**fields), split
    if not _AUTOTUNE or _interpreting() or torch.cuda.is_current_stream_capturing():
        return cands[0], split_of(cands[0])
    trials = [(c, s) for c in cands for s in ([split_of(c)] if _is_wgmma(c) or _is_ring(c) else  # their own
                                               _split_options(split_of(c), getattr(c, "slices", False), steps_of(c),
                                                              isinstance(c, DecodeConfig)))]
    if len(trials) == 1:
        return trials[0]
    weights = ring()
    timed = []
    for c, s in trials:
        try:
            launch(c, s)  # compile (and size the split-K buffers) outside the timing
            timed.append((_time(launch, c, s, weights), len(timed), (c, s)))
        except OutOfResources:
            continue  # this config does not fit the device (shared memory, registers)
    if not timed:
        raise RuntimeError(f"no W4A16 config runs on this device for {key}")
    # The leaders again, after every candidate has run once, so one unlucky timing cannot decide alone (added when
    # eager timing had kept a config 1.5x slower than another run's choice; see _time): first WARM_MS of the leader,
    # then RETIME_ROUNDS interleaved rounds (A B C, B C A, ...), each leader's median deciding. The first round runs
    # on a GPU that was idle and still boosts: on the H200 the M = 4096 candidates timed 5-10 % faster there than
    # later, and one more timing each in a row flipped a 4 % steady-state order (benchmarks/w4a16_tune_timing.py,
    # session 21: the persistent bm256 x bn128 config lost to the one-tile bk64 config in 11 of 12 cells it leads at
    # steady state); interleaved rounds on warm clocks spread such drift over every leader alike.
    leaders = [cs for _, _, cs in sorted(timed)[:RETIME_TOP]]
    if len(leaders) > 1:
        t_end = time.perf_counter() + WARM_MS * 1e-3
        while time.perf_counter() < t_end:
            _time(launch, *leaders[0], weights)
        seen = {i: [] for i in range(len(leaders))}
        for r in range(RETIME_ROUNDS):
            for i in [(r + j) % len(leaders) for j in range(len(leaders))]:
                seen[i].append(_time(launch, *leaders[i], weights))
        best = leaders[min(seen, key=lambda i: (sorted(seen[i])[len(seen[i]) // 2], i))]
    else:
        best = leaders[0]
    _TUNED[key] = dict(asdict(best[0]), split_k=best[1])
    return best


def w4a16_matmul(x2d: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None, *,
                 kernel: str | None = None,
                 config: GemmConfig | GemvConfig | DecodeConfig | RingConfig | WgmmaConfig | None = None,
                 split_k: int | None = None) -> torch.Tensor:
    """x2d (M, K) fp16/bf16, unit stride along K -> y (M, N) in x's dtype. Inputs are validated by
    flashscale.ops.w4a16_linear; this launcher assumes them right. kernel: None (by M), "gemv", "gemm",
    "decode", "ring" (M <= 8) or "wgmma" (Hopper); config (a GemmConfig, GemvConfig, DecodeConfig, RingConfig or
    WgmmaConfig) / split_k: force them (tests, benchmarks) instead of the tuned choice."""
    m, k = x2d.shape
    n = p.out_features
    y = torch.empty((m, n), dtype=x2d.dtype, device=x2d.device)
    if m == 0:
        return y
    auto = kernel is None and config is None  # the decode kernel joins the candidates of automatic dispatch only
    if kernel is None:
        kernel = "gemv" if m == 1 and gemv_candidates(p) else "gemm"
    if config is not None:
        kernel = "wgmma" if _is_wgmma(config) else "ring" if _is_ring(config) else {
            DecodeConfig: "decode", GemvConfig: "gemv", GemmConfig: "gemm"}[type(config)]
    dec = decode_candidates(p) if m <= 16 else []
    ring = ring_candidates(p, m) if auto else []
    if kernel == "gemv":
        if m != 1:
            raise ValueError(f"the gemv kernel takes one token (M = 1), got M={m}")
        cands, bucket = gemv_candidates(p) + (dec + ring if auto else []), 1
        if not gemv_candidates(p):
            raise ValueError(f"the gemv kernel needs a group size that is a multiple of 64 or one group per "
                             f"row; this weight has group_size={p.group_size}, K={k}")
    elif kernel == "gemm":
        cands, bucket = gemm_candidates(m) + (dec + ring if auto else []), m_bucket(m)
    elif kernel == "wgmma":
        from flashscale.kernels.w4a16_wgmma import unsupported

        why = unsupported(x2d, p, bias, config)
        if why is not None:
            raise ValueError(f"the wgmma kernel cannot take this call: {why}")
        cands, bucket = _wgmma_configs(m, p, twin=_wgmma_mode()), m_bucket(m)
    elif kernel == "decode":
        if m > 16:
            raise ValueError(f"the decode kernel takes up to 16 tokens, got M={m}")
        cands, bucket = dec, 16
        if not dec:
            raise ValueError(f"the decode kernel needs a group size that is a multiple of 64 or one group per "
                             f"row; this weight has group_size={p.group_size}, K={k}")
    elif kernel == "ring":
        cands, bucket = ring_candidates(p, m), m_bucket(m) if m > 1 else 1
        if not cands and config is None:
            raise ValueError(_ring_refusal("the ring kernel", x2d, p))
    else:
        raise ValueError(f"kernel={kernel!r}; expected None, 'gemv', 'gemm', 'decode', 'ring' or 'wgmma'")

    require_launchable(x2d, "x2d", "w4a16_matmul")

    def split_of(c):
        if _is_wgmma(c):
            return c.split_k  # 0: w4a16_wgmma's auto split
        if _is_ring(c):
            return c.per_sm
        if isinstance(c, DecodeConfig):
            return max(1, _DECODE_WARPS_PER_SM // c.num_warps)
        return _gemv_split(x2d, p, c) if isinstance(c, GemvConfig) else _gemm_split(x2d, p, c)

    def steps_of(c):
        return _k_steps(x2d, 64 * c.kt if isinstance(c, GemvConfig) else getattr(c, "bk", 64))

    if config is not None:
        cfg, split = config, split_k or split_of(config)
    else:
        key = _tune_key(kernel, bucket, x2d, p)
        if kernel == "gemm" and auto and m >= WGMMA_MIN_M and key not in _TUNED:  # only a tuning run looks
            cands = cands + wgmma_candidates(x2d, p, bias)
        def launch(c, s, w=p):
            _launch(x2d, w, bias, y, c, s)

        cfg, split = _tune(key, cands, split_of, launch, steps_of, ring=lambda: _weight_ring(p))
        split = split_k or split
    _launch(x2d, p, bias, y, cfg, split, pdl=pdl_active(x2d.device))
    return y


def w4a16_addmm_(out: torch.Tensor, x2d: torch.Tensor, p: PackedW4, *, prologue=None,
                 trace: torch.Tensor | None = None, counter: torch.Tensor | None = None) -> torch.Tensor:
    """out (M, N) float32 += x2d (M, K) @ dequant(W), in place, on the ring decode kernel (M <= 8): each program
    red.adds its fp32 partial of a tile straight into out, so the call has no split-K fold at its end (no
    ticket, no last contributor re-reading the tile: ~2 us a call on the H200, docs/w4a16_decode.md round 9) and
    whoever reads out next (a launch later on the stream) sees the sum. Summation order, so the last bits, vary
    between calls, as the atomic fold's. Configs: the ring candidates, tuned for this use apart from
    w4a16_matmul's. prologue (w4a16_prologue.XNorm / XSiLU / XAttn): the kernel's programs first write x2d
    (contiguous; no act-order) from it, the decode step's RMSNorm, SiLU * up or attention combine in the GEMV. Under
    kernels.pdl with trigger=True the launch lets the next kernel in early. trace (diagnostics, GPU): an int64 buffer
    of >= w4a16_ring.TRACE_STRIDE values a program that a TRACE build of the kernel fills with its programs'
    timestamps (w4a16_ring.TRACE_FIELDS). counter: a zeroed int32 element that the launch's programs take chunks of
    items from (w4a16_ring's DYN build: slow programs take fewer; no prologue or an XNorm; zero it again before the
    next launch). Returns out."""
    from flashscale.kernels import w4a16_prologue
    from flashscale.kernels.w4a16_ring import launch as ring_launch

    m, n = x2d.shape[0], p.out_features
    if out.dtype != torch.float32 or tuple(out.shape) != (m, n) or out.stride(1) != 1:
        raise ValueError(f"out must be float32 ({m}, {n}) with unit stride along N, got {out.dtype} "
                         f"{tuple(out.shape)} stride {out.stride()}")
    cands = ring_candidates(p, m)
    if not cands:
        raise ValueError(_ring_refusal("w4a16_addmm_", x2d, p))
    if prologue is not None:
        w4a16_prologue.check(prologue, x2d)
        if p.perm is not None:
            raise ValueError("prologue: the weight has act-order (x is gathered before the kernel); run the "
                             "prologue's reference first instead")
    if m == 0:
        return out
    require_launchable(x2d, "x2d", "w4a16_addmm_")
    key = _tune_key("ring-add" + w4a16_prologue.mode_name(prologue), m_bucket(m) if m > 1 else 1, x2d, p)
    scratch = []

    def launch(c, s, w=p):  # trials add into a scratch copy: out is left as the caller's (a prologue rewrites the same)
        if not scratch:
            scratch.append(torch.zeros_like(out))
        ring_launch(x2d, w, None, scratch[0], c, s, add=True, prologue=prologue)

    cfg, per_sm = _tune(key, cands, lambda c: c.per_sm, launch, ring=lambda: _weight_ring(p))
    ring_launch(x2d, p, None, out, cfg, per_sm, add=True, pdl=pdl_active(x2d.device), prologue=prologue,
                trigger=trigger_active(), pre_l2=pre_l2_items(), trace=trace, counter=counter)
    return out


def _compile_job(job: dict) -> str:
    """Worker: run one config on a small problem of the same specialization (dtype, G, act-order,
    bias, K/N evenness, argument alignment), which leaves its binary in Triton's on-disk cache.
    Returns "" or what went wrong (the caller's own call then fails loudly, this one must not)."""
    try:
        return _compile_one(job)
    except Exception as e:  # noqa: BLE001  (reported by precompile, raised again at the real call)
        return f"{job['kernel']} {job['config']}: {e!r}"[:500]


def _compile_one(job: dict) -> str:
    torch.manual_seed(0)
    k, n, g = job["k"], job["n"], job["group_size"]
    gg = k if g == -1 else g
    codes = torch.randint(0, 16, (k, n), device="cuda")
    zeros = torch.randint(0, 16, (k // gg, n), device="cuda")
    scales = torch.rand(k // gg, n, device="cuda").half()
    g_idx = (torch.arange(k, device="cuda") // gg)[torch.randperm(k, device="cuda")] if job["act_order"] else None
    p = pack_w4(codes, zeros, scales, group_size=g, g_idx=g_idx)
    dtype = getattr(torch, job["dtype"])
    x = torch.randn(job["m"], k, device="cuda", dtype=dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype) if job["bias"] else None
    if job["kernel"] == "ring":
        from flashscale.kernels.w4a16_ring import RingConfig as cls
    else:
        cls = {"gemv": GemvConfig, "gemm": GemmConfig, "decode": DecodeConfig}[job["kernel"]]
    try:
        w4a16_matmul(x, p, bias, kernel=job["kernel"], config=cls(**job["config"]), split_k=1)
        torch.cuda.synchronize()
    except OutOfResources:
        return ""  # autotuning skips it too
    return ""


def precompile(problems: list[dict], *, processes: int | None = None, all_candidates: bool = True) -> int:
    """Compile in parallel worker processes the configs that calls on `problems` will use, so those
    calls load binaries from Triton's on-disk cache instead of compiling one after another (minutes
    for a benchmark sweep). problems: dicts with m, k, n, group_size, dtype ("bfloat16"/"float16"),
    act_order, bias; a small problem stands for any larger one of the same evenness and alignment.
    all_candidates=False: each bucket's first candidate only (what set_autotune(False) runs).
    Returns the number of configs compiled."""
    import multiprocessing

    jobs, seen = [], set()
    for pr in problems:
        probe = PackedW4(qweight=torch.empty(0), sz=torch.empty(0), perm=None, in_features=pr["k"],
                         out_features=pr["n"], group_size=pr["k"] if pr["group_size"] == -1 else pr["group_size"])
        kernel = "gemv" if pr["m"] == 1 and gemv_candidates(probe) else "gemm"
        cands = gemv_candidates(probe) if kernel == "gemv" else gemm_candidates(pr["m"])
        dec = decode_candidates(probe) if pr["m"] <= 16 else []
        cands = ([(kernel, c) for c in cands] + [("decode", c) for c in dec]
                 + [("ring", c) for c in ring_candidates(probe, pr["m"])])
        for kernel, c in cands if all_candidates else cands[:1]:
            job = dict(pr, kernel=kernel, config=asdict(c))
            key = repr(sorted((k, v) for k, v in job.items() if k != "m"))  # M is not specialized on ...
            key += f"|bm{8 if pr['m'] <= 8 else 16}" if kernel == "decode" else ""  # ... but for the decode tile
            if key not in seen:
                seen.add(key)
                jobs.append(job)
    if not jobs:
        return 0
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes or min(len(jobs), os.cpu_count() or 1)) as pool:
        errors = [e for e in pool.map(_compile_job, jobs) if e]
    for e in errors:
        print(f"precompile: {e}", file=sys.stderr)
    return len(jobs) - len(errors)
