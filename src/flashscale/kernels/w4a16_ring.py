"""W4A16 decode (M <= 16) on a register ring of items rotated by position (docs/w4a16_decode.md "Round 5").

y (M, N) = x (M, K) @ dequant(W) (K, N) (+ bias) for a PackedW4 weight (w4a16_pack.py): w4a16_ring(), and three
configs (w4a16._RING_CANDIDATES) are autotune candidates of w4a16_matmul's M = 1 and M <= 8 buckets since session 29
(on the H200 it wins at M = 1 on most Llama shapes, with the atomic fold; it loses at M = 16: docs/w4a16_decode.md).

Files: w4a16_ring_config.py (RingConfig, the candidates, the launch plan), w4a16_ring_kernel.py (the Triton kernel,
and the design it implements in its module docstring), w4a16_ring_aot.py (sm_90 compiles and census); this module
checks the arguments, launches, and re-exports the names that callers import from it.
"""

from __future__ import annotations

import torch
import triton

from flashscale.kernels.w4a16_common import split_k_slices, split_k_workspace
from flashscale.kernels.w4a16_configs import _device_info, _interpreting
from flashscale.kernels.w4a16_launch import x_words
from flashscale.kernels.w4a16_pack import PackedW4
from flashscale.kernels.w4a16_prologue import Prologue, XAttn, XNorm, kernel_args
from flashscale.kernels.w4a16_ring_aot import aot_jobs, census, compile_sm90, hot_loop
from flashscale.kernels.w4a16_ring_config import (MAX_TOKENS, REGS_PER_SM, RING_CONFIGS, RING_CONFIGS_16, TRACE_FIELDS,
                                                  TRACE_STRIDE, RingConfig, configs_for, dyn_chunk, late_cut,
                                                  ring_grid)
from flashscale.kernels.w4a16_ring_kernel import w4a16_ring_kernel

# Names other modules, tests and benchmarks import from here (kept importable from this module since the split into
# w4a16_ring_config / w4a16_ring_kernel / w4a16_ring_aot). Replacing one here (monkeypatch.setattr(w4a16_ring,
# "RING_CONFIGS", ...)) does not reach the code that reads it in its own module (configs_for: w4a16_ring_config).
__all__ = [
    "MAX_TOKENS", "REGS_PER_SM", "RING_CONFIGS", "RING_CONFIGS_16", "TRACE_FIELDS", "TRACE_STRIDE", "RingConfig",
    "aot_jobs", "census", "check_args", "check_operands", "compile_sm90", "configs_for", "dyn_chunk", "hot_loop",
    "late_cut", "launch", "ring_grid", "w4a16_ring", "w4a16_ring_kernel",
]


# ---- launcher

def check_operands(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, kt: int,
                   kernel: str = "the ring decode kernel") -> None:
    """ValueError / TypeError naming the argument for operands a stream-K decode kernel (this one, w4a16_gring) does
    not take: x (M <= 16, K) 16-bit on p's device, items of 64 kt inputs inside one group, bias (N,) in x's dtype."""
    if not isinstance(p, PackedW4):
        raise TypeError(f"p must be a PackedW4, got {type(p).__name__}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor (M, K), got {getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"x must be float16 or bfloat16, got {x.dtype}")
    m, k = x.shape
    if m > MAX_TOKENS:
        raise ValueError(f"x has M={m} rows: {kernel} takes M <= {MAX_TOKENS} (use w4a16_matmul)")
    if k != p.in_features:
        raise ValueError(f"x has K={k} columns, the weight in_features={p.in_features}")
    if x.device != p.qweight.device:
        raise ValueError(f"x is on {x.device}, the weight on {p.qweight.device}")
    if k % p.group_size:
        raise ValueError(f"group_size={p.group_size} must divide K={k}")
    if p.group_size != k and p.group_size % (64 * kt):
        raise ValueError(f"group_size={p.group_size} must be a multiple of {64 * kt} (64 kt, kt={kt}) or "
                         f"K={k} (one group): an item may not cross a group")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (p.out_features,):
            raise ValueError(f"bias must have shape ({p.out_features},), got {getattr(bias, 'shape', None)}")
        if bias.dtype != x.dtype:
            raise ValueError(f"bias must have x's dtype {x.dtype}, got {bias.dtype}")


def check_args(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, cfg: RingConfig, per_sm: int) -> None:
    """ValueError / TypeError naming the argument for anything the kernel does not take."""
    check_operands(x, p, bias, cfg.kt)
    if cfg.bn < 16 or cfg.bn & (cfg.bn - 1) or cfg.bn // 16 < 1:
        raise ValueError(f"config.bn={cfg.bn} must be a power of two >= 16")
    if cfg.kt not in (1, 2) or cfg.ring not in (1, 2, 3, 4):
        raise ValueError(f"config kt={cfg.kt} must be 1 or 2 and ring={cfg.ring} 1..4")
    if not isinstance(cfg.l2_ahead, int) or not 0 <= cfg.l2_ahead <= 16:
        raise ValueError(f"config.l2_ahead={cfg.l2_ahead!r} must be an int 0..16 (items prefetched past the ring)")
    if not isinstance(per_sm, int) or per_sm < 1:
        raise ValueError(f"per_sm={per_sm!r} must be a positive int")


def w4a16_ring(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None, *, config: RingConfig | None = None,
               per_sm: int | None = None) -> torch.Tensor:
    """x (M <= 16, K) fp16/bf16 -> y (M, N) in x's dtype = x @ dequant(W) + bias, on the ring kernel.
    config: default the first candidate of M's bucket; per_sm: programs an SM (default config.per_sm)."""
    cfg = config or configs_for(x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 2 else 1)[0]
    per_sm = cfg.per_sm if per_sm is None else per_sm
    check_args(x, p, bias, cfg, per_sm)
    y = torch.empty((x.shape[0], p.out_features), dtype=x.dtype, device=x.device)
    if x.shape[0]:
        launch(x, p, bias, y, cfg, per_sm)
    return y


def launch(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, y: torch.Tensor, cfg: RingConfig, per_sm: int,
           trace: torch.Tensor | None = None, add: bool = False, pdl: bool = False, prologue: Prologue | None = None,
           trigger: bool = False, pre_l2: int = 0, counter: torch.Tensor | None = None):
    """One launch into y (M, N) (arguments as check_args takes them, M >= 1); returns what Triton's launch returns
    (on a GPU the compiled kernel: .n_regs, .metadata.shared). trace: an int64 tensor of >= 16 x programs values
    (ring_grid) that a TRACE build of the kernel fills with TRACE_FIELDS a program (GPU only). add: y is float32
    (M, N), unit stride along N, and the launch adds x @ dequant(W) into it (red.add; no bias, no split-K fold).
    pdl: a programmatic dependent launch (kernels.pdl; ignored under the interpreter); trigger: with pdl, let the
    next kernel launch once this one's prologue is done; pre_l2: with pdl, the packed words of that many items past
    the ring are asked of L2 before the wait (prefetch.global.L2). prologue: x (contiguous, no act-order) is first
    written by the kernel's programs from a w4a16_prologue.XNorm / XSiLU / XAttn (checked by the caller:
    w4a16_prologue.check). counter (add; no prologue or an XNorm; ring <= 2): a zeroed int32 tensor of one element
    that the kernel's programs take chunks of items from (the DYN build; left non-zero: zero it before each launch).
    cfg.late < 8 (add only; not with counter): the last cfg.late_share / per_sm of the programs take late / 8 of the
    others' share of items (late_cut)."""
    m, k = x.shape
    n = p.out_features
    xw = x_words(x, p)  # (M, K / 2) words of two 16-bit inputs
    if prologue is not None and (p.perm is not None or xw.data_ptr() != x.data_ptr()):
        raise ValueError("a prologue writes x where the kernel reads it: x must be contiguous and word-aligned and "
                         "the weight without act-order")
    progs, items, steps, cmax = ring_grid(k, n, cfg, per_sm, _device_info(x.device)[1])
    chunk = min(triton.cdiv(items, progs) + 1, steps) * 64 * cfg.kt  # inputs of x a program's prologue writes
    dyn = {}
    if counter is not None:
        if not add or cfg.ring > 2 or (prologue is not None and not isinstance(prologue, XNorm)):
            raise ValueError("counter (items taken dynamically) needs add=True, a ring of <= 2 and no prologue or an "
                             f"XNorm (its programs may take any item: x must be whole); got add={add}, ring="
                             f"{cfg.ring}, prologue {type(prologue).__name__}")
        if not isinstance(counter, torch.Tensor) or counter.dtype != torch.int32 or counter.numel() < 1 \
                or counter.device != x.device:
            raise ValueError(f"counter must be an int32 tensor on {x.device} (zero before the launch), got "
                             f"{getattr(counter, 'dtype', type(counter).__name__)}")
        chunk = steps * 64 * cfg.kt  # the whole row
        dyn = dict(DYN=True, CH=dyn_chunk(items, progs, cfg.ring))
    if cfg.late != 8 and not add:
        raise ValueError(f"cfg.late={cfg.late} (uneven shares) needs add=True (the split-K fold's contributors are "
                         "the even split's)")
    cut = late_cut(progs, items, per_sm, cfg) if not dyn else progs
    if cut < progs:  # the early programs' prologue writes their larger share of x
        chunk = min(items * 8 // (8 * cut + cfg.late * (progs - cut)) + 1, steps) * 64 * cfg.kt
    bm = 8 if m <= 8 else 16
    tiles = triton.cdiv(n, cfg.bn)
    slot = cfg.bn * bm  # fp32 values of a tile: NB x 128 x token blocks
    if add:  # no fold: no workspace, no tickets (y stands in for both pointers, never read through them)
        if bias is not None or y.dtype != torch.float32 or y.stride(1) != 1:
            raise ValueError("add=True takes a float32 y with unit stride along N and no bias")
        ws = cnt = y
    else:
        if cfg.atomic:
            ws, _ = split_k_workspace(x.device, tiles * slot)  # zero, and left zero by the kernel
        else:
            ws = split_k_slices(x.device, tiles * cmax * slot)
        _, cnt = split_k_workspace(x.device, tiles)  # after: a growing workspace replaces the pair
    extra = {"maxnreg": cfg.maxnreg} if cfg.maxnreg and not _interpreting() else {}
    if trace is not None and (trace.dtype != torch.int64 or trace.numel() < TRACE_STRIDE * progs or _interpreting()):
        raise ValueError(f"trace must be an int64 tensor of >= {TRACE_STRIDE * progs} values on a GPU, got "
                         f"{trace.dtype} x {trace.numel()}")
    return w4a16_ring_kernel[(progs,)](
        xw, p.qweight, p.sz, y, bias if bias is not None else y, ws, cnt, trace if trace is not None else cnt,
        m, n, k, xw.stride(0), y.stride(0), p.qweight.stride(0), p.sz.stride(0), steps, items, cmax,
        ctr_ptr=counter if counter is not None else cnt, LATE_CUT=cut, LATE=cfg.late if cut < progs else 8, **dyn,
        **kernel_args(prologue, x), PCH=_prologue_round(prologue, chunk),
        G=p.group_size, HAS_BIAS=bias is not None, BF16=x.dtype == torch.bfloat16, BN=cfg.bn, KT=cfg.kt, BM=bm,
        RING=cfg.ring, ATOMIC=cfg.atomic, EVEN_K=k % (64 * cfg.kt) == 0, EVEN_N=p.sz.shape[1] % cfg.bn == 0,
        **({"PDL": True, "launch_pdl": True, "TRIGGER": trigger, "L2PRE": pre_l2} if pdl and not _interpreting()
           else {}),
        ASM=cfg.asm and not _interpreting(), L2AHEAD=cfg.l2_ahead, TRACE=trace is not None, ADD=add,
        num_warps=cfg.num_warps, num_stages=1, **extra,
    )


def _prologue_round(prologue: Prologue | None, chunk: int) -> int:
    """Inputs of x a prologue round writes: the program's chunk up to 2048 (XAttn: 1024 partial values a round)."""
    pch = max(128, min(triton.next_power_of_2(chunk), 2048))
    return min(pch, max(16, 1024 // prologue.splits)) if isinstance(prologue, XAttn) else pch


if __name__ == "__main__":  # PYTHONPATH=src python -m flashscale.kernels.w4a16_ring (TRITON_INTERPRET unset)
    print("config (tokens) | regs spills local smem | resident/SM per_sm options | loop instr (flush) instr/weight | "
          "LDG.128 other-LDG HMMA LOP3 shifts PRMT moves uniform fp32 | modelled loads in flight, waits an iteration")
    bad = []
    for c, kw in aot_jobs():
        r = census(c, **kw)
        if r["spill_stores"] or r["spill_loads"] or r["stack"] or r["local"]:
            bad.append(r["label"])
        print(f"{c.label:40s} M<={kw['bm']:2d} | {r['registers']:3d} {r['spill_stores']}/{r['spill_loads']} "
              f"{r['local']} {r['shared']:5d} | {r['resident']:2d} {r['per_sm_options']} | {r['loop_instructions']:5d} "
              f"({r['flush_instructions']}) {r['per_weight']:.2f} | {r['ldg128']:3d} {r['ldg_other']:3d} "
              f"{r['hmma']:3d} "
              f"{r['lop3']:3d} {r['shifts']:3d} {r['prmt']:3d} {r['moves']:3d} {r['uniform']:3d} {r['fp32']:3d} | "
              f"{r['loads_in_flight']:.1f} of {r['ldg_per_iter']}, {r['waits_per_iter']} waits", flush=True)
    assert not bad, f"spills or local memory: {bad}"
