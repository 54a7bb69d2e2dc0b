"""The quantization benchmarks' --smoke modes (CPU): they run, check themselves, and write their JSON."""

import json
import math

import pytest
from bench_testutil import load_benchmark


def _load(name):
    return load_benchmark(name)


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
    for r in res["rows"]:  # the halves are the whole's windows: its perplexity is their token-weighted mean NLL
        a, b = r["ppl_halves"]
        assert min(a, b) <= r["ppl"] <= max(a, b)
    assert {r["method"]: r.get("options") for r in res["rows"]}["gptq_paper"] == {"token_weighting": "uniform",
                                                                                   "grid_search": "minmax"}


def test_quant_quality_eval_halves_are_the_whole():
    """eval_ppl's whole-text perplexity equals one perplexity() over the text; its halves split at a window."""
    import torch

    from flashscale.models import Llama, preset
    from flashscale.train.evaluate import perplexity

    qq = _load("quant_quality")
    model = Llama(preset("tiny")).init_weights(seed=0).eval()
    ids = torch.randint(0, model.config.vocab_size, (1000,), generator=torch.Generator().manual_seed(0))
    ppl, _, (a, b) = qq.eval_ppl(model, ids, 64, torch.device("cpu"))
    whole = perplexity(model, ids, window=64, device="cpu")["ppl"]
    assert ppl == pytest.approx(whole, rel=1e-5)  # other batches of windows: float32 rounding only
    assert a == pytest.approx(perplexity(model, ids[:448], window=64, device="cpu")["ppl"], rel=1e-12)
    assert b == pytest.approx(perplexity(model, ids[448:], window=64, device="cpu")["ppl"], rel=1e-12)


def test_gptq_speed_smoke(tmp_path):
    assert _load("gptq_speed").main(["--smoke", "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "gptq-speed-smoke.json").read_text())["rows"]
    assert row["layers"] == 2 and row["seconds"] > 0 and row["peak_gpu_gb"] is None
    assert row["seconds_per_block"] == pytest.approx(row["seconds"] / 2, rel=0.5)


def test_quant_quality_merge(tmp_path):
    """--merge: rows of one file per device call -> one table; a later file's cell replaces an earlier one's,
    one float row per model, the criteria recomputed over the merged rows."""
    def row(method, bits, group, ppl, model="m"):
        return dict(model=model, method=method, bits=bits, group_size=group, eval="moby_dick", ppl=ppl, seconds=1.0)

    head = dict(gpu="g", torch="t", triton="3.6.0", date="2026-12-02")
    a = dict(head, rows=[row("float", 16, None, 10.0), row("rtn", 4, 64, 14.0), row("gptq", 4, 64, 13.0)], checks=[])
    b = dict(head, rows=[row("float", 16, None, 10.0), row("gptq", 4, 64, 11.0), row("rtn", 3, 64, 22.0),
                         row("gptq", 3, 64, 13.0)], checks=[])
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    mod = _load("quant_quality")
    assert mod.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path),
                     "--name", "merged"]) == 0
    res = json.loads((tmp_path / "merged.json").read_text())
    assert sorted((r["method"], r["bits"], r["ppl"]) for r in res["rows"]) == [
        ("float", 16, 10.0), ("gptq", 3, 13.0), ("gptq", 4, 11.0), ("rtn", 3, 22.0), ("rtn", 4, 14.0)]
    checks = {(c["method"], c["bits"]): (round(c["ratio"], 6), c["passed"]) for c in res["checks"]}
    assert checks == {("gptq", 4): (0.25, True), ("gptq", 3): (0.25, True)}
    assert res["merged_from"] == ["a.json", "b.json"] and not (tmp_path / "merged.json.tmp").exists()
    with pytest.raises(SystemExit, match="is not a file"):
        mod.main(["--merge", str(tmp_path / "missing.json"), "--out", str(tmp_path)])
