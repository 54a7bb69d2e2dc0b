"""benchmarks/attention.py's CPU-checkable parts: the results file is written atomically after every group, marked
incomplete until the last, so a run cut by a time limit keeps the groups it measured."""

import argparse
import json
from bench_testutil import load_benchmark

bench = load_benchmark("attention")


def test_results_written_per_group_atomically(tmp_path):
    args = argparse.Namespace(out=str(tmp_path / "res"), tune=False, rounds=3, short_max=2048)
    row = dict(impl="flashscale", **{"pass": "fwd"}, hdim=64, causal=False, seqlen=1024, tflops=1.0)
    path = bench._write(args, "NVIDIA H200", "3.6.0", [row], [], [], {}, done=False)
    assert path == tmp_path / "res" / "attention-h200.json"
    first = json.loads(path.read_text())
    assert first["complete"] is False and first["rows"] == [row]
    assert {"gpu", "torch", "triton", "date", "rows"} <= set(first)
    path = bench._write(args, "NVIDIA H200", "3.6.0", [row, dict(row, hdim=128)], [], ["x"], {}, done=True)
    last = json.loads(path.read_text())
    assert last["complete"] is True and len(last["rows"]) == 2 and last["errors"] == ["x"]
    assert [p.name for p in path.parent.iterdir()] == ["attention-h200.json"]  # no temporary file left behind


def test_groups_cover_every_head_dim_both_ways():
    args = argparse.Namespace(hdims=[64, 128])
    assert bench._groups(args) == [(64, False), (64, True), (128, False), (128, True)]
