"""The FA3-style Gluon forward compiles for sm_90 without a GPU (Triton ships ptxas), and the machine code
has what the design promises: wgmma (warpgroup MMA), TMA bulk tensor copies, register reallocation between
the producer and consumer warpgroups, no register spills, and shared memory within an H100/H200 SM; with
ping-pong (the default) the consumer warpgroups are separate partitions (no barrier spans two of them).
The packed varlen kernel too, with the dense kernel's key loops; and the dense kernel's SASS is what it was
before varlen was added (instruction counts recorded with triton 3.6.0)."""

from __future__ import annotations

import json
import re

import pytest

from offline_compile import compile_offline

fa3 = pytest.importorskip("flashscale.kernels.attention_fa3")
if not fa3.HAS_GLUON:
    pytest.skip("this triton has no Gluon warp_specialize", allow_module_level=True)

SMEM_PER_BLOCK = 227 * 1024  # H100/H200: 228 KB an SM, 227 KB the most one block may take


# Compiled in a fresh interpreter: tests/conftest.py sets TRITON_INTERPRET=1 on CPU machines, and the
# interpreter tests that run before these patch triton.language in-process, which breaks Gluon's frontend.
_COMPILE = """
import json, sys
from flashscale.kernels import attention_fa3 as fa3
from flashscale.kernels.aot import ptxas_stats, sass
out, extra, res = sys.argv[1], json.loads(sys.argv[2]), {}
jobs = [(f"{pre}d{d}_{'causal' if c else 'full'}", d, c, None, pre == "varlen_") for pre in ("", "varlen_")
        for d in fa3.HEAD_DIMS for c in (False, True)]
jobs += [(name, d, c, fa3.FA3Config(**kw), False) for name, (d, c, kw) in extra.items()]
for name, d, causal, cfg, varlen in jobs:
    k = fa3.compile_sm90(d, causal, config=cfg, varlen=varlen)
    open(f"{out}/{name}.ptx", "w").write(k.asm["ptx"])
    open(f"{out}/{name}.sass", "w").write(sass(k.asm["cubin"]))
    res[name] = dict(shared=k.metadata.shared, cubin_bytes=len(k.asm["cubin"]), stats=ptxas_stats(k.asm["ptx"]))
json.dump(res, open(f"{out}/compiled.json", "w"))
"""

# Beyond the defaults (one compile each, to keep this CPU test fast): the cooperative fallback (one 8-warp
# consumer partition) and the 3-consumer ping-pong tile for D = 64.
EXTRA = {
    "coop_d128_causal": (128, True, dict(pingpong=False)),
    "pp3_d64_full": (64, False, dict(block_m=192, block_n=128, stages=3, consumers=3)),
    "dyn_d64_causal": (64, True, dict(block_m=128, block_n=128, stages=3, persistent=True, dynamic=True)),
}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("fa3_sm90")
    compile_offline(_COMPILE, str(out), json.dumps(EXTRA))
    meta = json.loads((out / "compiled.json").read_text())

    def get(name, sass=False):
        if sass:
            return (out / f"{name}.sass").read_text()
        return (out / f"{name}.ptx").read_text(), meta[name]

    return get


def _check_machine_code(ptx, meta, head_dim, cfg):
    stats = meta["stats"]
    assert meta["cubin_bytes"] > 0, "no cubin"
    n_wgmma = len(re.findall(r"wgmma\.mma_async", ptx))
    assert n_wgmma > 0, "no warpgroup MMA (wgmma.mma_async) in the PTX"
    loads = re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx)
    stores = re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)
    assert loads, "no TMA loads (cp.async.bulk.tensor global -> shared)"
    assert stores, "no TMA store of the output tile"
    assert "mbarrier.try_wait.parity" in ptx, "no mbarrier waits: the K/V ring is not mbarrier-synchronised"
    # producer gives registers back, consumers take them (FA3's register reallocation)
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx), "producer keeps its registers"
    consumer_regs = 240 if cfg.consumers <= 2 else 160
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{consumer_regs};", ptx), "consumers get no registers"
    assert stats["spill_stores"] == 0 and stats["spill_loads"] == 0, stats["log"]
    assert meta["shared"] <= SMEM_PER_BLOCK, f"{meta['shared']} B of shared memory"
    assert meta["shared"] >= fa3.smem_bytes(head_dim, cfg), "Q tile + K/V ring not all in shared memory"
    # Partition-local named barriers (Triton lowers each consumer partition's mbarrier.arrive to a bar.sync of
    # its own threads + one elected arrive): 128 threads per barrier with ping-pong, so no warpgroup ever
    # waits for another one outside the turn mbarriers; 256 (both warpgroups in lock-step) without.
    widths = {int(n) for n in re.findall(r"\bbar\.sync\s+\d+,\s*(\d+);", ptx)}
    assert widths == ({128} if cfg.is_pingpong else {128 * cfg.consumers}), widths


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", fa3.HEAD_DIMS)
def test_compiles_to_wgmma_and_tma_without_spills(compiled, head_dim, causal):
    cfg = fa3.DEFAULT_CONFIGS[head_dim]
    assert cfg.is_pingpong, "the defaults are the ping-pong schedule"
    ptx, meta = compiled(f"d{head_dim}_{'causal' if causal else 'full'}")
    _check_machine_code(ptx, meta, head_dim, cfg)


# SASS instructions of the dense defaults (cuobjdump of compile_sm90's cubin, triton 3.6.0's ptxas): the dense
# kernel shares its partitions with varlen, so a varlen change must not move them. Recorded before the varlen
# kernel was added, then +120-152 with the head-grouped tile order (2026-12-03: _tile_info's divisions by HG * n_m
# and the group's head count, once a tile in each of the three partitions, outside the key loop).
DENSE_SASS_INSTRUCTIONS = {"d64_full": 5624, "d64_causal": 6440, "d128_full": 4392, "d128_causal": 4920,
                           "d256_full": 4592, "d256_causal": 4864}


@pytest.mark.parametrize("bh,n_m,n_sms", [(256, 8, 132), (60, 8, 132), (16, 128, 132), (1, 3, 132), (7, 200, 132),
                                          (64, 12, 132), (5, 5, 1)])
def test_head_grouped_tile_order(bh, n_m, n_sms):
    # The tile order the kernels use (_tile_info; tile_order is its Python twin): every (head, query block)
    # exactly once; groups of hg heads whose tiles fill the SMs about once; within a group the heaviest query
    # blocks (last, the most keys under a causal mask) of all its heads first; hg = bh is the old global order.
    hg = fa3.head_group(bh, n_m, n_sms)
    assert 1 <= hg <= bh and (hg == bh or hg * n_m >= n_sms) and (hg == 1 or (hg - 1) * n_m < n_sms)
    order = fa3.tile_order(bh, n_m, hg)
    assert sorted(order) == [(h, m) for h in range(bh) for m in range(n_m)]
    for g0 in range(0, bh, hg):
        tiles = order[g0 * n_m:(g0 + min(hg, bh - g0)) * n_m]
        assert {h for h, _ in tiles} == set(range(g0, min(bh, g0 + hg))), "a group is a run of whole heads"
        assert [m for _, m in tiles] == sorted((m for _, m in tiles), reverse=True), "heaviest first in a group"
    flat = fa3.tile_order(bh, n_m, fa3.head_group(bh, n_m, n_sms, grouped=False))
    assert flat == [(t % bh, n_m - 1 - t // bh) for t in range(bh * n_m)]
    with pytest.raises(ValueError, match="n_m"):
        fa3.head_group(bh, 0, n_sms)


def test_seqlen_configs():
    # Every (head dim, causal) has a rule ending in "any length", every name is a config the sweep times and the
    # GPU tests run, and the bounds rise along a rule.
    for d in fa3.HEAD_DIMS:
        for causal in (False, True):
            rule = fa3.SEQLEN_CONFIGS[(d, causal)]
            assert rule[-1][0] is None and all(b is not None for b, _ in rule[:-1])
            assert [b for b, _ in rule[:-1]] == sorted(b for b, _ in rule[:-1])
            for bound, name in rule:
                assert fa3.config_error(d, fa3.TUNING_CONFIGS[d][name]) is None
                assert fa3.default_config(d, causal, bound or 1 << 20) is fa3.TUNING_CONFIGS[d][name]
    assert fa3.default_config(64, True, 4096).persistent and not fa3.default_config(64, False, 4097).persistent
    assert fa3.default_config(128, True, 16384).dynamic and not fa3.default_config(128, False, 16384).dynamic
    # the folded scale where the session-25 sweep measured it ahead, not at D 128 full 1k nor D 256
    assert fa3.default_config(128, True, 1024).fold_scale and not fa3.default_config(128, False, 1024).fold_scale
    assert fa3.default_config(128, False, 1025).fold_scale and not fa3.default_config(256, True, 4096).fold_scale


@pytest.mark.parametrize("n_tiles,programs", [(1000, 132), (132, 132), (50, 132), (7, 7), (264, 132), (133, 132)])
def test_persistent_snake_schedule(n_tiles, programs):
    # The persistent programs' tile lists (program_tiles mirrors the kernels' _program_tiles / _snake_tile
    # formulas, checked here against that closed form): every tile once, counts per program within one, and
    # under a causal mask (tile t's cost falling with its rank in a group of `programs` tiles) no program
    # carries the heaviest tile of every round as round-robin would.
    sched = fa3.program_tiles(n_tiles, programs)
    assert sorted(t for ts in sched for t in ts) == list(range(n_tiles))
    rounds, rem = divmod(n_tiles, programs)
    for p, ts in enumerate(sched):
        slot = p if rounds % 2 == 0 else programs - 1 - p
        assert len(ts) == rounds + (slot < rem)
        assert ts == [k * programs + p + (k % 2) * (programs - 1 - 2 * p) for k in range(len(ts))]
    if rounds >= 2:
        cost = [sum(programs - t % programs for t in ts) for ts in sched]
        robin = [sum(programs - t % programs for t in range(p, n_tiles, programs)) for p in range(programs)]
        assert max(cost) - min(cost) <= programs + 1 < max(robin) - min(robin)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", fa3.HEAD_DIMS)
def test_dense_sass_unchanged(compiled, head_dim, causal):
    import triton

    from flashscale.kernels.aot import sass_instructions

    if triton.__version__ != "3.6.0":
        pytest.skip(f"counts recorded with triton 3.6.0, this is {triton.__version__}")
    name = f"d{head_dim}_{'causal' if causal else 'full'}"
    assert len(sass_instructions(compiled(name, sass=True))) == DENSE_SASS_INSTRUCTIONS[name]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", fa3.HEAD_DIMS)
def test_varlen_compiles_to_wgmma_and_tma_without_spills(compiled, head_dim, causal):
    # The packed-layout kernel at the defaults: the same machine-code checks as dense (TMA loads, the output
    # TMA store for slices inside their sequence, mbarriers, setmaxnreg, partition-local barriers, no spills),
    # plus the masked 16-byte stores of a slice a sequence ends in and the loads of cu_seqlens.
    name = f"d{head_dim}_{'causal' if causal else 'full'}"
    ptx, meta = compiled("varlen_" + name)
    _check_machine_code(ptx, meta, head_dim, fa3.DEFAULT_CONFIGS[head_dim])
    assert re.search(r"st\.global(\.\w+)*\.v4\.b32", ptx), "no 16-byte masked output stores"
    assert re.search(r"ld\.global(\.\w+)*\.b32", ptx), "no cu_seqlens loads"
    _, dense_meta = compiled(name)
    assert meta["stats"]["registers"] == dense_meta["stats"]["registers"]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", fa3.HEAD_DIMS)
def test_varlen_key_loops_are_the_dense_ones(compiled, head_dim, causal):
    # Varlen changes where tiles come from and how the last slice is stored, not the key loop: one loop a
    # consumer, the same wgmmas and exp2s in each, and about the same length (uniform vs vector registers
    # for a few addresses differ; seen: within 2%).
    from collections import Counter

    from flashscale.kernels.aot import sass_key_loops, sass_opcode

    name = f"d{head_dim}_{'causal' if causal else 'full'}"
    ops = {v: [Counter(sass_opcode(t) for _, t in loop) for loop in sass_key_loops(compiled(v + name, sass=True))]
           for v in ("", "varlen_")}
    dense, varlen = ops[""], ops["varlen_"]
    assert len(dense) == len(varlen) == fa3.DEFAULT_CONFIGS[head_dim].consumers
    def key(c):  # (wgmmas, exp2s)
        return sum(n for o, n in c.items() if "GMMA" in o), c["MUFU.EX2"]

    assert sorted(map(key, dense)) == sorted(map(key, varlen))
    assert all(key(c)[0] > 0 and key(c)[1] > 0 for c in varlen)
    for d, v in zip(sorted(dense, key=lambda c: sum(c.values())), sorted(varlen, key=lambda c: sum(c.values()))):
        assert abs(sum(v.values()) - sum(d.values())) <= 0.05 * sum(d.values())


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_alternative_configs_compile_without_spills(compiled, name):
    head_dim, _, kw = EXTRA[name]
    ptx, meta = compiled(name)
    _check_machine_code(ptx, meta, head_dim, fa3.FA3Config(**kw))


def test_dynamic_scheduler_takes_tiles_from_one_atomic(compiled):
    # The dynamic persistent grid: the producer's one atomic add on the tile counter a tile (one lane, the result
    # broadcast), the next tile passed to the consumers through shared memory behind mbarriers.
    ptx, _ = compiled("dyn_d64_causal")
    atoms = re.findall(r"@%p\d+ atom\.global\.gpu\.acq_rel\.add\.u32", ptx)
    assert len(atoms) == 1, atoms
    assert "atom.global" not in compiled("d64_causal")[0], "a static grid touches no counter"
    assert "persistent=True" in fa3.config_error(128, fa3.FA3Config(dynamic=True))
    assert "no varlen" in fa3.config_error(128, fa3.FA3Config(persistent=True, dynamic=True), varlen=True)


def test_config_errors():
    # What the launcher refuses before compiling (Gluon tensor shapes are powers of two, wgmma needs 64-row
    # warpgroup slices, shared memory is 227 KB a block), and that every default is accepted.
    for d, cfg in fa3.DEFAULT_CONFIGS.items():
        assert fa3.config_error(d, cfg) is None, (d, cfg)
    C = fa3.FA3Config
    assert "power of two" in fa3.config_error(128, C(block_n=176))
    assert "shared memory" in fa3.config_error(128, C(block_n=256))  # 2 stages of 256-key K and V
    assert "shared memory" in fa3.config_error(256, C(block_n=64, stages=3))
    assert "persistent" in fa3.config_error(128, C(pingpong=False, persistent=True))
    assert "2 or 3" in fa3.config_error(64, C(block_m=256, consumers=4))
    assert fa3.config_error(128, C(block_m=192, consumers=2)) is not None  # 96-row slices
    assert fa3.config_error(64, C(block_m=192, consumers=3, stages=3)) is None
    assert fa3.config_error(128, C(stages=3)) is None  # 229.8 KB: fits, barely
    assert C(consumers=1, block_m=64).num_warps == 4 and not C(consumers=1, block_m=64).is_pingpong
    assert C(block_m=192, consumers=3).q_rows == 64 and C(pingpong=False).q_rows == 128


def test_ptxas_stats_reads_spills():
    # The spill check above must be able to fail: a PTX kernel that forces a local-memory spill.
    # 64 loaded values all stay live until their sum is known, then each is stored plus the sum.
    n = 64
    body = "".join(f"  ld.global.f32 %f{i}, [%rd0+{4 * i}];\n" for i in range(n))
    body += "  mov.f32 %f64, 0f00000000;\n" + "".join(f"  add.f32 %f64, %f64, %f{i};\n" for i in range(n))
    body += "".join(f"  add.f32 %f{i}, %f{i}, %f64;\n  st.global.f32 [%rd0+{4 * i}], %f{i};\n" for i in range(n))
    ptx = (".version 8.0\n.target sm_90a\n.address_size 64\n"
           ".visible .entry spill(.param .u64 p) .maxnreg 24 {\n  .reg .b64 %rd<2>;\n  .reg .f32 %f<65>;\n"
           "  ld.param.u64 %rd0, [p];\n" + body + "  ret;\n}\n")
    from flashscale.kernels.aot import ptxas_stats

    stats = ptxas_stats(ptx)
    assert stats["registers"] <= 24
    assert stats["spill_stores"] > 0, stats["log"]


_COMPILE_FOLD = """
import json, sys
from flashscale.kernels import attention_fa3 as fa3
from flashscale.kernels.aot import ptxas_stats, sass, sass_key_loops, sass_opcode
res = {}
for d, name in ((64, "pp_persist"), (128, "pp_persist")):
    for fold in (False, True):
        k = fa3.compile_sm90(d, True, config=fa3.TUNING_CONFIGS[d][name + ("_fold" if fold else "")])
        loop = [sass_opcode(t) for _, t in sass_key_loops(sass(k.asm["cubin"]))[0]]
        res[f"d{d}_{fold}"] = dict(n=len(loop), ffma=sum(o.startswith("FFMA") for o in loop),
                                   fmul=sum(o.startswith("FMUL") for o in loop),
                                   spills=ptxas_stats(k.asm["ptx"])["spill_stores"])
json.dump(res, open(sys.argv[1] + "/fold.json", "w"))
"""


def test_fold_scale_makes_the_softmax_one_ffma_an_element(tmp_path):
    # fold_scale: the row max on raw scores, p = exp2(s * scale - m) as one FFMA; the key loop (causal, both
    # branches) loses an FMUL and an FADD an element of the thread's 64 and gains nothing else, spilling no more
    compile_offline(_COMPILE_FOLD, str(tmp_path), what="sm_90 compile of the fold_scale variants")
    res = json.loads((tmp_path / "fold.json").read_text())
    for d in (64, 128):
        plain, fold = res[f"d{d}_False"], res[f"d{d}_True"]
        assert fold["ffma"] >= plain["ffma"] + 64 and fold["fmul"] <= plain["fmul"] - 62, (plain, fold)
        assert fold["n"] <= plain["n"] - 60 and fold["spills"] <= plain["spills"], (plain, fold)
