"""benchmarks/multigpu.py (issue 9's script) end to end on the CPU: two processes under torchrun with gloo
(--smoke shapes), then --merge into the results format. What the multi-GPU runs will use, checked where CI can:
every parity layout of world size 2 (dp with ZeRO 0-3, tp with and without sequence parallelism, pp with GPipe,
1F1B and interleaved) within the float32 tolerance of the single-process run, the scaling rows of each layout and of
torch's FSDP2 beside them, and a results file with the fields the issue names."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _parallel_harness as H  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "multigpu.py"
CPU = {"CUDA_VISIBLE_DEVICES": ""}  # gloo on the CPU on any machine
ROW_FIELDS = {"impl", "model", "gpus", "layout", "tokens_per_s_per_gpu", "mfu", "peak_mem_gb", "predicted_peak_gb",
              "max_loss_rel_diff", "bubble_measured", "bubble_formula"}


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multigpu")
    H.torchrun([str(SCRIPT), "--smoke", "--tmp", str(tmp / "parts")], ROOT, env=CPU)
    files = list((tmp / "parts").glob("part-2*.json"))
    assert len(files) == 1, files
    return tmp, json.loads(files[0].read_text())


def test_parity_of_every_layout_at_world_size_2(part):
    _, d = part
    assert d["world"] == 2
    parity = [r for r in d["rows"] if r["part"] == "parity" and r["impl"] == "flashscale"]
    layouts = {r["layout"] for r in parity}
    for want in ("dp2-tp1-pp1-zero0", "dp2-tp1-pp1-zero1", "dp2-tp1-pp1-zero2", "dp2-tp1-pp1-zero3",
                 "dp1-tp2-pp1-zero1", "dp1-tp2-pp1-zero1-sp", "dp1-tp1-pp2-zero1-gpipe", "dp1-tp1-pp2-zero1-1f1b",
                 "dp1-tp1-pp2-zero1-interleavedv2"):
        assert want in layouts, (want, sorted(layouts))
    for r in parity:
        assert r["passed"] and r["max_loss_rel_diff"] <= r["tolerance"], r
        assert r["max_loss_rel_diff_fp32"] <= 1e-5, r
        assert r["loss_last"] < r["loss_first"], r  # the synthetic bigram stream is learnable: the loss falls


def test_scaling_rows_beside_fsdp2_and_merge_format(part):
    tmp, d = part
    scaling = [r for r in d["rows"] if r["part"] == "scaling"]
    assert {r["impl"] for r in scaling} == {"flashscale", "fsdp2"}
    assert all(r["gpus"] == 2 and r["tokens_per_s_per_gpu"] > 0 for r in scaling), scaling
    out = tmp / "results"
    subprocess.run([sys.executable, str(SCRIPT), "--merge", str(tmp / "parts"), "--kind", "cpu-smoke", "--out",
                    str(out)], cwd=ROOT, env=dict(os.environ, **CPU), check=True, capture_output=True, timeout=300)
    res = json.loads((out / "multigpu-cpu-smoke.json").read_text())
    assert {"gpu", "torch", "triton", "date", "rows"} <= set(res)
    assert len(res["rows"]) == len(d["rows"])
    for r in res["rows"]:
        assert ROW_FIELDS <= set(r), sorted(ROW_FIELDS - set(r))
    if importlib.util.find_spec("matplotlib") is not None:  # the test install has none; --merge skips the plot then
        assert (out / "multigpu-cpu-smoke.png").stat().st_size > 0
