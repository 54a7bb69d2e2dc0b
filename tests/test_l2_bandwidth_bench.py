"""benchmarks/l2_bandwidth.py's kernel against torch (its --smoke mode, under the interpreter on the CPU), and its
argument errors."""

import pytest
import torch
from bench_testutil import load_benchmark


def test_smoke_matches_torch():
    assert load_benchmark("l2_bandwidth").main(["--smoke"]) == 0


def test_argument_errors():
    mod = load_benchmark("l2_bandwidth")
    with pytest.raises(ValueError, match="int32"):
        mod.read(torch.zeros(mod.CHUNK, dtype=torch.float32), 1, True)
    with pytest.raises(ValueError, match="divide the 3 chunks"):
        mod.read(torch.zeros(3 * mod.CHUNK, dtype=torch.int32), 2, False)
