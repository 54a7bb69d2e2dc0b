"""The pipeline executor's idle time with synthetic compute: no GPU, no model, just the schedule.

    torchrun --standalone --nproc-per-node 2 benchmarks/pipeline_sim.py [--fwd-ms 20 --bwd-ms 40]

Every rank runs flashscale.parallel.pipeline's plans and PipelineExecutor over gloo, with forward and
backward replaced by sleeps of fixed length (backward twice forward by default, as in a transformer)
and tiny activations, so what is measured is what the schedule and the executor's message exchange
cost: the busiest rank's idle fraction against the formulas ((p-1)/(m+p-1) of the total for GPipe and
1F1B; (p-1)/(v m) of the busy time for interleaved 1F1B, Megatron's definition). Prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from flashscale.parallel.config import ParallelConfig  # noqa: E402
from flashscale.parallel.mesh import ParallelMesh  # noqa: E402
from flashscale.parallel.pipeline import PipelineExecutor, build_plan, schedule_orders  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fwd-ms", type=float, default=20.0)
    p.add_argument("--bwd-ms", type=float, default=40.0)
    p.add_argument("--micro-batches", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        raise SystemExit("launch with torchrun --nproc-per-node >= 2")
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=120))
    rank = dist.get_rank()
    rows = []
    for sched, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        pc = ParallelConfig(pp=world, schedule=sched, virtual_stages=v, backend="gloo")
        mesh = ParallelMesh(pc, None, rank=rank, world_size=world)
        chunks = [c for c in range(world * v) if c % world == rank]
        for m in args.micro_batches:
            if sched == "interleaved" and m % world:
                continue
            plan = build_plan(schedule_orders(sched, world, v, m), world * v)[rank]
            busy = []

            def fwd(c, mb, x):
                t = time.perf_counter()
                time.sleep(args.fwd_ms / 1e3 / v)  # a chunk holds 1/v of the stage
                busy.append(time.perf_counter() - t)
                return None if chunks[c] == world * v - 1 else torch.zeros(4)  # the last chunk ends in the loss

            def bwd(c, mb, g):
                t = time.perf_counter()
                time.sleep(args.bwd_ms / 1e3 / v)
                busy.append(time.perf_counter() - t)
                return None if chunks[c] == 0 else torch.zeros(4)  # no gradient before the embedding

            totals, busies = [], []
            for _ in range(args.steps):
                busy.clear()
                dist.barrier()
                t0 = time.perf_counter()
                PipelineExecutor(mesh, plan, chunks).run(fwd, bwd, activation_shape=(4,), dtype=torch.float32,
                                                         device=torch.device("cpu"))
                dist.barrier()
                totals.append(time.perf_counter() - t0)
                busies.append(sum(busy))
            tb = torch.tensor([statistics.median(totals), statistics.median(busies)], dtype=torch.float64)
            allv = [torch.zeros_like(tb) for _ in range(world)]
            dist.all_gather(allv, tb)
            total, b = max(((float(a[0]), float(a[1])) for a in allv), key=lambda x: x[1])
            if sched == "interleaved":
                meas, formula = (total - b) / b, (world - 1) / (v * m)
            else:
                meas, formula = (total - b) / total, (world - 1) / (m + world - 1)
            rows.append((sched, v, m, meas, formula, total))
        mesh.destroy()
    if rank == 0:
        print(f"p={world}, forward {args.fwd_ms:g} ms, backward {args.bwd_ms:g} ms (sleeps), gloo")
        print(f"{'schedule':12s} {'v':>2s} {'m':>3s} {'bubble':>7s} {'formula':>7s} {'step s':>7s}")
        for sched, v, m, meas, formula, total in rows:
            print(f"{sched:12s} {v:2d} {m:3d} {meas:7.3f} {formula:7.3f} {total:7.3f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
