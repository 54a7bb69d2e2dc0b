"""benchmarks/decode_step_trace.py's analysis (CPU, synthetic stamps): each launch measured against the previous
launch's last end, medians over layers, the late starters and the last tenth's figures."""


import pytest
import torch
from bench_testutil import load_benchmark


def _load():
    return load_benchmark("decode_step_trace")


def test_analyse_synthetic_step():
    mod = _load()
    layers, progs = 3, 20
    tr = torch.zeros(layers + 1, 5, 64, 16, dtype=torch.int64)
    t = 10_000_000  # ns
    for i in range(layers):
        for j in range(5):
            prev = t
            for p in range(progs):
                late = p == progs - 1  # one program starts 1 us after the previous launch ended, and ends last
                row = tr[i, j, p]
                row[0] = prev + (1000 if late else -2000)
                row[8] = prev + 500 + (1000 if late else 0)
                row[5] = prev + 4000 + (3000 if late else p)
                row[7] = 5 + late
                if j != 1:  # a ring GEMV: prologue 800 ns, first item 1 us
                    row[9], row[10] = row[8] + 800, row[8] + 1800
            t = prev + 7000
    tr[layers, 0, :4, 0] = t - 1000
    tr[layers, 0, :4, 8] = t + 300
    tr[layers, 0, :4, 9] = t + 600
    tr[layers, 0, :4, 10] = t + 900
    tr[layers, 0, :4, 5] = t + 5000
    per, kinds = mod.analyse(tr)
    assert len(per) == 5 * layers + 1 and per[-1]["launch"] == "head"
    assert "raw" in per[5] and len(per[5]["raw"]) == progs  # layer 1 in full
    o = next(k for k in kinds if k["launch"] == "o")
    assert o["calls"] == layers and o["programs"] == progs
    assert abs(o["span"] - 7.0) < 1e-6 and abs(o["wait"] - 0.5) < 1e-6 and abs(o["pro"] - 0.8) < 1e-6
    assert abs(o["first"] - 1.0) < 1e-6 and abs(o["lead"] + 2.0) < 1e-6 and abs(o["start_max"] - 1.0) < 1e-6
    assert abs(o["late"] - 1 / progs) < 1e-6 and o["tail_late"] > 0 and o["tail_items"] > 0
    assert abs(o["tail"] - (7.0 - 4.0095)) < 1e-3  # the late program's end against the median end
    attn = next(k for k in kinds if k["launch"] == "attn")
    assert "pro" not in attn and abs(attn["span"] - 7.0) < 1e-6
    head = next(k for k in kinds if k["launch"] == "head")
    assert head["calls"] == 1 and abs(head["span"] - 5.0) < 1e-6 and abs(head["lead"] + 1.0) < 1e-6


def test_raw_stats_tells_index_from_sm():
    """raw_stats: programs slow by index in both layers (SMs shuffled between them) correlate by index, not by SM;
    the thirds' mean ends are the last third's delay."""
    mod = _load()
    gen = torch.Generator().manual_seed(0)
    launches = []
    for layer in (1, 16):
        sms = torch.randperm(30, generator=gen).tolist()
        raw = [[-1.0, 0.5, 1.0, 2.0, 5.0 + (2.0 if p >= 20 else 0.0) + 0.01 * p, float(sms[p]), 4] for p in range(30)]
        launches.append(dict(layer=layer, launch="qkv", raw=raw))
    (r,) = mod.raw_stats(dict(launches=launches))
    assert r["launch"] == "qkv" and r["layers"] == [1, 16]
    assert r["by_index"] > 0.99 and abs(r["by_sm"]) < 0.6
    assert r["thirds_end"][0] == pytest.approx([5.045, 5.145, 7.245])
