"""Config sweep of the FA3-style Gluon forward (src/flashscale/kernels/attention_fa3.py, issue #4) against
torch SDPA's cuDNN backend, on one Hopper GPU, in about 4 minutes at most.

For head dim 64 / 128 / 256, causal and not, seqlen 2048 and 16384 (and 4096, 8192 at head dim 128), with
the FlashAttention papers' setting (bf16, batch * seqlen = 16384, heads * head_dim = 2048), it times every
config of attention_fa3.TUNING_CONFIGS (ping-pong on/off, persistent, tiles, stages) and SDPA-cuDNN with
triton.testing.do_bench (median). FLOPs: 4 * B * S^2 * H * D, halved when causal. Before a config is timed,
its output is compared with SDPA-cuDNN's on the same inputs: a max abs error above --tol (2e-2) is reported
as a MISMATCH and that config is not timed (the exit status is then 1).

Stages, each time-limited (a broken config must not cost the rest of the sweep):
  1. compile: worker processes build every (config, head dim, causal) kernel into Triton's cache in
     parallel, without launching anything (attention_fa3.precompile); a compile error is recorded.
  2. time: one worker process runs the shapes one after another and reports each result as it goes. If
     it stays silent for --stall seconds (a hung kernel, a deadlock in a barrier protocol), it is killed,
     the config it was running is recorded as "hang", and a fresh worker continues with the rest.

    python benchmarks/attention_fa3_sweep.py --out $OUT/attention-fa3-sweep.json

Writes --out: {gpu, torch, triton, date, tol, rows, compile}; rows are flat: impl ("fa3" / "sdpa_cudnn"),
variant, the FA3Config fields, hdim, causal, seqlen, batch, heads, ms, tflops, max_err, status ("ok",
"mismatch", "compile_error", "hang", "error", "not_run") and error. Prints a table per head dim last.
Reads nothing outside this repository (and Triton's cache).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import signal
import sys
import time
from pathlib import Path

from sweep_procs import Proc, emit, pump  # (benchmarks/: the script's own folder)

REPO = Path(__file__).resolve().parents[1]
TOKENS, HIDDEN = 16384, 2048
HDIMS = (128, 256, 64)  # in this order: the targets first, in case time runs out
SEQLENS = {64: (2048, 16384), 128: (2048, 4096, 8192, 16384), 256: (2048, 16384)}


def flops(batch, seqlen, heads, hdim, causal):
    return 4.0 * batch * seqlen * seqlen * heads * hdim / (2 if causal else 1)


# ---- workers (subprocesses; they import torch and touch the GPU) ------------------------------------------

def _compile_worker(jobs):
    import torch

    from flashscale.kernels import attention_fa3 as fa3

    for hdim, causal, name in jobs:
        cfg = fa3.TUNING_CONFIGS[hdim][name]
        q = torch.randn(1, 256, 2, hdim, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(1, 256, 1, hdim, device="cuda", dtype=torch.bfloat16)
        t0 = time.time()
        try:
            fa3.precompile(q, kv, kv, causal=causal, config=cfg)
            emit(event="compiled", hdim=hdim, causal=causal, variant=name, s=round(time.time() - t0, 2))
        except Exception as e:  # noqa: BLE001 - any failure is a result of the sweep
            emit(event="compile_error", hdim=hdim, causal=causal, variant=name,
                 error=f"{type(e).__name__}: {e}"[:2000])


def _bench_worker(groups, tol, warmup, rep):
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashscale.kernels import attention_fa3 as fa3

    emit(event="info", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
         sms=torch.cuda.get_device_properties(0).multi_processor_count)
    for hdim, causal, seqlen, names, with_cudnn in groups:
        heads, batch = HIDDEN // hdim, TOKENS // seqlen
        shape = dict(hdim=hdim, causal=causal, seqlen=seqlen, batch=batch, heads=heads)
        fl = flops(batch, seqlen, heads, hdim, causal)
        g = torch.Generator(device="cuda").manual_seed(seqlen + hdim)
        q, k, v = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # SDPA's (B, H, S, D), its own layout

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        emit(event="start", variant="sdpa_cudnn", **shape)
        ref = cudnn().transpose(1, 2).float()
        torch.cuda.synchronize()
        if with_cudnn:
            ms = triton.testing.do_bench(cudnn, warmup=warmup, rep=rep, return_mode="median")
            emit(event="row", impl="sdpa_cudnn", variant="sdpa_cudnn", ms=ms, tflops=fl / ms * 1e-9, max_err=0.0,
                 status="ok", **shape)
        for name in names:
            cfg = fa3.TUNING_CONFIGS[hdim][name]
            fields = dataclasses.asdict(cfg)
            emit(event="start", variant=name, **shape)
            try:
                out, _ = fa3.attention_fa3_fwd(q, k, v, causal=causal, config=cfg)
                torch.cuda.synchronize()
                err = (out.float() - ref).abs().max().item()
                if not err <= tol:  # NaN included
                    emit(event="row", impl="fa3", variant=name, ms=None, tflops=None, max_err=err, status="mismatch",
                         error=f"max abs err {err:.3g} vs SDPA-cuDNN > {tol}", **fields, **shape)
                    continue
                ms = triton.testing.do_bench(lambda: fa3.attention_fa3_fwd(q, k, v, causal=causal, config=cfg),
                                             warmup=warmup, rep=rep, return_mode="median")
                emit(event="row", impl="fa3", variant=name, ms=ms, tflops=fl / ms * 1e-9, max_err=err, status="ok",
                     **fields, **shape)
            except Exception as e:  # noqa: BLE001
                emit(event="row", impl="fa3", variant=name, ms=None, tflops=None, max_err=None, status="error",
                     error=f"{type(e).__name__}: {e}"[:2000], **fields, **shape)
                os._exit(2)  # the CUDA context may be broken: the parent starts a fresh worker for the rest
        del q, k, v, qt, kt, vt, ref
        torch.cuda.empty_cache()
    emit(event="done")


# ---- parent: never touches the GPU (it imports the config table only); spawns the workers, keeps the clock --

def _variants(hdim, only):
    sys.path.insert(0, str(REPO / "src"))
    from flashscale.kernels.attention_fa3 import TUNING_CONFIGS  # imports torch/triton; no GPU use

    names = sorted(TUNING_CONFIGS[hdim], key=lambda n: n != "coop")  # the known-good first config first
    fields = {n: dataclasses.asdict(c) for n, c in TUNING_CONFIGS[hdim].items()}
    return [n for n in names if not only or n in only], fields


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="attention-fa3-sweep.json")
    ap.add_argument("--budget", type=float, default=230.0, help="seconds for the whole sweep")
    ap.add_argument("--compile-budget", type=float, default=100.0, help="seconds for stage 1")
    ap.add_argument("--stall", type=float, default=30.0, help="seconds of silence that mean a hang")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="compile processes")
    ap.add_argument("--hdims", default=",".join(map(str, HDIMS)))
    ap.add_argument("--seqlens", default="", help="override, e.g. 16384")
    ap.add_argument("--variants", default="", help="only these configs, e.g. pp,coop")
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--warmup", type=int, default=20, help="do_bench warm-up, ms")
    ap.add_argument("--rep", type=int, default=60, help="do_bench repetitions, ms")
    ap.add_argument("--replot", metavar="JSON", help="only redraw the .png of an existing results file")
    ap.add_argument("--worker", choices=("compile", "bench"), help=argparse.SUPPRESS)
    ap.add_argument("--payload", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replot:
        path = Path(args.replot)
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return 0
    if args.worker == "compile":
        return _compile_worker([tuple(j) for j in json.loads(args.payload)])
    if args.worker == "bench":
        return _bench_worker([tuple(g) for g in json.loads(args.payload)], args.tol, args.warmup, args.rep)

    t_start = time.time()
    deadline = t_start + args.budget
    only = {s for s in args.variants.split(",") if s}
    hdims = [int(x) for x in args.hdims.split(",") if x]
    cfg_fields, names = {}, {}
    for d in hdims:
        names[d], cfg_fields[d] = _variants(d, only)
    seqlens = {d: tuple(int(x) for x in args.seqlens.split(",")) if args.seqlens else SEQLENS[d] for d in hdims}

    # -- stage 1: compile in parallel ----------------------------------------------------------------------
    jobs = [(d, c, n) for d in hdims for c in (False, True) for n in names[d]]
    n_proc = max(1, min(args.jobs, len(jobs)))
    chunks = [jobs[i::n_proc] for i in range(n_proc)]
    compiled, compile_err = {}, {}

    def on_compile(pr, ev):
        key = (ev["hdim"], ev["causal"], ev["variant"])
        if ev["event"] == "compiled":
            compiled[key] = ev["s"]
        elif ev["event"] == "compile_error":
            compile_err[key] = ev["error"]
            print(f"COMPILE ERROR d={key[0]} causal={key[1]} {key[2]}: {ev['error'][:300]}", flush=True)

    t0 = time.time()
    procs = [Proc(Path(__file__).resolve(), "compile", ch, args) for ch in chunks if ch]
    finished = pump(procs, min(deadline, t0 + args.compile_budget), on_compile)
    for pr in procs:
        if pr.p.returncode not in (0, None) and pr.stderr_tail:
            print(f"compile worker exit {pr.p.returncode}:\n  " + "\n  ".join(pr.stderr_tail[-8:]), flush=True)
    n_left = len(jobs) - len(compiled) - len(compile_err)
    print(f"stage 1: {len(compiled)} compiled, {len(compile_err)} errors, {n_left} unfinished"
          f"{'' if finished else ' (time limit)'} in {time.time() - t0:.0f}s", flush=True)

    # -- stage 2: time, one shape after another, restarting the worker after a hang -------------------------
    todo = []  # (hdim, causal, seqlen, variant); "sdpa_cudnn" is timed with every shape
    for d in hdims:
        for c in (False, True):
            for s in seqlens[d]:
                todo += [(d, c, s, "sdpa_cudnn")] + [(d, c, s, n) for n in names[d] if (d, c, n) not in compile_err]
    rows, done, info, current = [], set(), {}, {}

    def on_bench(pr, ev):
        if ev["event"] == "info":
            if info:
                return
            info.update({k: ev[k] for k in ("gpu", "torch", "triton", "sms")})
            print(f"{info['gpu']}, {info['sms']} SMs, torch {info['torch']}, triton {info['triton']}", flush=True)
        elif ev["event"] == "start":
            current[id(pr)] = (ev["hdim"], ev["causal"], ev["seqlen"], ev["variant"])
        elif ev["event"] == "row":
            ev.pop("event")
            rows.append(ev)
            done.add((ev["hdim"], ev["causal"], ev["seqlen"], ev["variant"]))
            tf = f"{ev['tflops']:7.1f} TFLOP/s" if ev["tflops"] else ev["status"].upper()
            err = f"err {ev['max_err']:.2e}" if ev.get("max_err") is not None else ""
            print(f"d={ev['hdim']:3d} {'causal' if ev['causal'] else 'full  '} S={ev['seqlen']:5d} "
                  f"{ev['variant']:15s} {tf:>16s} {err}", flush=True)
            if ev["status"] not in ("ok",):
                print(f"  !! {ev['status'].upper()}: {ev.get('error', '')[:300]}", flush=True)

    hung = set()  # (hdim, causal, seqlen, variant) that hung or crashed
    hung_variants = {}  # (hdim, variant) -> the key it hung at: not run again at that head dim

    def on_stall(pr):
        key = current.get(id(pr))
        pr.kill()
        if key is not None:
            hung.add(key)
            hung_variants.setdefault((key[0], key[3]), key)
            d, c, s, n = key
            print(f"  !! HANG: d={d} causal={c} S={s} {n}: silent for {args.stall:.0f}s, worker killed", flush=True)
            rows.append(dict(impl="sdpa_cudnn" if n == "sdpa_cudnn" else "fa3", variant=n, hdim=d, causal=c, seqlen=s,
                             batch=TOKENS // s, heads=HIDDEN // d, ms=None, tflops=None, max_err=None, status="hang",
                             error=f"no progress for {args.stall:.0f}s", **cfg_fields[d].get(n, {})))
            done.add(key)

    t1 = time.time()
    while time.time() < deadline - 5:
        left = [t for t in todo if t not in done and t not in hung and (t[0], t[3]) not in hung_variants]
        if not left:
            break
        groups = []  # (hdim, causal, seqlen, [variants], time cudnn?)
        for d, c, s, n in left:
            if not groups or groups[-1][:3] != [d, c, s]:
                groups.append([d, c, s, [], False])
            if n == "sdpa_cudnn":
                groups[-1][4] = True
            else:
                groups[-1][3].append(n)
        # a shape whose cuDNN reference hung is skipped (no reference to check against)
        groups = [g for g in groups if (g[0], g[1], g[2], "sdpa_cudnn") not in hung]
        if not groups:
            break
        n_done = len(done)
        pr = Proc(Path(__file__).resolve(), "bench", groups, args)
        pump([pr], deadline, on_bench, stall=args.stall, on_stall=on_stall)
        key = current.get(id(pr))
        if pr.p.returncode not in (0, -signal.SIGKILL) and key is not None and key not in done:
            # a crash (not a hang) on the config it was running: record it, go on with the rest
            print(f"bench worker exit {pr.p.returncode}:\n  " + "\n  ".join(pr.stderr_tail[-12:]), flush=True)
            d, c, s, n = key
            hung.add(key)
            hung_variants.setdefault((d, n), key)
            rows.append(dict(impl="sdpa_cudnn" if n == "sdpa_cudnn" else "fa3", variant=n, hdim=d, causal=c, seqlen=s,
                             batch=TOKENS // s, heads=HIDDEN // d, ms=None, tflops=None, max_err=None, status="error",
                             error=f"worker exit {pr.p.returncode}: " + " | ".join(pr.stderr_tail[-3:])[:1500],
                             **cfg_fields[d].get(n, {})))
            done.add(key)
        elif len(done) == n_done:  # no progress and nothing to blame: stop rather than loop
            print(f"bench worker made no progress (exit {pr.p.returncode}):\n  " + "\n  ".join(pr.stderr_tail[-12:]),
                  flush=True)
            break
    print(f"stage 2: {len(rows)} rows in {time.time() - t1:.0f}s", flush=True)

    for d, c, s, n in todo:  # what the time limit or a compile error left out
        if (d, c, s, n) in done:
            continue
        why = f"skipped: hung at {hung_variants[(d, n)]}" if (d, n) in hung_variants else "time limit"
        rows.append(dict(impl="fa3" if n != "sdpa_cudnn" else "sdpa_cudnn", variant=n, hdim=d, causal=c, seqlen=s,
                         batch=TOKENS // s, heads=HIDDEN // d, ms=None, tflops=None, max_err=None, status="not_run",
                         error=why, **cfg_fields[d].get(n, {})))
    for (d, c, n), err in compile_err.items():
        for s in seqlens[d]:
            rows.append(dict(impl="fa3", variant=n, hdim=d, causal=c, seqlen=s, batch=TOKENS // s, heads=HIDDEN // d,
                             ms=None, tflops=None, max_err=None, status="compile_error", error=err, **cfg_fields[d][n]))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = dict(info, date=datetime.datetime.now().isoformat(timespec="seconds"), tol=args.tol,
               setting=dict(tokens=TOKENS, hidden=HIDDEN, dtype="bfloat16", warmup_ms=args.warmup, rep_ms=args.rep),
               compile=[dict(hdim=d, causal=c, variant=n, s=t) for (d, c, n), t in compiled.items()],
               rows=rows, wall_s=round(time.time() - t_start, 1))
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    plot(res, out.with_suffix(".png"))
    _table(rows, hdims, names, seqlens)
    print(f"wrote {out} ({len(rows)} rows) in {time.time() - t_start:.0f}s")
    bad = [r for r in rows if r["status"] in ("mismatch", "hang", "error", "compile_error")]
    for r in bad:
        print(f"FAILED: {r['status']} d={r['hdim']} causal={r['causal']} S={r['seqlen']} {r['variant']}: "
              f"{(r.get('error') or '')[:200]}")
    return 1 if bad else 0


def plot(res: dict, path: Path, *, label=lambda r: r["variant"], title: str = "FA3 forward variants",
         ylabel: str = "TFLOP/s") -> None:
    """One panel per head dim: TFLOP/s of every variant (bars, named by label(row)) per (causal, seqlen)
    cell, cuDNN (the label "sdpa_cudnn") as a black line. Also draws attention_fa3_bwd_sweep's plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (pip install matplotlib)")
        return
    rows = [r for r in res["rows"] if r.get("tflops")]
    hdims = sorted({r["hdim"] for r in rows})
    fig, axes = plt.subplots(1, len(hdims), figsize=(6 * len(hdims), 4.5), squeeze=False)
    for ax, d in zip(axes[0], hdims):
        rs = [r for r in rows if r["hdim"] == d]
        cells = sorted({(r["causal"], r["seqlen"]) for r in rs})
        variants = [v for v in dict.fromkeys(label(r) for r in rs) if v != "sdpa_cudnn"]
        width = 0.8 / max(len(variants), 1)
        get = {(r["causal"], r["seqlen"], label(r)): r["tflops"] for r in rs}
        for j, v in enumerate(variants):
            ax.bar([i + j * width for i in range(len(cells))], [get.get((c, s, v), 0) for c, s in cells],
                   width=width, label=v)
        for i, (c, s) in enumerate(cells):
            if (c, s, "sdpa_cudnn") in get:
                ax.hlines(get[(c, s, "sdpa_cudnn")], i - width / 2, i + 0.8 - width / 2, colors="k",
                          label="sdpa_cudnn" if i == 0 else None)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cells))],
                      [f"{'causal' if c else 'full'}\n{s}" for c, s in cells])
        ax.set_title(f"{title}, head dim {d} ({res.get('gpu', '')})")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _table(rows, hdims, names, seqlens):
    get = {(r["hdim"], r["causal"], r["seqlen"], r["variant"]): r for r in rows}
    for d in hdims:
        cols = ["sdpa_cudnn"] + names[d]
        w = max(9, *(len(c) + 1 for c in cols))
        print(f"\nhead dim {d}: TFLOP/s (fa3 rows: x cuDNN of the best)")
        print(f"{'causal':7s}{'seqlen':>7s}" + "".join(f"{c:>{w}s}" for c in cols) + f"  {'best':>15s} {'x cuDNN':>7s}")
        for c in (False, True):
            for s in seqlens[d]:
                cells, best = [], None
                for n in cols:
                    r = get.get((d, c, s, n))
                    if r is None or r["tflops"] is None:
                        cells.append(f"{(r['status'][:8] if r else '-'):>{w}s}")
                    else:
                        cells.append(f"{r['tflops']:>{w}.1f}")
                        if n != "sdpa_cudnn" and (best is None or r["tflops"] > best[1]):
                            best = (n, r["tflops"])
                ref = get.get((d, c, s, "sdpa_cudnn"))
                ratio = f"{best[1] / ref['tflops']:.2f}" if best and ref and ref["tflops"] else "-"
                print(f"{str(c):7s}{s:>7d}" + "".join(cells) + f"  {best[0] if best else '-':>15s} {ratio:>7s}")


if __name__ == "__main__":
    sys.exit(main())
