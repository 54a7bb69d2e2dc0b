"""The FP8 pre-pass kernel (kernels.hadamard) compiles for sm_90 without a GPU (Triton ships ptxas) with no register
spills: at the configs hadamard_quant picks by itself for Q, K and V^T as ops.attention_fp8 quantizes them for its
kernel's default (head dims 64, 128, 256; session 28 found whole blocks that spilled 188 B to ~1 KB and ran 3x
slower), and at the configs of the opt-in method "kron" that benchmarks/fp8_prepass_sweep.py times (KRON) in 128- and
256-row blocks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from offline_compile import compile_offline

pytest.importorskip("triton.compiler")

# Compiled in a fresh interpreter: tests/conftest.py sets TRITON_INTERPRET=1 on CPU machines.
_COMPILE = """
import json, sys
from flashscale.kernels import hadamard as hq
from flashscale.kernels.aot import ptxas_stats
out = []
for kw in json.loads(sys.argv[1]):
    st = ptxas_stats(hq.compile_sm90(**kw).asm["ptx"])
    out.append(dict(kw, registers=st["registers"], spills=st["spill_stores"] + st["spill_loads"] + st["stack"]))
json.dump(out, open(sys.argv[2], "w"))
"""


def _default_configs() -> list[dict]:
    from flashscale.kernels import attention_fa3_fp8 as fa3
    from flashscale.kernels.hadamard import auto_config

    out = []
    for d in (64, 128, 256):
        for causal in (False, True):
            bn = fa3.quant_block_n(d, causal)
            vperm = fa3.default_config(d, bn, causal).v_perm
            for block, hadamard, transpose in ((128, True, False), (bn, True, False), (bn, False, True)):
                chunk, warps, hmat = auto_config(block, d, transpose=transpose, hadamard=hadamard)
                kw = dict(D=d, block=block, hadamard=hadamard, chunk=chunk, num_warps=warps, transpose=transpose,
                          key_perm=transpose and vperm, hmat=hmat)
                if kw not in out:
                    out.append(kw)
    return out


def test_the_pre_pass_compiles_spill_free(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from fp8_prepass_sweep import KRON, kron_configs

    cases = _default_configs() + [dict(D=d, block=b, method="kron", chunk=c, num_warps=w) for d in KRON
                                  for b in (128, 256) for c, w in kron_configs(b, d)]
    out = tmp_path / "stats.json"
    compile_offline(_COMPILE, json.dumps(cases), str(out))
    stats = json.loads(out.read_text())
    assert len(stats) == len(cases)
    bad = [(s, s["spills"]) for s in stats if s["spills"]]
    assert not bad, bad
