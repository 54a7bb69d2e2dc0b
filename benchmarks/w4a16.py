"""W4A16 linear vs bf16 F.linear (cuBLAS) on the GPU, both measured in this run.

    python benchmarks/w4a16.py [--quick] [--out benchmarks/results/] [--group-size 128]

Cells: M (tokens) x (K, N) linear shapes of Llama-3-8B and -70B, group size 128, bf16 activations.
Correctness first: every shape at M = 1, 16, 256 against the float64 dequantized reference (error <=
2x cuBLAS bf16's + 1e-3); a failure is printed, kept in the JSON and makes the exit status 1. Then timing:
triton.testing.do_bench_cudagraph median (`us`: the GPU's time, calls replayed from a CUDA graph as a
decode loop runs them) and do_bench median (`us_eager`: one Python call each, L2 cleared before it),
while the weights rotate through copies that together pass 3x the 60 MB L2, so decode timings are HBM
reads, not cache hits.

Formulas: TFLOP/s = 2*M*K*N / t. TB/s = weight bytes / t: for W4A16 the packed bytes K*N/2 plus the
4-byte scale/zero word per group and column (K/G * N * 4); for bf16 K*N*2. int4 floor = packed bytes /
4.3 TB/s (the device copy rate measured on this H200). Output: JSON (gpu, torch, triton, date, rows,
tuned configs) and a PNG of speedup over bf16 vs M, one line per shape, with the ideal 4x; a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flashscale.data.cache import atomic_write_text  # noqa: E402
from flashscale.kernels.w4a16 import precompile, tuned_configs  # noqa: E402
from flashscale.kernels.w4a16_pack import PackedW4, pack_w4  # noqa: E402
from flashscale.ops.w4a16 import w4a16_linear  # noqa: E402
from flashscale.reference.w4a16 import dequantize_w4  # noqa: E402
from plotting import gpu_tag  # noqa: E402

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 8192), (8192, 28672), (28672, 8192)]  # (K, N)
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096]
L2_BYTES = 60e6
COPY_TBPS = 4.3  # measured device copy rate (shared/ANCHORS.md): the int4 floor's denominator


def random_packed(k: int, n: int, g: int, gen: torch.Generator) -> PackedW4:
    """Random 4-bit weight (asymmetric, realistic scale range), packed on the GPU."""
    codes = torch.randint(0, 16, (k, n), device="cuda", generator=gen, dtype=torch.uint8)
    zeros = torch.randint(0, 16, (k // g, n), device="cuda", generator=gen, dtype=torch.uint8)
    scales = (torch.rand(k // g, n, device="cuda", generator=gen) * 0.01 + 0.002).half()
    return pack_w4(codes, zeros, scales, group_size=g)


def packed_bytes(p: PackedW4) -> int:
    return p.in_features * p.out_features // 2 + p.num_groups * p.out_features * 4


def copies_for(nbytes: int) -> int:
    return max(2, min(32, math.ceil(3 * L2_BYTES / nbytes)))


def weight_copies(base: PackedW4, w_bf16: torch.Tensor) -> tuple[list[PackedW4], list[torch.Tensor]]:
    """base and w_bf16 each with copies that together pass 3x the L2, for the timed calls to rotate through."""
    packs = [base] + [dataclasses.replace(base, qweight=base.qweight.clone(), sz=base.sz.clone(), perm=None)
                      for _ in range(copies_for(packed_bytes(base)) - 1)]
    return packs, [w_bf16] + [w_bf16.clone() for _ in range(copies_for(w_bf16.numel() * 2) - 1)]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def check(p: PackedW4, w_bf16: torch.Tensor, m: int, gen: torch.Generator) -> tuple[float, float, bool]:
    x = torch.randn(m, p.in_features, device="cuda", generator=gen).to(torch.bfloat16)
    y = w4a16_linear(x, p)
    oracle = x.double() @ dequantize_w4(p, torch.float64)
    e_ours, e_bf16 = rel_err(y, oracle), rel_err(F.linear(x, w_bf16), oracle)
    ok = bool(e_ours <= 2 * e_bf16 + 1e-3 and torch.isfinite(y).all())
    if not ok:  # reported and kept in the JSON; the other cells still run (one device call, no retries)
        print(f"W4A16 WRONG at M={m} K={p.in_features} N={p.out_features}: rel err {e_ours:.3e} "
              f"vs bf16 {e_bf16:.3e}", flush=True)
    return e_ours, e_bf16, ok


def bench(fn, warmup: int, rep: int) -> tuple[float, float]:
    """(graph us, eager us). Graph: the calls replayed from a CUDA graph, so the number is the GPU's
    time (the way a decode loop runs); eager: do_bench's per-call time, L2 cleared before each call,
    which includes the Python launch cost whenever that exceeds the kernel (seen on the first H200
    run: ~65 us a call for every small shape)."""
    fn()  # compile and autotune outside the timed region
    graph = triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3
    eager = triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3
    return graph, eager


def timed_rounds(todo: list, rounds: int, warmup: int, rep: int) -> list[tuple[float, float, list[float]]]:
    """(median graph us, median eager us, graph us of each round) for each of todo's (impl, fn, bytes, config), the
    implementations timed one after another in each of `rounds` rounds: a cell's rows then share the card's state
    of the same seconds (session 43 saw one config 1-7 % apart between two runs minutes apart, bf16 too)."""
    times = [([], []) for _ in todo]
    for _ in range(rounds):
        for (_impl, fn, _nb, _cfg), (g, e) in zip(todo, times):
            us, us_eager = bench(fn, warmup, rep)
            g.append(us)
            e.append(us_eager)
    return [(statistics.median(g), statistics.median(e), [round(v, 3) for v in g]) for g, e in times]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--quick", action="store_true", help="3 shapes, 6 token counts, short timing")
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--impls", default="flashscale,bf16",
                    help="comma list of flashscale, bf16, flashscale-wgmma (the opt-in Gluon GEMM, M >= 16: each "
                         "candidate config checked against float64, then timed; the best kept a cell), "
                         "flashscale-strip (the no-split-K decode kernel, M <= 16, the same way)")
    ap.add_argument("--ms", default=None, help="comma list of token counts (default: the built-in sweep)")
    ap.add_argument("--shapes", default=None, help="comma list of KxN (default: the six Llama shapes)")
    ap.add_argument("--strip-match", default=None, metavar="REGEX",
                    help="flashscale-strip: only the configs whose label matches (re.search), e.g. 'fence|xp'")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds a cell, every implementation once a round; `us` is the median round (all in "
                    "us_rounds)")
    ap.add_argument("--merge-into", type=Path, default=None, metavar="JSON",
                    help="after the run, put its rows into this results file in place of the rows of the same M "
                    "(merge_results); the file's note is for the committer to extend")
    args = ap.parse_args(argv)
    impls = args.impls.split(",")
    if args.rounds < 1:
        ap.error(f"--rounds takes an int >= 1; got {args.rounds}")
    try:
        strip_match = re.compile(args.strip_match) if args.strip_match else None
    except re.error as e:
        ap.error(f"--strip-match takes a regular expression over strip config labels; {args.strip_match!r}: {e}")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes = SHAPES[::2] if args.quick else SHAPES
    ms = [1, 4, 16, 64, 256, 1024] if args.quick else MS
    if args.ms:
        ms = [int(v) for v in args.ms.split(",")]
    if args.shapes:
        try:
            shapes = [tuple(int(v) for v in kn.lower().split("x")) for kn in args.shapes.split(",")]
        except ValueError:
            ap.error(f"--shapes takes a comma list of KxN, e.g. 4096x4096,8192x8192; got {args.shapes!r}")
    warmup, rep = (5, 20) if args.quick else (10, 40)
    g = args.group_size
    # every candidate config of every M bucket, compiled in parallel processes first (one shape stands
    # for all: the benchmark shapes share evenness and alignment)
    t0 = time.time()
    jobs = 0 if "flashscale" not in impls else precompile_ms(sorted({1} | {min(max(m, 2), 4096) for m in ms}), g)
    print(f"precompiled {jobs} configs in {time.time() - t0:.1f} s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    gpu = torch.cuda.get_device_name()
    rows, checks = [], []
    for k, n in shapes:
        base = random_packed(k, n, g, gen)
        w_bf16 = dequantize_w4(base, torch.bfloat16).t().contiguous()  # (N, K): the same weights in bf16
        for m in (1, 16, 256) if "flashscale" in impls else ():
            e_ours, e_bf16, ok = check(base, w_bf16, m, gen)
            checks.append(dict(M=m, K=k, N=n, rel_err=e_ours, rel_err_bf16=e_bf16, ok=ok))
        packs, ws = weight_copies(base, w_bf16)
        nq, nw = len(packs), len(ws)
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            it = {"q": 0, "w": 0}

            def ours():
                it["q"] = (it["q"] + 1) % nq
                return w4a16_linear(x, packs[it["q"]])

            def cublas():
                it["w"] = (it["w"] + 1) % nw
                return F.linear(x, ws[it["w"]])

            flops = 2.0 * m * k * n
            todo = [(impl, fn, nb, None) for impl, fn, nb in (("flashscale", ours, packed_bytes(base)),
                                                               ("bf16", cublas, k * n * 2)) if impl in impls]
            if "flashscale-wgmma" in impls and m >= 16:
                todo += wgmma_trials(base, packs, w_bf16, x, m, gen, checks)
            if "flashscale-strip" in impls and m <= 16:
                todo += strip_trials(base, packs, w_bf16, x, m, checks, strip_match)
            best = {}
            timed = timed_rounds(todo, args.rounds, warmup, rep)
            for (impl, fn, nbytes, cfg), (us, us_eager, us_rounds) in zip(todo, timed):
                row = dict(impl=impl, M=m, K=k, N=n, group_size=g, us=us, us_eager=us_eager,
                           tflops=flops / us * 1e-6, TBps=nbytes / us * 1e-6,
                           floor_us=packed_bytes(base) / (COPY_TBPS * 1e6) if impl != "bf16" else None,
                           **({"us_rounds": us_rounds} if len(us_rounds) > 1 else {}))
                if cfg is not None:
                    row["config"] = cfg.label if impl.startswith("flashscale-strip") else \
                        cfg.label() + f"-g{cfg.group}-c{cfg.consumers}"
                    print(f"    trial {impl} [{row['config']}] M={m} K={k} N={n}: {us:.2f} us", flush=True)
                if impl not in best or us < best[impl]["us"]:
                    best[impl] = row
            shown = [i for i in impls if i in best] + [i for i in best if i not in impls]  # + strip_trials' extra
            rows += [best[i] for i in shown]
            bf = best.get("bf16", {}).get("us")
            print(f"  M={m:5d} K={k:5d} N={n:5d}  " + "  ".join(
                f"{i} {best[i]['us']:9.1f} us" + (f" x{bf / best[i]['us']:.2f}" if bf and i != "bf16" else "")
                + (f" [{best[i]['config']}]" if "config" in best[i] else "") for i in shown), flush=True)
        packs = ws = w_bf16 = base = None  # freed before the next shape (the closures above see None: not called again)
        torch.cuda.empty_cache()
        path = write(args, gpu, g, rows, checks)  # after every shape: a cut-short run keeps what it measured

    if args.merge_into is not None:  # the table below stays this run's (its rows alternate flashscale, bf16)
        merged = merge_results(json.loads(args.merge_into.read_text()), json.loads(path.read_text()))
        atomic_write_text(args.merge_into, json.dumps(merged, indent=1))
        plot(merged["rows"], args.merge_into.with_suffix(".png"), gpu)
        print(f"merged into {args.merge_into}")
    plot(rows, path.with_suffix(".png"), gpu)

    print(f"\nW4A16 vs bf16 F.linear on {gpu} (group {g}); TB/s on packed bytes; floor = packed bytes / 4.3 TB/s")
    print(f"{'M':>5} {'K':>6} {'N':>6} {'w4a16 us':>9} {'eager':>7} {'floor us':>8} {'TB/s':>5} {'TFLOP/s':>7} "
          f"{'bf16 us':>8} {'speedup':>7}")
    for a, b in zip(rows[::2], rows[1::2]) if impls == ["flashscale", "bf16"] else ():
        print(f"{a['M']:5d} {a['K']:6d} {a['N']:6d} {a['us']:9.1f} {a['us_eager']:7.1f} {a['floor_us']:8.1f} "
              f"{a['TBps']:5.2f} {a['tflops']:7.1f} {b['us']:8.1f} {b['us'] / a['us']:7.2f}")
    bad = [c for c in checks if not c["ok"]]
    print(f"correctness: {len(checks) - len(bad)}/{len(checks)} checks passed; wrote {path}")
    return 1 if bad else 0


def wgmma_trials(base: PackedW4, packs: list, w_bf16: torch.Tensor, x: torch.Tensor, m: int,
                 gen: torch.Generator, checks: list, configs: list | None = None) -> list:
    """checked_trials of every flashscale-wgmma candidate of M's bucket (or of those of `configs` that fit the group
    size)."""
    from flashscale.kernels import w4a16_wgmma as wg

    configs = wg.candidates(m) if configs is None else [
        c for c in configs if wg.config_error(c, base.group_size, base.in_features) is None]
    return checked_trials("flashscale-wgmma", configs, lambda xx, p, cfg: wg.w4a16_wgmma(xx, p, config=cfg),
                          lambda cfg: cfg.label(), base, packs, w_bf16, x, m, checks)


def strip_trials(base: PackedW4, packs: list, w_bf16: torch.Tensor, x: torch.Tensor, m: int, checks: list,
                 match=None) -> list:
    """checked_trials of every flashscale-strip candidate of M's bucket (kernels.w4a16_strip: no split-K across
    programs), or of those whose label `match` (a compiled regex) finds."""
    from flashscale.kernels import w4a16_strip as strip

    configs = [c for c in strip.configs_for(m) if match is None or match.search(c.label)]
    out = checked_trials("flashscale-strip", configs,
                         lambda xx, p, cfg: strip.w4a16_strip(xx, p, config=cfg), lambda cfg: cfg.label,
                         base, packs, w_bf16, x, m, checks)
    # the xperm configs again with x already in the B order (as a producer that writes it so would hand it over):
    # the kernel alone, without the pre-pass's gather; rows of their own impl, never the cell's flashscale-strip row
    xp = strip.x_perm_words(x, base)  # the weight copies share base's (absent) act-order permutation
    out += checked_trials("flashscale-strip-xgiven", [c for c in configs if c.xperm],
                          lambda xx, p, cfg: strip.w4a16_strip(xx, p, config=cfg, xw=xp), lambda cfg: cfg.label,
                          base, packs, w_bf16, x, m, checks)
    # (session 47 timed the gather + kernel launched plainly too, flashscale-strip-nopdl: PDL took 0.2-0.3 us back)
    return out


def checked_trials(impl: str, configs: list, run, label, base: PackedW4, packs: list, w_bf16: torch.Tensor,
                   x: torch.Tensor, m: int, checks: list) -> list:
    """(impl, fn, bytes, config) of every config that is correct here: run(x, weight, config) checked against the
    float64 product first (as check()); a wrong or failing config is reported in checks (label(config) names it)
    and not timed. fn runs it on the weight copies in turn."""
    out, it = [], {"q": 0}
    oracle = x.double() @ dequantize_w4(base, torch.float64)
    e_bf16 = rel_err(F.linear(x, w_bf16), oracle)
    for cfg in configs:
        try:
            e = rel_err(run(x, base, cfg), oracle)
        except Exception as exc:  # noqa: BLE001  (compile / resource errors: reported, the others still run)
            print(f"{impl} {label(cfg)}: {exc!r}"[:300], flush=True)
            e = float("inf")
        ok = e <= 2 * e_bf16 + 1e-3
        checks.append(dict(impl=impl, config=label(cfg), M=m, K=base.in_features, N=base.out_features, rel_err=e,
                           rel_err_bf16=e_bf16, ok=ok))
        if not ok:
            print(f"{impl} WRONG {label(cfg)} M={m}: rel err {e:.3e} vs bf16 {e_bf16:.3e}", flush=True)
            continue

        def fn(cfg=cfg):
            it["q"] = (it["q"] + 1) % len(packs)
            return run(x, packs[it["q"]], cfg)

        out.append((impl, fn, packed_bytes(base), cfg))
    return out


def precompile_ms(ms: list[int], group_size: int = 128) -> int:
    """kernels.w4a16.precompile of every candidate the tuner times at these M (a 256 x 256 bf16 problem stands for
    the benchmark shapes: they share evenness and alignment); returns the number of configs compiled."""
    return precompile([dict(m=m, k=256, n=256, group_size=group_size, dtype="bfloat16", act_order=False, bias=False)
                       for m in ms])


def merge_results(base: dict, new: dict) -> dict:
    """base with new's rows and checks in place of base's of the same M (every impl), sorted by (K, N, M, impl);
    new's tuned entries over base's; new's date, gpu, torch and triton (the file says when its newest rows ran)."""
    ms = {r["M"] for r in new["rows"]}
    key = lambda r: (r["K"], r["N"], r["M"], r.get("impl", ""))  # noqa: E731
    out = dict(base)
    out["rows"] = sorted([r for r in base["rows"] if r["M"] not in ms] + new["rows"], key=key)
    out["checks"] = sorted([c for c in base.get("checks", []) if c["M"] not in ms] + new.get("checks", []), key=key)
    out["tuned"] = {**base.get("tuned", {}), **new.get("tuned", {})}
    out.update({k: new[k] for k in ("gpu", "torch", "triton", "date") if k in new})
    return out


def write(args, gpu: str, g: int, rows: list[dict], checks: list[dict]) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = gpu_tag(gpu)
    result = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  group_size=g, quick=args.quick, rows=rows, checks=checks, tuned=tuned_configs())
    extra = "" if args.impls == "flashscale,bf16" else "-" + args.impls.replace(",", "-")  # never overwrite the sweep
    path = out / f"w4a16-{tag}{extra}.json"
    return atomic_write_text(path, json.dumps(result, indent=1))  # a run cut short leaves the previous file whole


def plot(rows: list[dict], path: Path, gpu: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    impls = sorted({r["impl"] for r in rows} - {"bf16"})  # every impl of the run beside bf16 (not only "flashscale")
    if not impls or not any(r["impl"] == "bf16" for r in rows):
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    shapes = sorted({(r["K"], r["N"]) for r in rows})
    for impl, style in zip(impls, ("-", "--", ":", "-.") * 4):
        for k, n in shapes:
            ours = {r["M"]: r["us"] for r in rows if r["impl"] == impl and (r["K"], r["N"]) == (k, n)}
            ref = {r["M"]: r["us"] for r in rows if r["impl"] == "bf16" and (r["K"], r["N"]) == (k, n)}
            m = sorted(set(ours) & set(ref))
            label = f"K={k} N={n}" if len(impls) == 1 else f"{impl} K={k} N={n}"
            ax.plot(m, [ref[i] / ours[i] for i in m], marker="o", linestyle=style, label=label)
    ax.axhline(4.0, color="gray", linestyle="--", label="ideal 4x (bytes)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speedup over bf16 F.linear")
    ax.set_title(f"W4A16 (group 128) vs bf16 cuBLAS, {gpu}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
