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
untraced and traced in the same run (the stamps' overhead). Also: late (the fraction of programs that started
after prev_end: no SM slot free before) and, for the last tenth of programs to end, how much later than the median
they started (tail_start, means over them) and left the wait (tail_wait), the fraction of them that started late
(tail_late), and how many more items they had (tail_items). Variants: attention tile rows (btN), context splits (sN)
and dyn (the GEMVs take their items from counters, StaticDecoder.dyn: it should shrink the tails). Writes
OUT/decode_step_trace-<gpu>.json: rows (impl flashscale-w4a16, variant, launch, the figures above, programs), the
steps' times, and every program of layers 1 and L/2 of the first variant (launches[].raw).

    python benchmarks/decode_step_trace.py --out $OUT [--layers 32] [--tokens 128] [--variants default,bt16]
    python benchmarks/decode_step_trace.py --raw-stats results/decode_step_trace-h200.json   # slow programs: where
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
from generate_w4a16 import pin_late, random_model, time_decode  # noqa: E402  (it puts src/ on the path)
from plotting import gpu_tag, plot_only, pyplot  # noqa: E402

from flashscale.infer.decode import StaticDecoder  # noqa: E402
from flashscale.kernels.w4a16 import pin_config  # noqa: E402
from flashscale.models.config import preset  # noqa: E402
from flashscale.quant.qlinear import QuantLinear  # noqa: E402

FIELDS = dict(start=0, end=5, wait=8, x=9, first=10)
RAW = ("start", "wait", "x", "first", "end")  # a program's raw row (us from prev_end), then smid and items


def launch_figures(tr: torch.Tensor, prev_end: float) -> dict:
    """tr (P, 16) int64 stamps of one launch (rows never written stay 0) -> its figures (us) and last end (ns)."""
    t = tr[tr[:, 0] > 0].double()
    if t.numel() == 0:
        return {}
    med = lambda col: float(t[:, col].median())  # noqa: E731
    end_max = float(t[:, FIELDS["end"]].max())
    out = dict(programs=int(t.shape[0]), lead=(float(t[:, 0].min()) - prev_end) / 1e3,
               start=(med(0) - prev_end) / 1e3, wait=(med(FIELDS["wait"]) - prev_end) / 1e3,
               tail=(end_max - med(FIELDS["end"])) / 1e3, span=(end_max - prev_end) / 1e3, _end=end_max,
               start_max=(float(t[:, 0].max()) - prev_end) / 1e3,
               wait_max=(float(t[:, FIELDS["wait"]].max()) - prev_end) / 1e3,
               late=float((t[:, 0] > prev_end).double().mean()))  # programs that started after prev_end
    last = t[t[:, FIELDS["end"]] >= torch.quantile(t[:, FIELDS["end"]], 0.9)]  # the last tenth to end
    out.update(tail_start=(float(last[:, 0].mean()) - med(0)) / 1e3,  # how much later they started (mean)
               tail_wait=(float(last[:, FIELDS["wait"]].mean()) - med(FIELDS["wait"])) / 1e3,
               tail_late=float((last[:, 0] > prev_end).double().mean()),
               tail_items=float(last[:, 7].mean()) - med(7))
    if bool((t[:, FIELDS["x"]] > 0).all()):  # ring GEMVs: prologue, first item, loop
        out.update(pro=(med(FIELDS["x"]) - med(FIELDS["wait"])) / 1e3,
                   first=(med(FIELDS["first"]) - med(FIELDS["x"])) / 1e3,
                   loop=(med(FIELDS["end"]) - med(FIELDS["first"])) / 1e3)
    return out


def analyse(trace: torch.Tensor) -> tuple[list[dict], list[dict]]:
    """trace (L + 1, 5, P, 16) -> (per launch in step order, medians over layers by launch kind)."""
    layers = trace.shape[0] - 1
    order = [(i, j) for i in range(layers) for j in range(len(StaticDecoder.LAUNCHES))] + [(layers, 0)]
    per, prev = [], None
    for i, j in order:
        tr = trace[i, j].cpu()
        if prev is None:  # the step's first traced launch: against its own first start
            prev = float(tr[tr[:, 0] > 0][:, 0].min()) if bool((tr[:, 0] > 0).any()) else 0.0
        f = launch_figures(tr, prev)
        if not f:
            continue
        end = f.pop("_end")
        row = dict(layer=i, launch="head" if i == layers else StaticDecoder.LAUNCHES[j], **f)
        if i in (1, layers // 2):  # two layers' programs in full: RAW fields (us from prev_end), smid, items
            t = tr[tr[:, 0] > 0].double()
            row["raw"] = [[round((float(r[FIELDS[k]]) - prev) / 1e3, 3) if r[FIELDS[k]] > 0 else None for k in RAW]
                          + [int(r[6]), int(r[7])] for r in t]
        prev = end
        per.append(row)
    kinds = []
    for kind in (*StaticDecoder.LAUNCHES, "head"):
        rows = [r for r in per if r["launch"] == kind and not (kind == "qkv" and r["layer"] == 0)]
        if not rows:
            continue
        keys = [k for k in rows[0] if k not in ("layer", "launch", "raw")]
        kinds.append(dict(launch=kind, calls=len(rows), **{k: round(statistics.median(r[k] for r in rows), 3)
                                                           for k in keys if all(k in r for r in rows)}))
    return per, kinds


def thirds_end(raw: list) -> list[float]:
    """Mean end of the first, second and last third of a launch's programs by index (the last third: placed last on
    their SMs, after the previous kernel's programs leave)."""
    ends = [r[4] for r in raw]
    n = len(ends)
    return [sum(e for e in ends[j * n // 3:(j + 1) * n // 3] if e is not None) / max(1, (j + 1) * n // 3 - j * n // 3)
            for j in range(3)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128, help="generated tokens (the cache: 16 more positions)")
    ap.add_argument("--variants", default="default,bt16",
                    help="comma-separated: default, btN (attention tiles of N rows), sN (N context splits), dyn, "
                         "lateN[sM] (every GEMV's tuned config with RingConfig.late N, late_share M; after default)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    model = random_model(preset("llama3-8B", num_hidden_layers=args.layers), "cuda", torch.bfloat16)
    qfn = lambda lin: QuantLinear.from_float(lin, group_size=128, sym=True)  # noqa: E731
    dec = StaticDecoder(model, args.tokens + 16, fuse=True, linear_fn=qfn, lm_head=qfn(model.lm_head))
    auto = dec.splits
    gpu = torch.cuda.get_device_name()
    tag = gpu_tag(gpu)
    rows, steps_ms, raw = [], {}, None
    for variant in args.variants.split(","):
        dec.attn_block = int(variant[2:]) if variant.startswith("bt") else 32
        dec.set_attn_splits(int(variant[1:]) if variant.startswith("s") else auto)
        dec.dyn = variant == "dyn"  # the GEMVs' items from counters (w4a16_ring DYN)
        late = variant[4:].split("s") if variant.startswith("late") else None
        pins = pin_late(int(late[0]), int(late[1]) if len(late) > 1 else 1) if late else {}
        dec.enable_trace(False)
        dec.graph = None
        plain = time_decode(dec, args.tokens, 17)
        dec.graph = None
        dec.enable_trace()
        traced = time_decode(dec, args.tokens, 17)  # the last replay's stamps stay in dec.trace
        per, kinds = analyse(dec.trace)
        steps_ms[variant] = dict(ms_per_token=plain, ms_per_token_traced=traced, attn_block=dec.attn_block,
                                 splits=dec.splits)
        rows += [dict(impl="flashscale-w4a16", variant=variant, **k) for k in kinds]
        raw = per if raw is None else raw  # the first variant's launches in full
        for key, (cfg, split) in pins.items():  # the tuned configs back
            pin_config(key, cfg, split)
        print("end (us) by thirds of the programs, layer 1:",
              ", ".join(f"{r['launch']} " + "/".join(f"{e:.2f}" for e in thirds_end(r["raw"])) for r in per
                        if "raw" in r and r["layer"] == 1))
        print(f"{variant}: step {plain:.3f} ms a token, traced {traced:.3f} (attention tiles of {dec.attn_block} "
              f"rows, {dec.splits} splits)")
        cols = ["launch", "programs", "lead", "start", "wait", "pro", "first", "loop", "tail", "span", "late",
                "tail_start", "tail_wait", "tail_late", "tail_items"]
        print(" ".join(f"{c[:8]:>8}" for c in cols))
        for r in kinds:
            print(" ".join(f"{r[c]:>8}" if isinstance(r.get(c), str) else f"{r[c]:8.2f}" if c in r else f"{'-':>8}"
                           for c in cols))
    starts = dec.trace[1 if args.layers > 1 else 0, 0, :, 0]  # a q/k/v GEMV's program starts: the timer's step
    gaps = torch.diff(starts[starts > 0].sort().values)
    doc = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               model=f"llama3-8B shape, {args.layers} layers, random weights, 4-bit (G 128) with a 4-bit lm_head",
               tokens=args.tokens, steps=steps_ms,
               globaltimer_step_ns=int(gaps[gaps > 0].min()) if bool((gaps > 0).any()) else None, rows=rows,
               launches=raw)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"decode_step_trace-{tag}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)
    plot(doc, path.with_suffix(".png"))
    print(f"wrote {path}")
    return 0


def plot(doc: dict, path: Path) -> None:
    """A block's launches as stacked bars (wait, prologue, first item, loop, tail: us, medians over layers) for
    each variant."""
    plt = pyplot()
    if plt is None:
        return
    rows = [r for r in doc["rows"] if r["launch"] != "head"]
    parts = [("wait", "#999999"), ("pro", "#e08030"), ("first", "#d0b020"), ("loop", "#3070b0"), ("tail", "#c03030")]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    names = [f"{r.get('variant', '')} {r['launch']}" for r in rows]
    left = [0.0] * len(rows)
    for key, color in parts:
        vals = [r.get(key, 0.0) if key != "loop" or "loop" in r else r["span"] - r["wait"] - r["tail"]
                for r in rows]
        ax.barh(names, vals, left=left, color=color, label=key + (" (attention: its work)" if key == "loop" else ""))
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()
    ax.set_xlabel("us after the previous launch's last program ends (medians over layers)")
    ax.set_title(f"4-bit decode step, one block's launches, {doc['gpu']}")
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def raw_stats(doc: dict) -> list[dict]:
    """Where a launch's slow programs are, from a result's raw programs (layers 1 and L/2 of its first variant): per
    launch kind, the correlation of the programs' ends (from their wait) between the two layers by program index and
    by SM, and each layer's mean end by thirds of the programs (docs/w4a16_decode.md round 12)."""
    import numpy as np

    raw = {(r["layer"], r["launch"]): np.array(r["raw"], dtype=float) for r in doc["launches"] if "raw" in r}
    out = []
    for kind in dict.fromkeys(k for _, k in raw):
        (la, a), (lb, b) = sorted((lay, v) for (lay, k), v in raw.items() if k == kind)[:2]
        da, db = a[:, 4] - a[:, 1], b[:, 4] - b[:, 1]
        sms = sorted(set(a[:, 5].tolist()) & set(b[:, 5].tolist()))  # the mean end from its wait an SM, each layer
        by_sm = [[d[sm == s].mean() for s in sms] for d, sm in ((da, a[:, 5]), (db, b[:, 5]))]
        out.append(dict(launch=kind, layers=[la, lb], by_index=float(np.corrcoef(da, db)[0, 1]),
                        by_sm=float(np.corrcoef(by_sm)[0, 1]),
                        thirds_end=[thirds_end(a.tolist()), thirds_end(b.tolist())]))
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--raw-stats":  # where the slow programs are, from a result
        for r in raw_stats(json.loads(Path(sys.argv[2]).read_text())):
            print(f"{r['launch']:5s} layers {r['layers']}: end correlation by program index {r['by_index']:5.2f}, "
                  f"by SM {r['by_sm']:5.2f}; ends by thirds " + ", ".join("/".join(f"{e:.2f}" for e in t)
                                                                        for t in r["thirds_end"]))
        raise SystemExit(0)
    raise SystemExit(0 if plot_only(sys.argv[1:], plot) else main())
