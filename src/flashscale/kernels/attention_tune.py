"""Block sizes, warps and pipeline stages for the attention kernels: defaults, tuning, and a config cache.

How a config is chosen for a call (first hit wins):
  1. this process's memo, keyed by (GPU name, Triton version, kernel, dtype, padded head dim, causal,
     sequence-length bucket);
  2. the user cache, a JSON file `$FLASHSCALE_CACHE_DIR/attention_configs.json` (default
     `~/.cache/flashscale/`), written by tuning runs (atomically: temp file + rename);
  3. tuning, only when enabled (`set_autotune(True)` or FLASHSCALE_AUTOTUNE=1): every candidate is timed
     with triton.testing.do_bench (median) on the real arguments and the fastest goes to 1 and 2;
  4. the hand-picked default for the head dim (chosen from the Hopper register/shared-memory budget:
     ptxas reports no spills for these).
Triton keeps compiled kernels in its own on-disk cache (~/.triton/cache), so a second process neither
re-tunes (the JSON has the choice) nor re-compiles (Triton has the binary).

Under the interpreter (CPU tests) one small config is used; tests pass explicit configs to cover others.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import triton

from flashscale.kernels.interpreter import interpreting


@dataclass(frozen=True, kw_only=True)
class FwdConfig:
    """Forward (and deterministic dQ) kernel: BLOCK_M query rows x BLOCK_N key rows a step."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    tma: bool = False  # K/V through tensor descriptors (Hopper+), else pointer loads
    warp_specialize: bool = False  # tl.range(..., warp_specialize=True) on the unmasked loop (needs tma)


@dataclass(frozen=True, kw_only=True)
class BwdConfig:
    """dK/dV kernel: BLOCK_N key rows held on chip, stepping over BLOCK_M query rows. d_split > 1: that many
    programs per key block, each accumulating one slice of the head dim of dK/dV (and its dQ atomics) while
    recomputing S and dP over the whole head dim: 1.4x the FLOPs at d_split 2, for accumulators that fit
    the register file at head_dim 256 with wgmma-sized tiles."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    d_split: int = 1


_lock = threading.Lock()
_memo: dict[str, dict] = {}  # tuned this process
_chosen: dict[str, dict] = {}  # every GPU pick this process, for reports (benchmarks record it)
_disk: dict[str, dict] | None = None
_autotune: bool | None = None


def set_autotune(enabled: bool) -> None:
    """Turn tuning of uncached shapes on or off for this process (default: FLASHSCALE_AUTOTUNE=1)."""
    global _autotune
    _autotune = bool(enabled)
    _plans.clear()  # picks made under the other setting are re-made


def autotune_enabled() -> bool:
    if _autotune is not None:
        return _autotune
    return os.environ.get("FLASHSCALE_AUTOTUNE", "0") == "1"


def cache_path() -> Path:
    root = os.environ.get("FLASHSCALE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "flashscale")
    return Path(root) / "attention_configs.json"


def _load_disk() -> dict[str, dict]:
    global _disk
    if _disk is None:
        try:
            _disk = json.loads(cache_path().read_text())
        except (OSError, ValueError):
            _disk = {}
    return _disk


def _store_disk(key: str, value: dict) -> None:
    disk = _load_disk()
    disk[key] = value
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(disk, f, indent=1, sort_keys=True)
        os.replace(f.name, path)
    except OSError:  # a read-only home only loses the persistence, never the run
        pass


def pow2(n: int) -> int:
    """Next power of two >= n (>= 1). Host-side: triton.next_power_of_2 and triton.cdiv are constexpr
    functions in Triton 3.6 and cost tens of microseconds a call, which short sequences feel."""
    return 1 << max(int(n) - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def seqlen_bucket(n: int) -> int:
    """Powers of two from 128 to 16384: configs change slowly with length, the key stays small."""
    return min(max(pow2(max(n, 1)), 128), 16384)


@functools.lru_cache(maxsize=None)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _device_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)


_cached_capability = functools.lru_cache(maxsize=None)(_device_capability)


def capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) of device's GPU, (0, 0) off CUDA; cached (checked on every launch), uncached under
    torch.compile, which traces the call once and would warn at every compile about an lru_cache wrapper."""
    return _device_capability(device) if torch.compiler.is_compiling() else _cached_capability(device)


@functools.lru_cache(maxsize=None)  # on every launch; never written
def dummy_i32(device: torch.device) -> torch.Tensor:
    """An empty int32 tensor standing in for absent pointer arguments (cu_seqlens of a dense call)."""
    return torch.empty(0, dtype=torch.int32, device=device)


def cache_key(kind: str, q: torch.Tensor, head_dim: int, causal: bool, seqlen: int) -> str:
    gpu = _device_name(q.device)
    bd = max(pow2(head_dim), 16)
    return f"{gpu}|triton-{triton.__version__}|{kind}|{str(q.dtype).replace('torch.', '')}|d{bd}|" \
           f"{'causal' if causal else 'full'}|s{seqlen_bucket(seqlen)}"


def tma_ready(t: torch.Tensor) -> torch.Tensor:
    """t contiguous with a 16-byte aligned base, as a Hopper kernel's TMA descriptor reads it (a copy where not)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def tma_ok(*tensors: torch.Tensor) -> bool:
    """TMA needs 16-byte aligned bases and row strides (per sequence and head, as the kernels index).

    Under the interpreter descriptors are emulated, so tests can run the TMA code path on CPU.
    """
    interp = interpreting()
    for t in tensors:
        if not interp and (not t.is_cuda or capability(t.device)[0] < 9):
            return False
        if t.data_ptr() % 16 or any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return False
    return True


def fwd_candidates(head_dim: int, dtype: torch.dtype, *, gpu: bool, hopper: bool,
                   dropout: bool = False) -> list[FwdConfig]:
    """Default first. Shared memory: Q (BM x BD) + stages x (K + V) (BN x BD); H100/H200 allow 227 KiB.

    ptxas (sm_90a, bf16) reports no spills for these; benchmarks/attention_resources.py re-checks.
    d <= 128 reads K/V through TMA on Hopper. d = 256 never does: with Triton 3.6 ptxas crashes
    (SIGSEGV) on the 256-wide descriptor loads (seen 2026-11 for every block shape tried).
    """
    if not gpu:
        return [FwdConfig(block_m=16, block_n=16)]
    tma = hopper and dtype != torch.float32
    if dtype == torch.float32:  # "ieee" fp32 products run on FMA units, register-hungry: small tiles
        return [FwdConfig(block_m=32, block_n=32, num_warps=4 if head_dim <= 64 else 8, num_stages=2)]
    if dropout and head_dim <= 128:
        # Philox state and the mask's shuffle: 128 x 128 tiles spill or pass 227 KiB of shared memory
        return [FwdConfig(block_m=128, block_n=64, num_warps=8, num_stages=3, tma=tma)]  # no spill
    if head_dim <= 64:
        return [FwdConfig(block_m=128, block_n=64, num_warps=4, num_stages=3, tma=tma),   # 196 regs
                FwdConfig(block_m=128, block_n=128, num_warps=8, num_stages=3, tma=tma),  # 164 regs
                FwdConfig(block_m=64, block_n=64, num_warps=4, num_stages=3, tma=tma)]
    if head_dim <= 128:
        return [FwdConfig(block_m=128, block_n=128, num_warps=8, num_stages=3, tma=tma),  # 199 regs, 225 KiB
                FwdConfig(block_m=128, block_n=64, num_warps=8, num_stages=3, tma=tma),   # 152 regs
                FwdConfig(block_m=128, block_n=128, num_warps=8, num_stages=2)]
    return [FwdConfig(block_m=128, block_n=32, num_warps=8, num_stages=2),                # 250 regs, 0 spill
            FwdConfig(block_m=64, block_n=32, num_warps=4, num_stages=3),
            FwdConfig(block_m=128, block_n=64, num_warps=8, num_stages=2)]                # 8 B spill


def bwd_candidates(head_dim: int, dtype: torch.dtype, *, gpu: bool, hopper: bool) -> list[BwdConfig]:
    """dK/dV kernel: K, V (BN x BD) on chip, dK, dV accumulate in registers (2 x BN x BD fp32): the
    register file bounds BN x BD, so BN shrinks as the head dim grows."""
    if not gpu:
        return [BwdConfig(block_m=16, block_n=16)]
    if dtype == torch.float32:
        return [BwdConfig(block_m=16, block_n=32, num_warps=4 if head_dim <= 128 else 8, num_stages=1)]
    if head_dim <= 64:
        return [BwdConfig(block_m=64, block_n=128, num_warps=8, num_stages=2),   # 219 regs
                BwdConfig(block_m=64, block_n=64, num_warps=4, num_stages=2)]
    if head_dim <= 128:
        return [BwdConfig(block_m=32, block_n=128, num_warps=8, num_stages=2),   # 226 regs
                BwdConfig(block_m=64, block_n=128, num_warps=8, num_stages=2),   # 88 B spill
                BwdConfig(block_m=64, block_n=64, num_warps=8, num_stages=2)]
    # head_dim 256 (sm_90a ptxas, bf16, 2026-11-29): whole-width accumulators spill or fall back to mma.sync;
    # the d_split=2 configs hold half of dK/dV each (1.4x the FLOPs) without spills, with wgmma
    return [BwdConfig(block_m=16, block_n=64, num_warps=8, num_stages=2),        # 48 B spill, wgmma
            BwdConfig(block_m=32, block_n=32, num_warps=8, num_stages=2),        # no spill, mma.sync only
            BwdConfig(block_m=32, block_n=64, num_warps=8, num_stages=2),        # 132 B spill
            BwdConfig(block_m=32, block_n=64, num_warps=8, num_stages=2, d_split=2),   # 220 regs, 184 KB smem
            BwdConfig(block_m=16, block_n=128, num_warps=8, num_stages=2, d_split=2)]  # 248 regs, 216 KB smem


def dq_candidates(head_dim: int, dtype: torch.dtype, *, gpu: bool, hopper: bool) -> list[FwdConfig]:
    """Deterministic dQ kernel: like the forward, plus dO on chip and two products more a step."""
    if not gpu:
        return [FwdConfig(block_m=16, block_n=16)]
    if dtype == torch.float32:
        return [FwdConfig(block_m=32, block_n=32, num_warps=4 if head_dim <= 64 else 8, num_stages=1)]
    if head_dim <= 128:
        return [FwdConfig(block_m=128, block_n=64, num_warps=8, num_stages=2),  # 173 regs (d128)
                FwdConfig(block_m=64, block_n=64, num_warps=4, num_stages=2)]
    return [FwdConfig(block_m=64, block_n=32, num_warps=4, num_stages=2),       # 220 regs
            FwdConfig(block_m=64, block_n=64, num_warps=8, num_stages=1)]


def _fit_block_m(cfg, seqlen_q: int):
    """Short query sequences (decode, tiny batches) get a smaller row block, never under tl.dot's 16."""
    bm = min(cfg.block_m, max(16, pow2(max(seqlen_q, 1))))
    if bm == cfg.block_m:
        return cfg
    return replace(cfg, block_m=bm, num_warps=min(cfg.num_warps, 4))


def chosen_configs() -> dict[str, dict]:
    """{cache key: config} of every config picked on a GPU in this process."""
    with _lock:
        return dict(sorted(_chosen.items()))


def _pick(kind: str, cls, candidates: list, q, head_dim, causal, seqlen, bench):
    if not q.is_cuda or interpreting():
        return candidates[0]
    key = cache_key(kind, q, head_dim, causal, seqlen)
    cfg = _pick_uncached(key, cls, candidates, bench)
    with _lock:
        _chosen[key] = asdict(cfg)
    return cfg


def _pick_uncached(key: str, cls, candidates: list, bench):
    if len(candidates) == 1:
        return candidates[0]
    with _lock:
        hit = _memo.get(key) or _load_disk().get(key)
    if hit is not None:
        try:
            cfg = cls(**hit)
        except TypeError:  # an entry from another version of this file: ignore it
            cfg = None
        if cfg in candidates:  # never resurrect a config this version no longer offers
            return cfg
    if not autotune_enabled() or bench is None:
        return candidates[0]
    timings = {}
    for cand in candidates:
        try:
            timings[cand] = bench(cand)
        except (triton.runtime.errors.OutOfResources, triton.CompilationError, RuntimeError):
            continue  # a config this GPU cannot hold is simply not a candidate
    best = min(timings, key=timings.get) if timings else candidates[0]
    with _lock:
        _memo[key] = asdict(best)
        _store_disk(key, asdict(best))
    return best


def bench_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")


def _where(q: torch.Tensor) -> dict:
    gpu = q.is_cuda and not interpreting()
    return dict(gpu=gpu, hopper=gpu and capability(q.device)[0] >= 9)


def _candidates(kind: str, q, head_dim: int, seqlen_q: int, dropout: bool) -> list:
    where = _where(q)
    if kind == "fwd":
        cands = fwd_candidates(head_dim, q.dtype, dropout=dropout, **where)
    elif kind == "bwd":
        cands = bwd_candidates(head_dim, q.dtype, **where)
    else:
        cands = dq_candidates(head_dim, q.dtype, **where)
    return list(dict.fromkeys(_fit_block_m(c, seqlen_q) for c in cands))


_plans: dict[tuple, tuple] = {}


def plan(kind: str, q: torch.Tensor, *, head_dim: int, seqlen_q: int, seqlen_k: int, causal: bool,
         dropout: bool = False, bench=None) -> tuple:
    """(config, candidates) for a "fwd", "bwd" (dK/dV) or "dq" launch.

    Memoized per shape class (device, dtype, head dim, causal, dropout, length buckets), so a repeat call
    costs one dict lookup: on short sequences the host time per call is what the GPU waits for.
    """
    fast = (kind, q.device, q.dtype, head_dim, causal, dropout, seqlen_bucket(max(seqlen_q, seqlen_k)),
            min(pow2(max(seqlen_q, 1)), 256))
    hit = _plans.get(fast)
    if hit is not None:
        return hit
    cands = _candidates(kind, q, head_dim, seqlen_q, dropout)
    cls = BwdConfig if kind == "bwd" else FwdConfig
    key_kind = "fwd-dropout" if kind == "fwd" and dropout else kind
    cfg = _pick(key_kind, cls, cands, q, head_dim, causal, max(seqlen_q, seqlen_k), bench)
    _plans[fast] = (cfg, cands)
    return cfg, cands


def launch_with_fallback(launch, config, candidates: list) -> None:
    """launch(config); if the GPU cannot hold it (shared memory or registers: an older or smaller GPU than
    the defaults were sized for), the next candidates in order, smallest last. Never a resource error
    in front of a user while some config fits."""
    order = [config] + [c for c in candidates if c != config]
    for i, cfg in enumerate(order):
        try:
            return launch(cfg)
        except triton.runtime.errors.OutOfResources:
            if i == len(order) - 1:
                raise
