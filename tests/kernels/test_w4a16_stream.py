"""Loads-only streaming probes of the packed W4A16 weights (flashscale.kernels.w4a16_stream, the s-* rows of
benchmarks/w4a16_probe.py; docs/w4a16_decode.md "Round 4").

CPU, Triton's interpreter: the plain-Triton ring kernel and the tensor-descriptor (TMA) kernel read every packed
word exactly once (the programs' XOR checksums XOR to that of the whole qweight, the probe's check) for both
views, every ring depth, persistent and one-program-a-box grids, on shapes whose boxes do not divide the
tensor (masked / zero-filled tails) and on ones they do; the probe's stream rows run end to end (timing
stubbed). The Gluon kernel cannot run under the interpreter: it is compiled only (GPU: the probe checks it).

sm_90, compiled ahead of time in a subprocess (no GPU needed): every config of the probe compiles without
spills or local memory; the plain kernel's loads are LDG.E.128 (no cp.async) and, by a static model of its
main loop's schedule (w4a16_stream.sass_load_rate), it keeps about RING boxes of loads in flight (a ring
rotated by register moves, or two boxes' XORs fused into one LOP3, would keep one); the TMA kernels issue
UTMALDG into a shared-memory ring of the configured depth, the Gluon consumer reads it with LDS.128.
"""

from __future__ import annotations

import json

import pytest
import torch
from bench_testutil import load_benchmark

from flashscale.kernels import w4a16_stream as WS
from flashscale.kernels.w4a16_pack import pack_w4
from offline_compile import compile_offline

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


def _probe():
    return load_benchmark("w4a16_probe")  # benchmarks/ on the path: the script imports its neighbour plotting.py


def _packed(k, n, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (k, n), generator=g, dtype=torch.uint8)
    zeros = torch.randint(0, 16, (k // 64, n), generator=g, dtype=torch.uint8)
    scales = (torch.rand(k // 64, n, generator=g) * 0.01 + 0.002).half()
    return pack_w4(codes, zeros, scales, group_size=64)


def _xor_words(q):
    r = 0
    for v in (q.reshape(-1).long() & 0xFFFFFFFF).tolist():
        r ^= v
    return r


# K x N -> qweight (N_pad/16, K_pad/64, 32, 4): 192 x 40 is (3, 3, 32, 4) (9 fragments: 4-fragment boxes leave a
# tail; fragment rows 3 against nb 2, 384 columns against kt 2's 256: both tails), 256 x 32 is (2, 4, 32, 4)
SHAPES = [(192, 40), (256, 32)]
VIEWS = [("flat", 4, 128), ("tile", 2, 256), ("tile", 1, 128)]


@pytest.mark.parametrize("kind,depths", [("triton", (1, 2, 3, 4)), ("tma", (2, 3))])
def test_every_word_once_interpreter(kind, depths):
    probe = _probe()
    for k, n in SHAPES:
        p = _packed(k, n, k + n)
        want = probe.xor_all(p.qweight)
        assert want & 0xFFFFFFFF == _xor_words(p.qweight)  # the probe's XOR of every word
        for view, br, bc in VIEWS:
            for st in depths:
                cfg = WS.StreamConfig(kind=kind, view=view, br=br, bc=bc, num_warps=1, stages=st)
                for per_sm in (0, 1, 2):
                    out = torch.zeros(64, dtype=torch.int32)
                    progs, _ = WS.launch(p, out, cfg, per_sm, 2)
                    assert progs == WS.stream_grid(p, cfg, per_sm, 2)[0]
                    assert probe.stream_check(out, progs, want), (k, n, cfg.label, per_sm)
                    assert not out[progs:].any()


def test_grid_and_views():
    p = _packed(192, 40, 1)
    flat = WS.StreamConfig(kind="triton", view="flat", br=4)
    tile = WS.StreamConfig(kind="triton", view="tile", br=2, bc=256)
    assert WS.view_of(p, flat)[1:] == (9, 128) and WS.stream_grid(p, flat, 0, 4) == (3, 3, 1)
    assert WS.view_of(p, tile)[1:] == (3, 384) and WS.stream_grid(p, tile, 0, 4) == (4, 4, 2)
    assert WS.stream_grid(p, tile, 1, 3) == (3, 4, 2) and WS.stream_grid(p, tile, 4, 3) == (4, 4, 2)
    # a view is the same memory, and the tile view's box is the decode kernel's item (BN / 16 rows x KT fragments)
    assert WS.view_of(p, tile)[0].data_ptr() == p.qweight.data_ptr()
    dec = WS.StreamConfig(kind="gluon", view="tile", br=16, bc=256)
    assert dec.box_bytes == 256 * 128 // 2 and dec.label.startswith("tile nb16 kt2 (16 KB)")


def test_bytes_in_flight_and_residency():
    by = {c.label + c.kind: c for c in WS.all_configs()}
    assert len(by) == len(WS.all_configs())
    for c in WS.all_configs():
        assert c.per_sm_options(), c
        for p in c.per_sm_options():
            assert c.in_flight_kb(p) > 0
            assert p == 0 or c.smem_bytes() * p <= WS.SMEM_PER_SM
    g = WS.StreamConfig(kind="gluon", view="flat", br=32, stages=6)
    assert g.per_sm_options() == [1] and g.in_flight_kb(1) == 96
    t = WS.StreamConfig(kind="tma", view="flat", br=32, stages=5)
    assert t.in_flight_kb(2) == 2 * 4 * 16 and t.smem_bytes() >= 4 * 16384
    r = WS.StreamConfig(kind="triton", view="flat", br=16, stages=4)
    assert r.in_flight_kb(4) == 4 * 4 * 8
    assert r.per_sm_options(regs=126) == [1, 2, 4] and r.per_sm_options(regs=200) == [1, 2]


def test_probe_stream_rows_interpreter(monkeypatch):
    """run_streams end to end on the CPU (graph timing stubbed: each call launched once), --kinds filtering,
    and the compile jobs the filter leaves."""
    probe = _probe()
    small = {"triton": [WS.StreamConfig(kind="triton", view="flat", br=4, num_warps=1, stages=2, nonpersistent=True),
                        WS.StreamConfig(kind="triton", view="tile", br=2, bc=256, num_warps=1, stages=3)],
             "tma": [WS.StreamConfig(kind="tma", view="tile", br=2, bc=256, num_warps=1, stages=3)],
             "gluon": WS.STREAM_CONFIGS["gluon"]}
    monkeypatch.setattr(WS, "STREAM_CONFIGS", small)

    def fake_graph(calls, n, reps=10):
        for c in calls:
            c()
        return 1.0

    monkeypatch.setattr(probe, "graph_us", fake_graph)
    ctx = probe.Ctx(100.0, ["s-triton", "s-tma"])
    assert ctx.want("s-tma") and not ctx.want("c-gemv", "e-bf16") and not ctx.want(*probe.PER_M_KINDS)
    p = _packed(192, 40, 3)
    packs = [p, WS.PackedW4(qweight=p.qweight.clone(), sz=p.sz, perm=None, in_features=192, out_features=40,
                            group_size=64)]

    def row(**kw):
        kw.update(K=192, N=40)
        nb = kw.pop("nbytes", 0)
        if kw.get("us") is not None:
            kw["TBps"] = nb / kw["us"] * 1e-6
        ctx.rows.append(kw)

    probe.run_streams(ctx, 192, 40, packs, 2, row, lambda what: False)
    assert not ctx.errors and ctx.bad == 0, ctx.errors
    kinds = [r["kind"] for r in ctx.rows]
    assert set(kinds) == {"s-triton", "s-tma"} and all(r["ok"] for r in ctx.rows)
    assert sorted(r["split"] for r in ctx.rows if r["label"].startswith("flat")) == [0, 1, 2, 4]
    assert all(r["TBps"] == pytest.approx(p.qweight.numel() * 4e-6) and r["in_flight_kb"] > 0 for r in ctx.rows)
    jobs = probe.compile_jobs(ctx)
    assert [j["kind"] for j in jobs] == ["stream"] * 3
    assert len(probe.compile_jobs(probe.Ctx(1.0, ["e-copy", "a-dec"]))) > 3  # per-M kinds bring their kernels
    with pytest.raises(SystemExit):
        probe.main(["--kinds", "s-triton,s-nope"])


# ---- sm_90, ahead of time (a fresh interpreter: tests/conftest.py sets TRITON_INTERPRET=1 on CPU machines)

_COMPILE = """
import json, sys
from flashscale.kernels import w4a16_stream as WS
json.dump([WS.census(c) for c in WS.all_configs()], open(sys.argv[1], "w"))
"""


@pytest.fixture(scope="module")
def census(tmp_path_factory):
    pytest.importorskip("triton.compiler")
    out = tmp_path_factory.mktemp("stream_sm90") / "census.json"
    compile_offline(_COMPILE, str(out))
    return json.loads(out.read_text())


def test_every_config_compiles_without_spills(census):
    assert len(census) == len(WS.all_configs())
    assert {r["kind"] for r in census} == ({"triton", "tma", "gluon"} if WS.HAS_GLUON else {"triton", "tma"})
    for r in census:
        assert r["spill_stores"] == r["spill_loads"] == r["stack"] == r["local"] == 0, r["label"]
        assert r["registers"] <= 255
        assert r["shared"] <= WS.SMEM_PER_BLOCK, r["label"]


def test_plain_kernel_ldg128_ring(census):
    for r in (r for r in census if r["kind"] == "triton"):
        c = WS.StreamConfig(**r["config"])
        per_box = c.box_bytes // (16 * 32 * c.num_warps)  # 16-byte loads a thread a box
        assert r["ldg_other"] == r["ldgsts"] == r["utmaldg"] == 0, r["label"]
        assert r["ldg_per_iter"] == c.stages * per_box, r["label"]  # the main loop: RING boxes of LDG.E.128
        assert r["ldg128"] == 2 * c.stages * per_box, r["label"]  # + the prologue's
        # the ring holds: ~RING boxes in flight while the loop waits (1000-cycle latency; loop overhead aside)
        assert r["loads_in_flight"] >= 0.75 * c.stages * per_box, (r["label"], r["loads_in_flight"])
        assert all(p <= c.resident(r["registers"], r["shared"]) for p in r["per_sm_options"] if p)


def test_tma_kernels_ring_in_shared_memory(census):
    for r in (r for r in census if r["kind"] in ("tma", "gluon")):
        c = WS.StreamConfig(**r["config"])
        assert r["utmaldg"] >= 1 and r["ldg128"] == r["ldgsts"] == 0, r["label"]
        slots = c.stages - 1 if c.kind == "tma" else c.stages  # Triton's pipeliner: num_stages - 1 buffers
        assert slots * c.box_bytes <= r["shared"] <= c.smem_bytes(), (r["label"], r["shared"])
        assert r["lds128"] * 16 * 32 * c.num_warps >= c.box_bytes, r["label"]  # the box read back 16 B a thread
