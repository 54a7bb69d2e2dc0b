"""W4A16 launchers: pick the kernel by M (tokens), the tile config by a cached autotune, the split-K.

    M == 1      w4a16_gemv.py   CUDA-core matrix-vector, split-K over the 132 SMs
    M >= 2      w4a16_gemm.py   tensor cores (swap AB, weights as the register operand); split-K
                                while the tiles cannot fill the machine (decode), tiles grow with M
    M <= 16     w4a16_decode.py w4a16_decode_kernel: mma.sync on packed-half dequantization, stream-K
                                over one persistent wave; extra autotune candidates of the M = 1 and
                                M <= 16 buckets (docs/w4a16_decode.md)
    M <= 8      w4a16_ring.py   the same math on a register ring of whole items; extra candidates of the
                                M = 1 and M <= 8 buckets (docs/w4a16_decode.md rounds 5 and 8)
    M <= 16     w4a16_strip.py  no split-K across programs (a program's warps split K, one cross-warp sum);
                                extra candidates of the M = 1, M <= 8 (docs round 14) and M <= 16 buckets
                                (x gathered into the B order first, round 14c)
    M >= 2      w4a16_wgmma.py  on Hopper (sm_90): the Gluon GEMM (TMA ring, warp-specialized producer,
                                register-A wgmma on in-register dequantization; 16-token tiles up to
                                M = 16); its configs join the autotune candidates of the bucket
                                (docs/w4a16_gemm.md, docs/w4a16_decode.md "Round 8")

Autotuning: the first call of a (kernel, M bucket, N, K, G, dtype, act-order) key on a GPU times the
candidate configs of its bucket (a handful, so few compiles) in CUDA graphs over copies of the weight
that pass the L2 (_time) and keeps the fastest for the process (tuned_configs() / load_tuned_configs() move the
table to and from a JSON file). Under CUDA-graph capture an untuned key takes its bucket's first candidate
without timing. Under Triton's interpreter (CPU tests) the first candidate runs, or the one passed as `config=`.

Files: w4a16_configs.py (configs, candidates, split-K and grid heuristics), w4a16_tune.py (the tuned table, timing and
the tuner: patch its knobs there), w4a16_launch.py (the launchers); this module dispatches (w4a16_matmul, w4a16_addmm_),
precompiles, and re-exports the names that callers import from it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch
from triton.runtime.errors import OutOfResources

from flashscale.kernels.interpreter import require_launchable
from flashscale.kernels.pdl import active as pdl_active
from flashscale.kernels.pdl import pre_l2_items, trigger_active
from flashscale.kernels.w4a16_common import split_k_slices
from flashscale.kernels.w4a16_configs import (WGMMA_ENV, WGMMA_MIN_M, DecodeConfig, GemmConfig, GemvConfig,
                                              _DECODE_CANDIDATES, _DECODE_WARPS_PER_SM, _GEMM_CANDIDATES,
                                              _GEMV_CANDIDATES, _RING_CANDIDATES, _config_class, _device_info,
                                              _gemm_split, _gemv_split, _interpreting, _is_ring, _is_strip, _is_wgmma,
                                              _k_steps, _ring_refusal, _wgmma_configs, _wgmma_mode, choose_split_k,
                                              choose_split_k_slices, decode_candidates, decode_grid, gemm_candidates,
                                              gemv_candidates, m_bucket, ring_candidates, stream_k_grid,
                                              strip_candidates, strip_group_multiple, wgmma_candidates)
from flashscale.kernels.w4a16_launch import _launch, _launch_decode, _launch_gemm, _launch_gemv, x_words
from flashscale.kernels.w4a16_pack import PackedW4, pack_w4
from flashscale.kernels.w4a16_tune import (_TUNED, _split_options, _time, _tune, _tune_key, _weight_ring,
                                           load_tuned_configs, pin_config, ring_add_choices, set_autotune,
                                           tuned_configs)

if TYPE_CHECKING:
    from flashscale.kernels.w4a16_ring import RingConfig
    from flashscale.kernels.w4a16_strip import StripConfig
    from flashscale.kernels.w4a16_wgmma import WgmmaConfig

# Names other modules, tests and benchmarks import from here (kept importable from this module since the split into
# w4a16_configs / w4a16_tune / w4a16_launch). Module state lives in w4a16_tune (_TUNED is the same dict object here);
# rebinding a name here (monkeypatch.setattr(w4a16, "_time", ...)) does not reach the code that reads it there.
__all__ = [
    "DecodeConfig", "GemmConfig", "GemvConfig", "WGMMA_ENV", "WGMMA_MIN_M", "_DECODE_CANDIDATES", "_GEMM_CANDIDATES",
    "_GEMV_CANDIDATES", "_RING_CANDIDATES", "_TUNED", "_config_class", "_device_info", "_gemm_split", "_gemv_split",
    "_interpreting", "_k_steps", "_launch", "_launch_decode", "_launch_gemm", "_launch_gemv", "_split_options",
    "_time", "_tune", "_weight_ring", "_wgmma_configs", "choose_split_k", "choose_split_k_slices",
    "decode_candidates", "decode_grid", "gemm_candidates", "gemv_candidates", "load_tuned_configs", "m_bucket",
    "pin_config", "precompile", "ring_add_choices", "ring_candidates", "set_autotune", "split_k_slices",
    "stream_k_grid", "strip_candidates", "tuned_configs", "w4a16_addmm_", "w4a16_matmul", "wgmma_candidates",
    "x_words",
]


def w4a16_matmul(x2d: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None, *,
                 kernel: str | None = None,
                 config: GemmConfig | GemvConfig | DecodeConfig | RingConfig | StripConfig | WgmmaConfig | None = None,
                 split_k: int | None = None) -> torch.Tensor:
    """x2d (M, K) fp16/bf16, unit stride along K -> y (M, N) in x's dtype. Inputs are validated by
    flashscale.ops.w4a16_linear; this launcher assumes them right. kernel: None (by M), "gemv", "gemm",
    "decode", "ring" (M <= 8), "strip" (M <= 16) or "wgmma" (Hopper); config (a GemmConfig, GemvConfig, DecodeConfig,
    RingConfig, StripConfig or WgmmaConfig) / split_k: force them (tests, benchmarks) instead of the tuned choice."""
    m, k = x2d.shape
    n = p.out_features
    y = torch.empty((m, n), dtype=x2d.dtype, device=x2d.device)
    if m == 0:
        return y
    auto = kernel is None and config is None  # the decode kernel joins the candidates of automatic dispatch only
    if kernel is None:
        kernel = "gemv" if m == 1 and gemv_candidates(p) else "gemm"
    if config is not None:
        kernel = ("wgmma" if _is_wgmma(config) else "strip" if _is_strip(config) else "ring" if _is_ring(config) else
                  {DecodeConfig: "decode", GemvConfig: "gemv", GemmConfig: "gemm"}[type(config)])
    dec = decode_candidates(p) if m <= 16 else []
    extra = ring_candidates(p, m) + strip_candidates(p, m) if auto else []  # ring: M <= 8, strip: M <= 16
    if kernel == "gemv":
        if m != 1:
            raise ValueError(f"the gemv kernel takes one token (M = 1), got M={m}")
        cands, bucket = gemv_candidates(p) + (dec + extra if auto else []), 1
        if not gemv_candidates(p):
            raise ValueError(f"the gemv kernel needs a group size that is a multiple of 64 or one group per "
                             f"row; this weight has group_size={p.group_size}, K={k}")
    elif kernel == "gemm":
        cands, bucket = gemm_candidates(m) + (dec + extra if auto else []), m_bucket(m)
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
    elif kernel == "strip":
        cands, bucket = strip_candidates(p, m), m_bucket(m) if m > 1 else 1
        if not cands and config is None:
            raise ValueError(_ring_refusal("the strip kernel", x2d, p, strip_group_multiple(m), tokens=16))
    else:
        raise ValueError(f"kernel={kernel!r}; expected None, 'gemv', 'gemm', 'decode', 'ring', 'strip' or 'wgmma'")

    require_launchable(x2d, "x2d", "w4a16_matmul")

    def split_of(c):
        if _is_wgmma(c):
            return c.split_k  # 0: w4a16_wgmma's auto split
        if _is_ring(c):
            return c.per_sm
        if _is_strip(c):
            return 1
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
    elif job["kernel"] == "strip":
        from flashscale.kernels.w4a16_strip import StripConfig as cls
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
                 + [("ring", c) for c in ring_candidates(probe, pr["m"])]
                 + [("strip", c) for c in strip_candidates(probe, pr["m"])])
        for kernel, c in cands if all_candidates else cands[:1]:
            job = dict(pr, kernel=kernel, config=asdict(c))
            key = repr(sorted((k, v) for k, v in job.items() if k != "m"))  # M is not specialized on ...
            key += f"|bm{8 if pr['m'] <= 8 else 16}" if kernel in ("decode", "strip") else ""  # ... but the M tile
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
