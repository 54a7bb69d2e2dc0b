"""Does the W4A16 tuner's timing rank GEMM configs as the benchmark's does? One process, interleaved rounds.

    python benchmarks/w4a16_tune_timing.py [--cells 4096x14336x1024,8192x8192x4096] [--rounds 3]

For each cell (K x N x M, group 128) and config (the persistent stream-K leader, the one-tile bk64 config, bm256 x
bn64 with one consumer) it prints, per round: `_time` (flashscale.kernels.w4a16_tune._time: the tuner's own timing over
its weight ring), `graph` (triton's do_bench_cudagraph over benchmarks/w4a16.py's weight copies, as the grid times
a cell), `graph1` (do_bench_cudagraph on one weight), and _time's method with one difference from do_bench_cudagraph
at a time (_time's knobs: a side stream, a synchronize after each replay, 60 ms replays); then cuBLAS, and the tuner
run on the cell with each of its timings. docs/w4a16_gemm.md (session 21) has what it showed on the H200. Needs a Hopper GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from w4a16 import random_packed, weight_copies  # noqa: E402

from flashscale.kernels import w4a16 as K  # noqa: E402
from flashscale.kernels import w4a16_tune as T  # noqa: E402
from flashscale.kernels import w4a16_wgmma as wg  # noqa: E402
from flashscale.reference.w4a16 import dequantize_w4  # noqa: E402

W = wg.WgmmaConfig


CONFIGS = {"sk": W(bm=256, consumers=2, stages=3, pingpong=True, persistent=True, stream_k=True),
           "bk64": W(bm=256, consumers=2, bk=64, stages=6),
           "c1": W(bm=256, consumers=1, stages=3)}


def cell(k: int, n: int, m: int, rounds: int, gen: torch.Generator) -> None:
    p = random_packed(k, n, 128, gen)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ring = K._weight_ring(p)
    packs, ws = weight_copies(p, dequantize_w4(p, torch.bfloat16).t().contiguous())
    print(f"== K{k} N{n} M{m}: tuner ring {len(ring)} copies, benchmark ring {len(packs)}", flush=True)

    def launch(c, s, w=p):
        K._launch(x, w, None, y, c, s)

    for c in CONFIGS.values():
        launch(c, 0)  # compile outside the timing
    variants = {"t10_side": dict(replay_ms=10, side_stream=True), "t10_sync": dict(replay_ms=10, sync=True),
                "t60": dict(replay_ms=60), "t60_side_sync": dict(replay_ms=60, side_stream=True, sync=True)}
    res = {name: {"_time": [], "graph": [], "graph1": [], **{v: [] for v in variants}} for name in CONFIGS}
    it = {"q": 0, "w": 0}
    for _ in range(rounds):
        for name, c in CONFIGS.items():
            res[name]["_time"].append(K._time(launch, c, 0, ring) * 1e3)

            def rotating(c=c):
                it["q"] = (it["q"] + 1) % len(packs)
                return wg.w4a16_wgmma(x, packs[it["q"]], config=c)

            res[name]["graph"].append(triton.testing.do_bench_cudagraph(rotating, rep=60) * 1e3)
            res[name]["graph1"].append(triton.testing.do_bench_cudagraph(lambda c=c: launch(c, 0), rep=60) * 1e3)
            for v, kw in variants.items():  # the tuner's ring and launch, one knob of _time changed at a time
                res[name][v].append(K._time(launch, c, 0, ring, **kw) * 1e3)

    def cublas():
        it["w"] = (it["w"] + 1) % len(ws)
        return F.linear(x, ws[it["w"]])

    cb = triton.testing.do_bench_cudagraph(cublas, rep=60) * 1e3
    for name, r in res.items():
        print(f"   {name:5s} " + "  ".join(f"{kind} " + " ".join(f"{v:7.1f}" for v in vals) for kind, vals in r.items()),
              flush=True)
    print(f"   cublas {cb:.1f} us", flush=True)
    log, orig = [], T._time

    def logged(launch_, c, s, ring_=()):
        v = orig(launch_, c, s, ring_)
        log.append((c.label() if hasattr(c, "label") else type(c).__name__, round(v * 1e3, 1)))
        return v

    T._time = logged  # where _tune reads it
    try:
        K.w4a16_matmul(x, p)
    finally:
        T._time = orig
    print("   tuner:", [t for t in log if t[0] != "GemmConfig"], flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="4096x14336x1024,8192x8192x4096,4096x14336x4096", help="KxNxM, comma list")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("needs a Hopper GPU", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    for spec in args.cells.split(","):
        k, n, m = (int(v) for v in spec.split("x"))
        cell(k, n, m, args.rounds, gen)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
