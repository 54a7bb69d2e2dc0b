"""The quantization benchmarks' --smoke modes (CPU): they run, check themselves, and write their JSON."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quant_quality_smoke(tmp_path):
    assert _load("quant_quality").main(["--smoke", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "quant-quality-smoke.json").read_text())
    assert {"gpu", "torch", "triton", "date", "rows", "checks"} <= set(res)
    methods = {(r["method"], r["bits"]) for r in res["rows"]}
    assert methods == {("float", 16)} | {(m, b) for m in ("rtn", "gptq", "gptq_act_order", "awq", "gptq_paper")
                                         for b in (4, 3)}
    for r in res["rows"]:
        assert {"model", "method", "bits", "group_size", "eval", "ppl", "seconds"} <= set(r)
        assert r["eval"] == "moby_dick" and math.isfinite(r["ppl"]) and r["ppl"] > 1
    # 4-bit: gptq, gptq_act_order, awq, gptq_paper; 3-bit: the GPTQs (AWQ's 3-bit has no criterion)
    assert len(res["checks"]) == 7
    weighting = {r["method"]: r.get("token_weighting") for r in res["rows"]}
    assert weighting == {"float": None, "rtn": None, "gptq": "attention", "gptq_act_order": "attention",
                         "awq": "attention", "gptq_paper": "uniform"}
    grids = {r["method"]: r.get("grid_search") for r in res["rows"]}
    assert grids == {"float": None, "rtn": None, "awq": None, "gptq": "hessian", "gptq_act_order": "hessian",
                     "gptq_paper": "minmax"}


def test_gptq_speed_smoke(tmp_path):
    assert _load("gptq_speed").main(["--smoke", "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "gptq-speed-smoke.json").read_text())["rows"]
    assert row["layers"] == 2 and row["seconds"] > 0 and row["peak_gpu_gb"] is None
    assert row["seconds_per_block"] == pytest.approx(row["seconds"] / 2, rel=0.5)
