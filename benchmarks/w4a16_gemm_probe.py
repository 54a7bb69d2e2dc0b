"""Every W4A16 wgmma config at prefill sizes, one row each, beside bf16 F.linear (cuBLAS): which tile wins and why.

    python benchmarks/w4a16_gemm_probe.py [--shapes 4096x4096,8192x28672] [--ms 1024,4096] [--out DIR]

benchmarks/w4a16.py keeps only the best config a cell; this prints every one (checked against the float64
dequantized reference first, as w4a16.py does; a wrong config is reported and not timed), with the traffic model
that says whether a tile is bound by the L2 -> SM stream of x: each (BM x BN) tile reads its x rows (BM x K x 2
bytes) and its packed words (BN x K / 2) once, so the L2 -> SM bytes are M*K*2*ceil(N/BN) + N*K/2*ceil(M/BM)
(`l2_TBps` = those bytes / time). cuBLAS's row uses a 128 x 256 tile for the same figure. Timing: median of calls
replayed from a CUDA graph (an eager Gluon call's ~70 us of host time would show at M = 1024 on 4096^2), weights
rotating through copies past 3x the L2.
Writes DIR/w4a16-gemm-probe-<gpu>.json (rows: impl, config, M, K, N, us, tflops, x_bf16, l2_TBps).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from w4a16 import precompile_ms, random_packed, weight_copies, wgmma_trials  # noqa: E402

from flashscale.kernels import w4a16_wgmma as wg  # noqa: E402
from flashscale.ops.w4a16 import w4a16_linear  # noqa: E402
from flashscale.reference.w4a16 import dequantize_w4  # noqa: E402
from plotting import gpu_tag  # noqa: E402

C = wg.WgmmaConfig
EXTRA = [C(bm=256, consumers=2, bk=64, stages=6), C(bm=256, consumers=2, bk=64, stages=6, group=4),
         C(bm=256, consumers=2, bk=64, stages=6, group=16), C(bm=256, consumers=2, bk=64, stages=6, pingpong=True),
         C(bm=256, consumers=2, bk=128, stages=3), C(bm=256, consumers=2, bk=128, stages=3, pingpong=True),
         C(bm=128, consumers=2, bk=128, stages=4, pingpong=True), C(bm=128, consumers=2, bk=64, stages=8, pingpong=True),
         C(bm=256, consumers=1, bk=128, stages=3), C(bm=256, consumers=1, bk=64, stages=6, group=16),
         C(bm=256, consumers=2, bk=64, stages=6, persistent=True), C(bm=256, consumers=2, bk=64, stages=6, group=16,
                                                                     persistent=True),
         C(bm=256, consumers=2, bk=128, stages=3, pingpong=True, persistent=True),
         C(bm=256, consumers=2, bk=128, stages=3, pingpong=True, persistent=True, stream_k=True)]

# M <= 64 (issue 7's point 2: 0.91-1.50x bf16 where the roofline allows 2.8-3.7x): the 64-token tile's knobs the
# candidates leave out (half-size K steps, turns, the sweep's grouping, persistence without the stream-K tail)
EXTRA_SMALL = [C(bm=64, consumers=2, bk=64, stages=8), C(bm=64, consumers=2, stages=6, pingpong=True),
               C(bm=64, consumers=2, bk=64, stages=8, pingpong=True), C(bm=64, consumers=2, stages=6, group=16),
               C(bm=64, consumers=2, stages=6, group=4), C(bm=64, consumers=2, stages=6, persistent=True),
               C(bm=64, consumers=2, stages=4)]

# One consumer owning 128 features (two wgmma row blocks on one x tile): x's L2 -> SM bytes a feature halve against
# bm64-bn64 one consumer, the M = 64 pick at 8192^2 at 6.5 TB/s of that stream; and two one-consumer blocks an SM
# (ctas=2: 128 registers at launch, 232 for the consumer by setmaxnreg) for two independent loops a scheduler
# (session 38, compile-checked)
EXTRA_F128 = [C(bm=64, consumers=1, features=128, bk=64, stages=8),
              C(bm=64, consumers=1, features=128, bk=64, stages=12),
              C(bm=32, consumers=1, features=128, bk=128, stages=8),
              C(bm=64, consumers=1, bk=64, stages=6, ctas=2), C(bm=64, consumers=1, bk=128, stages=3, ctas=2),
              C(bm=64, consumers=1, features=128, bk=64, stages=8, ctas=2)]

# M <= 16 (issue 7's point 1 asks 80 % of HBM bandwidth up to M = 16; the 16-token tile ran 8192^2 at 23.3 us, ~700
# cycles a K step of little work): two to four one-consumer blocks an SM, as many independent rings a scheduler
EXTRA_DEC = [C(bm=16, consumers=1, stages=8, ctas=2), C(bm=16, consumers=1, stages=8, ctas=3),
             C(bm=16, consumers=1, stages=4, ctas=3), C(bm=16, consumers=1, bk=64, stages=8, ctas=4),
             C(bm=16, consumers=1, features=128, bk=64, stages=8, ctas=2)]


def l2_bytes(m: int, k: int, n: int, bm: int, bn: int) -> float:
    return m * k * 2 * math.ceil(n / bn) + n * k / 2 * math.ceil(m / bm)


def write(out_dir: str, gpu: str, rows: list[dict]) -> Path:
    out = Path(out_dir) / f"w4a16-gemm-probe-{gpu_tag(gpu)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(), rows=rows), indent=1))
    tmp.replace(out)
    return out


def timed(fn, rep: int) -> float:
    """us: median of calls replayed from a CUDA graph (the host's launch time, ~70 us a Gluon call, left out)."""
    fn()
    return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x4096,8192x28672", help="comma list of KxN")
    ap.add_argument("--ms", default="1024,4096")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--rep", type=int, default=40)
    ap.add_argument("--candidates", default="big", help="which of w4a16_wgmma.candidates(M) run before EXTRA: all, "
                    "big (bm >= 128 only), none")
    ap.add_argument("--extra", default="large",
                    help="comma list of the configs timed after the candidates: large (EXTRA, large-M tiles), small "
                    "(EXTRA_SMALL, 64-token tiles), f128 (EXTRA_F128, one consumer of 128 features, two blocks an "
                    "SM), dec (EXTRA_DEC, 16-token tiles in two / three blocks an SM), h2 (each config timed, "
                    "candidates included, again with the packed 16-bit unpack, kernels/w4a16_h2.py), vy (each config "
                    "timed again with y written by 16-byte stores, WgmmaConfig.vec_y), none")
    ap.add_argument("--auto", action="store_true", help="also time w4a16_linear's own tuned choice (impl "
                    "flashscale-auto: the decode / ring / GEMV kernels too at M <= 16), its configs precompiled first")
    args = ap.parse_args(argv)
    lists = {"large": EXTRA, "small": EXTRA_SMALL, "f128": EXTRA_F128, "dec": EXTRA_DEC, "h2": [], "vy": [],
             "none": []}
    names = args.extra.split(",")
    bad = [v for v in names if v not in lists]
    if bad:
        ap.error(f"--extra {bad[0]!r}: a comma list of {', '.join(lists)}")
    extra = [c for v in names for c in lists[v]]
    if args.auto:  # the tuner's candidates compiled in parallel processes, not one after another in the first call
        precompile_ms(sorted({min(max(int(v), 1), 4096) for v in args.ms.split(",")}))
    gen = torch.Generator(device="cuda").manual_seed(0)
    gpu = torch.cuda.get_device_name()
    rows = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        base = random_packed(k, n, 128, gen)
        w_bf16 = dequantize_w4(base, torch.bfloat16).t().contiguous()
        packs, ws = weight_copies(base, w_bf16)
        for m in (int(v) for v in args.ms.split(",")):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            it = {"i": 0}

            def cublas():
                it["i"] += 1
                return F.linear(x, ws[it["i"] % len(ws)])

            t_bf = timed(cublas, args.rep)
            flops = 2.0 * m * k * n
            rows.append(dict(impl="bf16", config="cublas", M=m, K=k, N=n, us=t_bf, tflops=flops / t_bf * 1e-6,
                             x_bf16=1.0, l2_TBps=l2_bytes(m, k, n, 128, 256) / t_bf * 1e-6))
            print(f"M={m} {k}x{n}: bf16 {t_bf:.1f} us {flops / t_bf * 1e-6:.0f} TFLOP/s", flush=True)
            if args.auto:
                def auto():
                    it["i"] += 1
                    return w4a16_linear(x, packs[it["i"] % len(packs)])

                t = timed(auto, args.rep)  # the first call tunes the shape's bucket, outside the timed region
                rows.append(dict(impl="flashscale-auto", config="tuned", M=m, K=k, N=n, us=t,
                                 tflops=flops / t * 1e-6, x_bf16=t_bf / t, l2_TBps=None))
                print(f"  {'flashscale-auto (tuned)':34s} {t:9.1f} us x{t_bf / t:.2f} bf16", flush=True)
            cand = {"all": wg.candidates(m), "none": []}.get(args.candidates, [c for c in wg.candidates(m) if c.bm >= 128])
            todo = list(dict.fromkeys(cand + extra))
            for name in wg.TWINS:  # h2, then vy: each config so far timed again with that flag
                if name in names:
                    todo += [wg.twin(c, name) for c in todo if wg.twin(c, name) != c]
            checks = []  # float64 checks first (w4a16.wgmma_trials): only the correct configs are timed
            trials = wgmma_trials(base, packs, w_bf16, x, m, gen, checks, todo)
            err = {c["config"]: c["rel_err"] for c in checks}
            rows += [dict(impl="flashscale-wgmma", config=c["config"], M=m, K=k, N=n, wrong=True)
                     for c in checks if not c["ok"]]
            for _, fn, _, cfg in trials:
                t = timed(fn, args.rep)
                lbl = f"{cfg.label()}-c{cfg.consumers}-g{cfg.group}"
                rows.append(dict(impl="flashscale-wgmma", config=lbl, M=m, K=k, N=n, us=t, tflops=flops / t * 1e-6,
                                 x_bf16=t_bf / t, l2_TBps=l2_bytes(m, k, n, cfg.bm, cfg.bn) / t * 1e-6,
                                 rel_err=err[cfg.label()]))
                print(f"  {lbl:34s} {t:9.1f} us {flops / t * 1e-6:6.0f} TFLOP/s x{t_bf / t:.2f} bf16  "
                      f"L2->SM {rows[-1]['l2_TBps']:.2f} TB/s", flush=True)
        packs = ws = base = w_bf16 = None  # free the copies before the next shape
        torch.cuda.empty_cache()
        out = write(args.out, gpu, rows)  # after every shape: a run cut short keeps what it measured
    plot(rows, out.with_suffix(".png"), gpu)
    print(f"wrote {out}")
    return 0


def plot(rows: list[dict], path: Path, gpu: str) -> None:
    """One panel a (K x N, M) cell: each config's ratio to cuBLAS, sorted, 0.9 marked (issue 7's M >= 1024 bar)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    cells = sorted({(r["K"], r["N"], r["M"]) for r in rows})
    fig, axes = plt.subplots(len(cells), 1, figsize=(9, 2.2 * len(cells)), squeeze=False)
    for ax, (k, n, m) in zip(axes[:, 0], cells):
        got = sorted((r["x_bf16"], r["config"]) for r in rows
                     if (r["K"], r["N"], r["M"]) == (k, n, m) and r["impl"] != "bf16" and "x_bf16" in r)
        ax.barh([c for _, c in got], [v for v, _ in got], color="tab:blue")
        ax.axvline(0.9, color="red", linestyle="--", linewidth=0.8)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"K={k} N={n} M={m}", fontsize=9)
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel("x bf16 cuBLAS (same run)")
    fig.suptitle(f"W4A16 wgmma GEMM configs vs cuBLAS, {gpu}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
