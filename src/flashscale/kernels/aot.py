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


def sass_instructions(sass_text: str) -> list[tuple[int, str]]:
    """(address, instruction text without the trailing ';') of every instruction of a `cuobjdump -sass` listing."""
    pattern = r"/\*([0-9a-f]{4,})\*/\s+([^;]*);"
    return [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(pattern, sass_text)]


def sass_opcode(instruction: str) -> str:
    """The opcode with its modifiers ('MUFU.EX2', 'FFMA', ...) of one instruction, its predicate dropped."""
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0]


def branch_target(instruction: str) -> int | None:
    """The address a BRA instruction jumps to (None for any other instruction)."""
    m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)\s*$", instruction)
    return int(m.group(1), 16) if m else None


def sass_loops(ins: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """Every loop of a listing (sass_instructions): a backward BRA, as the instructions from its target to it."""
    loops = []
    for addr, text in ins:
        target = branch_target(text)
        if target is not None and target < addr:
            loops.append([x for x in ins if target <= x[0] <= addr])
    return loops


def sass_key_loops(sass_text: str, marker: str = "GMMA") -> list[list[tuple[int, str]]]:
    """The innermost loops whose body holds an instruction with `marker` in its opcode (the key loops of an
    attention kernel: one per consumer partition), each as its instructions from the back edge's target to the back
    edge. The out-of-line retry stubs of mbarrier waits also branch backwards, into the middle of a loop, from
    beyond the partition's EXIT: regions holding an EXIT are not loops."""
    loops = []
    for body in sass_loops(sass_instructions(sass_text)):
        ops = [sass_opcode(t) for _, t in body]
        if any(marker in o for o in ops) and "EXIT" not in ops:
            loops.append(body)
    return [b for b in loops if not any(o is not b and b[0][0] <= o[0][0] and o[-1][0] <= b[-1][0] for o in loops)]
