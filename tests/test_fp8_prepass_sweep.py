"""benchmarks/fp8_prepass_sweep.py's bookkeeping on the CPU: which configs it times, and when a config's output
agrees with the default's (bit for bit in the default's summation order; for kron, the GPU tests' bound)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from fp8_prepass_sweep import agrees, configs, kron_configs  # noqa: E402


def test_configs_respect_the_compile_limits():
    q = dict(block=128, hadamard=True)
    vt = dict(block=256, hadamard=False, transpose=True)
    for kw, d in ((q, 128), (q, 256), (vt, 128)):
        for c in configs(kw, d):
            rows = c["chunk"] or kw["block"]
            assert rows * d <= 128 * 256 and 16 <= rows * d // (32 * c["num_warps"]) <= 128
            assert not (c["hmat"] and not kw["hadamard"]) and not (c["chunk"] == 0 and c["num_stages"] > 1)
    assert all("method" not in c for c in configs(q, 256))  # mma only unless asked
    kron = [c for c in configs(q, 256, ("kron",))]
    assert kron and all(c["method"] == "kron" for c in kron) and not configs(vt, 128, ("kron",))
    assert kron_configs(256, 128) == [(32, 4), (64, 4), (64, 8)]  # no whole 256 x 128 block (it spills)


def test_agreement_rule():
    g = torch.Generator().manual_seed(0)
    vals = (torch.randn(1000, generator=g) * 50).to(torch.float8_e4m3fn)
    desc = torch.rand(8, generator=g)
    ref = (vals, desc)
    assert agrees(ref, ref, True) == (0, True) and agrees(ref, ref, False) == (0, True)
    one = vals.view(torch.uint8).clone()
    one[3] += 1  # one value one e4m3 step away
    got = (one.view(torch.float8_e4m3fn), desc)
    assert agrees(got, ref, True) == (1, False) and agrees(got, ref, False) == (1, True)
    many = vals.view(torch.uint8).clone()
    many[:20] += 1  # 2 % of the values a step away: over the 1 % the GPU tests allow
    assert agrees((many.view(torch.float8_e4m3fn), desc), ref, False) == (20, False)
    far = vals.view(torch.uint8).clone()
    far[5] += 9  # one value more than a step away
    assert not agrees((far.view(torch.float8_e4m3fn), desc), ref, False)[1]
    assert not agrees((vals, desc * (1 + 1e-5)), ref, False)[1]  # descales past 1e-6
