"""Config sweep of the FP8 FA3-style Gluon forward (src/flashscale/kernels/attention_fa3_fp8.py, issue #5)
beside the Triton FP8 kernel (kernels/attention_fp8.py) and torch SDPA's cuDNN backend (bf16), on one Hopper GPU,
in about 3 minutes at most.

For head dim 128 and 256, causal and not, seqlen 2048 / 8192 / 16384, in the FlashAttention papers' setting
(batch * seqlen = 16384, heads * head_dim = 2048, q, k, v ~ N(0, 1) in bf16), it times every config of
attention_fa3_fp8.TUNING_CONFIGS with triton.testing.do_bench (median):
  * kernel alone (tflops): attention_fa3_fp8_fwd on inputs quantized beforehand (quantize_fp8: Hadamard,
    e4m3 block quantization, V transposed; 256-row K/V blocks for the 256-key tiles, 128 otherwise);
  * end to end (tflops_e2e): the quantization pre-pass + the kernel, from the bf16 q, k, v.
The Triton FP8 kernel (its default tile, 128-row blocks) is timed the same two ways, SDPA-cuDNN once.
The variants include the MUFU-relief configs of issue #5 (D 128: pp_fma2 / pp_fma3 = exp2_fma, 2 or 3 eighths of
P's exp2 as FMA-pipe polynomials; pp_late = late_pv_wait, the softmax under the PV product in the SASS too;
pp_late_fma2 / pp_late_fma3 both; D 256: pp_n64_s4_late), each checked against the emulation like every other
(their P differs from exp2 by <= 1.02e-4 relative: well inside --tol), and timed beside the default pp.
FLOPs: 4 * B * S^2 * H * D, halved when causal (the pre-pass counts as time, not FLOPs).

Correctness first: before a kernel is timed its output is compared with the emulation
(flashscale.reference.attention_fp8, same key tiles) on the same quantized inputs; rmse(out, emulation) must be
at most --tol (0.5) x rmse(emulation, SDPA-cuDNN) (the emulation's own error: cuDNN's bf16 error is ~10x
smaller), and finite. max_err = max |out - emulation|. A failure is a MISMATCH: that config is not timed and
the exit status is 1.

Stages, each time-limited (a broken config must not cost the rest of the sweep):
  1. compile: worker processes build every (config, head dim, causal) kernel into Triton's cache in parallel,
     without launching (attention_fa3_fp8.precompile); a compile error is recorded.
  2. time: one worker process runs the shapes one after another and reports each result as it goes. If it
     stays silent for --stall seconds (a hung kernel, a deadlock in a barrier protocol), it is killed, the config
     it was running is recorded as "hang" (and not run again at that head dim), and a fresh worker continues.

    python benchmarks/attention_fa3_fp8_sweep.py --out $OUT/attention-fa3-fp8-sweep-h200.json
    python benchmarks/attention_fa3_fp8_sweep.py --hdims 128 --variants pp,pp_late,pp_late_fma2 --out ...  # a subset

Writes --out: {gpu, torch, triton, date, tol, setting, compile, rows, wall_s}; rows are flat: impl
("flashscale_fa3_fp8", "triton_fp8", "sdpa_cudnn"), variant, the config fields, hdim, causal, seqlen, batch,
heads, quant_block_n, ms, tflops, ms_e2e, tflops_e2e, max_err, rmse_vs_emu, rmse_emu, status ("ok", "mismatch",
"compile_error", "hang", "error", "not_run") and error; and a .png beside it. Prints a table per head dim last.
Exit status 1 on any mismatch, hang, error or compile error.
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
HDIMS = (128, 256)
SEQLENS = (16384, 2048, 8192)  # the acceptance shape first, in case time runs out
IMPL = "flashscale_fa3_fp8"


def flops(batch, seqlen, heads, hdim, causal):
    return 4.0 * batch * seqlen * seqlen * heads * hdim / (2 if causal else 1)


def _quant_block_n(cfg) -> int:
    return max(128, cfg.block_n)


# ---- workers (subprocesses; they import torch and touch the GPU) ------------------------------------------

def _compile_worker(jobs):
    import torch

    from flashscale.kernels import attention_fa3_fp8 as fp8
    from flashscale.ops import quantize_fp8

    xs = {}
    for hdim, causal, name in jobs:
        cfg = fp8.TUNING_CONFIGS[hdim][name]
        qbn = _quant_block_n(cfg)
        if (hdim, qbn) not in xs:
            q = torch.randn(1, 256, 2, hdim, device="cuda", dtype=torch.bfloat16)
            kv = torch.randn(1, 256, 1, hdim, device="cuda", dtype=torch.bfloat16)
            xs[(hdim, qbn)] = quantize_fp8(q, kv, kv, block_n=qbn)
        x = xs[(hdim, qbn)]
        t0 = time.time()
        try:
            fp8.precompile(*x.args(), causal=causal, block_n=qbn, config=cfg,
                           v_key_perm=cfg.v_perm)  # (256 keys: whole 32-key groups; the order does not matter here)
            emit(event="compiled", hdim=hdim, causal=causal, variant=name, s=round(time.time() - t0, 2))
        except Exception as e:  # noqa: BLE001 - any failure is a result of the sweep
            emit(event="compile_error", hdim=hdim, causal=causal, variant=name,
                 error=f"{type(e).__name__}: {e}"[:2000])


def _rmse(a, b):
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


def _bench_worker(groups, tol, warmup, rep):
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashscale.kernels import attention_fa3_fp8 as fp8
    from flashscale.kernels.attention_fp8 import attention_fp8_fwd, fp8_candidates
    from flashscale.ops import quantize_fp8
    from flashscale.reference.attention_fp8 import Fp8Inputs, attention_fp8_quantized_ref

    emit(event="info", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
         sms=torch.cuda.get_device_properties(0).multi_processor_count)
    bench = lambda f: triton.testing.do_bench(f, warmup=warmup, rep=rep, return_mode="median")  # noqa: E731
    for hdim, causal, seqlen, names, with_base in groups:
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
        ref = cudnn().transpose(1, 2)  # (B, S, H, D) bf16: the near-exact reference of the error budget
        torch.cuda.synchronize()
        if with_base:
            ms = bench(cudnn)
            emit(event="row", impl="sdpa_cudnn", variant="sdpa_cudnn", ms=ms, tflops=fl / ms * 1e-9, ms_e2e=None,
                 tflops_e2e=None, max_err=None, rmse_vs_emu=None, rmse_emu=None, status="ok", **shape)
        xs, emus = {}, {}

        def quantized(qbn):
            if qbn not in xs:
                xs[qbn] = quantize_fp8(q, k, v, block_n=qbn)
            return xs[qbn]

        def quantized_perm(qbn):  # V^T with its keys in a v_perm config's order, as the pre-pass writes it
            if ("perm", qbn) not in xs:
                xs["perm", qbn] = quantize_fp8(q, k, v, block_n=qbn, v_key_perm=True)
            return xs["perm", qbn]

        def emulation(qbn, tile):
            if (qbn, tile) not in emus:
                x = quantized(qbn)
                xi = Fp8Inputs(q8=x.q8, k8=x.k8, v8=x.v8[..., :seqlen].permute(0, 3, 1, 2), q_descale=x.q_descale,
                               k_descale=x.k_descale, v_descale=x.v_descale, block_m=x.block_m, block_n=x.block_n)
                emu = attention_fp8_quantized_ref(xi, causal=causal, tile_n=tile)
                emus[(qbn, tile)] = (emu, _rmse(emu, ref))
                del xi
            return emus[(qbn, tile)]

        def check_and_time(impl, name, fields, qbn, tile, run, run_e2e):
            emit(event="start", variant=name, **shape)
            try:
                out = run()
                torch.cuda.synchronize()
                emu, e_emu = emulation(qbn, tile)
                err = (out.float() - emu.float()).abs().max().item()
                r = _rmse(out, emu)
                base = dict(impl=impl, variant=name, quant_block_n=qbn, max_err=err, rmse_vs_emu=r, rmse_emu=e_emu,
                            **fields, **shape)
                if not (torch.isfinite(out).all().item() and r <= tol * e_emu):  # NaN included
                    emit(event="row", ms=None, tflops=None, ms_e2e=None, tflops_e2e=None, status="mismatch",
                         error=f"rmse vs emulation {r:.3g} > {tol} x {e_emu:.3g} (max abs {err:.3g})", **base)
                    return
                del out
                ms = bench(run)
                ms_e2e = bench(run_e2e)
                emit(event="row", ms=ms, tflops=fl / ms * 1e-9, ms_e2e=ms_e2e, tflops_e2e=fl / ms_e2e * 1e-9,
                     status="ok", **base)
            except Exception as e:  # noqa: BLE001
                emit(event="row", impl=impl, variant=name, quant_block_n=qbn, ms=None, tflops=None, ms_e2e=None,
                     tflops_e2e=None, max_err=None, rmse_vs_emu=None, rmse_emu=None, status="error",
                     error=f"{type(e).__name__}: {e}"[:2000], **fields, **shape)
                os._exit(2)  # the CUDA context may be broken: the parent starts a fresh worker for the rest

        if with_base:  # the Triton FP8 kernel, its default tile, 128-row quantization blocks
            tcfg = fp8_candidates(hdim, gpu=True)[0]
            out = torch.empty_like(q)
            lse = torch.empty(batch, heads, seqlen, device="cuda", dtype=torch.float32)

            def tri(x=None):
                x = x or quantized(128)
                attention_fp8_fwd(x.q8, x.k8, x.v8, x.q_descale, x.k_descale, x.v_descale, out, lse, causal=causal,
                                  softmax_scale=hdim ** -0.5, block_m=128, block_n=128, config=tcfg)
                return out

            check_and_time("triton_fp8", "triton_fp8", dataclasses.asdict(tcfg), 128, tcfg.block_n, tri,
                           lambda: tri(quantize_fp8(q, k, v)))
        for name in names:
            cfg = fp8.TUNING_CONFIGS[hdim][name]
            qbn = _quant_block_n(cfg)

            def ours(x=None, cfg=cfg, qbn=qbn):
                if x is None:  # kernel alone: inputs quantized beforehand (in the V^T key order cfg reads)
                    x = quantized_perm(qbn) if cfg.v_perm else quantized(qbn)
                return fp8.attention_fa3_fp8_fwd(*x.args(), causal=causal, block_n=qbn, config=cfg,
                                                 v_key_perm=x.v_key_perm)[0]

            check_and_time(IMPL, name, dataclasses.asdict(cfg), qbn, cfg.block_n, ours,  # end to end: the pre-pass
                           lambda ours=ours, qbn=qbn, p=cfg.v_perm: ours(quantize_fp8(q, k, v, block_n=qbn,
                                                                                       v_key_perm=p)))
        del q, k, v, qt, kt, vt, ref, xs, emus
        torch.cuda.empty_cache()
    emit(event="done")


# ---- parent: never touches the GPU (it imports the config table only); spawns the workers, keeps the clock --

def _variants(hdim, only):
    sys.path.insert(0, str(REPO / "src"))
    from flashscale.kernels.attention_fa3_fp8 import TUNING_CONFIGS  # imports torch/triton; no GPU use

    names = sorted(TUNING_CONFIGS[hdim], key=lambda n: n != "pp")  # the default first
    fields = {n: dataclasses.asdict(c) for n, c in TUNING_CONFIGS[hdim].items()}
    qbns = {n: _quant_block_n(c) for n, c in TUNING_CONFIGS[hdim].items()}
    return [n for n in names if not only or n in only], fields, qbns


def _row(impl, variant, d, c, s, status, error, fields, qbn=None):
    return dict(impl=impl, variant=variant, hdim=d, causal=c, seqlen=s, batch=TOKENS // s, heads=HIDDEN // d,
                quant_block_n=qbn, ms=None, tflops=None, ms_e2e=None, tflops_e2e=None, max_err=None, rmse_vs_emu=None,
                rmse_emu=None, status=status, error=error, **fields)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="attention-fa3-fp8-sweep.json")
    ap.add_argument("--budget", type=float, default=170.0, help="seconds for the whole sweep")
    ap.add_argument("--compile-budget", type=float, default=75.0, help="seconds for stage 1")
    ap.add_argument("--stall", type=float, default=30.0, help="seconds of silence that mean a hang")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="compile processes")
    ap.add_argument("--hdims", default=",".join(map(str, HDIMS)))
    ap.add_argument("--seqlens", default=",".join(map(str, SEQLENS)))
    ap.add_argument("--variants", default="", help="only these configs, e.g. pp,free")
    ap.add_argument("--tol", type=float, default=0.5, help="rmse(out, emulation) / rmse(emulation, cuDNN) at most")
    ap.add_argument("--warmup", type=int, default=15, help="do_bench warm-up, ms")
    ap.add_argument("--rep", type=int, default=40, help="do_bench repetitions, ms")
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
    seqlens = [int(x) for x in args.seqlens.split(",") if x]
    cfg_fields, names, qbns = {}, {}, {}
    for d in hdims:
        names[d], cfg_fields[d], qbns[d] = _variants(d, only)

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
    BASES = ("sdpa_cudnn", "triton_fp8")  # timed with every shape (and cuDNN is the shape's error reference)
    todo = []  # (hdim, causal, seqlen, variant)
    for d in hdims:
        for c in (False, True):
            for s in seqlens:
                todo += [(d, c, s, b) for b in BASES] + [(d, c, s, n) for n in names[d] if (d, c, n) not in compile_err]
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
            e2e = f"e2e {ev['tflops_e2e']:7.1f}" if ev.get("tflops_e2e") else ""
            err = f"rmse/emu {ev['rmse_vs_emu'] / ev['rmse_emu']:.2f}" if ev.get("rmse_emu") else ""
            print(f"d={ev['hdim']:3d} {'causal' if ev['causal'] else 'full  '} S={ev['seqlen']:5d} "
                  f"{ev['variant']:17s} {tf:>16s} {e2e:>12s} {err}", flush=True)
            if ev["status"] != "ok":
                print(f"  !! {ev['status'].upper()}: {ev.get('error', '')[:300]}", flush=True)

    hung = set()  # (hdim, causal, seqlen, variant) that hung or crashed
    hung_variants = {}  # (hdim, variant) -> the key it hung at: not run again at that head dim

    def impl_of(n):
        return n if n in BASES else IMPL

    def on_stall(pr):
        key = current.get(id(pr))
        pr.kill()
        if key is not None:
            hung.add(key)
            hung_variants.setdefault((key[0], key[3]), key)
            d, c, s, n = key
            print(f"  !! HANG: d={d} causal={c} S={s} {n}: silent for {args.stall:.0f}s, worker killed", flush=True)
            rows.append(_row(impl_of(n), n, d, c, s, "hang", f"no progress for {args.stall:.0f}s",
                             cfg_fields[d].get(n, {}), qbns[d].get(n)))
            done.add(key)

    t1 = time.time()
    while time.time() < deadline - 5:
        left = [t for t in todo if t not in done and t not in hung and (t[0], t[3]) not in hung_variants]
        if not left:
            break
        groups = []  # (hdim, causal, seqlen, [variants], time the bases?)
        for d, c, s, n in left:
            if not groups or groups[-1][:3] != [d, c, s]:
                groups.append([d, c, s, [], False])
            if n in BASES:
                groups[-1][4] = True
            else:
                groups[-1][3].append(n)
        groups = [g for g in groups if (g[0], g[1], g[2], "sdpa_cudnn") not in hung]  # no reference: skip
        if not groups:
            break
        n_done = len(done)
        pr = Proc(Path(__file__).resolve(), "bench", groups, args)
        pump([pr], deadline, on_bench, stall=args.stall, on_stall=on_stall)
        key = current.get(id(pr))
        if pr.p.returncode not in (0, -signal.SIGKILL) and key is not None and key not in done:
            print(f"bench worker exit {pr.p.returncode}:\n  " + "\n  ".join(pr.stderr_tail[-12:]), flush=True)
            d, c, s, n = key
            hung.add(key)
            hung_variants.setdefault((d, n), key)
            rows.append(_row(impl_of(n), n, d, c, s, "error",
                             f"worker exit {pr.p.returncode}: " + " | ".join(pr.stderr_tail[-3:])[:1500],
                             cfg_fields[d].get(n, {}), qbns[d].get(n)))
            done.add(key)
        elif len(done) == n_done:  # no progress and nothing to blame: stop rather than loop
            print(f"bench worker made no progress (exit {pr.p.returncode}):\n  " + "\n  ".join(pr.stderr_tail[-12:]),
                  flush=True)
            break
    print(f"stage 2: {len(rows)} rows in {time.time() - t1:.0f}s", flush=True)

    for d, c, s, n in todo:  # what the time limit or a hang left out
        if (d, c, s, n) in done:
            continue
        why = f"skipped: hung at {hung_variants[(d, n)]}" if (d, n) in hung_variants else "time limit"
        rows.append(_row(impl_of(n), n, d, c, s, "not_run", why, cfg_fields[d].get(n, {}), qbns[d].get(n)))
    for (d, c, n), err in compile_err.items():
        for s in seqlens:
            rows.append(_row(IMPL, n, d, c, s, "compile_error", err, cfg_fields[d][n], qbns[d][n]))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = dict(info, date=datetime.datetime.now().isoformat(timespec="seconds"), tol=args.tol,
               setting=dict(tokens=TOKENS, hidden=HIDDEN, dtype="bfloat16 in, e4m3 kernel", warmup_ms=args.warmup,
                            rep_ms=args.rep),
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


def plot(res: dict, path: Path) -> None:
    """One panel per head dim: TFLOP/s (kernel alone, bars; end to end, hatched) per (causal, seqlen) cell."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [r for r in res["rows"] if r.get("tflops")]
    hdims = sorted({r["hdim"] for r in rows})
    if not hdims:
        return
    fig, axes = plt.subplots(len(hdims), 1, figsize=(14, 4.5 * len(hdims)), squeeze=False)
    for ax, d in zip(axes[:, 0], hdims):
        rs = [r for r in rows if r["hdim"] == d]
        cells = sorted({(r["causal"], r["seqlen"]) for r in rs})
        variants = list(dict.fromkeys(r["variant"] for r in rs))
        width = 0.8 / max(len(variants), 1)
        get = {(r["causal"], r["seqlen"], r["variant"]): r for r in rs}
        for j, v in enumerate(variants):
            xs = [i + j * width for i in range(len(cells))]
            ax.bar(xs, [(get.get((c, s, v)) or {}).get("tflops") or 0 for c, s in cells], width=width, label=v)
            ax.bar(xs, [(get.get((c, s, v)) or {}).get("tflops_e2e") or 0 for c, s in cells], width=width * 0.5,
                   color="none", edgecolor="k", hatch="//", linewidth=0.5)
        ax.axhline({128: 1000, 256: 1150}.get(d, 0), color="r", linestyle="--", linewidth=0.8,
                   label="target (non-causal 16k)")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cells))],
                      [f"{'causal' if c else 'full'}\n{s}" for c, s in cells])
        ax.set_title(f"FP8 attention forward, head dim {d} ({res.get('gpu', '')}); hatched: end to end (pre-pass)")
        ax.set_ylabel("TFLOP/s")
        ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _table(rows, hdims, names, seqlens):
    get = {(r["hdim"], r["causal"], r["seqlen"], r["variant"]): r for r in rows}
    for d in hdims:
        cols = ["sdpa_cudnn", "triton_fp8"] + names[d]
        w = max(10, *(len(c) + 1 for c in cols))
        print(f"\nhead dim {d}: TFLOP/s kernel alone (end to end)")
        print(f"{'causal':7s}{'seqlen':>7s}" + "".join(f"{c:>{w + 8}s}" for c in cols) + f"  {'best':>17s}")
        for c in (False, True):
            for s in seqlens:
                cells, best = [], None
                for n in cols:
                    r = get.get((d, c, s, n))
                    if r is None or r["tflops"] is None:
                        cells.append(f"{(r['status'][:8] if r else '-'):>{w + 8}s}")
                        continue
                    e2e = f"({r['tflops_e2e']:.0f})" if r.get("tflops_e2e") else ""
                    cells.append(f"{r['tflops']:>{w}.1f}{e2e:>8s}")
                    if r["impl"] == IMPL and (best is None or r["tflops"] > best[1]):
                        best = (n, r["tflops"])
                print(f"{str(c):7s}{s:>7d}" + "".join(cells) + f"  {best[0] if best else '-':>17s}")


if __name__ == "__main__":
    sys.exit(main())
