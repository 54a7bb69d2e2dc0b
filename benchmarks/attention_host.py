"""Host time against device time of ops.attention's short cells (docs/attention_fa3.md, session 18: the forward at
d128 causal 1k measured 199 / 287 / 156 TFLOP/s in three runs of the same code, while every cell from 4k agreed
within 2 %). Per cell, three interleaved rounds of, for auto (the fa3 forward there) and impl="triton" (FA2's):

  event   - triton.testing.do_bench median (what benchmarks/attention.py reports), ms a call
  host    - wall time of 200 calls queued without synchronizing, divided by 200 (the launch path's cost; when
            it exceeds the kernel's time the GPU idles between calls and `event` measures the host)
  kernel  - the GPU kernels' own time a call, from torch.profiler (device time only)

    python benchmarks/attention_host.py [--out DIR]     # needs a CUDA GPU; prints a table, writes JSON if --out
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

TOKENS, HIDDEN = 16384, 2048
CELLS = [(128, True, 1024), (256, True, 2048), (128, True, 2048), (64, True, 512), (128, False, 16384)]


def measure(hdim: int, causal: bool, seqlen: int, impl: str, *, calls: int = 200) -> dict:
    import triton
    batch, heads = TOKENS // seqlen, HIDDEN // hdim
    q, k, v = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
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
    flop = 4 * batch * seqlen * seqlen * heads * hdim * (0.5 if causal else 1.0)
    return dict(impl=impl, hdim=hdim, causal=causal, seqlen=seqlen, event_ms=event, host_ms=host, kernel_ms=kernel,
                tflops_event=flop / event / 1e9, tflops_kernel=flop / kernel / 1e9 if kernel else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    print(f"{'round':>5} {'impl':>6} {'d':>4} {'causal':6} {'seqlen':>6} {'event ms':>9} {'host ms':>8} "
          f"{'kernel ms':>9} {'TF event':>8} {'TF kernel':>9}")
    for rnd in range(args.rounds):
        for cell in CELLS:
            for impl in ("auto", "triton"):  # auto: the fa3 forward in these cells; triton: FA2's
                r = dict(round=rnd, **measure(*cell, impl))
                rows.append(r)
                print(f"{rnd:>5} {impl:>6} {r['hdim']:>4} {str(r['causal']):6} {r['seqlen']:>6} {r['event_ms']:9.3f} "
                      f"{r['host_ms']:8.3f} {r['kernel_ms']:9.3f} {r['tflops_event']:8.1f} "
                      f"{r['tflops_kernel'] or 0:9.1f}", flush=True)
    if args.out:
        import triton
        out = Path(args.out) / f"attention_host-{torch.cuda.get_device_name().split()[-1].lower()}.json"
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
