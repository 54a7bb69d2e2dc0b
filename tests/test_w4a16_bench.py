"""benchmarks/w4a16.py's CPU-checkable parts."""

from bench_testutil import load_benchmark


def test_w4a16_merge_results_replaces_rows_of_the_same_m():
    """benchmarks/w4a16.py --merge-into: a run of some M replaces exactly those M's rows (every impl) and checks."""
    merge = load_benchmark("w4a16").merge_results
    row = lambda m, impl, us: dict(impl=impl, M=m, K=4096, N=4096, us=us)  # noqa: E731
    base = dict(gpu="a", date="old", note="n", rows=[row(1, "flashscale", 8.0), row(1, "bf16", 13.0),
                                                        row(16, "flashscale", 10.0), row(16, "bf16", 13.5)],
                checks=[dict(M=16, K=4096, N=4096, ok=True)], tuned={"k1": {"bm": 16}})
    new = dict(gpu="b", date="new", rows=[row(16, "bf16", 13.4), row(16, "flashscale", 9.6)],
               checks=[dict(M=16, K=4096, N=4096, ok=True, rel_err=1e-3)], tuned={"k2": {"bm": 64}})
    out = merge(base, new)
    assert [(r["M"], r["impl"], r["us"]) for r in out["rows"]] == [(1, "bf16", 13.0), (1, "flashscale", 8.0),
                                                                    (16, "bf16", 13.4), (16, "flashscale", 9.6)]
    assert out["checks"] == new["checks"] and out["tuned"] == {"k1": {"bm": 16}, "k2": {"bm": 64}}
    assert out["date"] == "new" and out["gpu"] == "b" and out["note"] == "n" and base["rows"][2]["us"] == 10.0


def test_w4a16_timed_rounds_interleaves_and_takes_the_median(monkeypatch):
    """--rounds: every implementation once a round, in order, and each row's time the median of its rounds."""
    mod = load_benchmark("w4a16")
    calls = []
    times = {"a": iter([(5.0, 50.0), (3.0, 30.0), (4.0, 40.0)]), "b": iter([(9.0, 90.0), (7.0, 70.0), (8.0, 80.0)])}

    def fake_bench(fn, warmup, rep):
        calls.append(fn)
        return next(times[fn])

    monkeypatch.setattr(mod, "bench", fake_bench)
    todo = [("ours", "a", 1, None), ("bf16", "b", 1, None)]
    out = mod.timed_rounds(todo, 3, 1, 1)
    assert calls == ["a", "b"] * 3
    assert out == [(4.0, 40.0, [5.0, 3.0, 4.0]), (8.0, 80.0, [9.0, 7.0, 8.0])]
