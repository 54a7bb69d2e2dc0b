"""One rank of a parallel test launch: python _parallel_worker.py JOBS.json RANK WORLD STORE OUTDIR.

Runs every job of JOBS.json (see _parallel_harness) in order and writes OUTDIR/result-RANK.pt.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _parallel_harness as H  # noqa: E402
from _parallel_layers import layer_checks  # noqa: E402

from flashscale.models.llama import Llama  # noqa: E402
from flashscale.parallel.config import ParallelConfig  # noqa: E402
from flashscale.parallel.engine import ParallelEngine  # noqa: E402
from flashscale.parallel.mesh import CollectiveError, ParallelMesh  # noqa: E402
from flashscale.train.engine import OptimConfig  # noqa: E402

_NOT_PARALLEL = ("model", "max_grad_norm", "micro_batches_step", "dtype")


def parallel_config(layout: dict) -> ParallelConfig:
    return ParallelConfig(**{k: v for k, v in layout.items() if k not in _NOT_PARALLEL})


def build(layout: dict, *, model=None) -> ParallelEngine:
    cfg = H.model_config(layout["model"])
    pc = parallel_config(layout)
    mesh = ParallelMesh(pc, cfg, rank=dist.get_rank(), world_size=dist.get_world_size())
    if model is None:
        model = Llama(cfg).init_weights(H.SEED)
        model.document_masking = layout["model"] in H.DOC_MODELS
    return ParallelEngine(cfg, pc, OptimConfig(), model=model, mesh=mesh, dtype=layout.get("dtype", "float32"))


def my_rows(eng: ParallelEngine, x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0] // eng.dp_size
    return x[eng.dp_rank * n:(eng.dp_rank + 1) * n]


def train_job(job: dict) -> dict:
    layout = job["layout"]
    if dist.get_world_size() != _world(layout):
        return {"skipped": True}
    eng = build(layout)
    if job.get("load"):
        eng.load(Path(job["load"]))
    cfg = eng.model_config
    data = H.batches(cfg, job["total_steps"])
    losses, norms = [], []
    t0 = time.perf_counter()
    for step in range(job.get("start", 0), job["stop"]):
        x, y = data[step]
        out = eng.train_step(my_rows(eng, x), my_rows(eng, y), lr=H.lr_at(step, job["total_steps"]),
                             micro_batches=layout.get("micro_batches_step", 2),
                             max_grad_norm=layout.get("max_grad_norm", 1.0))
        losses.append(float(out["loss"]))
        norms.append(float(out["grad_norm"]))
    seconds = time.perf_counter() - t0
    if job.get("save"):
        eng.save(Path(job["save"]))
    from flashscale.parallel.checkpoint import rank_pieces

    records, tensors = rank_pieces(eng.zero_data)
    eval_loss = float(eng.eval_loss(*data[0])) if job.get("eval") else None
    if job.get("export"):
        eng.export_hf(Path(job["export"]))
    eng.mesh.destroy()
    return {"label": job["label"], "losses": losses, "norms": norms, "records": records, "tensors": tensors,
            "seconds": seconds, "eval_loss": eval_loss}


def memory_job(job: dict) -> dict:
    layout = job["layout"]
    eng = build(layout)
    cfg = eng.model_config
    x, y = H.batches(cfg, 1)[0]
    eng.train_step(my_rows(eng, x), my_rows(eng, y), lr=1e-3, micro_batches=2, max_grad_norm=1.0)
    out = {"label": job["label"], "bytes": eng.memory_bytes(), "pp_rank": eng.mesh.pp_rank,
           "tp_rank": eng.mesh.tp_rank, "partition": eng.partition, "chunks": eng.model.chunk_ids}
    eng.mesh.destroy()
    return out


def timeout_job(job: dict) -> dict:
    pc = ParallelConfig(dp=dist.get_world_size(), timeout_s=job["timeout_s"])
    mesh = ParallelMesh(pc, None, rank=dist.get_rank(), world_size=dist.get_world_size())
    msg = None
    if mesh.rank == 0:
        try:
            mesh.dp.all_reduce(torch.ones(4), what="test all-reduce the others skip")
        except CollectiveError as e:
            msg = str(e)
    else:
        time.sleep(job["timeout_s"] + 3)
    return {"label": job["label"], "message": msg}


def crash_save_job(job: dict) -> dict:
    """Rank `crash_rank` dies after writing its files, before the marker: the directory must not look
    complete (the parent checks after the launch fails)."""
    eng = build(job["layout"])
    if dist.get_rank() == job["crash_rank"]:
        import flashscale.parallel.checkpoint as pc

        real = pc._atomic_write

        def dying(path, write):
            real(path, write)
            if path.suffix == ".json":
                os._exit(17)

        pc._atomic_write = dying
    eng.save(Path(job["save"]))
    return {"label": job["label"]}


def _world(layout: dict) -> int:
    return layout.get("dp", 1) * layout.get("tp", 1) * layout.get("pp", 1)


def main() -> None:
    jobs_path, rank, world, store, outdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    results = []
    for job in json.loads(Path(jobs_path).read_text()):
        kind = job["type"]
        fn = {"train": train_job, "memory": memory_job, "timeout": timeout_job, "crash_save": crash_save_job,
              "layers": layer_checks}[kind]
        results.append(fn(job))
    torch.save(results, Path(outdir) / f"result-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
