"""W4A16 decode probe (issue #7): where the time of the M <= 16 kernels goes, in one GPU call.

    OUT=$OUT python3 benchmarks/w4a16_probe.py --out $OUT            # ~2-3 minutes on an H200

For M = 1 and 16 and the six Llama-3 shapes (K x N; group 128, bf16 activations), rows of kind:
  e-copy   dst.copy_(packed words): the device's streaming rate on these bytes (read + write)
  e-bf16   F.linear with the bf16 weight (cuBLAS): the anchor of the 3.5x target
  noop     an empty Triton kernel with the decode grid: the launch floor of one call inside a graph
  c-gemv   (M = 1) the current GEMV, every config of the sweep (BN, K tile, prefetch, warps, stages,
           slices/atomics) x split-K factors around its heuristic
  c-gemm   (M = 16) the current tensor-core GEMM, every bucket-16 candidate (+ a bn32 one) x splits
  a-gemv   the best slice GEMV config with PROBE=1: the same grid, tile and prefetch ring, loads and
           a checksum, no dequantization: the memory ceiling of that access pattern
  b-gemv   the same config with PROBE=2: dequant + FMA, each split writes its slice, no reduction
  a-gemm   (M = 16) the loads-only GEMV with the GEMM's grid (bn 64/128, bk 128, its split, 2 steps
           in flight): the memory ceiling of the GEMM's access pattern
  d-dec    the new stream-K tensor-core decode kernel, every config x programs per SM
  a-dec / b-dec   its loads-only (PROBE=1) and no-reduction (PROBE=2) modes at the best config
  g-dec    the Gluon W4A16 GEMM (flashscale.kernels.w4a16_wgmma: TMA producer warp, shared-memory ring, register-A
           wgmma on in-register dequantization; an autotune candidate from M = 2) at decode M with 16-token tiles,
           every config of G_DEC_SWEEP x split-K (the split column; 0 = persistent stream-K) (docs "Round 8")
  q-dec    the Gluon decode kernel (flashscale.kernels.w4a16_gring, docs "Round 8"): the ring kernel's math with the
           items in flight in a shared-memory ring (per-thread cp.async), every candidate of M's bucket x per_sm
  r-dec    the ring decode kernel (flashscale.kernels.w4a16_ring, docs "Round 5"): every candidate of M's token
           bucket x the programs an SM its sm_90 registers let reside at once (the split column); fp16 checked
           once on the first shape. Short kind names work in --kinds: dec (d-dec), bf16 (e-bf16), copy (e-copy),
           ring (r-dec)
  s-triton / s-tma / s-gluon   (M = 0, right after e-copy: the first rows of every shape) loads-only streams of
           the packed qweight words (flashscale.kernels.w4a16_stream): every word read once and XORed into a
           checksum a program, no scales, no x, no math; plain Triton 16-byte loads into a register ring,
           Triton tensor descriptors (TMA) in a pipelined loop, a warp-specialized Gluon TMA ring; boxes of
           consecutive fragments (flat) or the decode kernel's item (tile), persistent grids of per_sm
           programs an SM (the split column), KB in flight an SM in the row. TB/s on the qweight bytes read
Every kernel row is checked before it is timed: outputs against x @ dequantized W in float64 (error at
most 2x cuBLAS bf16's + 1e-3), PROBE=1 checksums (XOR) against that of all the packed words (every word
read once), PROBE=2 partials summed on the host against the same reference. A failure prints WRONG, stays
in the JSON (ok=false) and makes the exit status 1; the row is still timed.

Timing: a CUDA graph of R calls (R >= 32) replayed 10 times after 3 warm-up replays, CUDA events per
replay, median / R. Every call of the graph reads the next of n copies of the weights, n chosen so the
copies pass 3x the L2 (50 MB on the H200): without that 4096^2 (8.4 MB) would be read from L2, not HBM.
Bytes (TB/s column): packed K*N/2 + scale/zero words K/G*N*4; bf16 K*N*2; copy 2x packed.
Output: $OUT/w4a16_probe-<gpu>.json (written after every shape) and a table on stdout.
Stages are time-limited (--budget seconds in all, default 160; compiles in parallel first, then
shapes, 8192^2 first); whatever runs out of time is listed as skipped. --kinds runs only the row kinds
listed (e.g. --kinds s-triton,s-tma,s-gluon,e-copy: the streaming rows in about a minute; the JSON is then
w4a16_probe-<gpu>-stream.json, or -subset.json, so a partial run never overwrites the full one).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashscale.data.cache import atomic_write_text  # noqa: E402
from flashscale.kernels import w4a16 as W  # noqa: E402
from flashscale.kernels import w4a16_gring as WQ  # noqa: E402
from flashscale.kernels import w4a16_ring as WR  # noqa: E402
from flashscale.kernels import w4a16_stream as WS  # noqa: E402
from flashscale.kernels.w4a16 import DecodeConfig, GemmConfig, GemvConfig  # noqa: E402
from flashscale.kernels.w4a16_pack import PackedW4, pack_w4  # noqa: E402
from flashscale.reference.w4a16 import dequantize_w4  # noqa: E402
from plotting import gpu_tag  # noqa: E402

SHAPES = [(8192, 8192), (4096, 4096), (28672, 8192), (8192, 28672), (4096, 14336), (14336, 4096)]  # (K, N)
G = 128
COPY_TBPS = 4.3  # the H200's measured device copy rate (benchmarks/w4a16.py): the floor's denominator

# (c) the GEMV sweep
GEMV_SWEEP = [GemvConfig(bn=bn, kt=kt, prefetch=pf, slices=True) for bn in (64, 128, 256) for kt in (1, 2)
              for pf in (1, 2)]
GEMV_SWEEP += [GemvConfig(bn=128, kt=2, num_warps=2, slices=True), GemvConfig(bn=128, kt=2, num_warps=8, slices=True),
               GemvConfig(bn=256, kt=2, num_warps=8, slices=True), GemvConfig(bn=128, kt=2, num_stages=1, slices=True),
               GemvConfig(bn=256, kt=2), GemvConfig(bn=128, kt=2)]
# (a)/(b) candidates among them (slices: their workspace takes the checksums and partials)
GEMV_PROBED = [GemvConfig(bn=128, kt=2, slices=True), GemvConfig(bn=256, kt=2, slices=True),
               GemvConfig(bn=128, kt=2, prefetch=2, slices=True), GemvConfig(bn=256, kt=2, prefetch=2, slices=True)]
GEMM_SWEEP = list(W._GEMM_CANDIDATES[16]) + [GemmConfig(bm=16, bn=32, bk=128, num_warps=2, num_stages=4, slices=True)]
GEMM_GRID_PROBE = {64: GemvConfig(bn=64, kt=2, prefetch=2, slices=True),
                   128: GemvConfig(bn=128, kt=2, prefetch=2, slices=True)}
DEC_SWEEP = list(W._DECODE_CANDIDATES) + [DecodeConfig(bn=512, kt=2, num_warps=8),
                                          DecodeConfig(bn=128, kt=2, prefetch=2)]
DEC_SWEEP_16 = list(W._DECODE_CANDIDATES) + [DecodeConfig(bn=256, kt=2, num_warps=8),
                                             DecodeConfig(bn=128, kt=2)]


# (g) the Gluon wgmma GEMM at decode M: 16-token tiles (the wgmma N), one or two consumer warpgroups, x split-K
G_DEC_SPLITS = (1, 2, 4, 8)
try:
    from flashscale.kernels import w4a16_wgmma as WG  # noqa: E402

    G_DEC_SWEEP = [WG.WgmmaConfig(bm=16, consumers=1, stages=8), WG.WgmmaConfig(bm=16, consumers=2, stages=6),
                   WG.WgmmaConfig(bm=16, consumers=1, bk=64, stages=12),
                   WG.WgmmaConfig(bm=16, consumers=2, stages=6, persistent=True, stream_k=True)]
except ImportError:  # no Gluon in this triton
    WG, G_DEC_SWEEP = None, []

# (s) loads-only streams of the packed words: kind -> configs (w4a16_stream.STREAM_CONFIGS, their comments
# give the KB in flight an SM of each)
STREAM_KINDS = {"s-triton": "triton", "s-tma": "tma", "s-gluon": "gluon"}
ALL_KINDS = ("e-copy", *STREAM_KINDS, "e-bf16", "noop", "c-gemv", "a-gemv", "b-gemv", "c-gemm", "a-gemm", "d-dec",
             "a-dec", "b-dec", "r-dec", "g-dec", "q-dec", "fp16-check")
KIND_ALIASES = {"dec": "d-dec", "bf16": "e-bf16", "copy": "e-copy", "ring": "r-dec", "wgmma": "g-dec", "gring": "q-dec"}
PER_M_KINDS = ALL_KINDS[1 + len(STREAM_KINDS):]


def stream_configs(kinds=None) -> list[tuple[str, WS.StreamConfig]]:
    """(row kind, config) of the streaming rows to run (gluon only where Triton has it)."""
    return [(kind, c) for kind, sk in STREAM_KINDS.items() if kinds is None or kind in kinds
            for c in WS.STREAM_CONFIGS[sk] if sk != "gluon" or WS.HAS_GLUON]


def per_sm_options(cfg: DecodeConfig) -> list[int]:
    return sorted({max(1, x * 4 // cfg.num_warps) for x in (2, 3, 4, 6)})


@triton.jit
def _noop_kernel(out_ptr):
    tl.store(out_ptr + tl.program_id(0), 0)


# ---- problems, launches, checks

def random_packed(k: int, n: int, gen: torch.Generator) -> PackedW4:
    codes = torch.randint(0, 16, (k, n), device="cuda", generator=gen, dtype=torch.uint8)
    zeros = torch.randint(0, 16, (k // G, n), device="cuda", generator=gen, dtype=torch.uint8)
    scales = (torch.rand(k // G, n, device="cuda", generator=gen) * 0.01 + 0.002).half()
    return pack_w4(codes, zeros, scales, group_size=G)


def packed_bytes(k: int, n: int) -> int:
    return k * n // 2 + k // G * n * 4


def launch(kind: str, x, p, y, cfg, split, probe=0):
    if kind == "gemv":
        W._launch_gemv(x, p, None, y, cfg, split, probe)
    elif kind == "gemm":
        W._launch_gemm(x, p, None, y, cfg, split)
    elif kind == "ring":
        return WR.launch(x, p, None, y, cfg, split)
    elif kind == "gring":
        return WQ.launch(x, p, None, y, cfg, split)
    elif kind == "wgmma":  # split: split_k, 0 for a persistent config (its own stream-K plan)
        return WG.w4a16_wgmma(x, p, None, replace(cfg, split_k=split) if split else cfg, out=y)
    else:
        W._launch_decode(x, p, None, y, cfg, split, probe)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def xor_all(v: torch.Tensor) -> int:
    v = v.reshape(-1)
    while v.numel() > 1:
        if v.numel() % 2:
            v = torch.cat([v, torch.zeros(1, dtype=v.dtype, device=v.device)])
        v = v[: v.numel() // 2] ^ v[v.numel() // 2:]
    return int(v.item())


def checksum_ok(ws_vals: torch.Tensor, p: PackedW4) -> bool:
    """PROBE=1: the programs' XORs of their words (int32 bits in an fp32 buffer) XOR to that of all the
    words, i.e. (but for cancelling pairs) every word was read once."""
    return xor_all(ws_vals.view(torch.int32)) == xor_all(p.qweight)


def decode_slot_sum(ws: torch.Tensor, n: int, cfg: DecodeConfig, cmax: int, m: int) -> torch.Tensor:
    """PROBE=2 partials of the decode kernel, summed on the host -> (M, N) float64. Workspace slot
    (tile, contributor) holds (token block, nb, lane 4g + t, c = 2 rh + e) fp32 values times s * 2^11:
    row tile*BN + 16 nb + 8 rh + g, token 8 block + 2t + e (the mma C layout); unused slots are zero."""
    tiles = -(-n // cfg.bn)
    nb_ = cfg.bn // 16
    tb = 1 if m <= 8 else 2
    slot = nb_ * 128 * tb
    v = ws[: tiles * cmax * slot].view(tiles, cmax, tb, nb_, 8, 4, 2, 2).double().sum(1)  # tile, tb, nb, g, t, rh, e
    v = v.permute(1, 4, 6, 0, 2, 5, 3)  # tb, t, e, tile, nb, rh, g
    y = v.reshape(tb * 8, tiles * cfg.bn) / 2048.0
    return y[:m, :n]


class Ctx:
    def __init__(self, budget: float, kinds=None, configs=None):
        self.t0 = time.time()
        self.configs = configs  # label substrings: r-dec / q-dec configs kept (None: all)
        self.budget = budget
        self.kinds = None if kinds is None else set(kinds)  # row kinds to run (None: all)
        self.rows: list[dict] = []
        self.skipped: list[str] = []
        self.errors: list[str] = []
        self.bad = 0

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)

    def keep(self, cfg) -> bool:
        """A ring config (r-dec / q-dec) is run unless --configs names none of its label's substrings."""
        return self.configs is None or any(c in cfg.label for c in self.configs)

    def want(self, *kinds) -> bool:
        return self.kinds is None or any(k in self.kinds for k in kinds)

    def error(self, what: str, e: Exception) -> None:
        """Record and print a row that raised (one config failing must not end the probe)."""
        self.errors.append(f"{what}: {e!r}"[:400])
        print(f"  ERROR {what}: {e!r}"[:300], flush=True)


def graph_us(calls: list, ncopies: int, reps: int = 10) -> float:
    """calls[i]() launches the call on weight copy i; median over replays of a graph of R calls / R."""
    r = max(32, ncopies)
    r = -(-r // ncopies) * ncopies
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(ncopies):
            calls[i]()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(r):
            calls[i % ncopies]()
    for _ in range(3):
        g.replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    us = statistics.median(a.elapsed_time(b) for a, b in ev) * 1e3 / r
    del g
    return us


# ---- parallel compiles (each config once on a small problem of the same specialization)

def _warm(job: dict) -> str:
    try:
        torch.manual_seed(0)
        if job["kind"] == "stream":  # 512 x 512: every box divides it, as it divides the Llama shapes
            p = random_packed(512, 512, torch.Generator(device="cuda").manual_seed(0))
            out = torch.zeros(4096, dtype=torch.int32, device="cuda")
            WS.launch(p, out, WS.StreamConfig(**job["config"]), 1, W._device_info(torch.device("cuda"))[1])
            torch.cuda.synchronize()
            return ""
        k, n = 256, 512
        p = random_packed(k, n, torch.Generator(device="cuda").manual_seed(0))
        dt = getattr(torch, job["dtype"])
        x = torch.randn(job["m"], k, device="cuda", dtype=dt)
        y = torch.empty(job["m"], n, device="cuda", dtype=dt)
        cls = {"gemv": GemvConfig, "gemm": GemmConfig, "decode": DecodeConfig, "ring": WR.RingConfig,
               "wgmma": getattr(WG, "WgmmaConfig", None), "gring": WQ.GRingConfig}[job["kind"]]
        launch(job["kind"], x, p, y, cls(**job["config"]), job.get("split", 2), job["probe"])
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # noqa: BLE001 (reported; the row fails again, loudly, when it runs)
        return f"{job['kind']} {job['config']} probe={job['probe']} m={job['m']}: {e!r}"[:400]


def compile_jobs(ctx: Ctx | None = None) -> list[dict]:
    want = ctx.want if ctx is not None else (lambda *k: True)
    keep = ctx.keep if ctx is not None else (lambda c: True)
    jobs = [dict(kind="stream", config=asdict(c), probe=0, m=0, dtype="int32")
            for _, c in stream_configs(None if ctx is None else ctx.kinds)]
    if not want(*PER_M_KINDS):
        return jobs
    if want("c-gemv", "a-gemv", "b-gemv", "c-gemm", "a-gemm"):  # the sweeps that find the a-/b- rows' configs
        for c in GEMV_SWEEP:
            jobs.append(dict(kind="gemv", config=asdict(c), probe=0, m=1, dtype="bfloat16"))
        for c in [*GEMV_PROBED, *GEMM_GRID_PROBE.values()]:
            for pr in (1, 2):
                jobs.append(dict(kind="gemv", config=asdict(c), probe=pr, m=1, dtype="bfloat16"))
        for c in GEMM_SWEEP:
            jobs.append(dict(kind="gemm", config=asdict(c), probe=0, m=16, dtype="bfloat16"))
    if want("d-dec", "a-dec", "b-dec", "fp16-check"):
        for m, sweep in ((1, DEC_SWEEP), (16, DEC_SWEEP_16)):
            for c in sweep:
                for pr in (0, 1, 2) if want("a-dec", "b-dec") else (0,):
                    jobs.append(dict(kind="decode", config=asdict(c), probe=pr, m=m, dtype="bfloat16"))
            jobs.append(dict(kind="decode", config=asdict(sweep[0]), probe=0, m=m, dtype="float16"))
    if want("g-dec"):
        for c in G_DEC_SWEEP:
            jobs.append(dict(kind="wgmma", config=asdict(c), probe=0, m=16, dtype="bfloat16",
                             split=0 if c.persistent else 1))
    if want("q-dec") and WQ.HAS_GLUON:
        for m in (1, 16):
            for c in WQ.configs_for(m):
                jobs.append(dict(kind="gring", config=asdict(c), probe=0, m=m, dtype="bfloat16"))
            jobs.append(dict(kind="gring", config=asdict(WQ.configs_for(m)[0]), probe=0, m=m, dtype="float16"))
    if want("r-dec"):
        for m in (1, 16):
            for c in filter(keep, WR.configs_for(m)):
                jobs.append(dict(kind="ring", config=asdict(c), probe=0, m=m, dtype="bfloat16"))
            jobs.append(dict(kind="ring", config=asdict(WR.configs_for(m)[0]), probe=0, m=m, dtype="float16"))
    uniq = {json.dumps(j, sort_keys=True): j for j in jobs}
    return list(uniq.values())


def precompile(ctx: Ctx, limit: float) -> None:
    import multiprocessing
    import os

    jobs = compile_jobs(ctx)
    if not jobs:
        return
    t0 = time.time()
    ctx_mp = multiprocessing.get_context("spawn")
    pool = ctx_mp.Pool(min(len(jobs), max(1, (os.cpu_count() or 2) - 1)))
    try:
        res = pool.map_async(_warm, jobs).get(timeout=limit)
        errs = [e for e in res if e]
    except multiprocessing.TimeoutError:
        errs = [f"compile stage passed {limit:.0f} s: the rest compiles on first use"]
    finally:
        pool.terminate()
    for e in errs:
        print(f"compile: {e}", flush=True)
    ctx.errors += errs
    print(f"compiled {len(jobs)} kernel variants in {time.time() - t0:.1f} s ({len(errs)} errors)", flush=True)


# ---- one shape

def run_shape(ctx: Ctx, k: int, n: int, gen: torch.Generator, l2: int, deadline: float, fp16_check: bool) -> None:
    base = random_packed(k, n, gen)
    nbytes = packed_bytes(k, n)
    ncopies = max(2, min(32, math.ceil(3 * l2 / nbytes)))
    packs = [base] + [PackedW4(qweight=base.qweight.clone(), sz=base.sz.clone(), perm=None, in_features=k,
                               out_features=n, group_size=G) for _ in range(ncopies - 1)]
    floor = nbytes / (COPY_TBPS * 1e6)

    def row(**kw):
        kw.update(K=k, N=n, copies=ncopies, floor_us=floor)
        nb = kw.pop("nbytes", nbytes)
        if kw.get("us") is not None:
            kw["TBps"] = nb / kw["us"] * 1e-6
        ctx.rows.append(kw)
        return kw

    def out_of_time(what: str) -> bool:
        if time.time() > deadline or ctx.left() < 5:
            ctx.skipped.append(f"{k}x{n} {what}")
            return True
        return False

    # (e) copy of the packed words
    if ctx.want("e-copy"):
        dst = torch.empty_like(base.qweight)
        us = graph_us([lambda i=i: dst.copy_(packs[i].qweight) for i in range(ncopies)], ncopies)
        row(M=0, kind="e-copy", us=us, nbytes=2 * base.qweight.numel() * 4, ok=True)
        del dst
    sms = W._device_info(torch.device("cuda"))[1]
    # (s) loads-only streams of the packed words, first: a short budget still measures them
    if ctx.want(*STREAM_KINDS):
        run_streams(ctx, k, n, packs, sms, row, out_of_time)
    if not ctx.want(*PER_M_KINDS):
        del packs, base
        torch.cuda.empty_cache()
        return
    w64 = dequantize_w4(base, torch.float64)  # (K, N)
    w_bf16 = w64.to(torch.bfloat16).t().contiguous()  # (N, K)
    nb16 = max(2, min(32, math.ceil(3 * l2 / (k * n * 2))))
    wcopies = [w_bf16] + [w_bf16.clone() for _ in range(nb16 - 1)]
    noop_out = torch.empty(8 * sms, dtype=torch.int32, device="cuda")

    for m in (1, 16):
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        ref = x.double() @ w64
        err_bf16 = rel_err(F.linear(x, w_bf16), ref)
        tol = 2 * err_bf16 + 1e-3
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        if ctx.want("e-bf16"):
            us = graph_us([lambda i=i: F.linear(x, wcopies[i]) for i in range(nb16)], nb16)
            row(M=m, kind="e-bf16", us=us, nbytes=k * n * 2, ok=True, err=err_bf16)
        if ctx.want("noop"):
            us = graph_us([lambda: _noop_kernel[(4 * sms,)](noop_out)], 1)
            row(M=m, kind="noop", us=us, nbytes=0, ok=True, note=f"{4 * sms} programs")

        def timed(kind, label, cfg, split, probe=0):
            """check then time one (kernel, config, split) at this M; returns the row (us None on error)."""
            kname = {"c-gemv": "gemv", "a-gemv": "gemv", "b-gemv": "gemv", "a-gemm": "gemv", "c-gemm": "gemm",
                     "r-dec": "ring", "g-dec": "wgmma"}.get(kind, "decode")
            info = dict(M=m, kind=kind, kernel=kname, config=asdict(cfg), split=split, probe=probe, label=label)
            try:
                ok, err = check(kname, x, base, y, cfg, split, probe, ref, tol, m)
                if not ok:
                    ctx.bad += 1
                    print(f"  WRONG {k}x{n} M={m} {kind} {label} split={split}: err {err}", flush=True)
                us = graph_us([lambda i=i: launch(kname, x, packs[i], y, cfg, split, probe) for i in range(ncopies)],
                              ncopies)
                return row(**info, us=us, ok=ok, err=err)
            except Exception as e:  # noqa: BLE001 (one config failing must not end the probe)
                ctx.error(f"{k}x{n} M={m} {kind} {label}", e)
                return row(**info, us=None, ok=False, err=None)

        if ctx.want("q-dec") and WQ.HAS_GLUON:  # first: the rows this probe's budget is for since round 8
            run_ring(ctx, k, n, m, x, base, packs, y, ref, tol, row, out_of_time, fp16_check, w64, WQ, "q-dec")
        if ctx.want("g-dec"):
            for cfg in G_DEC_SWEEP:
                for s in (0,) if cfg.persistent else G_DEC_SPLITS:
                    if out_of_time(f"M={m} g-dec {cfg.label()}"):
                        break
                    timed("g-dec", cfg.label(), cfg, s)
        if ctx.want("r-dec"):
            run_ring(ctx, k, n, m, x, base, packs, y, ref, tol, row, out_of_time, fp16_check, w64)
        best = {}
        if m == 1 and ctx.want("c-gemv", "a-gemv", "b-gemv"):  # a-/b- rows probe the best c- config
            for cfg in GEMV_SWEEP:
                if out_of_time(f"M={m} gemv sweep"):
                    break
                s0 = W._gemv_split(x, base, cfg)
                for s in W._split_options(s0, cfg.slices, W._k_steps(x, 64 * cfg.kt)):
                    r = timed("c-gemv", _label(cfg), cfg, s)
                    if r["us"] is not None and r["ok"] and r["us"] < best.get("gemv", (1e9,))[0]:
                        best["gemv"] = (r["us"], cfg, s)
            probed = [r for r in ctx.rows if r.get("kind") == "c-gemv" and r["K"] == k and r["N"] == n and r["ok"]
                      and r["us"] is not None and GemvConfig(**r["config"]) in GEMV_PROBED]
            if probed and not out_of_time("M=1 gemv probes"):
                r = min(probed, key=lambda r: r["us"])
                cfg = GemvConfig(**r["config"])
                if ctx.want("a-gemv"):
                    timed("a-gemv", _label(cfg), cfg, r["split"], probe=1)
                if ctx.want("b-gemv"):
                    timed("b-gemv", _label(cfg), cfg, r["split"], probe=2)
        elif m == 16 and ctx.want("c-gemm", "a-gemm"):
            for cfg in GEMM_SWEEP:
                if out_of_time(f"M={m} gemm sweep"):
                    break
                s0 = W._gemm_split(x, base, cfg)
                for s in W._split_options(s0, cfg.slices, W._k_steps(x, cfg.bk)):
                    r = timed("c-gemm", _label(cfg), cfg, s)
                    if r["us"] is not None and r["ok"] and r["us"] < best.get("gemm", (1e9,))[0]:
                        best["gemm"] = (r["us"], cfg, s)
            if "gemm" in best and best["gemm"][1].bn in GEMM_GRID_PROBE and ctx.want("a-gemm") \
                    and not out_of_time("M=16 gemm probe"):
                _, gcfg, s = best["gemm"]
                timed("a-gemm", f"grid of {_label(gcfg)}", GEMM_GRID_PROBE[gcfg.bn], s, probe=1)
        for cfg in (DEC_SWEEP if m == 1 else DEC_SWEEP_16) if ctx.want("d-dec", "a-dec", "b-dec") else ():
            if out_of_time(f"M={m} decode sweep"):
                break
            for s in per_sm_options(cfg):
                r = timed("d-dec", _label(cfg), cfg, s)
                if r["us"] is not None and r["ok"] and r["us"] < best.get("dec", (1e9,))[0]:
                    best["dec"] = (r["us"], cfg, s)
        if "dec" in best and not out_of_time(f"M={m} decode probes"):
            _, cfg, s = best["dec"]
            if ctx.want("a-dec"):
                timed("a-dec", _label(cfg), cfg, s, probe=1)
            if ctx.want("b-dec"):
                timed("b-dec", _label(cfg), cfg, s, probe=2)
        if fp16_check and ctx.want("fp16-check") and not out_of_time(f"M={m} fp16 check"):
            xh = x.half()
            refh = xh.double() @ w64
            yh = torch.empty(m, n, device="cuda", dtype=torch.float16)
            cfg = (DEC_SWEEP if m == 1 else DEC_SWEEP_16)[0]
            try:
                ok, err = check("decode", xh, base, yh, cfg, 4, 0, refh, 2 * rel_err(F.linear(xh, w64.half().t()), refh)
                                + 1e-3, m)
            except Exception as e:  # noqa: BLE001
                ok, err = False, repr(e)[:200]
            if not ok:
                ctx.bad += 1
                print(f"  WRONG {k}x{n} M={m} decode fp16: err {err}", flush=True)
            row(M=m, kind="fp16-check", kernel="decode", config=asdict(cfg), us=None, ok=ok, err=err)
        print_shape(ctx, k, n, m)
    del packs, wcopies, w64, w_bf16, base
    torch.cuda.empty_cache()


def run_ring(ctx: Ctx, k: int, n: int, m: int, x, base: PackedW4, packs: list[PackedW4], y, ref, tol, row, out_of_time,
             fp16_check: bool, w64, mod=WR, kind: str = "r-dec") -> None:
    """(r) rows: every ring decode config of M's bucket (w4a16_ring.configs_for; mod=w4a16_gring: the q rows) at
    each per_sm option its compiled registers let reside at once, each checked against float64 (check: error <= 2x
    cuBLAS bf16's + 1e-3) before it is timed like every other row; on the first shape the bucket's first config once
    more in fp16."""
    kname = "gring" if mod is WQ else "ring"
    for cfg in filter(ctx.keep, mod.configs_for(m)):
        if out_of_time(f"M={m} {kind} {cfg.label}"):
            break
        info = dict(M=m, kind=kind, kernel=kname, config=asdict(cfg), label=cfg.label)
        try:
            kern = mod.launch(x, base, None, y, cfg, cfg.per_sm)  # compiles (or loads) it: its registers
            sync(x)
            regs = getattr(kern, "n_regs", None)
            options = cfg.per_sm_options(regs)
        except Exception as e:  # noqa: BLE001 (one config failing must not end the probe)
            ctx.error(f"{k}x{n} M={m} {kind} {cfg.label}", e)
            row(**info, split=None, us=None, ok=False, err=None)
            continue
        for per_sm in options:
            try:
                ok, err = check(kname, x, base, y, cfg, per_sm, 0, ref, tol, m)
                if not ok:
                    ctx.bad += 1
                    print(f"  WRONG {k}x{n} M={m} {kind} {cfg.label} per_sm={per_sm}: err {err}", flush=True)
                us = graph_us([lambda i=i: mod.launch(x, packs[i], None, y, cfg, per_sm) for i in range(len(packs))],
                              len(packs))
                row(**info, split=per_sm, regs=regs, in_flight_kb=cfg.in_flight_kb(per_sm), us=us, ok=ok, err=err)
            except Exception as e:  # noqa: BLE001
                ctx.error(f"{k}x{n} M={m} {kind} {cfg.label} per_sm={per_sm}", e)
                row(**info, split=per_sm, us=None, ok=False, err=None)
    if fp16_check and not out_of_time(f"M={m} {kind} fp16"):
        cfg = mod.configs_for(m)[0]
        xh = x.half()
        refh = xh.double() @ w64
        yh = torch.empty(m, n, device=x.device, dtype=torch.float16)
        try:
            ok, err = check(kname, xh, base, yh, cfg, cfg.per_sm, 0, refh,
                            2 * rel_err(F.linear(xh, w64.half().t()), refh) + 1e-3, m)
        except Exception as e:  # noqa: BLE001
            ok, err = False, repr(e)[:200]
        if not ok:
            ctx.bad += 1
            print(f"  WRONG {k}x{n} M={m} {kind} fp16: err {err}", flush=True)
        row(M=m, kind="fp16-check", kernel=kname, config=asdict(cfg), us=None, ok=ok, err=err)


def stream_check(out: torch.Tensor, progs: int, want: int) -> bool:
    """The programs' XORs of their words XOR to that of every packed word (checksum_ok's test)."""
    return xor_all(out[:progs]) == want


def run_streams(ctx: Ctx, k: int, n: int, packs: list[PackedW4], sms: int, row, out_of_time) -> None:
    """(s) rows: every streaming config (w4a16_stream) of the kinds asked for, at every per_sm option whose
    programs are all resident at once (from the compiled kernel's registers and shared memory), each checked
    (checksum) before it is timed like every other row (a CUDA graph over the rotating weight copies)."""
    want = xor_all(packs[0].qweight)
    qbytes = packs[0].qweight.numel() * 4
    out = torch.zeros(max(WS.stream_grid(packs[0], c, 0, sms)[0] for _, c in stream_configs(ctx.kinds)) + 4 * sms,
                      dtype=torch.int32, device=packs[0].qweight.device)
    for kind, cfg in stream_configs(ctx.kinds):
        if out_of_time(f"{kind} {cfg.label}"):
            break
        info = dict(M=0, kind=kind, kernel="stream", config=asdict(cfg), label=cfg.label)
        try:
            descs = [WS.make_desc(p, cfg) if cfg.kind != "triton" else None for p in packs]
            out.zero_()
            progs, kern = WS.launch(packs[0], out, cfg, 1, sms, desc=descs[0])
            sync(out)
            regs, shared = getattr(kern, "n_regs", None), getattr(getattr(kern, "metadata", None), "shared", None)
            options = cfg.per_sm_options(regs, shared)
        except Exception as e:  # noqa: BLE001 (one config failing must not end the probe)
            ctx.error(f"{k}x{n} {kind} {cfg.label}", e)
            row(**info, split=None, us=None, ok=False, err=None)
            continue
        for per_sm in options:
            try:
                out.zero_()
                progs, _ = WS.launch(packs[0], out, cfg, per_sm, sms, desc=descs[0])
                sync(out)
                ok = stream_check(out, progs, want)
                if not ok:
                    ctx.bad += 1
                    print(f"  WRONG {k}x{n} {kind} {cfg.label} per_sm={per_sm}: checksum", flush=True)
                us = graph_us([lambda i=i: WS.launch(packs[i], out, cfg, per_sm, sms, desc=descs[i])
                               for i in range(len(packs))], len(packs))
                row(**info, split=per_sm, programs=progs, regs=regs, shared=shared,
                    in_flight_kb=cfg.in_flight_kb(per_sm, regs, shared), us=us, ok=ok, err=None, nbytes=qbytes)
            except Exception as e:  # noqa: BLE001
                ctx.error(f"{k}x{n} {kind} {cfg.label} per_sm={per_sm}", e)
                row(**info, split=per_sm, us=None, ok=False, err=None)
    print_streams(ctx, k, n)


def print_streams(ctx: Ctx, k: int, n: int) -> None:
    rows = [r for r in ctx.rows if r["K"] == k and r["N"] == n and r["M"] == 0]
    copy = next((r for r in rows if r["kind"] == "e-copy"), None)
    qmb = k * n / 2 / 2**20
    print(f"\n{k}x{n} loads-only streams: qweight {qmb:.1f} MiB, {qmb * 2**20 / 4.3e6:.1f} us at {COPY_TBPS} TB/s"
          + (f"; e-copy {copy['us']:.2f} us ({copy['TBps']:.2f} TB/s read + write)" if copy else ""), flush=True)
    for r in rows:
        if r["kind"] in STREAM_KINDS and r.get("us") is not None:
            per_sm = "grid" if r["split"] == 0 else f"{r['split']}/SM"
            print(f"  {r['kind']:8s} {r['label']:36s} {per_sm:>5s} {r['in_flight_kb']:5.0f} KB/SM  {r['us']:7.2f} us "
                  f"{r['TBps']:5.2f} TB/s{'' if r['ok'] else '  WRONG'}", flush=True)


def sync(x):
    if x.is_cuda:
        torch.cuda.synchronize()


def check(kname, x, p, y, cfg, split, probe, ref, tol, m):
    """Run once and compare (module docstring); works under the interpreter too (tests)."""
    if probe == 0:
        launch(kname, x, p, y, cfg, split)
        sync(x)
        err = rel_err(y.float(), ref)
        return bool(err <= tol and torch.isfinite(y).all()), err
    launch(kname, x, p, y, cfg, split, probe)  # sizes the workspace, which is then cleared and read
    sync(x)
    ws = W.split_k_slices(x.device, 1)
    if kname == "decode":
        progs, items, steps, cmax = W.decode_grid(x, p, cfg, split)
        ws.zero_()
        launch(kname, x, p, y, cfg, split, probe)
        sync(x)
        if probe == 1:
            return checksum_ok(ws[:progs], p), None
        yp = decode_slot_sum(ws, p.out_features, cfg, cmax, m)
    else:
        tiles = -(-p.out_features // cfg.bn)
        launch(kname, x, p, y, cfg, split, probe)
        sync(x)
        if probe == 1:
            return checksum_ok(ws[: tiles * split], p), None
        if split == 1:  # no split, no slices: y is written as usual
            yp = y.double()
        else:
            yp = ws[: split * p.out_features].view(split, p.out_features).double().sum(0)[None]
    err = rel_err(yp, ref)
    return bool(err <= tol), err


def _label(cfg) -> str:
    d = asdict(cfg)
    keep = {k: v for k, v in d.items() if k not in ("asm", "group") and v is not False}
    return " ".join(f"{k}{v}" for k, v in keep.items()).replace("num_warps", "w").replace("num_stages", "ns") \
        .replace("prefetch", "pf").replace("slices", "sl")


def print_shape(ctx: Ctx, k: int, n: int, m: int) -> None:
    rows = [r for r in ctx.rows if r["K"] == k and r["N"] == n and r["M"] in (0, m) and r.get("us") is not None]

    def best(kind):
        c = [r for r in rows if r["kind"] == kind and r["ok"]]
        return min(c, key=lambda r: r["us"]) if c else None

    print(f"\n{k}x{n} M={m}: packed {packed_bytes(k, n) / 2**20:.1f} MiB, floor {packed_bytes(k, n) / 4.3e6:.1f} us "
          f"at {COPY_TBPS} TB/s, {rows[0]['copies'] if rows else '?'} rotating copies", flush=True)
    for kind in ("e-copy", *STREAM_KINDS, "e-bf16", "noop", "c-gemv", "a-gemv", "b-gemv", "c-gemm", "a-gemm", "d-dec",
                 "a-dec", "b-dec", "r-dec", "g-dec", "q-dec"):
        r = best(kind)
        if r is not None:
            extra = f"{r.get('label', '')} split/per_sm {r.get('split', '')}" if "label" in r else r.get("note", "")
            print(f"  {kind:7s} {r['us']:8.2f} us  {r.get('TBps', 0):5.2f} TB/s  {extra}", flush=True)
    for r in (r for r in rows if r["kind"] == "g-dec" and r["M"] == m):
        print(f"    g-dec {r['label']:44s} split {r['split']} {r['us'] or 0:7.2f} us {r.get('TBps', 0):5.2f} TB/s"
              f"{'' if r['ok'] else '  WRONG'}", flush=True)
    for r in (r for r in rows if r["kind"] in ("r-dec", "q-dec") and r["M"] == m):
        print(f"    {r['kind']} {r['label']:44s} per_sm {r['split']:2d} ({r['regs'] or '?'} regs, "
              f"{r['in_flight_kb']:3.0f} KB/SM) {r['us']:7.2f} us {r['TBps']:5.2f} TB/s{'' if r['ok'] else '  WRONG'}",
              flush=True)
    bad = [r for r in ctx.rows if r["K"] == k and r["N"] == n and r["M"] == m and not r["ok"]]
    if bad:
        print(f"  WRONG/ERROR rows: {len(bad)}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--budget", type=float, default=160.0, help="seconds for the whole probe (after imports)")
    ap.add_argument("--shapes", default="all", help="'all', or e.g. 8192x8192,4096x4096")
    ap.add_argument("--kinds", default="all",
                    help="'all', or a comma list of row kinds, e.g. s-triton,s-tma,s-gluon,e-copy: "
                         + ",".join(ALL_KINDS) + " (aliases: " + ", ".join(f"{a}={b}" for a, b in KIND_ALIASES.items())
                         + ")")
    ap.add_argument("--configs", help="r-dec / q-dec rows: only configs whose label holds one of these comma-separated "
                                      "substrings (e.g. 'atomic,l2ahead')")
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--replot", metavar="JSON", help="only redraw the .png of an existing results file")
    args = ap.parse_args(argv)
    kinds = None if args.kinds == "all" else [KIND_ALIASES.get(x.strip(), x.strip()) for x in args.kinds.split(",")
                                               if x.strip()]
    bad_kinds = sorted(set(kinds or ()) - set(ALL_KINDS))
    if bad_kinds:
        ap.error(f"unknown kinds {bad_kinds}; known: {', '.join(ALL_KINDS)}")
    if args.replot:
        plot(json.loads(Path(args.replot).read_text()), Path(args.replot).with_suffix(".png"))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    ctx = Ctx(args.budget, kinds, [c for c in args.configs.split(",") if c] if args.configs else None)
    shapes = SHAPES if args.shapes == "all" else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20) or 50 * 2**20
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}: {props.multi_processor_count} SMs, L2 {l2 / 2**20:.0f} MiB; torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)
    if not args.no_precompile:
        precompile(ctx, limit=min(60.0, 0.35 * args.budget))
    W.set_autotune(False)
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = gpu_tag(gpu)
    if kinds is not None:  # a partial run never overwrites the full results file
        tag += ("-stream" if all(x in STREAM_KINDS or x == "e-copy" for x in kinds)
                else "-gring" if "q-dec" in kinds else "-wgmma" if "g-dec" in kinds
                else "-ring" if "r-dec" in kinds else "-subset")
    path = out / f"w4a16_probe-{tag}.json"
    for i, (k, n) in enumerate(shapes):
        left = ctx.left()
        if left < 8:
            ctx.skipped.append(f"{k}x{n} (no time left)")
            continue
        deadline = time.time() + left / (len(shapes) - i) * (1.6 if i == 0 else 1.0)
        t = time.time()
        run_shape(ctx, k, n, gen, l2, deadline, fp16_check=i == 0)
        print(f"[{k}x{n} took {time.time() - t:.1f} s, {ctx.left():.0f} s left]", flush=True)
        atomic_write_text(path, json.dumps(dict(gpu=gpu, sms=props.multi_processor_count, l2_bytes=l2, torch=torch.__version__,
                                        triton=triton.__version__, group_size=G, copy_tbps_floor=COPY_TBPS,
                                        kinds=kinds or "all",
                                        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                        rows=ctx.rows, skipped=ctx.skipped, errors=ctx.errors), indent=1))
    if path.exists():
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
    summary(ctx)
    if ctx.skipped:
        print(f"skipped (time): {ctx.skipped}", flush=True)
    print(f"wrong: {ctx.bad}, errors: {len(ctx.errors)}; wrote {path}", flush=True)
    return 1 if ctx.bad or ctx.errors else 0


def plot(res: dict, path: Path) -> None:
    """Per (shape, M): the best correct time of each row kind beside the floor, the copy and bf16."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    best: dict[tuple, dict[str, float]] = {}
    for r in res["rows"]:
        if not r.get("ok") or r.get("us") is None:
            continue
        cells = [(r["K"], r["N"], m) for m in ((1, 16) if r["M"] == 0 else (r["M"],))]
        for cell in cells:
            d = best.setdefault(cell, {"floor": r["floor_us"]})
            d[r["kind"]] = min(d.get(r["kind"], float("inf")), r["us"])
    cells = sorted(best, key=lambda c: (c[2], c[0] * c[1], c))
    kinds = [k for k in ("floor", "e-copy", *STREAM_KINDS, "e-bf16", "c-gemv", "c-gemm", "a-gemv", "a-gemm", "b-gemv",
                         "d-dec", "a-dec", "b-dec", "r-dec", "g-dec", "q-dec") if any(k in best[c] for c in cells)]
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(cells)), 4.5))
    width = 0.85 / len(kinds)
    for j, k in enumerate(kinds):
        ax.bar([i + j * width for i in range(len(cells))], [best[c].get(k, 0) for c in cells], width=width, label=k)
    ax.set_xticks([i + 0.42 for i in range(len(cells))], [f"{k}x{n}\nM={m}" for k, n, m in cells], fontsize=7)
    ax.set_ylabel("us (CUDA graph, weights from HBM)")
    ax.set_yscale("log")
    ax.set_title(f"W4A16 decode probe, group {res.get('group_size')} ({res.get('gpu')}): c old kernels, d new decode "
                 "kernel, a loads only, b no split-K reduction, s loads-only streams", fontsize=9)
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary(ctx: Ctx) -> None:
    print("\nsummary (us, best correct row of each kind; TB/s on packed bytes)")
    print(f"{'K x N':>12} {'M':>2} {'floor':>6} {'copy':>6} {'bf16':>6} {'noop':>5} {'old':>6} {'a-old':>6} "
          f"{'b-old':>6} "
          f"{'dec':>6} {'a-dec':>6} {'b-dec':>6} {'dec TB/s':>8} {'x bf16':>6}  best decode config")
    for k, n in SHAPES:
        for m in (1, 16):
            rows = [r for r in ctx.rows if r["K"] == k and r["N"] == n and r["M"] in (0, m) and r.get("us") is not None
                    and r["ok"]]
            if not any(r["M"] == m for r in rows):
                continue

            def b(*kinds):
                c = [r for r in rows if r["kind"] in kinds]
                return min(c, key=lambda r: r["us"]) if c else None

            def f(r):
                return f"{r['us']:6.1f}" if r else f"{'-':>6}"

            dec, bf = b("d-dec"), b("e-bf16")
            print(f"{k:>5}x{n:<6} {m:>2} {packed_bytes(k, n) / 4.3e6:6.1f} {f(b('e-copy'))} {f(bf)} "
                  f"{b('noop')['us'] if b('noop') else 0:5.1f} {f(b('c-gemv', 'c-gemm'))} {f(b('a-gemv', 'a-gemm'))} "
                  f"{f(b('b-gemv'))} {f(dec)} {f(b('a-dec'))} {f(b('b-dec'))} "
                  f"{dec['TBps'] if dec else 0:8.2f} {bf['us'] / dec['us'] if dec and bf else 0:6.2f}  "
                  f"{(dec['label'] + ' per_sm ' + str(dec['split'])) if dec else ''}", flush=True)
    stream_summary(ctx)
    ring_summary(ctx)
    ring_summary(ctx, "g-dec")
    ring_summary(ctx, "q-dec")


def ring_summary(ctx: Ctx, kind: str = "r-dec") -> None:
    """A decode candidate (the ring kernel, docs/w4a16_decode.md "Round 5"; g-dec and q-dec, "Round 8") against the old
    decode kernel: per shape and M its best correct row (us, TB/s on packed bytes), d-dec's, e-copy's rate, bf16 /
    it."""
    cells = list(dict.fromkeys((r["K"], r["N"], r["M"]) for r in ctx.rows if r["kind"] == kind))
    if not cells:
        return
    print(f"\n{kind} (best correct row): us, TB/s on packed bytes, x e-copy's rate, d-dec us, x bf16")
    for k, n, m in cells:
        rows = [r for r in ctx.rows if r["K"] == k and r["N"] == n and r.get("us") is not None and r["ok"]]

        def b(kind, mm=m):
            c = [r for r in rows if r["kind"] == kind and r["M"] == mm]
            return min(c, key=lambda r: r["us"]) if c else None

        ring, dec, bf, copy = b(kind), b("d-dec"), b("e-bf16"), b("e-copy", 0)
        if ring is None:
            print(f"  {k}x{n} M={m}: no correct {kind} row", flush=True)
            continue
        print(f"  {k:>5}x{n:<6} M={m:<2} {ring['us']:7.2f} us {ring['TBps']:5.2f} TB/s"
              + (f" ({ring['TBps'] / copy['TBps']:.2f} x e-copy)" if copy else "")
              + (f"  d-dec {dec['us']:.2f}" if dec else "") + (f"  x bf16 {bf['us'] / ring['us']:.2f}" if bf else "")
              + f"  {ring['label']} per_sm {ring['split']}", flush=True)


def stream_summary(ctx: Ctx) -> None:
    """Best correct loads-only stream of each kind per shape, in TB/s on the qweight bytes, against the copy
    (read + write TB/s) and the old kernels' loads-only rows where they ran."""
    shapes = list(dict.fromkeys((r["K"], r["N"]) for r in ctx.rows if r["kind"] in STREAM_KINDS))
    if not shapes:
        return
    print("\nloads-only streams (best correct row of each kind: us, TB/s on the qweight bytes; config, KB in flight "
          "an SM)")
    for k, n in shapes:
        rows = [r for r in ctx.rows if r["K"] == k and r["N"] == n and r.get("us") is not None and r["ok"]]
        copy = next((r for r in rows if r["kind"] == "e-copy"), None)
        old = [r for r in rows if r["kind"] in ("a-gemv", "a-dec") and r["M"] == 1]
        print(f"  {k}x{n}: qweight floor {k * n / 2 / 4.3e6:.1f} us at {COPY_TBPS} TB/s"
              + (f", e-copy {copy['TBps']:.2f} TB/s" if copy else "")
              + "".join(f", {r['kind']} {r['TBps']:.2f} TB/s (packed + scales)" for r in old), flush=True)
        for kind in STREAM_KINDS:
            c = [r for r in rows if r["kind"] == kind]
            if c:
                r = min(c, key=lambda r: r["us"])
                per_sm = "grid" if r["split"] == 0 else f"{r['split']}/SM"
                print(f"    {kind:8s} {r['us']:7.2f} us {r['TBps']:5.2f} TB/s"
                      + (f" ({r['TBps'] / copy['TBps']:.2f} x e-copy's TB/s)" if copy else "")
                      + f"  {r['label']} {per_sm}, {r['in_flight_kb']:.0f} KB/SM", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
