"""FlashAttention benchmark grid: flashscale's Triton kernels vs torch SDPA (flash and cuDNN backends).

The FlashAttention papers' setting: bf16, head dim 64 / 128 / 256, causal and not, seqlen 512 ... 16384
with batch * seqlen = 16384 and heads * head_dim = 2048. FLOPs (FlashAttention's count): forward
4 * B * S^2 * H * D, halved when causal; backward 2.5x the forward; forward + backward timed as one call
(`fwd_bwd`, as the FlashAttention benchmarks do) 3.5x. Times are triton.testing.do_bench
medians (CUDA events, warm-up first) on random inputs of 64 MiB a tensor, larger than the 60 MB L2.
Cells up to --short-max (2048) rows are timed in --rounds (3) rounds, the rounds of a group after one another
(every implementation once a round), and report the median round (`ms`; all rounds in `ms_rounds`): the short
cells moved 20-30 % between runs of the same code with one sample each (docs/attention_fa3.md, session 24).

Before timing, each (head dim, causal) group is checked at seqlen 1024: ours and SDPA-flash against a
float64 reference; ours must be within 2x SDPA-flash's error (+ one bf16 rounding).

    python benchmarks/attention.py [--quick] [--tune] [--jobs N] [--passes fwd,bwd,fwd_bwd] [--out DIR]
    python benchmarks/attention.py --precompile-only --jobs 12 [--tune]   # fill Triton's cache in parallel

Writes DIR/attention-<gpu>.json ({gpu, torch, triton, date, rows, checks, configs}) and a .png; prints a
table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from statistics import median

import torch

from plotting import gpu_tag

SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
QUICK_SEQLENS = [1024, 4096, 16384]
HDIMS = [64, 128, 256]
TOKENS, HIDDEN = 16384, 2048
TARGET = 1.3  # acceptance: >= 1.3x SDPA flash at seqlen >= 1024


PASSES = ("fwd", "bwd", "fwd_bwd")


def flops(batch, seqlen, heads, hdim, causal, mode):
    """FlashAttention's count: forward 4 B S^2 H D (halved when causal), backward 2.5x, forward + backward 3.5x."""
    f = 4.0 * batch * seqlen * seqlen * heads * hdim / (2 if causal else 1)
    return f * {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[mode]


def _inputs(batch, seqlen, heads, hdim, *, layout="bshd", grad=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, seqlen, heads, hdim) if layout == "bshd" else (batch, heads, seqlen, hdim)
    return [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(grad)
            for _ in range(4)]  # q, k, v, dout


def _ours(q, k, v, causal, deterministic=False, impl="auto"):
    from flashscale.ops import attention
    return attention(q, k, v, causal=causal, deterministic=deterministic, impl=impl)


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def fn(q, k, v, causal):
        with sdpa_kernel([be]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fn


def spin(ms: float = 300.0) -> None:
    """Keep the GPU busy for ~ms (bf16 GEMMs) so the next timings start at working clocks. The short cells run
    first in each group, right after its checks compiled kernels with the GPU idle; they varied up to 1.8x between
    runs of the same code (docs/attention_fa3.md, session 18) while the long ones agreed within 2 %."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < ms:
        for _ in range(8):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def time_cell(impl, batch, seqlen, heads, hdim, causal, *, rep, warmup, passes=PASSES):
    """{pass: median ms} of the forward, the backward (torch.autograd.grad of a saved forward, so nothing
    accumulates into .grad) and the two in one call (fwd_bwd, as the FlashAttention benchmarks time them), of
    those in `passes` this impl has; and the kernels the dispatch chose."""
    import triton
    layout = "bshd" if impl.startswith("flashscale") else "bhsd"
    q, k, v, do = _inputs(batch, seqlen, heads, hdim, layout=layout)
    if impl.startswith("flashscale"):
        det = impl == "flashscale_det"
        fwd = lambda: _ours(q, k, v, causal, det, "fa3" if impl == "flashscale_fa3" else "auto")  # noqa: E731
    else:
        sd = _sdpa(impl.split("_")[1])
        fwd = lambda: sd(q, k, v, causal)  # noqa: E731
    from flashscale.ops.attention_op import PATHS
    before = PATHS.copy()
    out = fwd()
    bwd = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)  # noqa: E731
    bwd()
    ran = PATHS - before  # which kernels this cell's dispatch chose (ours only; SDPA's are not counted)
    paths = {f"{mode}_path": "+".join(sorted(kern for (pas, kern) in ran if pas == mode)) or None
             for mode in ("fwd", "bwd")}
    paths["fwd_bwd_path"] = "+".join(p for p in (paths["fwd_path"], paths["bwd_path"]) if p) or None
    fwd_bwd = lambda: torch.autograd.grad(fwd(), (q, k, v), do)  # noqa: E731
    # the deterministic variant differs only in the backward, the fa3 one only in the forward
    has = {"fwd": impl != "flashscale_det", "bwd": impl != "flashscale_fa3", "fwd_bwd": impl != "flashscale_fa3"}
    fns = {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd_bwd}
    ms = {m: triton.testing.do_bench(fns[m], warmup=warmup, rep=rep, return_mode="median")
          for m in PASSES if m in passes and has[m]}
    return ms, paths


def check_group(hdim, causal, seqlen=1024, batch=2):
    """ours and SDPA-flash vs the float64 reference; the flash-attn rule on out, dq, dk, dv."""
    from flashscale.reference.attention import attention_ref
    heads = HIDDEN // hdim
    q, k, v, do = _inputs(batch, seqlen, heads, hdim, seed=1)
    res = {}
    out = _ours(q, k, v, causal)
    res["ours"] = (out, *torch.autograd.grad(out, (q, k, v), do))
    tq, tk, tv = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    o = _sdpa("flash")(tq, tk, tv, causal)
    res["sdpa"] = tuple(t.transpose(1, 2) for t in (o, *torch.autograd.grad(o, (tq, tk, tv), do.transpose(1, 2))))
    dq, dk, dv = (t.detach().double().requires_grad_() for t in (q, k, v))
    o = attention_ref(dq, dk, dv, causal=causal)
    res["ref"] = (o, *torch.autograd.grad(o, (dq, dk, dv), do.double()))
    eps = torch.finfo(torch.bfloat16).eps
    out = {}
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        ref = res["ref"][i]
        e_ours = (res["ours"][i].double() - ref).abs().max().item()
        e_sdpa = (res["sdpa"][i].double() - ref).abs().max().item()
        ok = math.isfinite(e_ours) and e_ours <= 2 * e_sdpa + eps * max(ref.abs().max().item(), 0.3)
        out[name] = dict(err=e_ours, sdpa_err=e_sdpa, ok=ok)
    del res
    torch.cuda.empty_cache()
    return out


def _groups(args):
    return [(d, c) for d in args.hdims for c in (False, True)]


def _precompile_task(task):
    """One process: launch (without timing) every config the tuner may pick for one kernel of one
    (head dim, causal) group, so Triton compiles it into its on-disk cache and the timing process loads
    binaries instead of compiling serially. Compiled code depends on the shapes only through their
    divisibility, so one seqlen stands for the whole grid."""
    hdim, causal, seqlen, kind, tune = task
    from flashscale.kernels import attention_tune as tn
    from flashscale.kernels.attention_bwd import attention_bwd
    from flashscale.kernels.attention_fwd import attention_fwd
    heads, batch = HIDDEN // hdim, TOKENS // seqlen
    q, k, v, do = (t.detach() for t in _inputs(batch, seqlen, heads, hdim))
    where = dict(gpu=True, hopper=torch.cuda.get_device_capability()[0] >= 9)
    cands = {"fwd": tn.fwd_candidates, "bwd": tn.bwd_candidates, "dq": tn.dq_candidates}[kind](hdim, q.dtype, **where)
    cands = cands if tune else cands[:1]
    kw = dict(softmax_scale=hdim ** -0.5, window=(-1, 0) if causal else (-1, -1))
    out, lse = torch.empty_like(q), torch.empty(batch, heads, seqlen, device="cuda")
    attention_fwd(q, k, v, out, lse, **kw)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    t0 = time.time()
    for c in cands:
        if kind == "fwd":
            attention_fwd(q, k, v, out, lse, config=c, **kw)
        elif kind == "bwd":
            attention_bwd(do, q, k, v, out, lse, *grads, config=c, deterministic=False, **kw)
        else:
            attention_bwd(do, q, k, v, out, lse, *grads, dq_config=c, deterministic=True, **kw)
    torch.cuda.synchronize()
    return f"{kind} d{hdim} {'causal' if causal else 'full'}: {len(cands)} configs in {time.time() - t0:.1f}s"


def precompile(args):
    import multiprocessing as mp
    kinds = ["bwd", "fwd"] + (["dq"] if args.deterministic else [])  # the slowest compiles first
    tasks = [(d, c, 1024, kind, args.tune) for kind in kinds for d, c in _groups(args)]
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("spawn")) as ex:
        for line in ex.map(_precompile_task, tasks):
            print("precompile:", line, flush=True)


def plot(rows, path, gpu):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    impls = [i for i in ("flashscale", "flashscale_fa3", "flashscale_fa2", "flashscale_det", "sdpa_flash", "sdpa_cudnn") if any(r["impl"] == i for r in rows)]
    hdims = sorted({r["hdim"] for r in rows})
    panels = [(m, c) for m in PASSES if any(r["pass"] == m for r in rows) for c in (False, True)]
    fig, axes = plt.subplots(len(panels), len(hdims), figsize=(5 * len(hdims), 3.2 * len(panels)), squeeze=False)
    colors = {"flashscale": "#d62728", "flashscale_fa3": "#9467bd", "flashscale_fa2": "#ff7f0e",
              "flashscale_det": "#2ca02c", "sdpa_flash": "#1f77b4", "sdpa_cudnn": "#7f7f7f"}
    for pi, (mode, causal) in enumerate(panels):
        for hi, d in enumerate(hdims):
            ax = axes[pi][hi]
            sel = [r for r in rows if r["pass"] == mode and r["causal"] == causal and r["hdim"] == d]
            seqs = sorted({r["seqlen"] for r in sel})
            pimpls = [i for i in impls if any(r["impl"] == i for r in sel)]  # backward-only variants: bwd panels
            w = 0.8 / max(len(pimpls), 1)
            for ii, impl in enumerate(pimpls):
                vals = [next((r["tflops"] for r in sel if r["impl"] == impl and r["seqlen"] == s), 0) for s in seqs]
                xs = [x + (ii - (len(pimpls) - 1) / 2) * w for x in range(len(seqs))]
                bars = ax.bar(xs, vals, w, label=impl, color=colors.get(impl))
                for b, val in zip(bars, vals):
                    if val:  # an impl not run in this cell (e.g. a backward-only variant) gets no label
                        ax.text(b.get_x() + b.get_width() / 2, val, f"{val:.0f}", ha="center", va="bottom", fontsize=6)
            ax.set_xticks(range(len(seqs)), [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqs])
            ax.set_title(f"{mode}, head dim {d}, {'causal' if causal else 'non-causal'}", fontsize=9)
            ax.set_ylabel("TFLOP/s")
            if hi == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"Attention bf16 on {gpu} (batch x seqlen = {TOKENS}, hidden {HIDDEN})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def table(rows, checks):
    lines = []
    for c in checks:
        bad = [n for n, v in c["result"].items() if not v["ok"]]
        lines.append(f"check d{c['hdim']} {'causal' if c['causal'] else 'full  '}: "
                     + ("ok" if not bad else "FAILED " + ", ".join(bad))
                     + "  (max err ours/sdpa: " + ", ".join(f"{n} {v['err']:.1e}/{v['sdpa_err']:.1e}"
                                                           for n, v in c["result"].items()) + ")")
    key = lambda r: (r["pass"], r["hdim"], r["causal"], r["seqlen"])  # noqa: E731
    cells = sorted({key(r) for r in rows})
    impls = [i for i in ("flashscale", "flashscale_det", "flashscale_fa3", "sdpa_flash", "sdpa_cudnn")
             if any(r["impl"] == i for r in rows)]
    lines.append(f"{'pass':7} {'d':>4} {'causal':6} {'seqlen':>6} " + " ".join(f"{i:>14}" for i in impls)
                 + f" {'vs flash':>8} {'target':>6}")
    misses = 0
    for cell in cells:
        vals = {r["impl"]: r["tflops"] for r in rows if key(r) == cell}
        ratio = vals.get("flashscale", 0) / vals["sdpa_flash"] if vals.get("sdpa_flash") else float("nan")
        mark = "" if cell[3] < 1024 else ("ok" if ratio >= TARGET else "MISS")
        misses += mark == "MISS"
        lines.append(f"{cell[0]:7} {cell[1]:>4} {str(cell[2]):6} {cell[3]:>6} "
                     + " ".join(f"{vals.get(i, float('nan')):>14.1f}" for i in impls) + f" {ratio:>8.2f} {mark:>6}")
    lines.append(f"cells with seqlen >= 1024 under {TARGET}x SDPA flash: {misses}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"seqlens {QUICK_SEQLENS} only, shorter timing")
    ap.add_argument("--hdims", type=int, nargs="+", default=HDIMS)
    ap.add_argument("--seqlens", type=int, nargs="+", default=None)
    ap.add_argument("--tune", action="store_true", help="time every candidate config (cached to JSON)")
    ap.add_argument("--deterministic", action="store_true", help="also time the deterministic backward")
    ap.add_argument("--fa3", action="store_true", help="also time the Hopper forward (ops.attention impl='fa3')")
    ap.add_argument("--no-anchors", action="store_true", help="skip SDPA flash/cuDNN")
    ap.add_argument("--jobs", type=int, default=0, help="compile kernels in N processes first")
    ap.add_argument("--precompile-only", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the short cells (median reported)")
    ap.add_argument("--short-max", type=int, default=2048, help="longest seqlen timed in every round")
    ap.add_argument("--passes", default=",".join(PASSES), help=f"comma-separated, of {', '.join(PASSES)}")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds takes an int >= 1; got {args.rounds}")
    passes = [p for p in args.passes.split(",") if p]
    if not passes or any(p not in PASSES for p in passes):
        ap.error(f"--passes takes a comma-separated list of {', '.join(PASSES)}; got {args.passes!r}")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.jobs:
        precompile(args)
    if args.precompile_only:
        return 0
    import triton
    from flashscale.kernels import attention_tune
    attention_tune.set_autotune(args.tune)
    seqlens = args.seqlens or (QUICK_SEQLENS if args.quick else SEQLENS)
    rep, warmup = (30, 10) if args.quick else (100, 25)
    gpu = torch.cuda.get_device_name()
    impls = ["flashscale"] + (["flashscale_det"] if args.deterministic else []) + \
        (["flashscale_fa3"] if args.fa3 else []) + \
        ([] if args.no_anchors else ["sdpa_flash", "sdpa_cudnn"])
    rows, checks, errors = [], [], []
    t0 = time.time()
    groups = _groups(args)
    for gi, (hdim, causal) in enumerate(groups):
        try:
            checks.append(dict(hdim=hdim, causal=causal, result=check_group(hdim, causal)))
        except Exception as e:  # report, keep measuring the rest
            errors.append(f"check d{hdim} causal={causal}: {type(e).__name__}: {e}")
        spin()  # the group's compiles left the GPU idle: its shortest (first) cells would time a clock ramp
        times, paths_of, failed = {}, {}, set()  # (impl, seqlen, mode) -> [ms a round]; (impl, seqlen) -> paths
        for rnd in range(args.rounds):
            for seqlen in seqlens:
                if rnd and seqlen > args.short_max:
                    continue
                batch, heads = TOKENS // seqlen, HIDDEN // hdim
                for impl in impls:
                    if (impl, seqlen) in failed:
                        continue
                    try:
                        ms_of, paths = time_cell(impl, batch, seqlen, heads, hdim, causal, rep=rep, warmup=warmup,
                                                 passes=passes)
                    except Exception as e:
                        failed.add((impl, seqlen))
                        errors.append(f"{impl} d{hdim} causal={causal} S{seqlen}: {type(e).__name__}: {str(e)[:200]}")
                        continue
                    paths_of[impl, seqlen] = paths
                    for mode, ms in ms_of.items():
                        times.setdefault((impl, seqlen, mode), []).append(ms)
        for (impl, seqlen, mode), ms_rounds in times.items():
            batch, heads = TOKENS // seqlen, HIDDEN // hdim
            ms = median(ms_rounds)
            path = paths_of[impl, seqlen][f"{mode}_path"]
            rows.append(dict(impl=impl, **{"pass": mode}, hdim=hdim, causal=causal, seqlen=seqlen, batch=batch,
                             heads=heads, ms=ms, tflops=flops(batch, seqlen, heads, hdim, causal, mode) / ms * 1e-9,
                             **({"ms_rounds": ms_rounds} if len(ms_rounds) > 1 else {}),
                             **({"path": path} if path else {})))
        print(f"d{hdim} causal={causal}: done ({time.time() - t0:.0f}s)", flush=True)
        # after every group, so a run cut short by a time limit still leaves the groups it finished
        res_path = _write(args, gpu, triton.__version__, rows, checks, errors, attention_tune.chosen_configs(),
                          done=gi == len(groups) - 1)
    print(f"wrote {res_path}")
    plot(rows, res_path.with_suffix(".png"), gpu)
    for e in errors:
        print("ERROR", e)
    print(table(rows, checks))
    return 1 if errors or any(not v["ok"] for c in checks for v in c["result"].values()) else 0


def _write(args, gpu: str, triton_version: str, rows, checks, errors, configs, done: bool) -> Path:
    """The results file, written atomically (a reader never sees half a file); `complete` False while groups of
    the grid are still to come."""
    slug = gpu_tag(gpu)  # "NVIDIA H200" -> h200
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = dict(gpu=gpu, torch=torch.__version__, triton=triton_version,
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  setting=dict(dtype="bfloat16", tokens=TOKENS, hidden=HIDDEN, tuned=args.tune,
                               flops="fwd 4*B*S^2*H*D (/2 causal); bwd 2.5x fwd; fwd_bwd 3.5x fwd",
                               timing="do_bench median; the median of `rounds` rounds up to short_max rows",
                               rounds=args.rounds, short_max=args.short_max),
                  complete=done, rows=rows, checks=checks, errors=errors, configs=configs)
    path = out_dir / f"attention-{slug}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    return path


if __name__ == "__main__":
    sys.exit(main())
