"""Host time against device time of ops.attention's short cells (docs/attention_fa3.md, session 18: the forward at
d128 causal 1k measured 199 / 287 / 156 TFLOP/s in three runs of the same code, while every cell from 4k agreed
within 2 %). Per cell, three interleaved rounds of, for auto (the fa3 forward there) and impl="triton" (FA2's):

  event   - triton.testing.do_bench median (what benchmarks/attention.py reports), ms a call
  host    - wall time of 200 calls queued without synchronizing, divided by 200 (the launch path's cost; when
            it exceeds the kernel's time the GPU idles between calls and `event` measures the host)
  kernel  - the GPU kernels' own time a call, from torch.profiler (device time only)

    python benchmarks/attention_host.py [--out DIR]     # needs a CUDA GPU; prints a table, writes JSON if --out
    python benchmarks/attention_host.py --rule [--out DIR]   # fa3 against FA2 forwards, 512-2048 rows (the auto rule)
    python benchmarks/attention_host.py --bwd [--out DIR]    # the backward (autograd.grad of a saved forward)
    python benchmarks/attention_host.py --profile       # where the host time goes: cProfile of the launch path
                                                        # (forward auto/triton, forward + backward), top functions
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flashscale.ops import attention  # noqa: E402
from plotting import gpu_tag  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
CELLS = [(128, True, 1024), (256, True, 2048), (128, True, 2048), (64, True, 512), (128, False, 16384)]
BWD_CELLS = [(128, True, 512), (128, True, 1024), (128, True, 2048), (128, False, 512), (128, False, 1024),
             (64, True, 512), (256, True, 512)]


def measure(hdim: int, causal: bool, seqlen: int, impl: str, *, calls: int = 200, mode: str = "fwd") -> dict:
    """mode "fwd": the forward; "bwd": the backward of a saved forward, as benchmarks/attention.py times it
    (torch.autograd.grad with retain_graph, inputs requiring grad)."""
    import triton
    batch, heads = TOKENS // seqlen, HIDDEN // hdim
    q, k, v = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=mode == "bwd") for _ in range(3))
    if mode == "bwd":
        out = attention(q, k, v, causal=causal, impl=impl)
        do = torch.randn_like(out)
        fn = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)  # noqa: E731
    else:
        fn = lambda: attention(q, k, v, causal=causal, impl=impl)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    event = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) * 1e3 / calls
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    kernel = sum(e.device_time_total for e in prof.key_averages()) / 20 / 1e3  # us -> ms
    flop = 4 * batch * seqlen * seqlen * heads * hdim * (0.5 if causal else 1.0) * (2.5 if mode == "bwd" else 1.0)
    return dict(impl=impl, mode=mode, hdim=hdim, causal=causal, seqlen=seqlen, event_ms=event, host_ms=host,
                kernel_ms=kernel, tflops_event=flop / event / 1e9, tflops_kernel=flop / kernel / 1e9 if kernel else None)


def profile_host(calls: int = 300, top: int = 25) -> None:
    """cProfile of `calls` queued calls (no synchronisation inside) of the d128 causal 1k cell: the auto (fa3)
    and triton forwards, then auto's forward + backward; the functions with the most own time, and the
    cumulative time of the entry points."""
    import cProfile
    import pstats

    batch, heads, seqlen, hdim = TOKENS // 1024, HIDDEN // 128, 1024, 128
    q, k, v = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)
    cases = {
        "fwd auto": lambda: attention(q.detach(), k.detach(), v.detach(), causal=True),
        "fwd triton": lambda: attention(q.detach(), k.detach(), v.detach(), causal=True, impl="triton"),
        "fwd auto, inputs requiring grad (as benchmarks/attention.py times it)": lambda: attention(q, k, v, causal=True),
        "fwd+bwd auto": lambda: torch.autograd.backward(attention(q, k, v, causal=True), do),
    }
    for name, fn in cases.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
        host = (time.perf_counter() - t0) * 1e3 / calls
        torch.cuda.synchronize()
        print(f"\n=== {name}: {host:.3f} ms a call on the host under cProfile ({calls} calls) ===")
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(top)
        st.sort_stats("cumulative").print_stats(top)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile the launch path instead of timing the cells")
    ap.add_argument("--rule", action="store_true", help="the forward's auto rule cells instead: fa3 and FA2 "
                    "(impl='fa3' / 'triton') at head dims 64/128/256, causal or not, 512-2048 query rows")
    ap.add_argument("--bwd", action="store_true", help="the backward instead, at the d128 cells that swung between "
                    "rounds of session 26's grid (512-2048 rows; d64 / d256 causal 512 beside): auto and FA2's")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.profile:
        profile_host()
        return 0
    rows = []
    print(f"{'round':>5} {'impl':>6} {'d':>4} {'causal':6} {'seqlen':>6} {'event ms':>9} {'host ms':>8} "
          f"{'kernel ms':>9} {'TF event':>8} {'TF kernel':>9}")
    cells = ([(d, c, s) for d in (64, 128, 256) for c in (False, True) for s in (512, 1024, 2048)] if args.rule
             else BWD_CELLS if args.bwd else CELLS)
    impls = ("fa3", "triton") if args.rule else ("auto", "triton")  # auto: the fa3 forward in CELLS
    for rnd in range(args.rounds):
        for cell in cells:
            for impl in impls:
                r = dict(round=rnd, **measure(*cell, impl, mode="bwd" if args.bwd else "fwd"))
                rows.append(r)
                print(f"{rnd:>5} {impl:>6} {r['hdim']:>4} {str(r['causal']):6} {r['seqlen']:>6} {r['event_ms']:9.3f} "
                      f"{r['host_ms']:8.3f} {r['kernel_ms']:9.3f} {r['tflops_event']:8.1f} "
                      f"{r['tflops_kernel'] or 0:9.1f}", flush=True)
    if args.out:
        import triton
        name = "attention_rule" if args.rule else "attention_host_bwd" if args.bwd else "attention_host"
        out = Path(args.out) / f"{name}-{gpu_tag(torch.cuda.get_device_name())}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                                       triton=triton.__version__, date=datetime.datetime.now(datetime.timezone.utc)
                                       .isoformat(timespec="seconds"), rows=rows), indent=1))
        tmp.replace(out)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
