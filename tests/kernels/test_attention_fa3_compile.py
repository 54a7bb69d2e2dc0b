"""The FA3-style Gluon forward compiles for sm_90 without a GPU (Triton ships ptxas), and the machine code
has what the design promises: wgmma (warpgroup MMA), TMA bulk tensor copies, register reallocation between
the producer and consumer warpgroups, no register spills, and shared memory within an H100/H200 SM."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

fa3 = pytest.importorskip("flashscale.kernels.attention_fa3")
if not fa3.HAS_GLUON:
    pytest.skip("this triton has no Gluon warp_specialize", allow_module_level=True)

SMEM_PER_BLOCK = 227 * 1024  # H100/H200: 228 KB an SM, 227 KB the most one block may take


# Compiled in a fresh interpreter: tests/conftest.py sets TRITON_INTERPRET=1 on CPU machines, and the
# interpreter tests that run before these patch triton.language in-process, which breaks Gluon's frontend.
_COMPILE = """
import json, sys
from flashscale.kernels import attention_fa3 as fa3
from flashscale.kernels.aot import ptxas_stats
out, res = sys.argv[1], {}
for d in fa3.HEAD_DIMS:
    for causal in (False, True):
        k = fa3.compile_sm90(d, causal)
        name = f"d{d}_{'causal' if causal else 'full'}"
        open(f"{out}/{name}.ptx", "w").write(k.asm["ptx"])
        res[name] = dict(shared=k.metadata.shared, cubin_bytes=len(k.asm["cubin"]),
                         stats=ptxas_stats(k.asm["ptx"]))
json.dump(res, open(f"{out}/compiled.json", "w"))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("fa3_sm90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(fa3.__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _COMPILE, str(out)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"sm_90 compile failed:\n{proc.stderr[-4000:]}"
    meta = json.loads((out / "compiled.json").read_text())

    def get(head_dim, causal):
        name = f"d{head_dim}_{'causal' if causal else 'full'}"
        return (out / f"{name}.ptx").read_text(), meta[name]

    return get


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", fa3.HEAD_DIMS)
def test_compiles_to_wgmma_and_tma_without_spills(compiled, head_dim, causal):
    ptx, meta = compiled(head_dim, causal)
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
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx), "consumers get no extra registers"
    assert stats["spill_stores"] == 0 and stats["spill_loads"] == 0, stats["log"]
    cfg = fa3.DEFAULT_CONFIGS[head_dim]
    assert meta["shared"] <= SMEM_PER_BLOCK, f"{meta['shared']} B of shared memory"
    assert meta["shared"] >= fa3.smem_bytes(head_dim, cfg), "Q tile + K/V ring not all in shared memory"


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
