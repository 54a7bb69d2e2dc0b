"""Summaries of benchmarks/ncu_device.sh's pages (no ncu needed): per kernel, the headline metrics, the warp
stall reasons, the pipes, and the SASS instructions where the stall samples fall.

    python benchmarks/ncu_summary.py DIR [--top 30]      # DIR: where ncu_text.tar.gz was unpacked

For each TARGET.raw.csv (ncu --page raw --csv: a header row of metric names, a row of units, a row a kernel) it
prints, per kernel: duration, SM / memory throughput, issue activity, registers, shared memory, the pipes
above 5 % of peak, and the stall-reason metrics (smsp__pcsamp_warps_issue_stalled_*: samples of warps not
issuing, by reason). For TARGET.sass.csv (--page source --print-source sass) the instructions with the most
stall samples, and the samples summed by opcode.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from collections import Counter
from pathlib import Path

HEADLINE = ["Kernel Name", "gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed", "smsp__issue_active.avg.pct_of_peak_sustained_active",
            "smsp__inst_executed.sum", "launch__registers_per_thread", "launch__shared_mem_per_block_dynamic",
            "launch__grid_size", "launch__block_size", "sm__warps_active.avg.pct_of_peak_sustained_active",
            "smsp__warps_eligible.avg.per_cycle_active", "sm__cycles_elapsed.avg.per_second"]


def _rows(path: Path) -> list[dict]:
    text = path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]  # drop ncu's ==PROF== chatter
    if len(lines) < 3:
        return []
    rdr = list(csv.reader(io.StringIO("\n".join(lines))))
    head, units = rdr[0], rdr[1]
    return [{h: (v, u) for h, v, u in zip(head, row, units)} for row in rdr[2:]]


def _num(s: str) -> float | None:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def raw_summary(path: Path, min_ms: float = 0.0) -> None:
    for r in _rows(path):
        name = r.get("Kernel Name", ("?", ""))[0]
        dur = _num(r.get("gpu__time_duration.sum", ("0", ""))[0]) or 0.0
        if dur < min_ms:
            print(f"  kernel {name[:60]} ({dur:.3f} ms: skipped)")
            continue
        print(f"  kernel {name[:90]}")
        for h in HEADLINE[1:]:
            if h in r:
                print(f"    {h:70s} {r[h][0]:>16s} {r[h][1]}")
        pipes = [(h, _num(v)) for h, (v, _u) in r.items()
                 if "pipe" in h and ".avg." in h and h.endswith("pct_of_peak_sustained_active") and (_num(v) or 0) > 5]
        for h, v in sorted(pipes, key=lambda x: -x[1]):
            print(f"    pipe {h:65s} {v:8.1f} %")
        stalls = [(h, _num(v)) for h, (v, _u) in r.items()
                  if re.match(r"smsp__pcsamp_warps_issue_stalled_\w+$", h) and (_num(v) or 0) > 0
                  and not h.endswith("_not_issued")]
        total = sum(v for _, v in stalls) or 1.0
        for h, v in sorted(stalls, key=lambda x: -x[1])[:14]:
            print(f"    stall {h.replace('smsp__pcsamp_warps_issue_stalled_', ''):40s} {v:10.0f}  {100 * v / total:5.1f} %")
        lat = [(h, _num(v)) for h, (v, _u) in r.items()
               if h.startswith("smsp__average_warps_issue_stalled_") and h.endswith("per_issue_active.ratio")
               and (_num(v) or 0) > 0.05]
        for h, v in sorted(lat, key=lambda x: -x[1])[:10]:
            print(f"    cycles/issue {h.replace('smsp__average_warps_issue_stalled_', ''):40s} {v:8.2f}")


def _sections(path: Path) -> list[tuple[str, list[dict]]]:
    """The source page holds one csv table a kernel, each after a '"Kernel Name","NAME",' line."""
    out, name, buf = [], None, []
    for ln in path.read_text(errors="replace").splitlines() + ['"Kernel Name","",']:
        if ln.startswith('"Kernel Name",'):
            if name is not None and len(buf) > 1:
                out.append((name, list(csv.DictReader(io.StringIO("\n".join(buf))))))
            name, buf = next(csv.reader([ln]))[1], []
        elif ln.startswith('"'):
            buf.append(ln)
    return out


def sass_summary(path: Path, top: int, listing: float) -> None:
    for name, rdr in _sections(path):
        cols = list(rdr[0].keys())
        samp = "Warp Stall Sampling (All Samples)"
        reasons = [c for c in cols if c.startswith("stall_") and "(Not Issued)" not in c]
        recs = []
        for r in rdr:
            why = sorted(((_num(r[c]) or 0.0, c[6:]) for c in reasons), reverse=True)[:3]
            recs.append((_num(r.get(samp, "0")) or 0.0, r["Source"].strip(), r.get("Instructions Executed", ""),
                         r["Address"][-5:], " ".join(f"{c}:{v:.0f}" for v, c in why if v > 0)))
        total = sum(x[0] for x in recs)
        if total < 1000:
            continue
        print(f"  sass of {name[:60]}: {len(recs)} instructions, {total:.0f} stall samples; top {top}:")
        for s, ins, ex, addr, why in sorted(recs, key=lambda x: -x[0])[:top]:
            print(f"    {100 * s / total:5.1f} %  {addr}  {ins[:70]:70s} exec {ex:>9s}  {why}")
        by_op = Counter()
        for s, ins, *_ in recs:
            op = re.sub(r"^@!?U?P\w+\s+", "", ins).split(" ")[0] if ins else "?"
            by_op[op.split(".")[0]] += s
        print("  by opcode:", ", ".join(f"{op} {100 * v / total:.1f}%" for op, v in by_op.most_common(14)))
        if listing > 0:
            print(f"  listing (address order, instructions with >= {listing} % of the samples):")
            for s, ins, ex, addr, why in recs:
                if 100 * s / total >= listing:
                    print(f"    {addr}  {100 * s / total:5.1f} %  {ins[:70]:70s} {why}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--listing", type=float, default=0.0, help="also list, in address order, the instructions "
                    "with at least this % of a kernel's stall samples")
    ap.add_argument("--min-ms", type=float, default=0.1, help="kernels shorter than this: name only")
    a = ap.parse_args(argv)
    for raw in sorted(a.dir.glob("*.raw.csv")):
        t = raw.name[: -len(".raw.csv")]
        print(f"== {t}")
        raw_summary(raw, a.min_ms)
        sass = a.dir / f"{t}.sass.csv"
        if sass.exists():
            sass_summary(sass, a.top, a.listing)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
