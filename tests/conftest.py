"""Test setup: Triton's interpreter on CPU-only machines, `gpu` and `slow` markers."""

import os

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False

# Triton reads TRITON_INTERPRET when a kernel is decorated, so it must be set before any kernel
# module is imported: on a CPU-only machine every @triton.jit kernel runs under the interpreter.
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "gpu" in item.keywords and not _HAS_CUDA:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
