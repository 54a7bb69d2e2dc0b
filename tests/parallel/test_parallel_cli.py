"""`flashscale train` with the parallel engine: in-process at world size 1 (CI), and under torchrun
with two processes, a checkpoint at one layout resumed at another (slow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _parallel_harness as H  # noqa: E402

from flashscale.cli import main  # noqa: E402

STEPS = 4
COMMON = ["tiny", "--train.steps", str(STEPS), "--train.micro_batches", "2", "--log.every", "1",
          "--log.tensorboard", "false", "--no-progress", "--train.device", "cpu"]


def _losses(out: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def _close(a: dict[int, float], b: dict[int, float], steps) -> None:
    for s in steps:
        assert abs(a[s] - b[s]) <= 1e-5 * abs(b[s]), f"step {s}: {a[s]} vs {b[s]}"


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    assert main(["train", *COMMON, "--out", str(out)]) == 0
    return out


def test_parallel_keys_at_world_size_1_train_like_the_single_device_engine(single, tmp_path):
    out = tmp_path / "par"
    assert main(["train", *COMMON, "--parallel.zero", "3", "--parallel.schedule", "gpipe", "--out", str(out)]) == 0
    _close(_losses(out), _losses(single), range(1, STEPS + 1))
    assert (out / "final" / "model.safetensors").is_file()
    saved = json.loads((out / "config.json").read_text())
    assert saved["parallel"]["zero"] == 3


def test_impossible_layout_is_a_one_line_user_error(tmp_path, capsys):
    assert main(["train", *COMMON, "--parallel.tp", "3", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "world size 1 is not divisible by tp * pp = 3 * 1" in err and err.count("\n") == 1


def _torchrun(args: list[str], cwd: Path, timeout: float = 600) -> None:
    H.torchrun(["-m", "flashscale", "train", *args], cwd, timeout=timeout)


@pytest.mark.slow
def test_torchrun_two_processes_checkpoint_and_resume_at_another_layout(single, tmp_path):
    a, b = tmp_path / "pp2", tmp_path / "tp2"
    _torchrun([*COMMON, "--parallel.pp", "2", "--parallel.zero", "2", "--checkpoint.every", "2",
               "--out", str(a)], tmp_path)
    _close(_losses(a), _losses(single), range(1, STEPS + 1))
    step2 = a / "checkpoints" / "step-00000002"
    assert (step2 / "engine" / "COMPLETE").is_file() and (step2 / "engine" / "rank-00001.pt").is_file()
    _torchrun([*COMMON, "--parallel.tp", "2", "--parallel.zero", "1", "--parallel.sequence_parallel", "true",
               "--resume", str(step2), "--out", str(b)], tmp_path)
    _close(_losses(b), _losses(single), range(3, STEPS + 1))
    from flashscale.models.checkpoint import load_hf

    ma, mb = load_hf(a / "final"), load_hf(b / "final")
    for (n, p), (_, q) in zip(ma.named_parameters(), mb.named_parameters()):
        assert ((p - q).norm() / q.norm()).item() <= 1e-5, n
