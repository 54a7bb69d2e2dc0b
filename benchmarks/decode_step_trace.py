"""Where a 4-bit decode step's time goes, kernel by kernel (issue #7's end-to-end point, session 32).

generate_w4a16.py's critical_ms says what each kernel adds to the step (its end minus the previous kernel's end);
this says why. StaticDecoder.enable_trace() captures the step with TRACE builds of the ring GEMVs and the decode
attention: every program writes %globaltimer (ns, one clock for all SMs) at its start, after its PDL wait, after its
prologue (x ready), when its first item is done and at its end (kernels.w4a16_ring.TRACE_FIELDS). For each launch
of the step, against the previous launch's last program end (prev_end), in us:

  lead      first program start - prev_end (negative: resident early, PDL)
  start     median program start - prev_end (programs that found no free SM slot start late)
  wait      median return from griddepcontrol.wait - prev_end (the previous grid's completion and flush)
  pro       median x ready - wait (the prologue: norm / SiLU / combine, a barrier)
  first     median first item done - x ready (x loads and the first item's math, its weights already loaded)
  loop      median end - median first item done
  tail      last end - median end (imbalance: the next kernel waits for the last program)
  span      last end - prev_end (what the launch adds to the step: generate_w4a16's critical_ms per call)

Medians over the layers for each launch of a block (qkv, attn, o, gu, down) and the lm_head. The step is timed
untraced and traced in the same run (the stamps' overhead). Writes OUT/decode_step_trace-<gpu>.json: rows
(impl flashscale-w4a16, launch, the figures above, programs) and the step's times.

    python benchmarks/decode_step_trace.py --out $OUT [--layers 32] [--tokens 64]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_w4a16 import time_decode  # noqa: E402  (it puts src/ on the path)

from flashscale.infer.decode import StaticDecoder  # noqa: E402
from flashscale.models.config import preset  # noqa: E402
from flashscale.models.llama import Llama  # noqa: E402
from flashscale.quant.qlinear import QuantLinear  # noqa: E402

FIELDS = dict(start=0, end=5, wait=8, x=9, first=10)


def launch_figures(tr: torch.Tensor, prev_end: float) -> dict:
    """tr (P, 16) int64 stamps of one launch (rows never written stay 0) -> its figures (us) and last end (ns)."""
    t = tr[tr[:, 0] > 0].double()
    if t.numel() == 0:
        return {}
    med = lambda col: float(t[:, col].median())  # noqa: E731
    end_max = float(t[:, FIELDS["end"]].max())
    out = dict(programs=int(t.shape[0]), lead=(float(t[:, 0].min()) - prev_end) / 1e3,
               start=(med(0) - prev_end) / 1e3, wait=(med(FIELDS["wait"]) - prev_end) / 1e3,
               tail=(end_max - med(FIELDS["end"])) / 1e3, span=(end_max - prev_end) / 1e3, _end=end_max)
    if bool((t[:, FIELDS["x"]] > 0).all()):  # ring GEMVs: prologue, first item, loop
        out.update(pro=(med(FIELDS["x"]) - med(FIELDS["wait"])) / 1e3,
                   first=(med(FIELDS["first"]) - med(FIELDS["x"])) / 1e3,
                   loop=(med(FIELDS["end"]) - med(FIELDS["first"])) / 1e3)
    return out


def analyse(trace: torch.Tensor) -> tuple[list[dict], list[dict]]:
    """trace (L + 1, 5, P, 16) -> (per launch in step order, medians over layers by launch kind)."""
    layers = trace.shape[0] - 1
    order = [(i, j) for i in range(layers) for j in range(len(StaticDecoder.TRACE_SLOTS))] + [(layers, 0)]
    per, prev = [], None
    for i, j in order:
        tr = trace[i, j].cpu()
        if prev is None:  # the step's first traced launch: against its own first start
            prev = float(tr[tr[:, 0] > 0][:, 0].min()) if bool((tr[:, 0] > 0).any()) else 0.0
        f = launch_figures(tr, prev)
        if not f:
            continue
        prev = f.pop("_end")
        per.append(dict(layer=i, launch="head" if i == layers else StaticDecoder.TRACE_SLOTS[j], **f))
    kinds = []
    for kind in (*StaticDecoder.TRACE_SLOTS, "head"):
        rows = [r for r in per if r["launch"] == kind and not (kind == "qkv" and r["layer"] == 0)]
        if not rows:
            continue
        keys = [k for k in rows[0] if k not in ("layer", "launch")]
        kinds.append(dict(launch=kind, calls=len(rows), **{k: round(statistics.median(r[k] for r in rows), 3)
                                                           for k in keys if all(k in r for r in rows)}))
    return per, kinds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    cfg = preset("llama3-8B", num_hidden_layers=args.layers)
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = Llama(cfg)
        torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, cfg.initializer_range)
    model.eval()
    qfn = lambda lin: QuantLinear.from_float(lin, group_size=128, sym=True)  # noqa: E731
    dec = StaticDecoder(model, args.tokens + 16, fuse=True, linear_fn=qfn, lm_head=qfn(model.lm_head))
    first = 17
    plain = time_decode(dec, args.tokens, first)
    dec.graph = None
    dec.enable_trace()
    traced = time_decode(dec, args.tokens, first)  # the last replay's stamps stay in dec.trace
    per, kinds = analyse(dec.trace)
    starts = dec.trace[1 if args.layers > 1 else 0, 0, :, 0]  # a q/k/v GEMV's program starts: the timer's step
    steps = torch.diff(starts[starts > 0].sort().values)
    res = [int(steps[steps > 0].min())] if bool((steps > 0).any()) else []
    gpu = torch.cuda.get_device_name()
    tag = "h200" if "H200" in gpu else gpu.lower().replace(" ", "-")
    rows = [dict(impl="flashscale-w4a16", **k) for k in kinds]
    doc = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               model=f"llama3-8B shape, {args.layers} layers, random weights, 4-bit (G 128) with a 4-bit lm_head",
               tokens=args.tokens, ms_per_token=plain, ms_per_token_traced=traced,
               globaltimer_step_ns=res[0] if res else None, splits=dec.splits, rows=rows, launches=per)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"decode_step_trace-{tag}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)
    print(f"step {plain:.3f} ms a token, traced {traced:.3f}; globaltimer step {doc['globaltimer_step_ns']} ns")
    cols = ["launch", "calls", "programs", "lead", "start", "wait", "pro", "first", "loop", "tail", "span"]
    print(" ".join(f"{c:>8}" for c in cols))
    for r in kinds:
        print(" ".join(f"{r.get(c, '-'):>8}" if isinstance(r.get(c, "-"), (str, int)) else f"{r[c]:8.2f}"
                       for c in cols))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
