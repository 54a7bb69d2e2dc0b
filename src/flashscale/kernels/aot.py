"""What ptxas and cuobjdump say of a kernel compiled ahead of time for sm_90 (no GPU needed: Triton
ships both tools). Used by the compile tests and the census/report tools of the kernels."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile


def _tool(name: str) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path  # Triton's ptxas (or TRITON_PTXAS_PATH); cuobjdump ships beside it
    return ptxas if name == "ptxas" else os.path.join(os.path.dirname(ptxas), name)


def ptxas_stats(ptx: str, arch: str = "sm_90a") -> dict:
    """Registers, spill bytes and stack frame as `ptxas -v` reports them for this PTX (Triton runs ptxas
    with -v too but drops the log): {'registers', 'spill_stores', 'spill_loads', 'stack', 'log'}."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        res = subprocess.run([_tool("ptxas"), "-v", f"--gpu-name={arch}", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True)
    log = res.stdout + res.stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    if regs is None or spill is None or stack is None:
        raise RuntimeError(f"unexpected ptxas -v output:\n{log}")
    return {"registers": int(regs.group(1)), "spill_stores": int(spill.group(1)), "spill_loads": int(spill.group(2)),
            "stack": int(stack.group(1)), "log": log}


def sass(cubin: bytes) -> str:
    """`cuobjdump -sass` of a cubin."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([_tool("cuobjdump"), "-sass", path], capture_output=True, text=True, check=True).stdout
