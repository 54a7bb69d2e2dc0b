"""The ring decode kernel (flashscale.kernels.w4a16_ring, docs/w4a16_decode.md "Round 5").

CPU, Triton's interpreter (fp16; the inline PTX replaced by the lane-by-lane emulation of the same registers and
mma.sync's fragment layout): the product against float64 (x @ dequantized W + bias) within 2x the error PyTorch
makes with 16-bit weights (test_w4a16's tolerance), for ring depths 1-4, both split-K reductions, programs that
hold less than a ring of items (slots skipped), many contributors a tile, one program a tile (direct stores), K/N
tails, one group a row, act-order, M = 1 / 3 / 9 / 16; the deterministic reduction gives the same bits on a repeat
call; tickets and the atomic tile are left at zero; bad arguments raise errors that name them.

sm_90, compiled ahead of time in a subprocess (no GPU needed; skipped when Triton's ptxas/cuobjdump are absent):
one config without spills or local memory, RING items of LDG.128 and HMMA in the hot loop.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from flashscale.kernels.w4a16_common import split_k_workspace
from flashscale.kernels.w4a16_pack import PackedW4, pack_w4
from flashscale.kernels.w4a16_ring import RING_CONFIGS, RingConfig, ring_grid, w4a16_ring
from flashscale.reference.w4a16 import w4a16_linear_ref
from offline_compile import compile_offline

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]
SMS = 4  # the interpreter's SM count (w4a16._device_info)


def _err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def _weight(k, n, g, *, sym, gen, act_order=False, device="cpu"):
    gg = k if g == -1 else g
    codes = torch.randint(0, 16, (k, n), generator=gen)
    zeros = torch.full((k // gg, n), 8) if sym else torch.randint(0, 17, (k // gg, n), generator=gen)
    scales = (torch.rand(k // gg, n, generator=gen) * 0.03 + 0.002).half()
    g_idx = (torch.arange(k) // gg)[torch.randperm(k, generator=gen)].int() if act_order else None
    p = pack_w4(codes, zeros, scales, group_size=g, g_idx=g_idx)
    return p.to(device) if device != "cpu" else p


def assert_within_noise(y, x, p, b=None):
    """y within 2x the error PyTorch makes with 16-bit weights (x @ dequantized W + b in x's dtype) of the float64
    product (test_w4a16's tolerance; the decode kernels' tests share it)."""
    oracle = w4a16_linear_ref(x.double(), p, None if b is None else b.double(), compute_dtype=torch.float64)
    same_dtype = w4a16_linear_ref(x, p, b, compute_dtype=x.dtype)  # PyTorch: 16-bit weights, then the matmul
    assert _err(y, oracle) <= 2 * _err(same_dtype, oracle) + 1e-6, (_err(y, oracle), _err(same_dtype, oracle))


CASES = [  # M, K, N, G, sym, act_order, bias, (bn, kt, ring, per_sm, atomic): what it exercises
    (1, 256, 64, 128, False, False, True, (16, 2, 2, 2, False)),  # 1 item a program, 2 contributors a tile
    (3, 512, 64, 128, False, False, False, (32, 2, 3, 1, False)),  # 2 items a program < ring 3: a slot skipped
    (16, 256, 256, 64, True, False, True, (64, 1, 4, 2, False)),  # two token blocks, ring 4, group 64
    (1, 512, 256, 64, False, False, True, (32, 1, 2, 3, True)),  # red.add reduction, 5-6 items a program
    (16, 512, 64, 128, False, False, False, (16, 2, 2, 4, True)),  # red.add with two token blocks
    (1, 512, 64, 64, False, False, False, (64, 1, 1, 2, False)),  # ring 1, 8 contributors: the 4-wide slot sum
    (9, 512, 256, 128, True, False, True, (128, 2, 2, 1, False)),  # one program a tile or two: direct stores
    (3, 192, 40, -1, False, False, True, (16, 2, 2, 2, False)),  # one group, K and N tails (masked loads)
    (1, 256, 64, 64, False, True, True, (32, 1, 3, 2, False)),  # act-order (x gathered once)
]


@pytest.mark.parametrize("m,k,n,g,sym,act_order,bias,cfg", CASES)
def test_ring_kernel_interpreter(m, k, n, g, sym, act_order, bias, cfg):
    gen = torch.Generator().manual_seed(m * 1000 + k + n + g)
    p = _weight(k, n, g, sym=sym, gen=gen, act_order=act_order)
    x = torch.randn(m, k, generator=gen).half()
    b = torch.randn(n, generator=gen).half() if bias else None
    bn, kt, ring, per_sm, atomic = cfg
    c = RingConfig(bn=bn, kt=kt, num_warps=1, ring=ring, per_sm=per_sm, atomic=atomic)
    y = w4a16_ring(x, p, b, config=c)
    assert y.shape == (m, n) and y.dtype == x.dtype and torch.isfinite(y).all()
    assert_within_noise(y, x, p, b)
    ws, cnt = split_k_workspace(x.device, 1)
    assert not cnt.any() and not ws.any()  # tickets put back to zero, the atomic tiles zeroed
    if not atomic and m == 1 and n == 64 and k == 256:  # the slot reduction is a fixed fold: the same bits again
        assert torch.equal(y, w4a16_ring(x, p, b, config=c))


def test_grid_and_workspace_slots():
    """Stream-K: every tile's contributors fit its CMAX slots; the cases above cover the regimes they claim."""
    c = RingConfig(bn=16, kt=2, ring=2)
    assert ring_grid(256, 64, c, 2, SMS) == (8, 8, 2, 3)  # 8 items, 8 programs: 2 contributors a tile
    assert ring_grid(512, 64, RingConfig(bn=64, kt=1, ring=1), 2, SMS) == (8, 8, 8, 9)  # 1 tile, 8 contributors
    assert ring_grid(8192, 8192, RingConfig(bn=128, kt=2), 4, 132) == (528, 4096, 64, 11)
    for k, n, cfg in [(k, n, RingConfig(bn=bn, kt=kt)) for k in (4096, 8192, 28672) for n in (4096, 8192, 28672)
                      for bn in (128, 256) for kt in (1, 2)]:
        for per_sm in (1, 2, 4, 8):
            progs, items, s, cmax = ring_grid(k, n, cfg, per_sm, 132)
            for tile in range(0, items // s, max(1, items // s // 7)):
                pf = ((tile * s + 1) * progs - 1) // items
                pl = ((tile * s + s) * progs - 1) // items
                assert pl - pf + 1 <= cmax


def test_configs():
    assert 4 <= len(RING_CONFIGS) <= 12 and len(set(RING_CONFIGS)) == len(RING_CONFIGS)
    for c in RING_CONFIGS:
        assert c.bn % 16 == 0 and c.kt in (1, 2) and 1 <= c.ring <= 4
        assert c.loads_per_item() >= 1 and c.in_flight_kb(c.per_sm) >= 32
        assert c.per_sm_options(128)[0] >= 1
    c = RingConfig(bn=128, kt=2, num_warps=4, ring=2, per_sm=4)
    assert c.resident(128) == 4 and c.resident(129) == 3 and c.per_sm_options(128) == [4]
    assert c.per_sm_options(64) == [4, 6, 8] and c.in_flight_kb(4) == 64


def test_bad_arguments():
    gen = torch.Generator().manual_seed(3)
    p = _weight(256, 64, 128, sym=False, gen=gen)
    x = torch.randn(2, 256).half()
    with pytest.raises(ValueError, match="x must be float16 or bfloat16"):
        w4a16_ring(x.float(), p)
    with pytest.raises(ValueError, match="M=17"):
        w4a16_ring(torch.randn(17, 256).half(), p)
    with pytest.raises(ValueError, match="in_features"):
        w4a16_ring(torch.randn(2, 128).half(), p)
    with pytest.raises(ValueError, match="x must be a 2-D"):
        w4a16_ring(torch.randn(256).half(), p)
    with pytest.raises(ValueError, match="bias must have shape"):
        w4a16_ring(x, p, torch.zeros(63).half())
    with pytest.raises(ValueError, match="bias must have x's dtype"):
        w4a16_ring(x, p, torch.zeros(64))
    with pytest.raises(ValueError, match="per_sm"):
        w4a16_ring(x, p, per_sm=0)
    with pytest.raises(ValueError, match="ring=5"):
        w4a16_ring(x, p, config=RingConfig(ring=5))
    with pytest.raises(ValueError, match="config.bn=24"):
        w4a16_ring(x, p, config=RingConfig(bn=24))
    with pytest.raises(TypeError, match="PackedW4"):
        w4a16_ring(x, p.qweight)
    p32 = _weight(256, 64, 32, sym=True, gen=gen)  # an item of 64 kt inputs would cross a group
    with pytest.raises(ValueError, match="group_size=32"):
        w4a16_ring(x, p32, config=RingConfig(kt=1))
    odd = PackedW4(qweight=p.qweight, sz=p.sz, perm=None, in_features=256, out_features=64, group_size=192)
    with pytest.raises(ValueError, match="group_size=192"):  # K not a multiple of the group
        w4a16_ring(x, odd)
    assert w4a16_ring(torch.empty(0, 256).half(), p).shape == (0, 64)


# ---- sm_90, ahead of time (a fresh interpreter: tests/conftest.py sets TRITON_INTERPRET=1 on CPU machines)

_COMPILE = """
import json, sys
from flashscale.kernels import w4a16_ring as R
json.dump([R.census(R.RingConfig(bn=128, kt=2, num_warps=4, ring=2), bm=8)], open(sys.argv[1], "w"))
"""


def _sm90_toolchain() -> str | None:
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        path = get_ptxas(90).path
    except Exception as e:  # noqa: BLE001
        return f"no sm_90 ptxas in this Triton: {e!r}"
    if not os.path.exists(os.path.join(os.path.dirname(path), "cuobjdump")):
        return "no cuobjdump beside Triton's ptxas"
    return None


def sm90_census(tmp_path, script: str) -> list[dict]:
    """What `script` (argv[1]: a JSON path) writes after compiling for sm_90 in a fresh interpreter; skips the test
    where Triton's ptxas / cuobjdump are absent. Shared with test_w4a16_gring."""
    why = _sm90_toolchain()
    if why:
        pytest.skip(why)
    out = tmp_path / "census.json"
    compile_offline(script, str(out))
    return json.loads(out.read_text())


def test_sm90_compile_no_spills_ring_in_flight(tmp_path):
    (r,) = sm90_census(tmp_path, _COMPILE)
    c = RingConfig(**r["config"])
    assert r["spill_stores"] == r["spill_loads"] == r["stack"] == r["local"] == 0, r
    assert r["registers"] <= 128  # 4 programs of 4 warps an SM: 64 KB of packed words in flight
    words = c.bn * 64 * c.kt // 8 // (32 * c.num_warps)  # packed words a thread an item
    assert r["ldg128"] == c.ring * words // 4, r  # the hot loop: RING items of LDG.128 straight to registers
    assert r["hmma"] == c.ring * (words + 4 * c.kt), r  # one mma.sync a word + the x sums (4 a column)
    assert r["smem"] == 0 and r["bar"] == 0 and r["moves"] <= 32, r  # no smem per item, no ring moves
    assert r["atomics_ptx"] == 2 * c.ring  # one ticket + reset a tile end, one flush per unrolled slot
    assert r["loads_in_flight"] >= 0.6 * r["ldg_per_iter"], r  # the ring holds while it waits (static model)


# ---- benchmarks/w4a16_probe.py: the r-dec rows end to end on the CPU (graph timing stubbed)

def _probe():
    from bench_testutil import load_benchmark  # benchmarks/ on the path: the script imports its neighbour plotting.py

    return load_benchmark("w4a16_probe")


def test_probe_ring_rows_interpreter(monkeypatch):
    from flashscale.kernels import w4a16_ring_config as WR  # configs_for reads RING_CONFIGS there

    probe = _probe()
    monkeypatch.setattr(WR, "RING_CONFIGS", [RingConfig(bn=16, kt=2, num_warps=1, ring=2, per_sm=2),
                                             RingConfig(bn=32, kt=2, num_warps=1, ring=3, per_sm=1, atomic=True)])
    monkeypatch.setattr(probe, "graph_us", lambda calls, n, reps=10: [c() for c in calls] and 1.0)
    ctx = probe.Ctx(100.0, ["r-dec", "e-copy"])
    k, n, m = 256, 64, 1
    gen = torch.Generator().manual_seed(5)
    p = _weight(k, n, 128, sym=False, gen=gen)
    packs = [p, PackedW4(qweight=p.qweight.clone(), sz=p.sz.clone(), perm=None, in_features=k, out_features=n,
                         group_size=128)]
    x = torch.randn(m, k, generator=gen).half()
    w64 = w4a16_linear_ref(torch.eye(k).double(), p, compute_dtype=torch.float64)  # (K, N) dequantized
    ref = x.double() @ w64
    tol = 2 * _err(w4a16_linear_ref(x, p, compute_dtype=x.dtype), ref) + 1e-6

    def row(**kw):
        kw.update(K=k, N=n)
        if kw.get("us") is not None:
            kw["TBps"] = 1.0
        ctx.rows.append(kw)

    y = torch.empty(m, n, dtype=x.dtype)
    probe.run_ring(ctx, k, n, m, x, p, packs, y, ref, tol, row, lambda what: False, True, w64)
    assert not ctx.errors and ctx.bad == 0, ctx.errors
    timed = [r for r in ctx.rows if r["kind"] == "r-dec"]
    assert [r["label"] for r in timed] == [c.label for c in WR.RING_CONFIGS] and all(r["ok"] for r in timed)
    assert [r["split"] for r in timed] == [2, 1] and all(r["err"] <= tol for r in timed)
    assert [r["kind"] for r in ctx.rows if r.get("kernel") == "ring" and r["us"] is None] == ["fp16-check"]
    jobs = probe.compile_jobs(probe.Ctx(1.0, ["r-dec", "d-dec", "e-copy", "e-bf16"]))
    assert {j["kind"] for j in jobs} == {"ring", "decode"}  # no GEMV / GEMM sweeps for these kinds
    assert sum(j["kind"] == "ring" for j in jobs) == len(WR.RING_CONFIGS) + len(WR.RING_CONFIGS_16) + 2
    assert probe.main(["--kinds", "ring,dec,copy,bf16", "--no-precompile"]) == 2  # aliases parse; no GPU here
    # g-dec (docs "Round 8"): the Gluon wgmma GEMM at decode M, 16-token tiles, compiled once each at its first split
    jobs = probe.compile_jobs(probe.Ctx(1.0, ["g-dec"]))
    assert [(j["kind"], j["m"]) for j in jobs] == [("wgmma", 16)] * len(probe.G_DEC_SWEEP)
    assert all(c.bm == 16 and j["split"] == (0 if c.persistent else 1) for c, j in zip(probe.G_DEC_SWEEP, jobs))
    assert probe.main(["--kinds", "wgmma,ring", "--no-precompile"]) == 2
    with pytest.raises(SystemExit):
        probe.main(["--kinds", "r-dec,nope"])


# ---- w4a16_matmul's automatic dispatch: the ring kernel as an autotune candidate of the M = 1 and M <= 8 buckets

def test_ring_is_a_dispatch_candidate_interpreter():
    import dataclasses

    from flashscale.kernels import w4a16

    gen = torch.Generator().manual_seed(5)
    p = _weight(256, 64, 128, sym=False, gen=gen)
    cands = w4a16.ring_candidates(p, 1)
    assert [(c.bn, c.per_sm, c.atomic) for c in cands] == list(w4a16._RING_CANDIDATES)
    assert w4a16.ring_candidates(p, 8) == cands and w4a16.ring_candidates(p, 9) == []  # M <= 8 only
    assert w4a16.ring_candidates(_weight(256, 64, 64, sym=True, gen=gen), 1) == []  # an item would cross a group
    assert w4a16._config_class(dataclasses.asdict(cands[0])) is RingConfig  # a tuned table entry round-trips
    x = torch.randn(3, 256, generator=gen).half()
    b = torch.randn(64, generator=gen).half()
    c = RingConfig(bn=16, kt=2, num_warps=1, ring=2, per_sm=2, atomic=True)
    y = w4a16.w4a16_matmul(x, p, b, config=c)  # forced: the ring kernel, per_sm as its split
    assert_within_noise(y, x, p, b)
    with pytest.raises(ValueError, match="ring kernel takes up to 8 tokens"):
        w4a16.w4a16_matmul(torch.randn(9, 256).half(), p, kernel="ring")


@pytest.mark.parametrize("m,cfg", [(1, (16, 2, 2, 2, False)), (3, (32, 1, 3, 2, True)), (9, (16, 2, 1, 4, False))])
def test_add_mode_adds_into_a_float32_out(m, cfg):
    """launch(add=True) (w4a16_addmm_'s kernel): out += x @ W in float32, every tile's partials red.added (one
    contributor or several, two token blocks at M = 9), within 2x PyTorch's 16-bit error of the float64 sum; the
    rows of out past M and its columns stay untouched."""
    from flashscale.kernels.w4a16_ring import launch

    k, n = 512, 48
    gen = torch.Generator().manual_seed(m)
    p = _weight(k, n, 128, sym=False, gen=gen)
    x = torch.randn(m, k, generator=gen).half()
    bn, kt, ring, per_sm, atomic = cfg
    c = RingConfig(bn=bn, kt=kt, num_warps=1, ring=ring, per_sm=per_sm, atomic=atomic)
    base = torch.randn(m + 1, n + 8, generator=gen)
    out = base.clone()
    launch(x, p, None, out[:m, :n], c, per_sm, add=True)
    assert_within_noise(out[:m, :n].double() - base[:m, :n].double(), x, p)
    assert torch.equal(out[m:], base[m:]) and torch.equal(out[:, n:], base[:, n:])
    with pytest.raises(ValueError, match="float32 y"):
        launch(x, p, None, torch.zeros(m, n).half(), c, per_sm, add=True)


def test_addmm_api():
    """w4a16_addmm_ (the ring candidates' first config when untimed) adds into out; wrong outs and M > 8 are
    refused with errors naming what they take."""
    from flashscale.kernels.w4a16 import w4a16_addmm_

    gen = torch.Generator().manual_seed(5)
    p = _weight(256, 32, 128, sym=True, gen=gen)
    x = torch.randn(1, 256, generator=gen).half()
    out = torch.ones(1, 32)
    assert w4a16_addmm_(out, x, p) is out
    ref = w4a16_linear_ref(x.double(), p, None, compute_dtype=torch.float64) + 1
    assert _err(out, ref) < 2e-3
    with pytest.raises(ValueError, match="out must be float32"):
        w4a16_addmm_(torch.zeros(1, 32).half(), x, p)
    with pytest.raises(ValueError, match="out must be float32"):
        w4a16_addmm_(torch.zeros(2, 32), x, p)
    with pytest.raises(ValueError, match="up to 8 tokens"):
        w4a16_addmm_(torch.zeros(9, 32), torch.randn(9, 256).half(), p)


PROLOGUE_CASES = [  # mode, M, K, N, (bn, kt, ring, per_sm, atomic): what it exercises
    ("norm", 1, 512, 64, (16, 2, 2, 3, True)),  # residual + r, chunks shared by many programs
    ("norm0", 2, 384, 64, (16, 2, 2, 2, True)),  # no r (a decode step's first layer), two rows, one group (G = K)
    ("norm", 1, 4096, 48, (16, 1, 2, 1, True)),  # 48 items a program: the prologue writes x in two rounds
    ("silu", 2, 512, 48, (32, 1, 2, 2, False)),  # SiLU(g) * u from a float32 (M, 2K) sum; kt 1 chunks
    ("silu", 1, 256, 256, (16, 2, 1, 4, True)),  # programs whose items wrap from the last chunk to the first
    ("attn", 1, 256, 64, (16, 1, 2, 3, True)),  # the attention's split combine: 4 heads of 64, 4 splits
    ("attn", 1, 512, 32, (32, 2, 2, 2, False)),  # 4 heads of 128, 8 splits, a split with no rows (max -inf)
]


@pytest.mark.parametrize("mode,m,k,n,cfg", PROLOGUE_CASES)
def test_add_mode_prologue_writes_x_then_adds(mode, m, k, n, cfg):
    """launch(add=True, prologue=...) (the decode step's norms and SiLU * up inside the GEMV, w4a16_prologue): each
    program writes the chunks of x its items read; x and the new residual equal the prologue's PyTorch reference
    bitwise, whole (every chunk written by some program), and out gets x @ W within 2x PyTorch's 16-bit error."""
    from flashscale.kernels.w4a16_prologue import XAttn, XNorm, XSiLU, reference
    from flashscale.kernels.w4a16_ring import launch

    gen = torch.Generator().manual_seed(k + n)
    hd, ns = (64, 4) if k == 256 else (128, 8)
    gen_a = torch.Generator().manual_seed(2)
    ws = torch.randn(k // hd * ns, hd + 2, generator=gen_a) * 4  # (acc, max, sum) rows
    ws[:, hd + 1] = torch.rand(k // hd * ns, generator=gen_a) * 9 + 1
    ws[1, hd], ws[1, hd + 1], ws[1, :hd] = float("-inf"), 0.0, 0.0  # an empty split
    p = _weight(k, n, 128 if mode != "norm0" else -1, sym=False, gen=gen)
    res = torch.randn(m, k, generator=gen).half()
    w = (torch.rand(k, generator=gen) + 0.5).half()
    r = torch.randn(m, k, generator=gen) if mode == "norm" else None

    def make():
        if mode == "silu":
            return XSiLU(gu=torch.randn(m, 2 * k, generator=torch.Generator().manual_seed(1)) * 3)
        if mode == "attn":
            return XAttn(ws=ws, splits=ns, head_dim=hd)
        return XNorm(res=res, weight=w, eps=1e-5, res_out=torch.full_like(res, float("nan")), r=r)

    pro, ref = make(), make()
    x, x_ref = torch.full((m, k), float("nan")).half(), torch.zeros(m, k).half()
    reference(ref, x_ref)
    bn, kt, ring, per_sm, atomic = cfg
    out = torch.zeros(m, n)
    launch(x, p, None, out, RingConfig(bn=bn, kt=kt, num_warps=1, ring=ring, per_sm=per_sm, atomic=atomic), per_sm,
           add=True, prologue=pro)
    assert torch.equal(x, x_ref)
    if mode.startswith("norm"):
        assert torch.equal(pro.res_out, ref.res_out) and torch.equal(ref.res_out, res if r is None else ref.res_out)
    assert_within_noise(out.double(), x_ref, p)


def test_addmm_prologue_refusals():
    """w4a16_addmm_(prologue=...) refuses what its programs cannot write: res_out aliasing res, wrong shapes and
    dtypes (named), a non-contiguous x, an act-order weight (x is gathered before the kernel)."""
    from flashscale.kernels.w4a16 import w4a16_addmm_
    from flashscale.kernels.w4a16_prologue import XAttn, XNorm, XSiLU

    gen = torch.Generator().manual_seed(7)
    p = _weight(256, 32, 128, sym=True, gen=gen)
    x, res, w = torch.zeros(1, 256).half(), torch.randn(1, 256).half(), torch.ones(256).half()
    out = torch.zeros(1, 32)
    with pytest.raises(ValueError, match="res_out must be a buffer of its own"):
        w4a16_addmm_(out, x, p, prologue=XNorm(res=res, weight=w, eps=1e-5, res_out=res))
    with pytest.raises(ValueError, match=r"prologue r must be torch.float32 \(1, 256\)"):
        w4a16_addmm_(out, x, p, prologue=XNorm(res=res, weight=w, eps=1e-5, res_out=res.clone(), r=res))
    with pytest.raises(ValueError, match=r"prologue gu must be torch.float32 \(1, 512\)"):
        w4a16_addmm_(out, x, p, prologue=XSiLU(gu=torch.zeros(1, 256)))
    with pytest.raises(ValueError, match="prologue eps must be a positive float"):
        w4a16_addmm_(out, x, p, prologue=XNorm(res=res, weight=w, eps=0, res_out=res.clone()))
    with pytest.raises(ValueError, match="x must be contiguous"):
        w4a16_addmm_(out, torch.zeros(256, 1).half().t(), p, prologue=XSiLU(gu=torch.zeros(1, 512)))
    with pytest.raises(TypeError, match="prologue must be an XNorm, an XSiLU or an XAttn"):
        w4a16_addmm_(out, x, p, prologue="norm")
    with pytest.raises(ValueError, match="prologue splits must be a power of two >= 2"):
        w4a16_addmm_(out, x, p, prologue=XAttn(ws=torch.zeros(2, 130), splits=1, head_dim=128))
    with pytest.raises(ValueError, match="x must have 1 row"):
        w4a16_addmm_(torch.zeros(2, 32), torch.zeros(2, 256).half(), p,
                     prologue=XAttn(ws=torch.zeros(4, 130), splits=2, head_dim=128))
    with pytest.raises(ValueError, match=r"prologue ws must be torch.float32 \(4, 130\)"):
        w4a16_addmm_(out, x, p, prologue=XAttn(ws=torch.zeros(4, 128), splits=2, head_dim=128))
    pa = _weight(256, 32, 128, sym=True, gen=gen, act_order=True)
    with pytest.raises(ValueError, match="act-order"):
        w4a16_addmm_(out, x, pa, prologue=XSiLU(gu=torch.zeros(1, 512)))


_COMPILE_PROLOGUE = """
import json, re, sys
from flashscale.kernels import w4a16_ring as R
from flashscale.kernels.aot import ptxas_stats, sass
rows = []
for xmode, k, dyn in ((1, 4096, 0), (2, 14336, 0), (3, 4096, 0), (1, 4096, 4), (0, 4096, 4)):
    kk = R.compile_sm90(R.RingConfig(bn=256, kt=2, num_warps=4, ring=2, atomic=True), add=True, pdl=True,
                        xmode=xmode, trigger=True, k=k, dyn=dyn, pch=2048 if dyn and xmode else None)
    t = sass(kk.asm["cubin"])
    ops = re.findall(r"\\b(LDG\\.E\\.128|LDG\\.E\\.64|LDG\\.E\\S*|ACQBULK|STG\\S*|BAR\\.SYNC\\S*|PREEXIT|REDG\\S*)", t)
    rows.append(dict(ptxas_stats(kk.asm["ptx"]), ops=ops, xmode=xmode, dyn=dyn))
json.dump(rows, open(sys.argv[1], "w"))
"""


def test_sm90_prologue_and_trigger(tmp_path):
    """sm_90, the prologue builds under PDL with the early trigger: no spills; the first items' packed words load
    before the wait (ACQBULK) and nothing is stored before it; the prologue's stores, then a CTA barrier, then the
    trigger (PREEXIT), then the GEMV's red.adds. The DYN builds (items from a counter; no prologue or XNorm's whole
    row) too."""
    for r in sm90_census(tmp_path, _COMPILE_PROLOGUE):
        ops = r["ops"]
        assert r["spill_stores"] == r["spill_loads"] == 0, r
        wait, trig = ops.index("ACQBULK"), ops.index("PREEXIT")
        assert ops[:wait].count("LDG.E.128") == 16 and not any(o.startswith("STG") for o in ops[:wait]), ops[:wait]
        stores = [i for i, o in enumerate(ops) if o.startswith("STG")]
        if r["xmode"]:
            assert stores and wait < stores[0] and stores[-1] < trig, (r["xmode"], ops)
            assert any(o.startswith("BAR.SYNC") for o in ops[stores[-1]:trig]), ops
        else:
            assert not stores, ops
        assert min(i for i, o in enumerate(ops) if o.startswith("REDG")) > trig, ops


_COMPILE_ADD_PDL = """
import json, re, sys
from flashscale.kernels import w4a16_ring as R
from flashscale.kernels.aot import ptxas_stats, sass
k = R.compile_sm90(R.RingConfig(bn=256, kt=2, num_warps=4, ring=2, atomic=True), add=True, pdl=True)
t = sass(k.asm["cubin"])
ops = re.findall(r"\\b(LDG\\.E\\.128|LDG\\.E\\.64|LDG\\.E |ACQBULK|REDG\\S*|ATOMG\\S*|PREEXIT)", t)
json.dump([dict(ptxas_stats(k.asm["ptx"]), ops=ops)], open(sys.argv[1], "w"))
"""


def test_sm90_add_mode_with_pdl(tmp_path):
    """The decode step's launch of the ring kernel (w4a16_addmm_ under PDL), sm_90: float32 red.adds (no CAS loop,
    no ticket), the first items' packed words (LDG.128) and scale words (LDG.64) loaded before the griddepcontrol
    wait (ACQBULK) and every x word (4-byte LDG) after it, no early trigger of the next kernel, no spills."""
    (r,) = sm90_census(tmp_path, _COMPILE_ADD_PDL)
    ops = r["ops"]
    assert r["spill_stores"] == r["spill_loads"] == 0, r
    assert ops.count("ACQBULK") == 1 and "PREEXIT" not in ops, ops
    wait = ops.index("ACQBULK")
    assert ops[:wait].count("LDG.E.128") == 2 * 8 and "LDG.E.64" in ops[:wait], ops[:wait]  # 2 items x 8 a thread
    assert "LDG.E " not in ops[:wait] and "LDG.E " in ops[wait:], ops
    assert any(o.startswith("REDG.E.ADD.F32") for o in ops) and not any(o.startswith("ATOMG") for o in ops), ops


DYN_CASES = [  # M, K, N, (bn, kt, ring, per_sm, atomic), prologue: what it exercises
    (1, 512, 64, (16, 2, 2, 3, True), None),  # more programs than chunks: some take none
    (1, 1024, 48, (16, 1, 2, 1, True), None),  # 4 programs, 12 chunks of 4: most taken from the counter
    (2, 256, 96, (32, 2, 1, 2, False), None),  # ring 1, two token rows
    (1, 4096, 48, (16, 1, 2, 1, True), "norm"),  # an XNorm prologue: every program writes the whole row
]


def _xnorm_inputs(m: int, k: int, gen: torch.Generator, pro):
    """(prologue, its reference twin, x, x_ref): with pro an XNorm over random residual / weight / r whose x starts as
    NaN (the kernel must write it) and x_ref the reference's; without, no prologue and x = x_ref random."""
    from flashscale.kernels.w4a16_prologue import XNorm, reference

    res = torch.randn(m, k, generator=gen).half()
    w = (torch.rand(k, generator=gen) + 0.5).half()
    r = torch.randn(m, k, generator=gen)
    if not pro:
        return None, None, res, res
    make = lambda: XNorm(res=res, weight=w, eps=1e-5, res_out=torch.full_like(res, float("nan")), r=r)  # noqa: E731
    prologue, ref_pro = make(), make()
    x, x_ref = torch.full((m, k), float("nan")).half(), torch.zeros(m, k).half()
    reference(ref_pro, x_ref)
    return prologue, ref_pro, x, x_ref


@pytest.mark.parametrize("m,k,n,cfg,pro", DYN_CASES)
def test_dyn_add_mode_takes_every_item_once(m, k, n, cfg, pro):
    """launch(add=True, counter=...) (the DYN build: chunks of items taken from an atomic counter after each
    program's first): out gets x @ W as the static split's launch does (the same items, another summation order), the
    counter ends at the chunks taken (every chunk past the programs' first once, and one empty take a program at
    most); with an XNorm prologue x and the new residual equal the reference bitwise, whole."""
    from flashscale.kernels.w4a16_ring import dyn_chunk, launch, ring_grid

    gen = torch.Generator().manual_seed(k + n + m)
    p = _weight(k, n, 128, sym=False, gen=gen)
    bn, kt, ring, per_sm, atomic = cfg
    c = RingConfig(bn=bn, kt=kt, num_warps=1, ring=ring, per_sm=per_sm, atomic=atomic)
    progs, items, _, _ = ring_grid(k, n, c, per_sm, 4)
    ch = dyn_chunk(items, progs, ring)
    prologue, ref_pro, x, x_ref = _xnorm_inputs(m, k, gen, pro)
    out, ctr = torch.zeros(m, n), torch.zeros(1, dtype=torch.int32)
    launch(x, p, None, out, c, per_sm, add=True, prologue=prologue, counter=ctr)
    if pro:
        assert torch.equal(x, x_ref) and torch.equal(prologue.res_out, ref_pro.res_out)
    want = torch.zeros(m, n)
    launch(x_ref, p, None, want, c, per_sm, add=True)
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-4)
    nch = -(-items // ch)
    taken = max(0, nch - progs)  # chunks past the programs' first
    assert taken <= ctr.item() <= taken + progs


LATE_CASES = [  # M, K, N, (bn, kt, ring, per_sm, atomic, late, late_share), prologue: what it exercises
    (1, 1024, 96, (16, 1, 2, 3, True, 6, 1), None),  # 12 programs, the last 4 with 3/4 of a share
    (2, 512, 128, (16, 2, 1, 2, False, 4, 1), None),  # ring 1, two token rows, half a share
    (1, 1024, 48, (16, 1, 2, 3, True, 5, 2), "norm"),  # two thirds late; the early programs' prologue writes more x
]


@pytest.mark.parametrize("m,k,n,cfg,pro", LATE_CASES)
def test_late_shares_take_every_item_once(m, k, n, cfg, pro):
    """RingConfig.late < 8 (add mode): the last programs take late / 8 of a share, the others more; out gets the
    even split's x @ W (the same items, partials summed in another order), an XNorm prologue's x and new residual
    equal the reference bitwise; the split is uneven as asked (late_cut)."""
    from flashscale.kernels.w4a16_ring import late_cut, launch, ring_grid

    gen = torch.Generator().manual_seed(k + n + m + 1)
    p = _weight(k, n, 128, sym=False, gen=gen)
    bn, kt, ring, per_sm, atomic, late, share = cfg
    c = RingConfig(bn=bn, kt=kt, num_warps=1, ring=ring, per_sm=per_sm, atomic=atomic, late=late, late_share=share)
    progs, items, _, _ = ring_grid(k, n, c, per_sm, 4)  # the interpreter's 4 SMs
    cut = late_cut(progs, items, per_sm, c)
    assert cut == progs - progs * share // per_sm < progs
    prologue, ref_pro, x, x_ref = _xnorm_inputs(m, k, gen, pro)
    out = torch.zeros(m, n)
    launch(x, p, None, out, c, per_sm, add=True, prologue=prologue)
    if pro:
        assert torch.equal(x, x_ref) and torch.equal(prologue.res_out, ref_pro.res_out)
    want = torch.zeros(m, n)
    launch(x_ref, p, None, want, RingConfig(bn=bn, kt=kt, num_warps=1, ring=ring, per_sm=per_sm, atomic=atomic),
           per_sm, add=True)
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-4)


def test_late_refusals():
    """late / late_share out of range and late without add mode are refused, naming the field; a late share too small
    for an item leaves the split even."""
    from flashscale.kernels.w4a16_ring import late_cut, launch

    gen = torch.Generator().manual_seed(5)
    p = _weight(256, 32, 128, sym=True, gen=gen)
    x, out = torch.zeros(1, 256).half(), torch.zeros(1, 32)
    with pytest.raises(ValueError, match="late=6 .* needs add=True"):
        launch(x, p, None, out.half(), RingConfig(bn=16, kt=2, num_warps=1, ring=2, per_sm=2, late=6), 2)
    with pytest.raises(ValueError, match="late must be 1..8 and late_share 1..per_sm=2"):
        late_cut(10, 40, 2, RingConfig(late=0))
    with pytest.raises(ValueError, match="late_share 1..per_sm=2"):
        late_cut(10, 40, 2, RingConfig(late=6, late_share=3))
    assert late_cut(10, 40, 2, RingConfig(late=6)) == 5
    assert late_cut(10, 12, 2, RingConfig(late=1)) == 10  # 1/8 of 1.3 items: none, so even


def test_dyn_refusals():
    """counter is refused where its programs could not take any item: no add mode, a SiLU prologue (x is written
    chunk by chunk), a ring of 4, a counter that is not int32."""
    from flashscale.kernels.w4a16_prologue import XSiLU
    from flashscale.kernels.w4a16_ring import launch

    gen = torch.Generator().manual_seed(3)
    p = _weight(256, 32, 128, sym=True, gen=gen)
    x, out, ctr = torch.zeros(1, 256).half(), torch.zeros(1, 32), torch.zeros(1, dtype=torch.int32)
    c = RingConfig(bn=16, kt=2, num_warps=1, ring=2, per_sm=1, atomic=True)
    with pytest.raises(ValueError, match="counter .* needs add=True"):
        launch(x, p, None, out.half(), c, 1, counter=ctr)
    with pytest.raises(ValueError, match="needs add=True, a ring of <= 2 and no prologue or an XNorm"):
        launch(x, p, None, out, c, 1, add=True, prologue=XSiLU(gu=torch.zeros(1, 512)), counter=ctr)
    with pytest.raises(ValueError, match="ring of <= 2"):
        launch(x, p, None, out, RingConfig(bn=16, kt=2, num_warps=1, ring=4, per_sm=1), 1, add=True, counter=ctr)
    with pytest.raises(ValueError, match="counter must be an int32 tensor"):
        launch(x, p, None, out, c, 1, add=True, counter=torch.zeros(1))
