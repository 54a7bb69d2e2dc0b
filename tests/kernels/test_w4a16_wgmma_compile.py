"""The Gluon W4A16 GEMM (w4a16_wgmma.py) compiles for sm_90 without a GPU for every candidate config, and the
machine code has what the design promises: no spills or local memory, SMEM within a block's limit, setmaxnreg,
BK / 16 HGMMA a consumer loop step with the packed words in BK / 64 LDS.128, no STS in the loop (the A tile never
goes through shared memory), the unpack (LOP3 / SHF / FFMA / F2FP) issued while a wgmma group is in flight (the
dequantization overlaps the MMA), and for one consumer warpgroup (loop unrolled by two) no register moves. N and K are runtime arguments
(not specialized), so one compile stands for 8192x8192 and 8192x28672 (bf16, G = 128)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from offline_compile import run_offline

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


def _census(tmp_path_factory, script: str, name: str) -> list[dict]:
    out = tmp_path_factory.mktemp(name) / "census.json"
    proc = run_offline(script, str(out))
    if proc.returncode and "get_ptxas" in proc.stderr:
        pytest.skip("no sm_90 toolchain (ptxas) in this triton")
    assert proc.returncode == 0, f"sm_90 compile failed:\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def census(tmp_path_factory):
    return _census(tmp_path_factory, _COMPILE, "w4a16_wgmma_sm90")


def test_every_candidate_compiles_without_spills(census):
    assert len(census) == len(wg.all_candidates()) + 1
    bad = [(r["config"], r["spill_stores"], r["spill_loads"], r["stack"], r["local"]) for r in census
           if r["spill_stores"] or r["spill_loads"] or r["stack"] or r["local"]]
    assert not bad, bad
    assert all(r["shared"] <= wg.SMEM_LIMIT for r in census)
    assert all(24 in r["setmaxnreg"] for r in census), "the producer warp keeps its registers"


def test_main_loop_machine_code(census):
    for r in census:
        # one key loop a consumer partition; two with a stream-K tail (whole tiles, then the tail's segments)
        assert len(r["loops"]) == r["consumers"] * (2 if r["stream_k"] else 1), (r["config"], len(r["loops"]))
        assert not r["serialized"], r["config"]
        for lp in r["loops"]:
            # one consumer: the loop is unrolled by two (two K steps a body); two: one step a body
            assert lp["steps"] == (2 if r["consumers"] == 1 else 1), (r["config"], lp["steps"])
            f = r["features"] // 64  # 64-feature row blocks a consumer
            assert lp["hgmma"] == f * lp["steps"] * r["bk"] // 16, r["config"]  # BK / 16 wgmma a step and block
            assert lp["lds128"] == f * lp["steps"] * r["bk"] // 64, r["config"]  # 16 bytes of packed words a load
            assert lp["sts"] == 0, r["config"]  # no layout conversion through shared memory
            assert lp["dequant"]["LOP3"] >= 32 * f * lp["steps"] * r["bk"] // 64, r["config"]
            assert lp["dequant"]["FFMA"] >= 32 * f * lp["steps"] * r["bk"] // 64, r["config"]
            # the overlap: >= 80 % of the unpack is issued while a wgmma group is in flight. Not asked of two
            # consumers at bm256 without turns: ptxas puts each consumer's wgmma wait before its unpack there
            # (0-15 of 96 overlap), so the unpack of one warpgroup overlaps the other's MMA instead (measured the
            # fastest at M >= 1024 all the same; with turns, `-pp`, the unpack is under its own wgmma: checked)
            if not (r["consumers"] == 2 and r["bm"] == 256 and not r["pingpong"]):
                assert lp["dequant_between_issue_and_wait"] >= 0.8 * lp["dequant_total"], (r["config"], lp)
            if r["consumers"] == 1:  # the A buffers alternate by position: no loop-carried register copies
                assert lp["moves"] == 0, (r["config"], lp["moves"])


def test_large_token_tiles_are_candidates():
    labels = {c.label() for c in wg.candidates(1 << 20)}
    assert {"bm128-bn64-bk128-s4", "bm128-bn128-bk128-s4", "bm256-bn64-bk128-s3", "bm256-bn64-bk64-s6"} <= labels
    assert {"bm128-bn64-bk128-s4", "bm128-bn128-bk128-s4"} <= {c.label() for c in wg.candidates(256)}


# The packed 16-bit unpack (h2=True, kernels/w4a16_h2.py) on the 64-token candidates, the large-M pick, fp16, and
# group 64 with bias.
_COMPILE_H2 = """
import dataclasses, json, sys, torch
from flashscale.kernels import w4a16_wgmma as wg
cs = [dataclasses.replace(c, h2=True) for c in wg.candidates(64) + [wg.candidates(4096)[0]]]
rows = [wg.census(c) for c in cs]
rows.append(wg.census(cs[3], dtype=torch.float16))
rows.append(wg.census(cs[1], group_size=64, bias=True))
C = wg.WgmmaConfig
rows += [wg.census(C(bm=64, consumers=1, features=128, bk=64, stages=8)),
         wg.census(C(bm=32, consumers=1, features=128, bk=128, stages=8, h2=True)),
         wg.census(C(bm=64, consumers=1, bk=64, stages=6, ctas=2)),
         wg.census(C(bm=64, consumers=1, features=128, bk=64, stages=8, ctas=2, h2=True)),
         wg.census(C(bm=16, consumers=1, bk=128, stages=8, ctas=3, h2=True)),
         wg.census(C(bm=16, consumers=1, bk=64, stages=8, ctas=4))]
json.dump(rows, open(sys.argv[1], "w"))
"""


@pytest.fixture(scope="module")
def census_h2(tmp_path_factory):
    return _census(tmp_path_factory, _COMPILE_H2, "w4a16_wgmma_h2")


def test_h2_unpack_machine_code(census_h2):
    """Per packed word (8 weights): 1 SHF, 4 PRMT, 4 LOP3 and 4 HADD2 + 4 HMUL2 (+ 4 HFMA2 for bf16), no F2FP,
    no FFMA beyond the per-row constants: the pairs come out of the asm as A-fragment registers. Spill-free, and
    the unpack issued while a wgmma group is in flight as in the fp32 path."""
    for r in census_h2:
        if not r["config"].endswith("-h2"):
            continue
        assert not (r["spill_stores"] or r["spill_loads"] or r["stack"] or r["local"]), r
        for lp in r["loops"]:
            words = lp["steps"] * r["bk"] * r["features"] // 1024  # features x BK / 128 threads / 8 a word, a step
            d = lp["dequant"]
            assert d["HADD2"] == d["HMUL2"] == 4 * words, (r["config"], d, words)
            assert d["HFMA2"] == (0 if r.get("fp16") else 4 * words), (r["config"], d)
            assert d["F2FP"] == 0 and d["FFMA"] <= 4 * lp["steps"], (r["config"], d)
            assert 4 * words <= d["LOP3"] <= 4 * words + 12 * lp["steps"], (r["config"], d)  # + constants
            # one consumer: all of it under the wgmma (289 / 289 at bm64); two, persistent: 125-138 / 144. The plain
            # two-consumer loop (wait(0), one tile a program): ptxas sinks a third or more of A_{j+1}'s packed ops
            # below the try-wait loop and the wgmma wait (session 38, bf16 100 / 146, fp16 46 / 112), which it does
            # not do to the fp32 unpack's last ops (F2FP, 151 / 184): a cost on the critical path, timed on the GPU
            share = 0.95 if r["consumers"] == 1 else 0.8 if r["config"].count("persist") else 0.35
            assert lp["dequant_between_issue_and_wait"] >= share * lp["dequant_total"], (r["config"], lp)
            if r["consumers"] == 1:
                assert lp["moves"] <= (r["bm"] == 16), (r["config"], lp["moves"])  # bm16 h2: one MOV


def test_one_consumer_of_128_features(census_h2):
    """features=128 (one consumer, two wgmma row blocks on each x tile): spill-free and not serialized where
    config_error lets it compile (bm + bk <= 160), twice the HGMMA and LDS.128 of a 64-feature step, the A tiles
    converted in registers (no STS, no moves), the whole unpack under the wgmma."""
    rows = [r for r in census_h2 if "-f128" in r["config"]]
    assert len(rows) >= 3
    for r in rows:
        assert not (r["spill_stores"] or r["spill_loads"] or r["stack"] or r["local"] or r["serialized"]), r
        (lp,) = r["loops"]
        assert r["features"] == 128 and lp["steps"] == 2 and lp["hgmma"] == 2 * 2 * r["bk"] // 16, (r["config"], lp)
        assert lp["lds128"] == 2 * 2 * r["bk"] // 64 and lp["sts"] == 0 and lp["moves"] == 0, (r["config"], lp)
        assert lp["dequant_between_issue_and_wait"] >= 0.95 * lp["dequant_total"], (r["config"], lp)
    bad = wg.config_error(wg.WgmmaConfig(bm=64, consumers=1, features=128, bk=128))
    assert "bm + bk <= 160" in bad
    assert "features=128 takes consumers=1" in wg.config_error(wg.WgmmaConfig(bm=64, consumers=2, features=128, bk=64))
    assert "features=96" in wg.config_error(wg.WgmmaConfig(bm=64, consumers=1, features=96))
    assert wg.WgmmaConfig(bm=64, consumers=1, features=128, bk=64).label() == "bm64-bn128-bk64-s4-f128"


def test_two_to_four_blocks_an_sm(census_h2):
    """ctas=2 / 3 / 4 (one consumer): 128 / 80 / 64 registers a thread at launch (ctas blocks x 8 warps fill the SM's
    64 K), the consumer raised to 232 / 136 / 104 and the producer lowered to 24 by setmaxnreg, spill-free and
    unserialized at that budget, at most 1 / ctas of an SM's shared memory a block; the loop as the one-block
    kernel's (no STS, no moves, the unpack under the wgmma)."""
    rows = [r for r in census_h2 if any(f"-x{c}" in r["config"] for c in (2, 3, 4))]
    assert len(rows) >= 4
    for r in rows:
        ctas = next(c for c in (2, 3, 4) if f"-x{c}" in r["config"])
        assert r["registers"] == wg.CTA_MAXNREG[ctas], r
        assert {24, 2 * wg.CTA_MAXNREG[ctas] - 24} <= set(r["setmaxnreg"]), r
        assert not (r["spill_stores"] or r["spill_loads"] or r["stack"] or r["local"] or r["serialized"]), r
        assert r["shared"] <= wg.SMEM_PER_SM // ctas - 1024, r
        (lp,) = r["loops"]
        assert lp["sts"] == 0 and lp["moves"] <= (r["bm"] == 16), (r["config"], lp)
        assert lp["dequant_between_issue_and_wait"] >= 0.95 * lp["dequant_total"], (r["config"], lp)
    C = wg.WgmmaConfig
    assert "ctas=2 takes consumers=1" in wg.config_error(C(bm=64, consumers=2, ctas=2))
    assert "1 / 2 of an SM" in wg.config_error(C(bm=64, consumers=1, stages=8, ctas=2))
    assert "ctas=3 takes bm=16" in wg.config_error(C(bm=64, consumers=1, stages=2, ctas=3))
    assert "ctas=4 takes bm=16 and bk=64" in wg.config_error(C(bm=16, consumers=1, stages=2, ctas=4))
    assert "1, 2, 3 or 4" in wg.config_error(C(bm=16, consumers=1, ctas=5))
    assert "bm + bk <= 128 at ctas=2" in wg.config_error(C(bm=16, consumers=1, features=128, stages=4, ctas=2))
    assert wg.launch_options(C(bm=64, consumers=1, ctas=2)) == {"maxnreg": 128}
    assert wg.launch_options(C(bm=16, consumers=1, ctas=3)) == {"maxnreg": 80}
    assert wg.launch_options(C(bm=64, consumers=1)) == {}


# vec_y=True (y by 16-byte stores after an in-warp layout conversion) on the M > 256 leaders, a 64-token and a
# two-blocks-an-SM candidate, fp16 with bias and G = 64
_COMPILE_VY = """
import dataclasses, json, sys, torch
from flashscale.kernels import w4a16_wgmma as wg
cs = [dataclasses.replace(c, vec_y=True)
      for c in wg.candidates(4096)[:2] + wg.candidates(64)[:1] + wg.candidates(16)[2:]]
json.dump([wg.census(c, n=14336, k=4096) for c in cs] + [wg.census(cs[0], group_size=64, bias=True,
          dtype=torch.float16), wg.census(dataclasses.replace(cs[1], vec_y=False), n=14336, k=4096)],
          open(sys.argv[1], "w"))
"""


def test_vec_y_store_machine_code(tmp_path_factory):
    """vec_y: y leaves by STG.E.128 (a 64 x 64 chunk of a consumer: 4 a thread, against 32 STG.E.U16 in the
    accumulator's layout), the conversion by STSM in a few KB of shared memory (within smem_bytes' allowance), no
    spills or local memory, and the main loop (its HGMMA, no STS, within 3 % of its instructions) as without it."""
    rows = _census(tmp_path_factory, _COMPILE_VY, "w4a16_wgmma_vy")
    plain = rows.pop()
    for r in rows:
        assert r["config"].endswith("-vy"), r["config"]
        assert r["stg128"] > 0 and r["stsm"] > 0, r
        assert not (r["spill_stores"] or r["spill_loads"] or r["stack"] or r["local"] or r["serialized"]), r
        cfg = next(c for c in wg.all_candidates() if c.label() + "-vy" == r["config"])
        assert r["shared"] <= wg.smem_bytes(dataclasses.replace(cfg, vec_y=True), 64 if r["fp16"] else 128) + 1024, r
    assert plain["stg128"] == 0 and plain["stg16"] > 0, plain
    vy = next(r for r in rows if r["config"] == plain["config"] + "-vy")
    assert vy["stg128"] * 8 == plain["stg16"], (vy["stg128"], plain["stg16"])  # the whole-tile path: 8x fewer
    for a, b in zip(vy["loops"], plain["loops"], strict=True):  # the same loop, up to ptxas' scheduling (179 -> 182)
        assert a["hgmma"] == b["hgmma"] and a["sts"] == b["sts"] == 0, (a, b)
        assert abs(a["instructions"] - b["instructions"]) <= 0.03 * b["instructions"], (a, b)


# The split-K and stream-K fix-ups (w4a16_wgmma._fixup): a forced split of a one-consumer config, of a two-consumer
# config, and the M > 256 leader's stream-K tail (fp16, G = 64, bias, N % 8 != 0)
_COMPILE_FIXUP = """
import json, sys, torch
from flashscale.kernels import w4a16_wgmma as wg
from flashscale.kernels.aot import sass
C = wg.WgmmaConfig
kw = dict(n=2100, k=4160, group_size=64, dtype=torch.float16, bias=True)
cs = [(C(bm=16, consumers=1, stages=8, split_k=2), 2), (C(bm=64, consumers=2, stages=6, split_k=2), 2),
      (wg.candidates(4096)[0], 1)]
json.dump([[c.label(), sass(wg.compile_sm90(c, split_k=s, **kw).asm["cubin"])] for c, s in cs], open(sys.argv[1], "w"))
"""


def test_fixup_ticket_machine_code(tmp_path_factory):
    """Each consumer's ticket (one a consumer warpgroup: one atomic add per split or stream-K contributor) is taken
    the way the PTX memory model asks of a release / acquire hand-off (CUTLASS's semaphore): every fp32 partial
    stored before the warpgroup's barrier, then one thread's MEMBAR.ALL.GPU and the atomic, the L1 invalidated
    (CCTL.IVALL) after it, and the value reaching the other threads through shared memory behind a second barrier
    before any of them loads a partial."""
    from flashscale.kernels.aot import sass_instructions

    rows = _census(tmp_path_factory, _COMPILE_FIXUP, "w4a16_wgmma_fixup")
    for label, text in rows:
        ins = [t for _, t in sass_instructions(text)]
        adds = [i for i, t in enumerate(ins) if "ATOMG.E.ADD" in t]
        consumers = 2 if "bn128" in label else 1
        assert len(adds) == consumers, (label, len(adds))
        for i in adds:
            assert ins[i].startswith("@P"), (label, ins[i])  # one thread
            bar = max(j for j in range(i) if "BAR.SYNC" in ins[j])
            assert any("STG" in t for t in ins[bar - 200:bar]), label  # the partials, before the barrier
            between = ins[bar + 1:i]
            assert any("MEMBAR.ALL.GPU" in t for t in between) and not any("STG" in t or "LDG" in t
                                                                          for t in between), (label, between)
            assert any("CCTL.IVALL" in t for t in ins[i + 1:i + 3]), (label, ins[i:i + 3])
            bar2 = next(j for j in range(i + 1, len(ins)) if "BAR.SYNC" in ins[j])
            assert any(t.startswith(("@P", "STS")) and "STS" in t for t in ins[i:bar2]), label
            first_ldg = next(j for j in range(i + 1, len(ins)) if "LDG" in ins[j])
            assert bar2 < first_ldg and any("LDS" in t for t in ins[bar2:first_ldg]), label


def test_workspace_grows_outside_capture_only(monkeypatch):
    """The fix-up workspace (partials, tickets) is reused and grown call by call; growing it inside CUDA-graph capture
    is refused with a message (the tickets' zeros would exist only at replay), reusing it there is fine."""
    import torch

    dev = torch.device("cuda", 7)  # only the device's type is read before allocating
    monkeypatch.setitem(wg._WS, dev, [torch.empty(64), torch.zeros(8, dtype=torch.int32)])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    ws, cnt = wg._workspace(dev, 64, 8)
    assert ws.numel() == 64 and cnt.numel() == 8
    for floats, tickets in ((65, 8), (64, 9)):
        with pytest.raises(RuntimeError, match="inside CUDA-graph capture"):
            wg._workspace(dev, floats, tickets)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    cpu = torch.device("cpu")
    monkeypatch.setitem(wg._WS, cpu, [torch.empty(0), torch.zeros(0, dtype=torch.int32)])
    ws, cnt = wg._workspace(cpu, 100, 10)
    assert ws.numel() == 100 and cnt.numel() == 10 and not cnt.any()
