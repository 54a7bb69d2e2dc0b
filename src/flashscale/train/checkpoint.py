"""Training checkpoints: written atomically, found again after a crash, pruned to the newest K.

Layout of one checkpoint, CKPT_DIR/step-00000100/:
    engine/          the engine's files (SingleDeviceEngine: model.safetensors with float32 master
                     weights, optimizer.pt, engine.json; a parallel engine writes its ranks' files)
    rng.pt           RNG states: python, numpy, torch CPU, every CUDA device
    trainer.json     step, tokens seen, sampler state, the run's config, written last

Atomicity: everything is written into CKPT_DIR/.tmp-step-00000100, each file fsynced, then the folder
is renamed to step-00000100 and CKPT_DIR fsynced. rename(2) within a file system is atomic, so a
process killed at any instant leaves either a complete step-* folder or a .tmp-* one, which discovery
ignores and the next save clears. Pruning renames a folder to .del-* before deleting it, so a
half-deleted checkpoint never looks complete either.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

_NAME = re.compile(r"^step-(\d{8})$")
TRAINER_FILE = "trainer.json"
RNG_FILE = "rng.pt"
ENGINE_DIR = "engine"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file, then every folder bottom-up: the data and the names that point to it."""
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for f in filenames:
            _fsync(Path(dirpath) / f)
        _fsync(Path(dirpath))


def is_complete(path: Path) -> bool:
    return bool(_NAME.match(path.name)) and path.is_dir() and (path / TRAINER_FILE).is_file()


def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints in `ckpt_dir`, oldest first."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if is_complete(p)), key=lambda p: p.name)


def latest_checkpoint(ckpt_dir: str | os.PathLike) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def clear_incomplete(ckpt_dir: str | os.PathLike) -> None:
    """Removes the leftovers of saves or prunes that a crash interrupted."""
    d = Path(ckpt_dir)
    if d.is_dir():
        for p in d.iterdir():
            if p.name.startswith((".tmp-", ".del-")):
                shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- RNG

def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        if len(state["cuda"]) != torch.cuda.device_count():
            raise ValueError(f"checkpoint holds RNG states of {len(state['cuda'])} CUDA devices, "
                             f"this process sees {torch.cuda.device_count()}")
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    """random.setstate wants tuples all the way down; serialization may give lists."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# --------------------------------------------------------------------------------------- save / load

def save_checkpoint(ckpt_dir: str | os.PathLike, step: int, *, save_engine: Callable[[Path], None],
                    trainer_state: dict[str, Any], keep: int | None = None) -> Path:
    """Writes checkpoint `step` atomically (module docstring); returns its folder.

    save_engine(directory) writes the engine's files. trainer_state must be JSON-able. keep: prune to
    the newest `keep` complete checkpoints afterwards (None: keep all)."""
    d = Path(ckpt_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = d / step_dir_name(step)
    tmp = d / f".tmp-{final.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        (tmp / ENGINE_DIR).mkdir(parents=True)
        save_engine(tmp / ENGINE_DIR)
        torch.save(rng_state(), tmp / RNG_FILE)
        (tmp / TRAINER_FILE).write_text(json.dumps({"step": step, **trainer_state}, indent=1))
        _fsync_tree(tmp)
    except BaseException:  # an error (a full disk, say) leaves nothing behind; a kill leaves .tmp-*
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():  # the same step saved again (a rerun of a finished run): replace it
        old = d / f".del-{final.name}"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        shutil.rmtree(old)
    os.rename(tmp, final)
    _fsync(d)
    if keep is not None:
        prune(d, keep)
    return final


def prune(ckpt_dir: str | os.PathLike, keep: int) -> None:
    if keep < 1:
        raise ValueError(f"keep={keep}: expected an int >= 1")
    d = Path(ckpt_dir)
    for p in list_checkpoints(d)[:-keep]:
        doomed = d / f".del-{p.name}"
        os.rename(p, doomed)
        shutil.rmtree(doomed)
    _fsync(d)


def read_trainer_state(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not is_complete(p):
        raise FileNotFoundError(f"{str(p)!r} is not a complete training checkpoint "
                                f"(expected a step-NNNNNNNN folder holding {TRAINER_FILE})")
    try:
        return json.loads((p / TRAINER_FILE).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"training checkpoint {p / TRAINER_FILE} is corrupt: {e}") from None


def load_rng(path: str | os.PathLike) -> None:
    f = Path(path) / RNG_FILE
    if not f.is_file():
        raise FileNotFoundError(f"training checkpoint {str(path)!r} has no {RNG_FILE}")
    set_rng_state(torch.load(f, weights_only=True))


def resolve_resume(resume: str | os.PathLike | None, ckpt_dir: str | os.PathLike) -> Path | None:
    """None -> start fresh; "auto" -> the newest complete checkpoint in ckpt_dir, or None when there is
    none; else a checkpoint folder, or a folder of checkpoints (its newest)."""
    if resume is None:
        return None
    if str(resume) == "auto":
        return latest_checkpoint(ckpt_dir)
    p = Path(resume).expanduser()
    if is_complete(p):
        return p
    if p.is_dir():
        latest = latest_checkpoint(p)
        if latest is not None:
            return latest
    raise FileNotFoundError(f"resume={str(resume)!r}: not a complete training checkpoint or a folder of them "
                            f"(expected step-NNNNNNNN folders holding {TRAINER_FILE}), nor 'auto'")
