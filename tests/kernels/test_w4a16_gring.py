"""The Gluon decode kernel (flashscale.kernels.w4a16_gring, docs/w4a16_decode.md "Round 8").

Gluon has no interpreter: on the CPU the kernel is compiled for sm_90 (ptxas from Triton, in a fresh interpreter)
and its machine code read: no spills; the item loop copies with cp.async (LDGSTS, 16-byte for the packed words),
reads the slot with LDS.128, runs one mma.sync a packed word plus the x sums, and has no global load of its own.
The arguments it refuses raise errors that name them.

GPU (sm_90): the product against float64 (x @ dequantized W + bias) within 2x the error PyTorch makes with 16-bit
weights, for both split-K reductions, programs that hold fewer items than the ring (copies masked off), many
contributors a tile and one program a tile (direct stores), K/N tails, one group a row, act-order, bias, fp16 and
bf16, M = 1 / 3 / 9 / 16; the deterministic reduction gives the same bits on a repeat; tickets and the atomic tiles
are left at zero.
"""

from __future__ import annotations

import pytest
import torch

from flashscale.kernels.w4a16_common import split_k_workspace
from flashscale.kernels.w4a16_gring import GRING_CONFIGS, GRING_CONFIGS_16, GRingConfig, check_args, w4a16_gring
from test_w4a16_ring import _weight, assert_within_noise, sm90_census


def test_configs():
    for c in GRING_CONFIGS + GRING_CONFIGS_16:
        assert (c.bn // 16) % c.num_warps == 0 and c.kt in (1, 2) and 2 <= c.stages <= 8
        assert c.in_flight_kb(c.per_sm) >= 48 or c in GRING_CONFIGS_16
        assert c.resident(80) >= 1 and c.per_sm_options(80)[0] >= 1
    c = GRingConfig(bn=128, kt=2, num_warps=4, stages=4, per_sm=4)
    assert c.smem_bytes() == 4 * (8192 + 4096 + 2048) and c.resident(76) == 4  # shared memory: 4 x 57 KB
    assert c.in_flight_kb(4) == 96 and c.per_sm_options(76) == [4]


def test_bad_arguments():
    gen = torch.Generator().manual_seed(3)
    p = _weight(256, 64, 128, sym=False, gen=gen)
    x = torch.randn(2, 256).half()
    c = GRING_CONFIGS[0]
    with pytest.raises(ValueError, match="x must be float16 or bfloat16"):
        check_args(x.float(), p, None, c, 4)
    with pytest.raises(ValueError, match="M=17"):
        check_args(torch.randn(17, 256).half(), p, None, c, 4)
    with pytest.raises(ValueError, match="in_features"):
        check_args(torch.randn(2, 128).half(), p, None, c, 4)
    with pytest.raises(ValueError, match="bias must have shape"):
        check_args(x, p, torch.zeros(63).half(), c, 4)
    with pytest.raises(ValueError, match="per_sm"):
        check_args(x, p, None, c, 0)
    with pytest.raises(ValueError, match="stages=1"):
        check_args(x, p, None, GRingConfig(stages=1), 4)
    with pytest.raises(ValueError, match="config.bn=32"):  # 2 fragment rows cannot be split over 4 warps
        check_args(x, p, None, GRingConfig(bn=32, num_warps=4), 4)
    with pytest.raises(TypeError, match="PackedW4"):
        check_args(x, p.qweight, None, c, 4)
    p32 = _weight(256, 64, 32, sym=True, gen=gen)
    with pytest.raises(ValueError, match="group_size=32"):
        check_args(x, p32, None, GRingConfig(kt=1), 4)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="Hopper"):  # no interpreter path: the CPU is refused by name
            w4a16_gring(x, p)


_COMPILE = """
import json, sys
from flashscale.kernels import w4a16_gring as Q
c = Q.GRingConfig(bn=128, kt=2, num_warps=4, stages=4)
json.dump([Q.census(c, tokens=8), Q.census(c, tokens=16, dtype="fp16")], open(sys.argv[1], "w"))
"""


def test_sm90_compile_no_spills_copies_in_flight(tmp_path):
    census = sm90_census(tmp_path, _COMPILE)
    c = GRingConfig(bn=128, kt=2, num_warps=4, stages=4)
    words = c.bn * 64 * c.kt // 8 // (32 * c.num_warps)  # packed words a thread an item
    for r, tb in zip(census, (1, 2)):
        assert r["spill_stores"] == r["spill_loads"] == r["stack"] == 0, r
        assert r["registers"] <= 128 and r["resident"] >= 3, r  # 3-4 programs an SM: 72-96 KB in flight
        assert r["ldgsts128"] == words // 4 and r["ldg"] == 0, r  # the words by 16-byte cp.async, no plain load
        assert r["hmma"] == tb * (words + 4 * c.kt), r  # one mma.sync a word (a token block) + the x sums
        assert r["lds128"] >= words // 4 and r["bar"] <= 2, r  # the slot read back; one wait + barrier an item


CASES = [  # M, K, N, G, sym, act_order, bias, dtype, (bn, warps, stages, per_sm, atomic): what it exercises
    (1, 4096, 4096, 128, False, False, False, torch.bfloat16, (128, 4, 4, 4, True)),  # Llama shape, 8 contributors
    (1, 4096, 4096, 128, False, False, True, torch.bfloat16, (128, 4, 4, 4, False)),  # deterministic slots + bias
    (3, 1024, 512, 128, True, False, True, torch.float16, (64, 4, 6, 4, True)),  # fp16, symmetric
    (16, 2048, 1024, 64, False, False, False, torch.bfloat16, (128, 4, 4, 3, True)),  # two token blocks, group 64
    (9, 2048, 1024, 128, False, False, True, torch.bfloat16, (128, 4, 4, 3, False)),  # two blocks, slots
    (1, 512, 4096, 128, False, False, False, torch.bfloat16, (256, 8, 4, 1, True)),  # 16 KB items, 4 a tile
    (1, 256, 16384, 128, False, False, True, torch.bfloat16, (64, 4, 3, 1, True)),  # 1-2 programs a tile: direct
    (2, 256, 256, 128, False, False, False, torch.bfloat16, (128, 8, 6, 2, True)),  # programs shorter than the ring
    (3, 320, 200, -1, False, False, True, torch.float16, (64, 4, 3, 2, False)),  # one group, K and N tails
    (1, 1024, 512, 128, False, True, True, torch.bfloat16, (128, 4, 3, 5, True)),  # act-order (x gathered once)
]


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n,g,sym,act_order,bias,dtype,cfg", CASES)
def test_gring_kernel_gpu(m, k, n, g, sym, act_order, bias, dtype, cfg):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon decode kernel is sm_90 only")
    gen = torch.Generator().manual_seed(m * 1000 + k + n + g)
    p = _weight(k, n, g, sym=sym, gen=gen, act_order=act_order, device="cuda")
    x = torch.randn(m, k, generator=gen).to("cuda", dtype)
    b = torch.randn(n, generator=gen).to("cuda", dtype) if bias else None
    bn, warps, stages, per_sm, atomic = cfg
    c = GRingConfig(bn=bn, kt=2 if g % 128 == 0 or g == -1 else 1, num_warps=warps, stages=stages, per_sm=per_sm,
                    atomic=atomic)
    y = w4a16_gring(x, p, b, config=c)
    assert y.shape == (m, n) and y.dtype == x.dtype and torch.isfinite(y).all()
    assert_within_noise(y, x, p, b)
    ws, cnt = split_k_workspace(x.device, 1)
    assert not cnt.any() and not ws.any()  # element tickets put back to zero, the atomic tiles zeroed
    if not atomic:  # the slot reduction is a fixed fold: the same bits again
        assert torch.equal(y, w4a16_gring(x, p, b, config=c))
