"""W4A16 dispatch plans, pure Python: the GEMM / GEMV / decode configs, the autotune candidates of each M bucket
(with the ring and wgmma kernels' candidates), and the split-K and stream-K grid heuristics that size a launch.

Apart from the dispatcher (w4a16.py), the tuner (w4a16_tune.py) and the launchers (w4a16_launch.py), which all choose
among or launch these: a module without kernel code, that the kernels' own modules (w4a16_ring, w4a16_gring, the AOT
compiles of w4a16_aot) read as well.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton

from flashscale.kernels.interpreter import interpreting
from flashscale.kernels.w4a16_pack import FRAG_K, PackedW4


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
_ATOMIC_BUDGET = 1 << 18  # split-K adds M*N*splits values (and as many tickets) with atomics: cap that


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


# The strip decode kernel (kernels.w4a16_strip, docs/w4a16_decode.md round 14: no split-K across programs, so no
# workspace fold at the end of a call) joins the M = 1 and M <= 8 buckets after the ring kernel's candidates. On the
# H100 (session 45, benchmarks/results/w4a16-strip-h100.json) the best of these beat the
# tuned default at M = 1..8 on 4096^2 (7.3 against 8.4 us at M = 1, 7.8 against 9.9 at M = 4) and 8192^2 (17.1
# against 18.2), and tied it (+-4 %) on the MLP shapes; at M = 16 it lost by 1.3-1.9x (not a candidate there).
# (rows, kt, warps, ring, maxnreg) of each; split 1 (the grid is ceil(N / 16 R)). Ring 3 at R 1: four 4-warp
# programs an SM under the 128-register cap (one wave at N 8192; the tuner's pick at M = 1 on 4096^2, 8192^2 and
# 8192 x 28672 in session 46's H100 run). Sweep-only: the fenced configs (round 14e) and the rul10 ones (H100,
# session 49: within 1-2 % of these at M = 1).
_STRIP_CANDIDATES = ((1, 2, 4, 2, None), (1, 2, 4, 3, 128), (2, 2, 4, 2, None), (1, 2, 8, 2, None), (2, 2, 8, 2, None))
# M 2-8, beside those: x in the B order (its gather part of every timed call), (rows, kt, warps, ring, maxnreg,
# fence). Since round 14f its loop is 1.90 instructions a weight against 2.32 and a warp reads M/8 of x's block: on
# the H100 (session 49, `gpu_pending.sh s48` and the M 1 / 4 / 8 sweep; docs/w4a16_decode.md round 14g) they beat
# the tuned default at M = 4 and 8 on every shape, gather included (M = 8: 8192^2 19.9 -> 17.7 us, 28672 x 8192
# 53.3 -> 48.8, 14336 x 4096 19.2 -> 17.0 with eight warps), and not at M = 1 (the gather's ~1.5 us).
_STRIP_CANDIDATES_XP8 = ((1, 2, 4, 2, None, False), (1, 2, 4, 3, None, False), (1, 2, 8, 2, None, True))
# M 9-16: x in the B order alone (the same fields). On the H100 (session 47, benchmarks/results/w4a16-strip-h100.json)
# r1 kt2 w4 ring2 xp took 20.8 us at 8192^2, M = 16, gather included, against the tuned default's 23.1, and 10.3
# against 10.2 at 4096^2; the x-words strip lost 1.3-1.9x there.
_STRIP_CANDIDATES_16 = ((1, 2, 4, 2, None, False),)


def _strip_bucket(m: int) -> int:
    return 1 if m == 1 else 8 if m <= 8 else 16


@functools.cache
def _strip_configs(bucket: int) -> tuple:
    """The strip configs of a bucket (1: M = 1, 8: M 2-8, 16: M 9-16)."""
    from flashscale.kernels.w4a16_strip import StripConfig  # here: w4a16_strip imports this module

    words = () if bucket == 16 else tuple(StripConfig(rows=r, kt=kt, num_warps=w, ring=ring, maxnreg=cap)
                                          for r, kt, w, ring, cap in _STRIP_CANDIDATES)
    xp = _STRIP_CANDIDATES_16 if bucket == 16 else _STRIP_CANDIDATES_XP8 if bucket == 8 else ()
    return words + tuple(StripConfig(rows=r, kt=kt, num_warps=w, ring=ring, maxnreg=cap, xperm=True, fence=f)
                         for r, kt, w, ring, cap, f in xp)


def strip_candidates(p: PackedW4, m: int) -> list:
    """The strip kernel's configs for M tokens (x words at M <= 8, x in the B order too at 2..8 and alone at 9..16;
    none past 16) and p's group size (a sub-item of 64 kt inputs in a group)."""
    g, k = p.group_size, p.in_features
    if m > 16:
        return []
    return [c for c in _strip_configs(_strip_bucket(m)) if g == k or g % (64 * c.kt) == 0]


def strip_group_multiple(m: int) -> int:
    """The group sizes the strip candidates of M's bucket take: multiples of this (64 kt; or one group a row)."""
    return 64 * min(c.kt for c in _strip_configs(_strip_bucket(m)))


def _ring_refusal(what: str, x2d: torch.Tensor, p: PackedW4, multiple: int = 128, tokens: int = 8) -> str:
    return (f"{what} takes up to {tokens} tokens and a group size that is a multiple of {multiple} or one group per "
            f"row; got M={x2d.shape[0]}, group_size={p.group_size}, K={p.in_features}")


def _is_ring(cfg) -> bool:
    # kernels.w4a16_ring.RingConfig (imported where used: it imports this module); a StripConfig has a ring too
    return hasattr(cfg, "ring") and not hasattr(cfg, "rows")


def _is_strip(cfg) -> bool:
    return hasattr(cfg, "rows")  # kernels.w4a16_strip.StripConfig


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


def _config_class(fields: dict):
    if "consumers" in fields:
        from flashscale.kernels.w4a16_wgmma import WgmmaConfig

        return WgmmaConfig
    if "rows" in fields:
        from flashscale.kernels.w4a16_strip import StripConfig

        return StripConfig
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
# its twin that writes y by 16-byte stores (WgmmaConfig(vec_y=True): the same bits) at every M. By default the vec_y
# twins are timed from M = VEC_Y_MIN_M: on an H100 (session 43, docs/w4a16_gemm.md) they took M = 256 from 0.87 /
# 0.82 / 0.90x bf16 to 0.93 / 0.93 / 0.95x on the three large shapes and were within the grid's run-to-run spread
# from M = 1024 (the tuner keeps a twin only where it times faster); =plain times the configs alone.
WGMMA_ENV = "FLASHSCALE_W4A16_WGMMA"
WGMMA_MIN_M = 2
VEC_Y_MIN_M = 65


def _wgmma_mode() -> str:
    """FLASHSCALE_W4A16_WGMMA, checked: "", "0", "1", "plain", "h2" or "vy"."""
    mode = os.environ.get(WGMMA_ENV, "")
    if mode not in ("", "0", "1", "plain", "h2", "vy"):
        raise ValueError(f"{WGMMA_ENV}={mode!r}: takes 0 (never the wgmma GEMM), 1 / unset (an autotune candidate "
                         f"from M = {WGMMA_MIN_M} on sm_90, each config beside its 16-byte y store twin from M = "
                         f"{VEC_Y_MIN_M}), plain (the configs without twins), h2 (each beside its packed 16-bit unpack "
                         f"twin) or vy (each beside its 16-byte y store twin at every M)")
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
    "h2" / "vy", each followed by its h2=True / vec_y=True twin (where that fits too); twin "" or "1" (the
    default): the vec_y twins from M = VEC_Y_MIN_M; "plain": none."""
    from flashscale.kernels import w4a16_wgmma as wg

    if twin in ("", "1"):
        twin = "vy" if m >= VEC_Y_MIN_M else ""
    ok = [c for c in wg.candidates(m) if wg.config_error(c, p.group_size, p.in_features) is None]
    out = []
    for c in ok:
        t = wg.twin(c, twin) if twin in wg.TWINS else c
        out += [c] + ([t] if t != c and wg.config_error(t, p.group_size, p.in_features) is None else [])
    return out


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
