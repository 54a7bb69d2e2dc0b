"""W4A16 launchers: pick the kernel by M (tokens), the tile config by a cached autotune, the split-K.

    M == 1      w4a16_gemv.py   CUDA-core matrix-vector, split-K over the 132 SMs
    M >= 2      w4a16_gemm.py   tensor cores (swap AB, weights as the register operand); split-K
                                while the tiles cannot fill the machine (decode), tiles grow with M

Autotuning: the first call of a (kernel, M bucket, N, K, G, dtype, act-order) key on a GPU times the
candidate configs of its bucket (a handful, so few compiles) with triton.testing.do_bench and keeps
the fastest for the process (tuned_configs() / load_tuned_configs() move the table to and from a JSON
file). Under CUDA-graph capture an untuned key takes its bucket's first candidate without timing.
Under Triton's interpreter (CPU tests) the first candidate runs, or the one passed as `config=`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass

import torch
import triton
import triton.testing
from triton.runtime.errors import OutOfResources

from flashscale.kernels.w4a16_common import MAGIC_ONE, split_k_workspace
from flashscale.kernels.w4a16_gemm import w4a16_gemm_kernel
from flashscale.kernels.w4a16_gemv import w4a16_gemv_kernel
from flashscale.kernels.w4a16_pack import FRAG_K, PackedW4, pack_w4


@dataclass(frozen=True, kw_only=True)
class GemmConfig:
    bm: int  # tokens per tile (the MMA's n)
    bn: int  # output features per tile (the MMA's m; 64 per warpgroup)
    bk: int  # input features per step, a multiple of 64
    num_warps: int = 4
    num_stages: int = 3
    group: int = 8


@dataclass(frozen=True, kw_only=True)
class GemvConfig:
    bn: int  # output features per program, a multiple of 16
    kt: int  # 64-wide fragment columns per step (BK = 64 * kt)
    num_warps: int = 4
    num_stages: int = 2


# Candidates per M bucket, best guess first (the one taken untimed). Few on purpose: each is a compile.
# BK = 128 everywhere: with two fragment columns per step Triton keeps the dequantized tile in the
# wgmma A-fragment registers (BK = 64 made it convert through shared memory, seen in the sm_90 TTGIR);
# tiles of 128x128 tokens take 8 warps (4 spill the accumulator inside the loop).
_GEMM_CANDIDATES: dict[int, list[GemmConfig]] = {
    16: [GemmConfig(bm=16, bn=128, bk=128, num_stages=4), GemmConfig(bm=16, bn=64, bk=128, num_stages=4)],
    32: [GemmConfig(bm=32, bn=128, bk=128, num_stages=4), GemmConfig(bm=32, bn=64, bk=128, num_stages=4)],
    64: [GemmConfig(bm=64, bn=128, bk=128, num_stages=3), GemmConfig(bm=64, bn=128, bk=128, num_warps=8, num_stages=4)],
    128: [GemmConfig(bm=128, bn=128, bk=128, num_warps=8, num_stages=3),
          GemmConfig(bm=64, bn=128, bk=128, num_warps=8, num_stages=4)],
    1 << 30: [GemmConfig(bm=128, bn=128, bk=128, num_warps=8, num_stages=3),
              GemmConfig(bm=256, bn=128, bk=128, num_warps=8, num_stages=3),
              GemmConfig(bm=128, bn=128, bk=128, num_warps=8, num_stages=4)],
}
_GEMV_CANDIDATES: list[GemvConfig] = [GemvConfig(bn=256, kt=2), GemvConfig(bn=128, kt=2), GemvConfig(bn=256, kt=1)]

_TUNED: dict[str, dict] = {}
_AUTOTUNE = True


def set_autotune(enabled: bool) -> None:
    """Off: every key takes its bucket's first candidate untimed (one compile a bucket: tests)."""
    global _AUTOTUNE
    _AUTOTUNE = bool(enabled)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: exercise split-K on small shapes
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_split_k(tiles: int, k_steps: int, num_sms: int) -> int:
    """Splits of K so tiles * splits is about two programs per SM, each split >= 2 steps."""
    if tiles >= num_sms or k_steps < 4:
        return 1
    return max(1, min(-(-2 * num_sms // tiles), k_steps // 2))


def tuned_configs() -> dict[str, dict]:
    """The autotune table of this process (JSON-able): key -> config fields."""
    return {k: dict(v) for k, v in _TUNED.items()}


def load_tuned_configs(table: dict[str, dict]) -> None:
    _TUNED.update({k: dict(v) for k, v in table.items()})


def _common_args(x2d: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, y: torch.Tensor):
    perm = p.perm if p.perm is not None else p.sz  # any int32 pointer when unused
    b = bias if bias is not None else y
    return perm, b


def _launch_gemm(x2d, p: PackedW4, bias, y, cfg: GemmConfig, split_k: int | None = None) -> None:
    m, k = x2d.shape
    n = p.out_features
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
    k_steps = triton.cdiv(triton.cdiv(k, FRAG_K) * FRAG_K, cfg.bk)
    if split_k is None:
        split_k = choose_split_k(tiles, k_steps, _num_sms(x2d.device))
    # a workspace even without split-K (then untouched): the pointer types are part of the compiled variant
    ws, cnt = split_k_workspace(x2d.device, m * n if split_k > 1 else 1)
    perm, b = _common_args(x2d, p, bias, y)
    n_pad = p.sz.shape[1]
    w4a16_gemm_kernel[(tiles, split_k)](
        x2d, p.qweight, p.sz, perm, y, b, ws, cnt,
        m, n, k, x2d.stride(0), y.stride(0), p.qweight.stride(0), p.sz.stride(0), MAGIC_ONE, split_k,
        G=p.group_size, HAS_PERM=p.perm is not None, HAS_BIAS=bias is not None,
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, GROUP=cfg.group,
        EVEN_K=k % cfg.bk == 0, EVEN_N=n_pad % cfg.bn == 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def _launch_gemv(x2d, p: PackedW4, bias, y, cfg: GemvConfig, split_k: int | None = None) -> None:
    k = x2d.shape[1]
    n = p.out_features
    bk = 64 * cfg.kt
    tiles = triton.cdiv(n, cfg.bn)
    k_steps = triton.cdiv(triton.cdiv(k, FRAG_K) * FRAG_K, bk)
    if split_k is None:
        split_k = choose_split_k(tiles, k_steps, _num_sms(x2d.device))
    ws, cnt = split_k_workspace(x2d.device, n if split_k > 1 else 1)
    perm, b = _common_args(x2d, p, bias, y)
    n_pad = p.sz.shape[1]
    w4a16_gemv_kernel[(tiles, split_k)](
        x2d, p.qweight, p.sz, perm, y, b, ws, cnt,
        n, k, p.qweight.stride(0), p.sz.stride(0), MAGIC_ONE, split_k,
        G=p.group_size, HAS_PERM=p.perm is not None, HAS_BIAS=bias is not None,
        BN=cfg.bn, KT=cfg.kt, EVEN_K=k % bk == 0, EVEN_N=n_pad % cfg.bn == 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def _tune(key: str, cands: list, launch) -> object:
    """Fastest candidate for `key` (timed once per process), or the first when timing is impossible."""
    hit = _TUNED.get(key)
    if hit is not None:
        cls = GemvConfig if "kt" in hit else GemmConfig
        return cls(**hit)
    if len(cands) == 1 or not _AUTOTUNE or _interpreting() or torch.cuda.is_current_stream_capturing():
        return cands[0]
    best, best_t = None, float("inf")
    for c in cands:
        try:
            launch(c)  # compile outside the timing
            t = triton.testing.do_bench(lambda c=c: launch(c), warmup=5, rep=25, return_mode="median")
        except OutOfResources:
            continue  # this config does not fit the device (shared memory, registers)
        if t < best_t:
            best, best_t = c, t
    if best is None:
        raise RuntimeError(f"no W4A16 config runs on this device for {key}")
    _TUNED[key] = asdict(best)
    return best


def w4a16_matmul(x2d: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None, *,
                 kernel: str | None = None, config: GemmConfig | GemvConfig | None = None,
                 split_k: int | None = None) -> torch.Tensor:
    """x2d (M, K) fp16/bf16, unit stride along K -> y (M, N) in x's dtype. Inputs are validated by
    flashscale.ops.w4a16_linear; this launcher assumes them right. kernel: None (by M), "gemv", "gemm"."""
    m, k = x2d.shape
    n = p.out_features
    y = torch.empty((m, n), dtype=x2d.dtype, device=x2d.device)
    if m == 0:
        return y
    if kernel is None:
        kernel = "gemv" if m == 1 and gemv_candidates(p) else "gemm"
    perm_tag = "perm" if p.perm is not None else "noperm"
    dev = torch.cuda.get_device_name(x2d.device) if x2d.is_cuda else "cpu"
    if kernel == "gemv":
        if m != 1:
            raise ValueError(f"the gemv kernel takes one token (M = 1), got M={m}")
        cands = [config] if config is not None else gemv_candidates(p)
        if not cands:
            raise ValueError(f"the gemv kernel needs a group size that is a multiple of 64 or one group per "
                             f"row; this weight has group_size={p.group_size}, K={k}")
        key = f"gemv|{n}|{k}|{p.group_size}|{x2d.dtype}|{perm_tag}|{dev}"
        cfg = config or _tune(key, cands, lambda c: _launch_gemv(x2d, p, bias, y, c, split_k))
        _launch_gemv(x2d, p, bias, y, cfg, split_k)
    elif kernel == "gemm":
        cands = [config] if config is not None else gemm_candidates(m)
        key = f"gemm|{m_bucket(m)}|{n}|{k}|{p.group_size}|{x2d.dtype}|{perm_tag}|{dev}"
        cfg = config or _tune(key, cands, lambda c: _launch_gemm(x2d, p, bias, y, c, split_k))
        _launch_gemm(x2d, p, bias, y, cfg, split_k)
    else:
        raise ValueError(f"kernel={kernel!r}; expected None, 'gemv' or 'gemm'")
    return y


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
    cls = GemvConfig if job["kernel"] == "gemv" else GemmConfig
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
        for c in cands if all_candidates else cands[:1]:
            job = dict(pr, kernel=kernel, config=asdict(c))
            key = repr(sorted((k, v) for k, v in job.items() if k != "m"))  # M is not specialized on
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
