"""Running a compile script for sm_90 without a GPU (Triton ships ptxas): in a fresh interpreter, because
tests/conftest.py sets TRITON_INTERPRET=1 on CPU machines and Triton reads it when a kernel is decorated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def run_offline(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -c script args...` without TRITON_INTERPRET, src first on the path; output captured."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def compile_offline(script: str, *args: str, timeout: int = 300, what: str = "sm_90 compile") -> None:
    """run_offline, asserting it succeeded (the end of its stderr in the message)."""
    proc = run_offline(script, *args, timeout=timeout)
    assert proc.returncode == 0, f"{what} failed:\n{proc.stderr[-4000:]}"
