"""CPU tensors meeting kernels compiled for the GPU: the entry points' NeedsInterpreter, and conftest's rule that
reports such interpreter tests as skipped on a GPU machine (only those: any other failure stays a failure)."""

from __future__ import annotations

import importlib

import pytest
import torch

# decorated now, while conftest's TRITON_INTERPRET holds (a test below unsets it, and Triton reads it at decoration)
importlib.import_module("flashscale.kernels.w4a16")
from conftest import _needs_interpreter
from flashscale.kernels.interpreter import NeedsInterpreter, interpreting, require_launchable
from flashscale.kernels.w4a16_pack import pack_w4
from flashscale.ops import attention
from flashscale.ops.w4a16 import w4a16_linear


def _weight():
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (128, 32), generator=gen)
    return pack_w4(codes, torch.full((1, 32), 8), torch.rand(1, 32, generator=gen).half() * 0.01, group_size=128)


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("0", False), ("", False)])
def test_interpreting_reads_the_variable_as_triton_does(monkeypatch, value, on):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert interpreting() is on


def test_cpu_tensors_without_the_interpreter_are_refused_naming_the_argument(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    require_launchable(torch.zeros(2), "x", "f")  # the interpreter takes CPU tensors
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(NeedsInterpreter, match=r"w4a16_matmul: x2d is on cpu; .*TRITON_INTERPRET=1"):
        w4a16_linear(torch.randn(1, 128).half(), _weight(), impl="triton")
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(ValueError, match=r"attention\(impl='triton'\): q is on cpu"):
        attention(q, q, q, impl="triton")
    # the argument checks come first: they hold wherever the kernels run
    with pytest.raises(ValueError, match="one token"):
        w4a16_linear(torch.randn(2, 128).half(), _weight(), impl="gemv")


def test_the_rule_matches_refusals_and_nothing_else():
    assert _needs_interpreter(NeedsInterpreter("x"))
    assert _needs_interpreter(ValueError("Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)"))
    try:  # pytest.raises(match=...) meeting the refusal: an AssertionError raised while handling it
        with pytest.raises(ValueError, match="must be contiguous"):
            raise NeedsInterpreter("x2d is on cpu")
    except AssertionError as e:
        assert _needs_interpreter(e)
    assert not _needs_interpreter(AssertionError("max error 0.3 > 0.01"))
    assert not _needs_interpreter(ValueError("out must be float32"))
    assert not _needs_interpreter(None)
