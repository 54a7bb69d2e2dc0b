"""Sharded training checkpoints that load into any other (pp, dp, tp, ZeRO) layout, and the HF export.

Layout of a checkpoint directory:
    rank-00003.pt    this rank's pieces: fp32 master weights and AdamW moments of the elements it owns
    rank-00003.json  the index of that file: for each piece, the logical tensor name, its full shape,
                     the tensor-parallel slice the rank holds (dim, start, stop, local shape) and the
                     range [lo, hi) of that local tensor (flattened) the piece covers
    meta.json        layout, model config, AdamW step count (rank 0)
    COMPLETE         written last by rank 0, after a barrier that every rank reaches once its files
                     are durable: a crash mid-save never leaves a complete-looking checkpoint (the
                     marker is removed first when a directory is saved over)

Each element of the model is written once (the owners: one dp shard each, tensor-parallel replicas
and the tied head copy skipped). Loading assembles one logical tensor at a time from the pieces that
cover it (memory: one full tensor) and cuts what the new layout's rank needs: resharding is the same
code as loading. export_hf builds the single model and writes it with models.checkpoint.save_hf.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from flashscale.errors import UserError
from flashscale.models.config import LlamaConfig
from flashscale.models.llama import Llama

FORMAT = "flashscale-parallel-checkpoint-v1"
MARKER = "COMPLETE"
META = "meta.json"
KINDS = ("master", "exp_avg", "exp_avg_sq")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    _fsync_file(tmp)
    os.replace(tmp, path)


def is_complete(directory: str | os.PathLike) -> bool:
    return (Path(directory) / MARKER).is_file()


# ------------------------------------------------------------------------------------------ saving

def rank_pieces(zd) -> tuple[list[dict], list[torch.Tensor]]:
    """This rank's owned pieces of a ZeroData: (index records, tensors) in matching order."""
    records, tensors = [], []
    for u in zd.units.values():
        states = {}
        for lo, hi, _, p in u.pieces:
            st = zd.optimizer.state.get(p, {})
            for k in ("exp_avg", "exp_avg_sq"):
                if k in st:
                    states.setdefault(k, []).append((lo, hi, st[k]))
        for e in u.entries:
            if not e.spec.owner:
                continue
            a, b = max(e.offset, u.shard_lo), min(e.offset + e.numel, u.shard_lo + u.shard)
            if a >= b:
                continue
            s = e.spec
            base = {"name": s.logical_name, "logical_shape": list(s.logical_shape), "dim": s.dim,
                    "start": s.start, "stop": s.stop, "local_shape": list(e.shape),
                    "lo": a - e.offset, "hi": b - e.offset}
            records.append({**base, "kind": "master"})
            tensors.append(u.master[a - u.opt_lo:b - u.opt_lo].detach().cpu().clone())
            for k, parts in states.items():
                vals = [st[max(a, lo) - lo:min(b, hi) - lo] for lo, hi, st in parts if max(a, lo) < min(b, hi)]
                records.append({**base, "kind": k})
                tensors.append(torch.cat(vals).detach().cpu().clone())
    return records, tensors


def save_sharded(engine, directory: str | os.PathLike) -> None:
    """Collective: every rank of the engine's mesh calls it with the same directory (a file system
    they share)."""
    d = Path(directory)
    mesh = engine.mesh
    if mesh.rank == 0:
        d.mkdir(parents=True, exist_ok=True)
        for p in [d / MARKER, d / META, *d.glob("rank-*.pt"), *d.glob("rank-*.json")]:
            p.unlink(missing_ok=True)  # the marker first: from here on the directory is incomplete
    mesh.world.barrier("checkpoint save: directory ready")
    records, tensors = rank_pieces(engine.zero_data)
    name = f"rank-{mesh.rank:05d}"
    _atomic_write(d / f"{name}.pt", lambda p: torch.save(tensors, p))
    _atomic_write(d / f"{name}.json", lambda p: p.write_text(json.dumps(records)))
    mesh.world.barrier("checkpoint save: every rank's files written")
    if mesh.rank == 0:
        meta = {"format": FORMAT, "layout": engine.layout(), "world_size": mesh.world_size,
                "step": engine.optimizer_step(), "model_config": engine.model_config.to_hf_dict()}
        _atomic_write(d / META, lambda p: p.write_text(json.dumps(meta, indent=1)))
        _atomic_write(d / MARKER, lambda p: p.write_text("ok\n"))
        _fsync_file(d)
    mesh.world.barrier("checkpoint save: marker written")


# ----------------------------------------------------------------------------------------- loading

class ShardedReader:
    """Assembles logical tensors (fp32, full shape) from a complete sharded checkpoint."""

    def __init__(self, directory: str | os.PathLike):
        d = Path(directory)
        if not d.is_dir():
            raise FileNotFoundError(f"parallel checkpoint {d} does not exist")
        if not is_complete(d):
            raise UserError(f"parallel checkpoint {d} is incomplete (no {MARKER} marker: the save was "
                            f"interrupted); use an earlier checkpoint")
        try:
            self.meta = json.loads((d / META).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"parallel checkpoint {d / META} is unreadable: {e}") from None
        if self.meta.get("format") != FORMAT:
            raise UserError(f"{d / META}: format {self.meta.get('format')!r}, expected {FORMAT!r}")
        self.dir = d
        self.index: dict[tuple[str, str], list[tuple[int, int, dict]]] = {}
        for r in range(self.meta["world_size"]):
            path = d / f"rank-{r:05d}.json"
            if not path.is_file():
                raise UserError(f"parallel checkpoint {d} lacks {path.name} (saved by {self.meta['world_size']} ranks)")
            for i, rec in enumerate(json.loads(path.read_text())):
                self.index.setdefault((rec["name"], rec["kind"]), []).append((r, i, rec))
        self._files: dict[int, list[torch.Tensor]] = {}
        self._cache: tuple[tuple[str, str], torch.Tensor] | None = None

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def model_config(self) -> LlamaConfig:
        return LlamaConfig.from_hf_dict(self.meta["model_config"])

    def _tensors(self, r: int) -> list[torch.Tensor]:
        if r not in self._files:
            self._files[r] = torch.load(self.dir / f"rank-{r:05d}.pt", map_location="cpu", mmap=True,
                                        weights_only=True)
        return self._files[r]

    def has(self, name: str, kind: str) -> bool:
        return (name, kind) in self.index

    def get(self, name: str, kind: str = "master") -> torch.Tensor:
        """The full logical tensor `name` (fp32)."""
        if self._cache is not None and self._cache[0] == (name, kind):
            return self._cache[1]
        recs = self.index.get((name, kind))
        if not recs:
            raise UserError(f"parallel checkpoint {self.dir} holds no {kind} of tensor {name}")
        full = assemble([(rec, self._tensors(r)[i]) for r, i, rec in recs], where=str(self.dir))
        self._cache = ((name, kind), full)
        return full


def assemble(pieces: list[tuple[dict, torch.Tensor]], *, where: str = "checkpoint") -> torch.Tensor:
    """One logical tensor (fp32, full shape) from (record, tensor) pieces of one name and kind, each
    covering [lo, hi) of a tensor-parallel slice; raises when a slice is not covered completely."""
    rec0 = pieces[0][0]
    full = torch.zeros(rec0["logical_shape"], dtype=torch.float32)
    blocks: dict[tuple, tuple[torch.Tensor, list]] = {}
    for rec, t in pieces:
        key = (rec["dim"], rec["start"], rec["stop"], tuple(rec["local_shape"]))
        if key not in blocks:
            blocks[key] = (torch.zeros(math.prod(rec["local_shape"]), dtype=torch.float32), [])
        flat, filled = blocks[key]
        flat[rec["lo"]:rec["hi"]] = t
        filled.append((rec["lo"], rec["hi"]))
    for (dim, start, stop, shape), (flat, filled) in blocks.items():
        end = 0
        for lo, hi in sorted(filled):
            if lo > end:
                break
            end = max(end, hi)
        if end < flat.numel():
            raise UserError(f"{where}: tensor {rec0['name']} ({rec0['kind']}) is missing elements "
                            f"[{end}, {flat.numel()}) of its slice {dim}:{start}:{stop}")
        local = flat.view(shape)
        if dim is None:
            full.copy_(local)
        else:
            full.narrow(dim, start, stop - start).copy_(local.narrow(dim, 0, stop - start))
    return full


def assemble_all(pieces: list[tuple[dict, torch.Tensor]]) -> dict[tuple[str, str], torch.Tensor]:
    """{(name, kind): full tensor} from every rank's rank_pieces, concatenated."""
    by: dict[tuple[str, str], list] = {}
    for rec, t in pieces:
        by.setdefault((rec["name"], rec["kind"]), []).append((rec, t))
    return {k: assemble(v) for k, v in by.items()}


def load_into(zd, reader: ShardedReader, model_config: LlamaConfig) -> None:
    """Fills a ZeroData's masters (and AdamW moments when the checkpoint has a step > 0) from any
    layout's checkpoint, then rounds them into the compute parameters."""
    saved = reader.model_config
    if saved.to_hf_dict() != model_config.to_hf_dict():
        diff = [k for k, v in saved.to_hf_dict().items() if model_config.to_hf_dict().get(k) != v]
        raise UserError(f"parallel checkpoint {reader.dir} was saved for another model (differs in {diff})")
    step = reader.step
    kinds = KINDS if step > 0 else ("master",)
    moments: dict = {}
    for u in zd.units.values():
        bufs = {k: (u.master if k == "master" else torch.zeros_like(u.master)) for k in kinds}
        for e in u.entries:
            a, b = max(e.offset, u.opt_lo), min(e.offset + e.numel, u.opt_hi)
            if a >= b:
                continue
            for k in kinds:
                local = e.spec.local_from_logical(reader.get(e.spec.logical_name, k)).reshape(-1)
                with torch.no_grad():
                    bufs[k][a - u.opt_lo:b - u.opt_lo].copy_(local[a - e.offset:b - e.offset])
        if step > 0:
            for lo, hi, _, p in u.pieces:
                moments[p] = {k: bufs[k][lo - u.opt_lo:hi - u.opt_lo].clone() for k in ("exp_avg", "exp_avg_sq")}
    if step > 0:
        opt = zd.optimizer
        sd = opt.state_dict()
        params = [p for g in opt.param_groups for p in g["params"]]
        sd["state"] = {i: {"step": torch.tensor(float(step)), **moments[p]} for i, p in enumerate(params)}
        opt.load_state_dict(sd)
    else:
        zd.optimizer.state.clear()
    zd.masters_to_params()


# ----------------------------------------------------------------------------------------- HF export

def assemble_model(reader: ShardedReader) -> Llama:
    """The single-device Llama (float32) of a sharded checkpoint's master weights."""
    model = Llama(reader.model_config)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied lm_head is deduplicated away
            t = reader.get(name, "master")
            if tuple(t.shape) != tuple(p.shape):
                raise UserError(f"parallel checkpoint {reader.dir}: {name} has shape {tuple(t.shape)}, "
                                f"the model wants {tuple(p.shape)}")
            p.copy_(t)
    return model.eval()


def export_hf(directory: str | os.PathLike, out_dir: str | os.PathLike, *, dtype=None, tokenizer=None) -> Path:
    """Writes a sharded checkpoint as an HF Llama directory (config.json + safetensors)."""
    from flashscale.models.checkpoint import save_hf

    return save_hf(assemble_model(ShardedReader(directory)), out_dir, dtype=dtype, tokenizer=tokenizer)
