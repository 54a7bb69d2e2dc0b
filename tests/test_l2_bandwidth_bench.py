"""benchmarks/l2_bandwidth.py's kernel against torch (its --smoke mode, under the interpreter on the CPU), and its
argument errors."""

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("bench_l2_bandwidth", ROOT / "benchmarks" / "l2_bandwidth.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_matches_torch():
    assert _load().main(["--smoke"]) == 0


def test_argument_errors():
    mod = _load()
    with pytest.raises(ValueError, match="int32"):
        mod.read(torch.zeros(mod.CHUNK, dtype=torch.float32), 1, True)
    with pytest.raises(ValueError, match="divide the 3 chunks"):
        mod.read(torch.zeros(3 * mod.CHUNK, dtype=torch.int32), 2, False)
