"""The Gluon W4A16 GEMM (w4a16_wgmma.py) compiles for sm_90 without a GPU for every candidate config, and the
machine code has what the design promises: no spills or local memory, SMEM within a block's limit, setmaxnreg,
8 HGMMA (BK / 16) a consumer loop step with the packed words in 2 LDS.128, no STS in the loop (the A tile never
goes through shared memory), and the unpack (LOP3 / SHF / FFMA / F2FP) between the group's first async HGMMA
issue and its wait (WARPGROUP.DEPBAR): the dequantization overlaps the MMA. N and K are runtime arguments
(not specialized), so one compile stands for 8192x8192 and 8192x28672 (bf16, G = 128)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

wg = pytest.importorskip("flashscale.kernels.w4a16_wgmma")
if not wg.HAS_GLUON:
    pytest.skip("this triton has no Gluon warp_specialize", allow_module_level=True)

# Compiled in a fresh interpreter: tests/conftest.py sets TRITON_INTERPRET=1 on CPU machines.
_COMPILE = """
import json, sys
from flashscale.kernels import w4a16_wgmma as wg
json.dump([wg.census(c) for c in wg.all_candidates()] + [wg.census(wg.all_candidates()[0], group_size=64, bias=True,
          dtype=__import__("torch").float16)], open(sys.argv[1], "w"))
"""


@pytest.fixture(scope="module")
def census(tmp_path_factory):
    out = tmp_path_factory.mktemp("w4a16_wgmma_sm90") / "census.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _COMPILE, str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode and "get_ptxas" in proc.stderr:
        pytest.skip("no sm_90 toolchain (ptxas) in this triton")
    assert proc.returncode == 0, f"sm_90 compile failed:\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def test_every_candidate_compiles_without_spills(census):
    assert len(census) == len(wg.all_candidates()) + 1
    bad = [(r["config"], r["spill_stores"], r["spill_loads"], r["stack"], r["local"]) for r in census
           if r["spill_stores"] or r["spill_loads"] or r["stack"] or r["local"]]
    assert not bad, bad
    assert all(r["shared"] <= wg.SMEM_LIMIT for r in census)
    assert all(24 in r["setmaxnreg"] for r in census), "the producer warp keeps its registers"


def test_main_loop_machine_code(census):
    for r in census:
        cons = 2 if "bn128" in r["config"] else 1
        assert len(r["loops"]) == cons, (r["config"], len(r["loops"]))  # one key loop a consumer partition
        for lp in r["loops"]:
            assert lp["hgmma"] == 8, r["config"]  # BK / 16 wgmma a step
            assert lp["lds128"] == 2, r["config"]  # 8 packed words a thread a step, 16 bytes a load
            assert lp["sts"] == 0, r["config"]  # no layout conversion through shared memory
            assert lp["dequant"]["LOP3"] >= 64 and lp["dequant"]["FFMA"] >= 64, r["config"]
            # the overlap: >= 80 % of the unpack sits between the first HGMMA issue and the wait
            assert lp["dequant_between_issue_and_wait"] >= 0.8 * lp["dequant_total"], (r["config"], lp)
            assert not r["serialized"], r["config"]
