"""The strip decode kernel (flashscale.kernels.w4a16_strip: no split-K across programs, warps split K;
docs/w4a16_decode.md "Round 14").

CPU, Triton's interpreter (fp16; the inline PTX replaced by the lane-by-lane emulation with one B operand a warp):
the product against float64 within 2x PyTorch's own 16-bit error (test_w4a16_ring's rule) for 1, 2 and 4 rows a
program, 1-4 warps splitting K, rings 1-3, K ranges that leave some warps without a sub-item in the last iteration,
K and N tails, one group a row, act-order, M = 1 / 3 / 9 / 16; bad arguments raise errors that name them.

sm_90, compiled ahead of time (no GPU): every candidate without spills or local memory and with no shared memory or
barrier in the hot loop (the warps' sums meet once, after it); RING x KT x R LDG.128 an iteration.

GPU (marked gpu): every candidate at Llama decode shapes in bf16, and the same bits on a repeat call.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flashscale.kernels import w4a16_configs
from flashscale.kernels.w4a16_strip import (STRIP_CONFIGS, STRIP_CONFIGS_16, StripConfig, configs_for, w4a16_strip,
                                            x_perm_words, x_perm_words_reference)
from test_w4a16_ring import _weight, assert_within_noise, sm90_census

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

CASES = [  # M, K, N, G, sym, act_order, bias, (rows, kt, warps, ring[, xperm]): what it exercises
    (1, 512, 64, 128, False, False, True, (1, 2, 2, 2)),  # 2 iterations, ring 2
    (3, 256, 48, 64, True, False, False, (2, 1, 2, 3)),  # 2 rows a program, ring 3 > iterations (refills skipped)
    (16, 512, 64, 128, False, False, True, (1, 2, 2, 1)),  # two token blocks, ring 1
    (9, 192, 40, -1, False, False, True, (2, 2, 2, 2)),  # one group, K tail (3 fragments), N tail (odd rows)
    (1, 640, 32, 128, False, False, False, (1, 2, 4, 3)),  # 5 sub-items over 4 warps: 3 warps idle at the end
    (1, 1024, 80, 64, False, False, True, (4, 1, 2, 2)),  # 4 rows a program, 5 fragment rows (3 masked)
    (4, 256, 64, 64, False, True, True, (1, 1, 2, 2)),  # act-order (x gathered once)
    # x in the B order (xperm): the pre-pass's token and K padding, act-order in the same gather, idle warps
    (1, 512, 64, 128, False, False, True, (1, 2, 2, 2, True)),  # 2 iterations
    (9, 192, 40, -1, False, False, True, (2, 2, 2, 2, True)),  # two token blocks (9 -> 16 rows), K tail, N tail
    (1, 640, 32, 128, False, False, False, (1, 2, 4, 3, True)),  # 3 warps idle at the end: columns past K are zeros
    (5, 320, 64, 64, False, True, True, (1, 1, 2, 2, True)),  # act-order, kt 1, 5 sub-items over 2 warps
]


@pytest.mark.parametrize("m,k,n,g,sym,act_order,bias,cfg", CASES)
def test_strip_kernel_interpreter(m, k, n, g, sym, act_order, bias, cfg):
    gen = torch.Generator().manual_seed(m * 1000 + k + n + g)
    p = _weight(k, n, g, sym=sym, gen=gen, act_order=act_order)
    x = torch.randn(m, k, generator=gen).half()
    b = torch.randn(n, generator=gen).half() if bias else None
    rows, kt, warps, ring, *xp = cfg
    c = StripConfig(rows=rows, kt=kt, num_warps=warps, ring=ring, xperm=bool(xp))
    y = w4a16_strip(x, p, b, config=c)
    assert y.shape == (m, n) and y.dtype == x.dtype and torch.isfinite(y).all()
    assert_within_noise(y, x, p, b)
    if xp:  # the same products in the same order as x words through b_pairs: the same bits; x handed over given
        assert torch.equal(y, w4a16_strip(x, p, b, config=dataclasses.replace(c, xperm=False)))
        assert torch.equal(y, w4a16_strip(x, p, b, config=c, xw=x_perm_words(x, p)))
    assert torch.equal(y, w4a16_strip(x, p, b, config=dataclasses.replace(c, fence=True)))  # its store never runs


def test_x_perm_words_layout():
    """Word [tb, 256 col + 128 h + 4 (4 g + t) + 2 ii + b] of x_perm_words holds inputs 64 col + 16 i + 2 t + b
    (low half) and + 8 (high half) of token 8 tb + g, i = 2 h + ii; zeros past M and K; act-order gathered."""
    gen = torch.Generator().manual_seed(3)
    m, k = 3, 104
    x = torch.randn(m, k, generator=gen).half()
    for act in (False, True):
        p = _weight(k, 16, 8, sym=False, gen=gen, act_order=act)
        assert (p.perm is not None) == act
        xg = x[:, p.perm.long()] if act else x
        w = x_perm_words(x, p)
        assert w.shape == (1, 2 * 256) and w.dtype == torch.int32
        h16 = w.view(torch.int16).view(1, 2, 2, 8, 4, 2, 2, 2)  # (tb, col, h, g, t, ii, b, e)
        for col, h, g, t, ii, b_, e in ((0, 0, 0, 0, 0, 0, 0), (1, 1, 2, 3, 1, 1, 1), (0, 1, 1, 2, 0, 1, 0),
                                        (1, 0, 5, 1, 1, 0, 1), (1, 1, 0, 3, 1, 1, 1)):
            kk = 64 * col + 16 * (2 * h + ii) + 2 * t + b_ + 8 * e
            want = xg[g, kk].view(torch.int16) if g < m and kk < k else torch.tensor(0, dtype=torch.int16)
            assert h16[0, col, h, g, t, ii, b_, e] == want, (col, h, g, t, ii, b_, e)
        assert torch.equal(w, x_perm_words_reference(x, p))  # the kernel and its torch reference


@pytest.mark.parametrize("m,k,g,act", [(1, 64, 64, False), (8, 192, 64, True), (13, 328, 8, True),
                                       (16, 1000, 8, False)])
def test_x_perm_kernel_equals_reference(m, k, g, act):
    gen = torch.Generator().manual_seed(m + k)
    p = _weight(k, 16, g, sym=True, gen=gen, act_order=act)
    x = torch.randn(m, 2 * k, generator=gen).half()[:, ::2]  # strided: the kernel takes contiguous rows
    assert torch.equal(x_perm_words(x, p), x_perm_words_reference(x, p))


def test_configs():
    assert configs_for(1) is STRIP_CONFIGS and configs_for(8) is STRIP_CONFIGS and configs_for(9) is STRIP_CONFIGS_16
    for c in STRIP_CONFIGS + STRIP_CONFIGS_16:
        assert c.item_bytes == c.num_warps * c.rows * c.kt * 512
        assert c.resident(128) * c.num_warps * 32 * 128 <= 65536 and c.label.startswith("strip r")


def test_strip_is_a_dispatch_candidate_interpreter():
    """w4a16_matmul: the strip configs join the M = 1 and M <= 8 buckets (after the ring kernel's), only where a
    sub-item stays inside a group, and the M <= 16 bucket with x in the B order; a forced StripConfig runs the
    strip kernel (split 1); a tuned table entry round-trips to a StripConfig (not a RingConfig: both have a ring);
    kernel="strip" runs M = 12 and refuses M = 17."""
    from flashscale.kernels import w4a16
    from flashscale.kernels.w4a16_ring import RingConfig

    gen = torch.Generator().manual_seed(7)
    p = _weight(256, 64, 128, sym=False, gen=gen)
    cands = w4a16.strip_candidates(p, 1)
    assert [(c.rows, c.kt, c.num_warps, c.ring, c.maxnreg) for c in cands] == list(w4a16_configs._STRIP_CANDIDATES)
    c8 = w4a16.strip_candidates(p, 8)  # M 2-8: the same, then x in the B order (fenced where the list says)
    assert w4a16.strip_candidates(p, 2) == c8 and c8[:len(cands)] == cands and w4a16.strip_candidates(p, 17) == []
    assert [(c.rows, c.kt, c.num_warps, c.ring, c.maxnreg, c.fence) for c in c8[len(cands):]] == list(
        w4a16_configs._STRIP_CANDIDATES_XP8) and all(c.xperm for c in c8[len(cands):])
    c16 = w4a16.strip_candidates(p, 9)  # M 9-16: x in the B order (its gather part of the call)
    assert c16 == w4a16.strip_candidates(p, 16) and c16 and all(c.xperm for c in c16)
    assert [(c.rows, c.kt, c.num_warps, c.ring, c.maxnreg, c.fence) for c in c16] == list(
        w4a16_configs._STRIP_CANDIDATES_16)
    assert w4a16._config_class(dataclasses.asdict(c16[0])) is StripConfig and w4a16._is_strip(c16[0])
    assert w4a16.strip_candidates(_weight(256, 64, 64, sym=True, gen=gen), 1) == [
        c for c in cands if c.kt == 1]  # kt 2 would cross a group of 64
    assert w4a16._config_class(dataclasses.asdict(cands[0])) is StripConfig
    assert w4a16._is_strip(cands[0]) and not w4a16._is_ring(cands[0])
    assert w4a16._is_ring(RingConfig(bn=16, kt=2, num_warps=1, ring=2, per_sm=2)) and not w4a16._is_strip(
        RingConfig(bn=16, kt=2, num_warps=1, ring=2, per_sm=2))
    x = torch.randn(5, 256, generator=gen).half()
    b = torch.randn(64, generator=gen).half()
    y = w4a16.w4a16_matmul(x, p, b, config=StripConfig(rows=2, kt=2, num_warps=2, ring=2))
    assert_within_noise(y, x, p, b)
    x12 = torch.randn(12, 256, generator=gen).half()  # kernel="strip" at M 12: the tuned (first) xperm config
    assert_within_noise(w4a16.w4a16_matmul(x12, p, b, kernel="strip"), x12, p, b)
    with pytest.raises(ValueError, match="strip kernel takes up to 16 tokens"):
        w4a16.w4a16_matmul(torch.randn(17, 256).half(), p, kernel="strip")
    p64 = _weight(256, 64, 64, sym=True, gen=gen)  # every candidate has kt 2: a sub-item of 128 crosses a group of 64
    with pytest.raises(ValueError, match="group size that is a multiple of 128.*group_size=64"):
        w4a16.w4a16_matmul(x, p64, kernel="strip")


def test_tuner_takes_strip_where_it_times_fastest_interpreter(monkeypatch):
    """Automatic dispatch at M = 1 with the tuner on (timings faked: strip r2 kt2 w4 ring2 fastest): every candidate
    of the bucket runs once (gemv, decode, ring, strip: each launched on the interpreter), the strip config is kept
    with split 1, the result is the product, and the tuned entry is read back as that StripConfig untimed."""
    from flashscale.kernels import w4a16, w4a16_tune

    gen = torch.Generator().manual_seed(11)
    p = _weight(256, 32, 128, sym=False, gen=gen)
    x = torch.randn(1, 256, generator=gen).half()
    fast = StripConfig(rows=2, kt=2, num_warps=4, ring=2)
    seen = []

    def fake_time(launch, c, s, ring=()):
        seen.append(type(c).__name__)
        return 1.0 if c == fast else 2.0 + len(seen) * 1e-3

    monkeypatch.setattr(w4a16_tune, "_AUTOTUNE", True)
    monkeypatch.setattr(w4a16_tune, "WARM_MS", 0.0)
    monkeypatch.setattr(w4a16_tune, "_interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(w4a16_tune, "_split_options", lambda default, *a: [default])
    monkeypatch.setattr(w4a16_tune, "_time", fake_time)
    monkeypatch.setattr(w4a16, "_weight_ring", lambda q: [q])
    key = w4a16._tune_key("gemv", 1, x, p)
    monkeypatch.setitem(w4a16._TUNED, key, None)  # removed again afterwards
    del w4a16._TUNED[key]
    y = w4a16.w4a16_matmul(x, p)
    assert_within_noise(y, x, p)
    assert {"GemvConfig", "DecodeConfig", "RingConfig", "StripConfig"} <= set(seen)
    assert w4a16._TUNED[key] == dict(dataclasses.asdict(fast), split_k=1)
    n = len(seen)
    assert torch.equal(w4a16.w4a16_matmul(x, p), y) and len(seen) == n  # cached: the same kernel, untimed


def test_bad_arguments():
    gen = torch.Generator().manual_seed(0)
    p = _weight(256, 64, 128, sym=False, gen=gen)
    x = torch.randn(1, 256, generator=gen).half()
    with pytest.raises(ValueError, match="rows=3"):
        w4a16_strip(x, p, config=StripConfig(rows=3))
    with pytest.raises(ValueError, match="ring=4"):
        w4a16_strip(x, p, config=StripConfig(ring=4))
    with pytest.raises(ValueError, match="num_warps=3"):
        w4a16_strip(x, p, config=StripConfig(num_warps=3))
    with pytest.raises(ValueError, match="maxnreg=300"):
        w4a16_strip(x, p, config=StripConfig(maxnreg=300))
    with pytest.raises(ValueError, match="reg_level=11"):
        w4a16_strip(x, p, config=StripConfig(reg_level=11))
    with pytest.raises(TypeError, match="StripConfig"):
        w4a16_strip(x, p, config=object())
    with pytest.raises(ValueError, match=r"xw must be x_perm_words\(x, p\): int32 of shape \(1, 1024\)"):
        w4a16_strip(x, p, config=StripConfig(xperm=True), xw=x.view(torch.int32))
    with pytest.raises(ValueError, match=r"xw must be x_words\(x, p\)"):
        w4a16_strip(x, p, config=StripConfig(), xw=x_perm_words(x, p))
    with pytest.raises(TypeError, match="pdl must be a bool"):
        w4a16_strip(x, p, pdl=1)
    with pytest.raises(ValueError, match="M=17"):
        w4a16_strip(torch.randn(17, 256).half(), p)
    with pytest.raises(ValueError, match="K=128"):
        w4a16_strip(torch.randn(1, 128).half(), p)
    with pytest.raises(ValueError, match="group_size=64 must be a multiple of 128"):
        w4a16_strip(x, _weight(256, 64, 64, sym=False, gen=gen), config=StripConfig(kt=2))


_COMPILE = """
import json, sys
from flashscale.kernels import w4a16_strip as S
json.dump([S.census(c, bm=bm) for bm in (8, 16) for c in S.configs_for(bm)], open(sys.argv[1], "w"))
"""


def test_sm90_compile_no_spills_no_smem_in_loop(tmp_path):
    rs = sm90_census(tmp_path, _COMPILE)
    assert len(rs) == len(STRIP_CONFIGS) + len(STRIP_CONFIGS_16)
    for r in rs:
        c = StripConfig(**r["config"])
        assert r["spill_stores"] == r["spill_loads"] == r["stack"] == r["local"] == 0, r
        assert r["smem"] == 0 and r["bar"] == 0, r  # no layout conversion, no barrier an iteration
        assert c.maxnreg is None or r["registers"] <= c.maxnreg, r  # the cap reached ptxas
        # a 512-byte fragment a warp instruction, 16 B a lane; x in the B order: two a column and token block
        x_ldg = 2 * (r["bm"] // 8) if c.xperm else 0
        assert r["ldg128"] == c.ring * c.kt * (c.rows + x_ldg), r
        assert r["moves"] <= 16, r  # slots rotated by position
        assert r["loads_in_flight"] >= 0.6 * r["ldg_per_iter"], r  # the ring holds while it waits (static model)
        if c.fence:  # the first slot's refill (its words, scale words and x in the B order) before the second's math
            assert r["early_ldg"] >= c.rows * c.kt + 1 + (2 * c.kt * r["bm"] // 8 if c.xperm else 0), r


_COMPILE_XP = """
import json, sys
from flashscale.kernels.aot import ptxas_stats
from flashscale.kernels import w4a16_strip as S
ptx = [S.compile_x_perm_sm90(h).asm["ptx"] for h in (False, True)]
rs = [{k: v for k, v in ptxas_stats(p).items() if k != "log"} for p in ptx]
for r, p in zip(rs, ptx):
    r["trigger"] = "griddepcontrol.launch_dependents" in p
kernel = S.compile_sm90(S.StripConfig(xperm=True)).asm["ptx"]  # an xperm config as launch runs it (PDL)
rs.append({"spill_stores": 0, "spill_loads": 0, "trigger": True, "wait": "griddepcontrol.wait" in kernel})
json.dump(rs, open(sys.argv[1], "w"))
"""


def test_x_perm_kernel_compiles_sm90(tmp_path):
    """The gather compiles spill-free and lets its programmatic dependent start (launch_dependents); the strip kernel
    of an xperm config waits for it (griddepcontrol.wait) before it reads x."""
    rs = sm90_census(tmp_path, _COMPILE_XP)
    for r in rs:
        assert r["spill_stores"] == r["spill_loads"] == 0 and r["trigger"], r
    assert rs[-1]["wait"]


HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("k,n", [(4096, 4096), (14336, 4096), (4096, 1000)])
def test_strip_gpu(m, k, n):
    gen = torch.Generator().manual_seed(m + k + n)
    p = _weight(k, n, 128, sym=False, gen=gen, device="cuda")
    x = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
    b = torch.randn(n, generator=gen).to("cuda", torch.bfloat16)
    for cfg in configs_for(m):
        y = w4a16_strip(x, p, b, config=cfg)
        assert_within_noise(y, x, p, b)
        assert torch.equal(y, w4a16_strip(x, p, b, config=cfg)), cfg  # no atomics: the same bits every call
        if cfg.xperm:  # the gather's PDL dependent, the plain launch and x handed over: the same bits
            assert torch.equal(y, w4a16_strip(x, p, b, config=cfg, pdl=False)), cfg
            assert torch.equal(y, w4a16_strip(x, p, b, config=cfg, xw=x_perm_words(x, p))), cfg
