"""Where a ring decode call's time goes: per-program timelines of w4a16_ring at M = 1 (issue #7, session 30).

benchmarks/w4a16.py's M = 1 times fit ~5 us a call + the packed bytes at ~3.1 TB/s (4096^2 7.8 us, 8192^2 15.9,
8192 x 28672 41.9), where a copy of the same bytes has ~1.1 us fixed. This script says where the fixed part goes. A
TRACE build of the ring kernel (kernels.w4a16_ring.TRACE_FIELDS) has every program write its start and end
(%globaltimer, ns, comparable across SMs) and, on its own SM's %clock64, its start, the end of its first item
(first loads' latency + one item's math), the start of its last flush and its end. The launches run as the benchmark
runs them: a CUDA graph of R back-to-back calls over weight copies that pass 3x the L2, each call with its own trace
buffer; the last replay's traces are read. Per call (median over the graph's calls, first one skipped):

  span      first program start -> last program end (globaltimer)
  gap       previous call's last end -> this call's first start (launch gap inside the graph)
  skew      last program start - first program start
  first     a program's start -> its first item done (median / max over programs)
  steady    first item done -> last flush started (the ring's loop), per item
  flush     last flush start -> program end (the split-K fold's tail: red.add, fence, ticket, last one's read)
  tail      last program end - median program end

The clock rate comes from each program's clock64 / globaltimer ratio (median). The non-TRACE build is timed in the
same graph shape for the trace's overhead. Writes $OUT/w4a16_ring_trace-<gpu>.json (rows: impl = config label).

    python benchmarks/w4a16_ring_trace.py --out $OUT [--shapes 1024x1024,4096x4096,8192x8192,8192x28672]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the probe's weights and graph timing
from w4a16_probe import G, graph_us, random_packed  # noqa: E402  (it puts src/ on the path)

from flashscale.data.cache import atomic_write_text  # noqa: E402
from flashscale.kernels import w4a16_ring as WR  # noqa: E402
from flashscale.kernels.w4a16_pack import PackedW4  # noqa: E402
from flashscale.reference.w4a16 import w4a16_linear_ref  # noqa: E402

CONFIGS = [WR.RingConfig(bn=256, kt=2, num_warps=4, ring=2, per_sm=2, atomic=True),
           WR.RingConfig(bn=128, kt=2, num_warps=4, ring=2, per_sm=3, atomic=True),
           WR.RingConfig(bn=128, kt=2, num_warps=4, ring=2, per_sm=4, atomic=False)]


def summarize(tr: torch.Tensor) -> dict:
    """tr (R, P, 8) int64 TRACE_FIELDS of R calls -> medians over calls 1.. of each call's figures (us)."""
    t = tr.double().cpu()
    t0, c0, c1, c2, cf, t1, _, items = (t[..., i] for i in range(8))
    ghz = float(((c2 - c0) / (t1 - t0).clamp(min=1)).median())  # cycles a ns
    us = lambda cyc: cyc / ghz / 1e3  # noqa: E731
    per_call = []
    for i in range(1, t.shape[0]):
        first, steady, flush = us(c1[i] - c0[i]), us(cf[i] - c1[i]), us(c2[i] - cf[i])
        ends = (t1[i] - t1[i].min()) / 1e3
        per_call.append(dict(
            span=float(t1[i].max() - t0[i].min()) / 1e3, gap=float(t0[i].min() - t1[i - 1].max()) / 1e3,
            skew=float(t0[i].max() - t0[i].min()) / 1e3,
            first_med=float(first.median()), first_max=float(first.max()),
            steady_med=float(steady.median()), per_item=float((steady / (items[i] - 1).clamp(min=1)).median()),
            flush_med=float(flush.median()), flush_max=float(flush.max()),
            tail=float(ends.max() - ends.median()), dur_med=float(us(c2[i] - c0[i]).median())))
    out = {k: statistics.median(c[k] for c in per_call) for k in per_call[0]}
    out["clock_ghz"] = ghz
    out["items_med"] = float(items[0].median())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp")
    ap.add_argument("--shapes", default="1024x1024,4096x4096,8192x8192,8192x28672")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or 50 << 20
    gpu = torch.cuda.get_device_name()
    rows = []
    print(f"{gpu}: {'shape':12s} {'config':34s} {'us':>6s} {'trace':>6s} {'span':>6s} {'gap':>5s} {'skew':>5s} "
          f"{'first':>11s} {'steady':>6s} {'/item':>5s} {'flush':>11s} {'tail':>5s} items", flush=True)
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        base = random_packed(k, n, gen)
        nbytes = base.qweight.numel() * 4 + base.sz.numel() * 4
        ncopies = max(2, min(32, math.ceil(3 * l2 / nbytes)))
        packs = [base] + [PackedW4(qweight=base.qweight.clone(), sz=base.sz.clone(), perm=None, in_features=k,
                                   out_features=n, group_size=G) for _ in range(ncopies - 1)]
        r = -(-max(32, ncopies) // ncopies) * ncopies
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        ref = w4a16_linear_ref(x.double(), base, None, compute_dtype=torch.float64).float()
        for cfg in CONFIGS:
            progs = WR.ring_grid(k, n, cfg, cfg.per_sm, torch.cuda.get_device_properties(0).multi_processor_count)[0]
            trace = torch.zeros(r, progs * WR.TRACE_STRIDE, dtype=torch.int64, device="cuda")
            WR.launch(x, base, None, y, cfg, cfg.per_sm, trace=trace[0])
            err = float((y.float() - ref).abs().max() / ref.abs().max())
            us_plain = graph_us([lambda i=i: WR.launch(x, packs[i], None, y, cfg, cfg.per_sm) for i in range(ncopies)],
                                ncopies)
            # the traced calls: R launches over the copies, each with its own trace row; the last replay's remain
            us_trace = graph_us([lambda i=i: WR.launch(x, packs[i % ncopies], None, y, cfg, cfg.per_sm, trace=trace[i])
                                 for i in range(r)], r)
            s = summarize(trace.view(r, progs, WR.TRACE_STRIDE))
            rows.append(dict(impl=cfg.label, per_sm=cfg.per_sm, M=1, K=k, N=n, programs=progs, us=us_plain,
                             us_trace=us_trace, max_rel_err=err, **s))
            print(f"{'':{len(gpu)}s}  {shape:12s} {cfg.label:34s} {us_plain:6.2f} {us_trace:6.2f} {s['span']:6.2f} "
                  f"{s['gap']:5.2f} {s['skew']:5.2f} {s['first_med']:5.2f}/{s['first_max']:5.2f} "
                  f"{s['steady_med']:6.2f} {s['per_item']:5.2f} {s['flush_med']:5.2f}/{s['flush_max']:5.2f} "
                  f"{s['tail']:5.2f} {s['items_med']:.0f}  (err {err:.1e}, {s['clock_ghz']:.2f} GHz)", flush=True)
            del trace
        del packs, base
        torch.cuda.empty_cache()
    doc = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               note="benchmarks/w4a16_ring_trace.py: per-program timelines of the ring decode kernel at M = 1 "
                    "(us; medians over the calls of a CUDA graph over weight copies; see the script's docstring)",
               rows=rows)
    tag = "h200" if "H200" in gpu else gpu.lower().replace(" ", "-")
    path = Path(args.out) / f"w4a16_ring_trace-{tag}.json"
    atomic_write_text(path, json.dumps(doc, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
