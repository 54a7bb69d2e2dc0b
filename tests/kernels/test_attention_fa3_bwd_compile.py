"""The FA3-style Gluon backward compiles for sm_90 without a GPU (Triton ships ptxas), and the machine code
has what the design promises: wgmma for the five GEMMs, TMA loads of K/V and the Q/dO ring, TMA stores of
dK/dV, mbarrier waits, dQ by vector reductions (red.global.add.v2.f32), shared memory within an H200 SM,
and register spills bounded (docs/attention_fa3.md records them: the fused dQ costs registers).
The warp-specialized configs (ws=True in TUNING_CONFIGS) are held to more: no spill and no local memory at all,
setmaxnreg 240 for the MMA warps and 24 for the producer / dQ writer, no wgmma serialization, and a key loop
with the five GEMMs' HGMMAs and no global reduction (the dQ writer's red.global.add.v4, or its TMA reduce-add
with dq_tma, lies outside it)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from offline_compile import compile_offline

bwd = pytest.importorskip("flashscale.kernels.attention_fa3_bwd")
if not bwd.HAS_GLUON:
    pytest.skip("this triton has no Gluon", allow_module_level=True)

SMEM_PER_BLOCK = 227 * 1024

_COMPILE = """
import json, sys
from flashscale.kernels import attention_fa3_bwd as bwd
from flashscale.kernels.aot import ptxas_stats
out, res = sys.argv[1], {}
for d, causal, group in ((64, True, 1), (128, False, 4), (256, True, 2)):
    name = f"d{d}_{'causal' if causal else 'full'}_g{group}"
    k = bwd.compile_sm90(d, causal, group=group, config=bwd.PLAIN_CONFIGS[d])
    open(f"{out}/{name}.ptx", "w").write(k.asm["ptx"])
    st = ptxas_stats(k.asm["ptx"])
    st.pop("log")
    res[name] = dict(shared=k.metadata.shared, cubin_bytes=len(k.asm["cubin"]), stats=st)
json.dump(res, open(f"{out}/compiled.json", "w"))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("fa3_bwd_sm90")
    compile_offline(_COMPILE, str(out))  # Gluon has no interpreter
    return out, json.loads((out / "compiled.json").read_text())


@pytest.mark.parametrize("name", ["d64_causal_g1", "d128_full_g4", "d256_causal_g2"])
def test_machine_code(compiled, name):
    out, meta = compiled
    ptx = (out / f"{name}.ptx").read_text()
    m = meta[name]
    assert m["cubin_bytes"] > 0
    # five GEMMs a step (S^T, dP^T, dV, dQ, dK), each some wgmma instructions
    assert len(re.findall(r"wgmma\.mma_async", ptx)) >= 5 * 4
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.3d\.shared::cluster\.global", ptx)) >= 4  # K, V, Q, dO
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.3d\.global\.shared", ptx)) == 2  # dK, dV
    assert "mbarrier.try_wait.parity" in ptx
    assert "red.relaxed.gpu.global.add.v2.f32" in ptx and "atom.global" not in ptx
    assert m["shared"] <= SMEM_PER_BLOCK, m
    # measured (2026-12-01): 16-84 spilled registers (64-336 B); a regression past 512 B fails here
    assert m["stats"]["spill_stores"] <= 512, m["stats"]


_COMPILE_WS = """
import json, re, sys
from flashscale.kernels import attention_fa3_bwd as bwd
from flashscale.kernels.aot import ptxas_stats, sass, sass_instructions, sass_key_loops, sass_opcode
out, res = sys.argv[1], {}
for d, cfgs in bwd.TUNING_CONFIGS.items():
    for name, cfg in cfgs.items():
        if not cfg.ws:
            continue
        for causal in ((False, True) if d == 128 else (True, )):
            key = f"d{d}_{name}_{'causal' if causal else 'full'}"
            k = bwd.compile_sm90(d, causal, group=2, config=cfg)
            ptx = k.asm["ptx"]
            st = ptxas_stats(ptx)
            text = sass(k.asm["cubin"])
            ops = [sass_opcode(t) for _, t in sass_instructions(text)]
            loops = [[sass_opcode(t) for _, t in body] for body in sass_key_loops(text)]
            res[key] = dict(
                d=d, block_m=cfg.block_m, block_n=cfg.block_n, shared=k.metadata.shared, smem_est=bwd.smem_bytes(d, cfg),
                registers=st["registers"], spill_stores=st["spill_stores"], spill_loads=st["spill_loads"],
                stack=st["stack"], serialized="C7512" in st["log"],
                setmaxnreg=sorted({int(x) for x in re.findall(r"setmaxnreg\\.\\w+\\.sync\\.aligned\\.u32\\s+(\\d+)", ptx)}),
                local=sum(o.startswith(("LDL", "STL")) for o in ops), red_v4=sum(o.startswith("REDG") and "F32x4" in o
                                                                                 for o in ops),
                tma_loads=len(re.findall(r"cp\\.async\\.bulk\\.tensor\\.3d\\.shared::cluster\\.global", ptx)),
                tma_stores=len(re.findall(r"cp\\.async\\.bulk\\.tensor\\.3d\\.global\\.shared", ptx)),
                ptx_red_v4="red.relaxed.gpu.global.add.v4.f32" in ptx, ptx_atom="atom.global" in ptx,
                dq_tma=cfg.dq_tma, dq_split=cfg.dq_split,
                tma_reduce=len(re.findall(r"cp\\.reduce\\.async\\.bulk\\.tensor\\.3d\\.global\\.shared[^;]*\\.add", ptx)),
                loops=[dict(hgmma=sum("HGMMA" in o for o in b), red=sum(o.startswith("RED") for o in b),
                            local=sum(o.startswith(("LDL", "STL")) for o in b)) for b in loops])
json.dump(res, open(f"{out}/compiled_ws.json", "w"))
"""

WS_NAMES = [f"d{d}_{name}_{c}" for d, cfgs in bwd.TUNING_CONFIGS.items() for name, cfg in cfgs.items() if cfg.ws
            for c in (("full", "causal") if d == 128 else ("causal", ))]


@pytest.fixture(scope="module")
def compiled_ws(tmp_path_factory):
    out = tmp_path_factory.mktemp("fa3_bwd_ws_sm90")
    compile_offline(_COMPILE_WS, str(out), what="sm_90 compile of the warp-specialized backward")
    return json.loads((out / "compiled_ws.json").read_text())


def test_ws_configs_are_listed_and_are_the_defaults_where_they_fit():
    assert {"n128_m64_ws", "n128_m64_ws_s3"} <= set(bwd.TUNING_CONFIGS[128])
    # measured faster (docs/attention_fa3.md): warp-specialized with the TMA dQ writer at every head dim
    assert all(bwd.DEFAULT_CONFIGS[d].ws and bwd.DEFAULT_CONFIGS[d].dq_tma for d in (64, 128, 256))
    assert not any(cfg.ws for cfg in bwd.PLAIN_CONFIGS.values())
    assert len(WS_NAMES) >= 4


# configs allowed a few spilled registers, all outside the key loop (stored and reloaded once a program)
WS_SPILLS_OUTSIDE_LOOP = {"d64_n128_m128_ws_tma_causal": 64, "d64_n128_m128_ws_tma_1b_causal": 64}


@pytest.mark.parametrize("name", WS_NAMES)
def test_ws_machine_code(compiled_ws, name):
    m = compiled_ws[name]
    allowed = WS_SPILLS_OUTSIDE_LOOP.get(name, 0)
    assert m["spill_stores"] <= allowed and m["spill_loads"] <= allowed, m
    assert allowed or (m["spill_stores"] == 0 and m["stack"] == 0 and m["local"] == 0), m
    assert not m["serialized"], f"ptxas serialized the wgmmas (C7512): {m}"
    assert m["shared"] <= SMEM_PER_BLOCK, m
    # smem_bytes (config_error's check) bounds the real thing from above, within its 6 KB of alignment slack
    assert m["smem_est"] - 6 * 1024 <= m["shared"] <= m["smem_est"], m
    assert m["setmaxnreg"] == [24, 240], m  # MMA warps 240, producer / dQ writer 24
    # one key loop, the MMA warps': S^T, dP^T (K = D), dV, dK (K = BLOCK_M), dQ (K = BLOCK_N), in 16-deep HGMMAs a
    # warpgroup; no global reduction there: the writer's red.global.add.v4 (outside) does dQ
    assert len(m["loops"]) == 1, m
    loop = m["loops"][0]
    # (dq_split pieces of dQ: each piece's wgmmas are narrower, as many of them as a whole dQ's)
    assert loop["hgmma"] == (2 * m["d"] + 2 * m["block_m"]) // 16 + m["block_n"] // 16 * m["dq_split"], m
    assert loop["red"] == 0 and loop["local"] == 0, m
    if m["dq_tma"]:  # one bulk tensor reduce-add of the float32 dQ tile a step (split in 128-byte-wide boxes)
        assert m["tma_reduce"] >= 1 and m["red_v4"] == 0 and not m["ptx_red_v4"] and not m["ptx_atom"], m
    else:
        assert m["red_v4"] > 0 and m["ptx_red_v4"] and not m["ptx_atom"] and m["tma_reduce"] == 0, m
    assert m["tma_loads"] >= 4 and m["tma_stores"] == 2, m  # K, V, Q, dO in; dK, dV out


def test_config_errors_are_clear():
    assert bwd.config_error(96, bwd.FA3BwdConfig()) is not None
    assert "block_n" in bwd.config_error(128, bwd.FA3BwdConfig(block_n=32))
    assert bwd.config_error(256, bwd.FA3BwdConfig(block_n=128, block_m=128)) is not None  # shared memory
    assert bwd.config_error(128, bwd.FA3BwdConfig(ws=True, stages=1)) is not None
    assert bwd.config_error(128, bwd.FA3BwdConfig(ws=True, stages=3, dq_stages=2)) is not None  # 242 KB
    assert bwd.config_error(256, bwd.FA3BwdConfig(block_n=64, block_m=64, ws=True)) is not None  # shared memory
    assert bwd.config_error(256, bwd.FA3BwdConfig(block_n=64, block_m=64, ws=True, dq_tma=True, dq_warps=1,
                                                  dq_split=2, dq_stages=1)) is not None  # 32 KB dQ piece: no room
    assert "dq_split" in bwd.config_error(128, bwd.FA3BwdConfig(dq_split=4))  # 32-column pieces
    assert "dq_split 8" in bwd.config_error(128, bwd.FA3BwdConfig(ws=True, dq_tma=True, dq_warps=1, dq_split=8))
    assert "dq_split" in bwd.config_error(256, bwd.FA3BwdConfig(dq_split=8))  # 32-column pieces need the TMA writer
    assert "dq_tma" in bwd.config_error(128, bwd.FA3BwdConfig(ws=True, dq_split=2))
    assert bwd.config_error(128, bwd.FA3BwdConfig(ws=True, red_v2=False)) is not None
    assert "dq_warps" in bwd.config_error(128, bwd.FA3BwdConfig(ws=True, dq_tma=True, dq_warps=2))
    assert "ws=True" in bwd.config_error(128, bwd.FA3BwdConfig(dq_tma=True))
    assert "ws=True" in bwd.config_error(256, bwd.FA3BwdConfig(block_n=64, block_m=64, ss_dkv=True))
    assert "block_n 64" in bwd.config_error(128, bwd.FA3BwdConfig(ws=True, ss_dkv=True))
    assert "do_single" in bwd.config_error(256, bwd.FA3BwdConfig(block_n=64, block_m=64, do_single=True))
    assert "dq_stages 7" in bwd.config_error(64, bwd.FA3BwdConfig(ws=True, dq_tma=True, dq_warps=1, dq_stages=7))
    # one_end_bar: one arrive serves the Q/dO ring and the dQ slots, so they need the same depth
    d128 = bwd.DEFAULT_CONFIGS[128]
    assert bwd.config_error(128, replace(d128, one_end_bar=True)) is None
    assert "dq_stages 1, stages 2" in bwd.config_error(128, replace(d128, one_end_bar=True, dq_stages=1))
    assert "one_end_bar" in bwd.config_error(128, replace(d128, one_end_bar=True, dq_split=2, dq_stages=2))
    assert "one_end_bar" in bwd.config_error(256, replace(bwd.DEFAULT_CONFIGS[256], one_end_bar=True))  # do_single
    assert "ws=True" in bwd.config_error(128, bwd.FA3BwdConfig(early_stats=True))
    assert "one_end_bar is the warp-specialized" in bwd.config_error(128, bwd.FA3BwdConfig(one_end_bar=True))
    # D 256: dO single-buffered frees the 32 KB that a third dQ slot takes; with dO in the ring it does not fit
    d256 = bwd.DEFAULT_CONFIGS[256]
    assert d256.do_single and d256.dq_stages == 3 and bwd.config_error(256, d256) is None
    assert "shared memory" in bwd.config_error(256, replace(d256, do_single=False))
