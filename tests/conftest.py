"""Test setup: Triton's interpreter on CPU-only machines, `gpu` and `slow` markers.

The tests not marked `gpu` are written for the interpreter (what CI runs): many launch kernels on CPU tensors. Where
Triton compiles for a GPU instead (CUDA present, TRITON_INTERPRET unset), such a launch is refused by our entry points
(kernels.interpreter.NeedsInterpreter) or fails in Triton's launcher ("cannot be accessed from Triton (cpu
tensor?)"); those tests are reported as skipped with that reason rather than failed, so a whole-suite run on a GPU
machine shows the real failures. Run them there with TRITON_INTERPRET=1, or on a CPU machine; the GPU's own checks
are the `gpu` tests (`-m gpu`)."""

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

from flashscale.kernels.interpreter import NeedsInterpreter, interpreting  # noqa: E402  (after the variable is set)

_COMPILED = not interpreting()  # kernels compile for the GPU in this run
_CPU_TENSOR_LAUNCH = "cannot be accessed from Triton (cpu tensor?)"  # Triton's launcher on a CPU tensor


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


def _needs_interpreter(exc: BaseException | None) -> bool:
    """The failure, or an exception it was raised from (pytest.raises(match=...) meeting another error), is a CPU
    tensor refused by a kernel that compiles for the GPU."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, NeedsInterpreter) or _CPU_TENSOR_LAUNCH in str(exc):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """An interpreter test (not `gpu`) whose kernel got CPU tensors where Triton compiles for the GPU: skipped, with
    the reason, instead of failed (module docstring). Any other failure stays a failure."""
    outcome = yield
    rep = outcome.get_result()
    if (_COMPILED and call.when == "call" and rep.failed and "gpu" not in item.keywords and call.excinfo is not None
            and _needs_interpreter(call.excinfo.value)):
        rep.outcome = "skipped"
        rep.longrepr = (str(item.path), item.location[1] or 0,
                        "an interpreter test (its kernel got CPU tensors where Triton compiles for the GPU): run it "
                        "with TRITON_INTERPRET=1")
