"""The W4A16 decode kernels compile for sm_90 without a GPU (Triton ships ptxas and cuobjdump) for every
decode autotune candidate, and the main loop's machine code stays lean (docs/w4a16_decode.md):
no register spills or local memory, the packed weights in 128-bit loads (LDG.128 for the GEMV,
LDGSTS.128 into the pipeline's shared memory for the tensor-core kernel), no int/float conversions per
weight (only per group), wgmma for the tensor-core kernel, a per-weight instruction count under a
ceiling, and the slice-reduced split-K with exactly two atomics (one ticket a program) instead of
per-element ones. The stream-K decode kernel (mma.sync on packed-half dequantization) is counted on
its hot path (the once-a-tile flush inside its loop left out): 1 HMMA a packed word, no shared memory
or barrier per item."""

from __future__ import annotations

import json

import pytest

from offline_compile import compile_offline

pytest.importorskip("triton.compiler")

# Compiled in a fresh interpreter: tests/conftest.py sets TRITON_INTERPRET=1 on CPU machines.
_COMPILE = """
import json, sys
from flashscale.kernels import w4a16_aot as aot
json.dump([aot.census(c, **kw) for c, kw in aot.decode_candidates()], open(sys.argv[1], "w"))
"""

# Thread-instructions per weight in one main-loop step, ceilings a little above what Triton 3.6 gives
# (GEMV 3.8-4.7, GEMM 4.3-5.3, decode 2.1-2.9): a regression in the unpacking shows up here.
_MAX_PER_WEIGHT = {"gemv": 4.9, "gemm": 5.6, "decode": 3.1}


@pytest.fixture(scope="module")
def census(tmp_path_factory):
    out = tmp_path_factory.mktemp("w4a16_sm90") / "census.json"
    compile_offline(_COMPILE, str(out))
    return json.loads(out.read_text())


def _name(r):
    return f"{r['kernel']}{r['bm'] or ''}-" + "-".join(f"{k}{v}" for k, v in r["config"].items())


def test_every_decode_candidate_compiles(census):
    from flashscale.kernels.w4a16 import _DECODE_CANDIDATES, _GEMM_CANDIDATES, _GEMV_CANDIDATES

    old = set(_GEMV_CANDIDATES) | set(_GEMM_CANDIDATES[16]) | set(_GEMM_CANDIDATES[32])
    assert len(census) == len(old) + len(_DECODE_CANDIDATES) + 1  # + the first decode config at 16 tokens


def test_no_spills_no_local_memory(census):
    bad = [(_name(r), r["spill_stores"], r["spill_loads"], r["stack"], r["local"]) for r in census
           if r["spill_stores"] or r["spill_loads"] or r["stack"] or r["local"]]
    assert not bad, bad
    assert all(r["registers"] <= 255 for r in census)


def test_packed_weights_in_128_bit_loads(census):
    for r in census:
        words = r["weights_per_thread_step"] // 8  # one int32 word holds 8 weights
        if r["kernel"] in ("gemv", "decode"):
            assert r["ldg128"] * 4 >= words, (_name(r), r["ldg128"])  # 4 words a 128-bit load, straight to registers
        else:
            assert r["ldgsts128"] * 4 >= words, (_name(r), r["ldgsts128"])  # cp.async 16 B into the pipeline
            assert r["hgmma"] > 0, _name(r)


def test_no_per_weight_conversions(census):
    for r in census:
        w = r["weights_per_thread_step"]
        assert r["cvt"] * 16 <= w, (_name(r), r["cvt"])  # I2F/F2F only for the group constants
        assert r["lop3"] <= 1.2 * w, (_name(r), r["lop3"])  # one LOP3 a weight (magic-number unpack)
        if r["kernel"] == "gemm":
            assert r["f2fp_pack"] * 2 <= w, (_name(r), r["f2fp_pack"])  # two weights a 16-bit pack


def test_instructions_per_weight_ceiling(census):
    over = [(_name(r), round(r["per_weight"], 2)) for r in census if r["per_weight"] > _MAX_PER_WEIGHT[r["kernel"]]]
    assert not over, over


def test_decode_kernel_hot_path(census):
    """One mma.sync a packed word (plus one per chunk for the x sums), nothing through shared memory
    and no barrier per item (the flush, once a tile, is outside the hot path)."""
    dec = [r for r in census if r["kernel"] == "decode"]
    assert dec
    for r in dec:
        words = r["weights_per_thread_step"] // 8
        tb = r["bm"] // 8
        assert r["hmma"] == tb * (words + 4 * r["config"]["kt"]), (_name(r), r["hmma"])
        assert r["smem"] == 0 and r["bar"] == 0, (_name(r), r["smem"], r["bar"])
        assert r["cvt"] == 0, (_name(r), r["cvt"])


def test_slice_split_k_has_one_ticket_not_per_element_atomics(census):
    for r in census:
        if r["kernel"] == "decode" or r["config"]["slices"]:
            assert r["atomics_ptx"] == 2, (_name(r), r["atomics_ptx"])  # ticket add + reset
        else:
            assert r["atomics_ptx"] > 2, _name(r)  # per-element adds and tickets
