"""Hopper W4A16 GEMM in Gluon (an autotune candidate of w4a16_matmul from M = 2): y (M, N) = x (M, K) @ W (K, N).

Swap AB as w4a16_gemm.py: each consumer warpgroup computes acc^T (64 features, BM tokens) = W^T (64, BK) @
x^T (BK, BM) with RS-wgmma (m64nBMk16: A, the dequantized weights, from registers; B, x^T, from shared memory).
  * producer, 1 warp (setmaxnreg PRODUCER_REGS): TMA copies of one K step into a STAGES-slot ring: the packed
    words of the tile (qweight viewed (N_pad/16, K_pad/64, 128) int32, box (BN/16, BK/64, 128): BN*BK/2 bytes,
    unswizzled), x (box (BM, BK) bf16/fp16, 128-byte swizzle, rows >= M and columns >= K zero-filled) and the
    scale/zero words (sz (NG, N_pad), box (SZR, BN), SZR = BK / G groups a step for G = 64, else 1); one
    ready mbarrier a slot (expect-tx of all three), one empty mbarrier (count CONSUMERS).
  * consumers, CONSUMERS warpgroups (setmaxnreg CONSUMER_REGS; consumer 0 is the default partition), each
    owning 64 of the tile's BN = 64 * CONSUMERS features (or one consumer owning 128: `features=128`, two wgmma row
    blocks sharing each x tile, so x's L2 -> SM bytes a feature halve): LDS.128 of its fragments (one 16-byte vector a
    thread IS a 16x16 A fragment of four K steps, PackedW4), dequantization in registers, then with one
    consumer (unrolled by two, A buffers alternating by position: no register moves; _mainloop_wait1)
        dequantize A_j (slot j, wgmma j-1 in flight)  ->  issue wgmma j  ->  wait(1): j-1 retired  ->  release j-1
    and with two (12 warps: 168 registers at launch, 240 by setmaxnreg; wait(1) makes ptxas serialize the wgmma
    there, C7512; _mainloop_wait0)
        issue wgmma(A_j, x_j)  ->  dequantize A_{j+1} (slot j+1)  ->  wait for slot j+2  ->  wait(0)  ->  release j
    so the unpack of a step runs on the CUDA cores while the tensor cores work on another one (two A buffers
    live, each untouched until its wgmma retires). Epilogue in 16..64-token chunks (HAS_SPLIT: split-K path).
  * scale and zero are applied to A before the MMA, exactly (w4a16_common's fp32 magic-number unpack: one
    shift per two nibbles, one LOP3 and one FFMA a weight, one cvt per pair; w = (q - z) * s rounded once to
    16 bits, as the reference does); with h2=True (opt-in until timed) the packed 16-bit unpack of w4a16_h2.py: the
    same values, two weights an instruction, 9 instead of 15 ALU-pipe instructions a packed word. The alternative
    (decode kernel: MMA on OFF + q, s and z*sum(x) per group after) needs one accumulator drain per group: BM/2
    fp32 per thread times two FMAs every 128 K plus group sums of x and a wait per group that breaks the wgmma
    overlap: more work than the dequant at BM >= 64.
  * split-K (grid axis 1) for grids that cannot fill the SMs (M = 64 on N <= 8192): each split writes its fp32
    partial to its own workspace slice, one acq_rel ticket a (tile, consumer), the last split sums the slices
    in split order (deterministic) and writes y, as w4a16_common's slice scheme.
  * tile order over (n, m) grouped by GROUP n-tiles (their weights stay in L2 across the token tiles).
  * pingpong (two consumers): FA3's tensor-core turns, consumer c issues its wgmma of a step after the other one's
    (mbarriers turn[0..1]), so one warpgroup's unpack runs under the other's MMA instead of both at once.
  * persistent (two consumers, no split): grid = min(tiles, SMs), program p takes tiles p, p + grid, ...; the ring's
    steps and turns run on across tiles (counters base + j), so the producer loads tile t+1 while the consumers
    store tile t (the fill and the epilogue of a tile no longer leave the tensor cores idle).
  * stream_k (persistent): where the last wave would leave >= 10 % of the SMs idle (stream_k_plan), the grid is
    the SMs; the whole waves (or all but one) go tile by tile, and the K steps of the remaining tiles form one run
    cut into equal pieces, one a program (Stream-K's hybrid; with several token tiles, each partial-wave tile in
    S aligned K pieces). A tile split between programs: each writes its fp32 partial to its own block, and the last
    to take the tile's ticket sums the blocks in program order.
act-order (perm): x is gathered once on the host (x[:, perm], one copy of M*K*2 bytes) since TMA cannot gather.
Shapes: x (M, K), qweight (N_pad/16, K_pad/64, 32, 4) int32, sz (NG, N_pad) int32, y (M, N).

Files: w4a16_wgmma_config.py (WgmmaConfig, the candidates, config_error, launch_options and the env knobs, the launch
plans: pure Python), w4a16_wgmma_unpack.py (the dequantization in registers, and the HAS_GLUON probe),
w4a16_wgmma_epilogue.py (the epilogue, y stores, split-K / stream-K fix-ups), w4a16_wgmma_kernel.py (the producer,
the main loops, the consumers, the kernel), w4a16_wgmma_aot.py (sm_90 compiles and census); this module checks the
arguments, keeps the workspace (_WS) and the descriptors, launches, and re-exports the names callers import from it.
"""

from __future__ import annotations

import functools

import torch

from flashscale.kernels.w4a16_common import MAGIC_ONE
from flashscale.kernels.w4a16_pack import FRAG_K, PackedW4
from flashscale.kernels.w4a16_wgmma_aot import _DEQUANT_OPS, _is_move, _main, census, compile_sm90
from flashscale.kernels.w4a16_wgmma_config import (_BIG, _LARGE, CANDIDATES, CTA_MAXNREG, SK_MIN_STEPS, SMEM_LIMIT,
                                                   SMEM_PER_SM, TWINS, WgmmaConfig, _grid_flags, _szr, all_candidates,
                                                   auto_split, candidates, config_error, launch_options, plan_split,
                                                   smem_bytes, stream_k_plan, twin)
from flashscale.kernels.w4a16_wgmma_kernel import _gl_dtype, _layouts
from flashscale.kernels.w4a16_wgmma_unpack import HAS_GLUON

if HAS_GLUON:
    import triton
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from flashscale.kernels.w4a16_wgmma_kernel import w4a16_wgmma_kernel

# Names other modules, tests and benchmarks use from here (kept importable from this module since the split into
# w4a16_wgmma_config / _unpack / _epilogue / _kernel / _aot). The diagnosis knobs MAXNREG_OVERRIDE and FIXUP_FENCE
# are not re-exported: a copy here would not reach the code that reads them (launch_options, _fixup's _FENCE); set
# w4a16_wgmma_config.MAXNREG_OVERRIDE, and FIXUP_FENCE by its environment variable. _WS (the workspace cache) is
# this module's own dict.
__all__ = [
    "CANDIDATES", "CTA_MAXNREG", "HAS_GLUON", "SK_MIN_STEPS", "SMEM_LIMIT", "SMEM_PER_SM", "TWINS", "WgmmaConfig",
    "_BIG", "_DEQUANT_OPS", "_LARGE", "_WS", "_gl_dtype", "_grid_flags", "_is_move", "_layouts", "_main", "_num_sms",
    "_szr", "_weight_descs", "_workspace", "all_candidates", "auto_split", "candidates", "census", "compile_sm90",
    "config_error", "launch_options", "plan_split", "smem_bytes", "stream_k_plan", "supported", "twin", "unsupported",
    "w4a16_wgmma",
]
if HAS_GLUON:
    __all__ += ["w4a16_wgmma_kernel"]


# ---- host side

def unsupported(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None,
                config: WgmmaConfig | None = None) -> str | None:
    """Why w4a16_wgmma cannot run these inputs, or None."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        return "x must be a 2-D (M, K) tensor"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"x has dtype {x.dtype}; the wgmma kernel takes bfloat16 or float16"
    if not isinstance(p, PackedW4):
        return f"p must be a PackedW4, got {type(p).__name__}"
    if x.shape[1] != p.in_features:
        return f"x has K={x.shape[1]} columns but p has in_features={p.in_features}"
    if p.in_features % 8:
        return f"in_features K={p.in_features} must be a multiple of 8 (16-byte TMA row stride of x)"
    g, k = p.group_size, p.in_features
    if g != k and g % 64:
        return f"group_size={g}: the wgmma kernel takes multiples of 64 or one group a row (w4a16_matmul takes more)"
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (p.out_features, )):
        return f"bias must be a ({p.out_features},) tensor"
    if config is not None:
        bad = config_error(config, g, k)
        if bad is not None:
            return f"config {config}: {bad}"
    if not HAS_GLUON:
        return "needs triton.experimental.gluon with warp_specialize (Triton >= 3.6)"
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] != 9:
        return f"x is on {x.device}: the wgmma kernel needs a Hopper GPU (sm_90)"
    if p.qweight.device != x.device:
        return f"p is on {p.qweight.device} but x on {x.device}"
    return None


def supported(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None,
              config: WgmmaConfig | None = None) -> bool:
    return unsupported(x, p, bias, config) is None


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_WS: dict[torch.device, list] = {}


def _workspace(device: torch.device, floats: int, tickets: int):
    """(fp32 partials, int32 tickets) of at least floats / tickets, one pair a device, grown as needed. Calls on one
    device must not overlap in time (one stream). Growing inside CUDA-graph capture fails (the new tickets' zeros
    would exist only when the graph replays, not for the eager calls after it): run each shape once before."""
    buf = _WS.get(device)
    if buf is None:  # (not setdefault: its default would allocate two empty tensors on every call)
        buf = _WS[device] = [torch.empty(0, device=device), torch.zeros(0, dtype=torch.int32, device=device)]
    if (buf[0].numel() < floats or buf[1].numel() < tickets) and device.type == "cuda" \
            and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"the W4A16 wgmma workspace must grow to {floats} floats / {tickets} tickets inside "
                           "CUDA-graph capture; run each shape once before capturing")
    if buf[0].numel() < floats:
        buf[0] = torch.empty(floats, device=device)
    if buf[1].numel() < tickets:  # tickets are left at zero by the kernel
        buf[1] = torch.zeros(tickets, dtype=torch.int32, device=device)
    return buf[0], buf[1]


def _weight_descs(p: PackedW4, cfg: WgmmaConfig, w_l, sz_l):
    """The TMA descriptors of the packed words and the scale/zero words, kept on p (host time: ~8 us each to
    build and validate), rebuilt when p's tensors are replaced."""
    cache = p.__dict__.setdefault("_wgmma_descs", {})
    key = (cfg.bn, cfg.bk, _szr(cfg, p.group_size))
    now = (p.qweight.data_ptr(), p.sz.data_ptr(), p.qweight.shape, p.sz.shape)
    hit = cache.get(key)
    if hit is None or hit[0] != now:  # one entry a tile shape: a replaced tensor's descriptors are dropped
        nb_all, kt_all = p.qweight.shape[:2]
        w3 = p.qweight.view(nb_all, kt_all, 128)
        ng, n_pad = p.sz.shape
        hit = cache[key] = (now, (
            TensorDescriptor(w3, [nb_all, kt_all, 128], [kt_all * 128, 128, 1], [cfg.bn // 16, cfg.bk // 64, 128], w_l),
            TensorDescriptor(p.sz, [ng, n_pad], [n_pad, 1], [_szr(cfg, p.group_size), cfg.bn], sz_l)))
    return hit[1]


def w4a16_wgmma(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None,
                config: WgmmaConfig | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) bf16/fp16 -> y (M, N) = x @ W + bias in x's dtype (semantics of w4a16_matmul). config: the
    first candidate of M's bucket by default. out: a contiguous (M, N) tensor of x's dtype to write y into
    (w4a16_matmul's). Raises ValueError naming the argument it cannot take."""
    why = unsupported(x, p, bias, config)
    if why is not None:
        raise ValueError(f"w4a16_wgmma: {why}")
    m, k = x.shape
    n = p.out_features
    if out is not None and (out.shape != (m, n) or out.dtype != x.dtype or not out.is_contiguous()
                            or out.device != x.device):
        raise ValueError(f"w4a16_wgmma: out must be a contiguous ({m}, {n}) {x.dtype} tensor on {x.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if m == 0 or n == 0:  # (n == 0: no tile; auto_split would divide by zero tiles)
        return y
    if k == 0:  # no K step: n_it = 0 and the consumers would wait forever on ring slot 0, which nobody fills
        return y.zero_() if bias is None else y.copy_(bias.to(x.dtype).expand(m, n))
    cfg = config or candidates(m)[0]
    bad = config_error(cfg, p.group_size, k)
    if bad is not None:
        raise ValueError(f"w4a16_wgmma: config {cfg}: {bad}")
    if p.perm is not None:
        x = x[:, p.perm.long()]  # act-order: one gather (TMA cannot gather on sm_90)
    if x.stride(1) != 1 or (x.stride(0) * 2) % 16 or x.data_ptr() % 16:
        x = x.contiguous()
        if x.data_ptr() % 16:
            x = x.clone()
    if bias is not None:
        bias = bias.to(x.dtype).contiguous()
    w_l, x_l, sz_l = _layouts(cfg, x.dtype)
    w_desc, sz_desc = _weight_descs(p, cfg, w_l, sz_l)
    x_desc = TensorDescriptor(x, [m, k], [x.stride(0), 1], [cfg.bm, cfg.bk], x_l)
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
    k_steps = triton.cdiv(triton.cdiv(k, FRAG_K) * FRAG_K, cfg.bk)
    sms = _num_sms(x.device.index or 0)
    split = plan_split(cfg, tiles, k_steps, sms)
    persistent, stream_k = _grid_flags(cfg, split)
    dp, skq, maxc = stream_k_plan(tiles, k_steps, sms, triton.cdiv(m, cfg.bm)) if stream_k else (tiles, 0, 0)
    floats = split * m * n if split > 1 else (tiles - dp) * maxc * cfg.bm * cfg.bn if skq else 1
    ws, cnt = _workspace(x.device, floats, tiles * cfg.consumers)
    grid0 = (sms if skq else min(tiles, sms)) if persistent else tiles
    w4a16_wgmma_kernel[(grid0, split)](
        w_desc, x_desc, sz_desc, y, bias if bias is not None else y, ws, cnt, m, n, k, MAGIC_ONE, split, dp, skq, maxc,
        G=p.group_size, HAS_BIAS=bias is not None, BM=cfg.bm, BK=cfg.bk, STAGES=cfg.stages,
        CONSUMERS=cfg.consumers, GROUP=cfg.group, PRODUCER_REGS=cfg.producer_regs, CONSUMER_REGS=cfg.consumer_regs,
        HAS_SPLIT=split > 1, PINGPONG=cfg.pingpong, PERSISTENT=persistent, STREAM_K=skq > 0, H2=cfg.h2,
        VEC_Y=cfg.vec_y and n % 8 == 0 and y.data_ptr() % 16 == 0, num_warps=4, **launch_options(cfg))
    return y


if __name__ == "__main__":
    _main()
