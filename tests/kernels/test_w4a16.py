"""W4A16: packing (GPTQ v1/v2, act-order, AWQ -> the kernel layout), the reference, and the Triton
kernels (CPU: Triton's interpreter on tiny shapes; GPU: Llama shapes).

Every format is unpacked here a second time, by a plain loop written from the format's definition, so
the packers are checked against something they do not share code with.
"""

import pytest
import torch

from flashscale.kernels.w4a16_pack import (FRAG_K, FRAG_N, awq_codes, from_awq, from_gptq, gptq_codes,
                                           pack_w4, to_gptq, unpack_w4)
from flashscale.ops.w4a16 import w4a16_linear
from flashscale.reference.w4a16 import dequantize_w4, w4a16_linear_ref

# triton 3.6's interpreter turns 1-element loop bounds into ints through a deprecated numpy path
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: slot i of a word holds column 8c + ORDER[i]


# ---- independent implementations of the checkpoint formats (loops, straight from the definitions)

def naive_gptq_pack(codes, zeros, *, v1):
    """codes (K, N), zeros (NG, N) -> qweight (K/8, N), qzeros (NG, N/8), int32 words."""
    k, n = codes.shape
    qweight = torch.zeros(k // 8, n, dtype=torch.int64)
    for kk in range(k):
        qweight[kk // 8] |= codes[kk].long() << (4 * (kk % 8))
    zs = zeros.long() - (1 if v1 else 0)
    qzeros = torch.zeros(zeros.shape[0], n // 8, dtype=torch.int64)
    for nn_ in range(n):
        qzeros[:, nn_ // 8] |= (zs[:, nn_] & 0xF) << (4 * (nn_ % 8))
    wrap = lambda t: torch.where(t >= 2**31, t - 2**32, t).to(torch.int32)  # noqa: E731
    return wrap(qweight), wrap(qzeros)


def naive_awq_pack(codes, zeros):
    k, n = codes.shape
    qweight = torch.zeros(k, n // 8, dtype=torch.int64)
    qzeros = torch.zeros(zeros.shape[0], n // 8, dtype=torch.int64)
    for c in range(n // 8):
        for i in range(8):
            qweight[:, c] |= codes[:, 8 * c + AWQ_PACK_ORDER[i]].long() << (4 * i)
            qzeros[:, c] |= zeros[:, 8 * c + AWQ_PACK_ORDER[i]].long() << (4 * i)
    wrap = lambda t: torch.where(t >= 2**31, t - 2**32, t).to(torch.int32)  # noqa: E731
    return wrap(qweight), wrap(qzeros)


def naive_gptq_dequant(qweight, qzeros, scales, g_idx, *, v1):
    """W (K, N) float64 from GPTQ tensors, read nibble by nibble."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    w = torch.empty(k, n, dtype=torch.float64)
    qw, qz = qweight.long() & 0xFFFFFFFF, qzeros.long() & 0xFFFFFFFF
    for kk in range(k):
        g = int(g_idx[kk])
        q = (qw[kk // 8] >> (4 * (kk % 8))) & 0xF
        z = torch.stack([(qz[g, nn_ // 8] >> (4 * (nn_ % 8))) & 0xF for nn_ in range(n)]) + (1 if v1 else 0)
        w[kk] = (q - z).double() * scales[g].double()
    return w


def rand_grid(k, n, g, *, sym, gen, zero_max=15):
    ng, dev = k // g, gen.device
    codes = torch.randint(0, 16, (k, n), generator=gen, device=dev)
    zeros = torch.full((ng, n), 8, device=dev) if sym else torch.randint(0, zero_max + 1, (ng, n), generator=gen,
                                                                          device=dev)
    scales = (torch.rand(ng, n, generator=gen, device=dev) * 0.03 + 0.002).half()
    return codes, zeros, scales


def act_order_g_idx(k, g, gen):
    return (torch.arange(k, device=gen.device) // g)[torch.randperm(k, generator=gen, device=gen.device)].to(torch.int32)


# ---- packing

@pytest.mark.parametrize("v1", [True, False])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_unpack_matches_definition(v1, act_order):
    gen = torch.Generator().manual_seed(1)
    k, n, g = 64, 24, 16
    codes, zeros, scales = rand_grid(k, n, g, sym=False, gen=gen)
    if v1:
        zeros = zeros.clamp(min=1)
        zeros[0, 0] = 16  # v1 stores zero - 1 = 15: reads back as 16
    g_idx = act_order_g_idx(k, g, gen) if act_order else (torch.arange(k) // g).int()
    qweight, qzeros = naive_gptq_pack(codes, zeros, v1=v1)
    fmt = "gptq" if v1 else "gptq_v2"
    c2, z2, s2, gi2, g2 = gptq_codes(qweight, qzeros, scales, g_idx, checkpoint_format=fmt)
    assert g2 == g and torch.equal(c2, codes) and torch.equal(z2, zeros) and torch.equal(s2, scales)
    p = from_gptq(qweight, qzeros, scales, g_idx, checkpoint_format=fmt)
    assert (p.perm is not None) == act_order
    w_ref = naive_gptq_dequant(qweight, qzeros, scales, g_idx, v1=v1)
    assert torch.equal(dequantize_w4(p, torch.float64), w_ref)


def test_awq_unpack_matches_definition():
    gen = torch.Generator().manual_seed(2)
    k, n, g = 64, 32, 32
    codes, zeros, scales = rand_grid(k, n, g, sym=False, gen=gen)
    qweight, qzeros = naive_awq_pack(codes, zeros)
    c2, z2, s2, g2 = awq_codes(qweight, qzeros, scales)
    assert g2 == g and torch.equal(c2, codes) and torch.equal(z2, zeros)
    w = dequantize_w4(from_awq(qweight, qzeros, scales), torch.float64)
    gi = torch.arange(k) // g
    assert torch.equal(w, (codes.double() - zeros.double()[gi]) * scales.double()[gi])


def test_kernel_layout_matches_docstring():
    """Word [nb, kt, lane, i], nibble j = 4*k3 + 2*n3 + k0 holds q[64kt + 16i + 8k3 + 2t + k0, 16nb + 8n3 + g]."""
    gen = torch.Generator().manual_seed(3)
    k, n = 128, 32
    codes, zeros, scales = rand_grid(k, n, 64, sym=True, gen=gen)
    p = pack_w4(codes, zeros, scales, group_size=64)
    words = p.qweight.long() & 0xFFFFFFFF
    assert tuple(words.shape) == (n // FRAG_N, k // FRAG_K, 32, 4)
    for nb in range(n // 16):
        for kt in range(k // 64):
            for lane in range(32):
                g, t = divmod(lane, 4)
                for i in range(4):
                    for j in range(8):
                        k3, n3, k0 = j >> 2, (j >> 1) & 1, j & 1
                        want = codes[64 * kt + 16 * i + 8 * k3 + 2 * t + k0, 16 * nb + 8 * n3 + g]
                        assert (words[nb, kt, lane, i] >> (4 * j)) & 0xF == want


@pytest.mark.parametrize("k,n,g,act_order", [(200, 40, 40, False), (192, 56, 64, True), (72, 8, -1, False)])
def test_pack_roundtrip_odd_shapes(k, n, g, act_order):
    gen = torch.Generator().manual_seed(4)
    gg = k if g == -1 else g
    codes, zeros, scales = rand_grid(k, n, gg, sym=False, gen=gen, zero_max=16)
    g_idx = act_order_g_idx(k, gg, gen) if act_order else None
    p = pack_w4(codes, zeros, scales, group_size=g, g_idx=g_idx)
    c2, z2, s2, gi2 = unpack_w4(p)
    assert torch.equal(c2.long(), codes) and torch.equal(z2.long(), zeros) and torch.equal(s2, scales)
    assert torch.equal(gi2, g_idx if g_idx is not None else (torch.arange(k) // gg).int())
    t = to_gptq(c2, z2.clamp(max=15), s2, gi2, checkpoint_format="gptq_v2")
    c3, z3, s3, gi3, _ = gptq_codes(**t, checkpoint_format="gptq_v2")
    assert torch.equal(c3, codes) and torch.equal(gi3, gi2)


def test_pack_errors():
    gen = torch.Generator().manual_seed(5)
    codes, zeros, scales = rand_grid(64, 16, 32, sym=True, gen=gen)
    with pytest.raises(ValueError, match="group_size"):
        pack_w4(codes, zeros, scales, group_size=48)
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_w4(codes[:60], zeros, scales, group_size=-1)
    with pytest.raises(ValueError, match="exactly 32 rows"):
        pack_w4(codes, zeros, scales, group_size=32, g_idx=torch.zeros(64, dtype=torch.int32).index_fill_(0, torch.tensor([0]), 1))
    with pytest.raises(ValueError, match="float16"):
        pack_w4(codes, zeros, scales.float() + 1e-4, group_size=32)
    with pytest.raises(ValueError, match=r"\[0, 16\]"):
        pack_w4(codes, zeros + 9, scales, group_size=32)
    with pytest.raises(TypeError, match="int32"):
        gptq_codes(torch.zeros(8, 16), torch.zeros(2, 2, dtype=torch.int32), scales[:2])
    with pytest.raises(ValueError, match="checkpoint_format"):
        gptq_codes(torch.zeros(8, 16, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32), scales[:2],
                   checkpoint_format="exl2")


# ---- kernels under Triton's interpreter (tiny shapes) and the op's checks

def _err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def _check_kernel(x, p, bias, impl):
    """Kernel error against a float64 oracle <= 2x PyTorch's error doing the same in x's dtype."""
    y = w4a16_linear(x, p, bias, impl=impl)
    assert y.dtype == x.dtype and y.shape == (*x.shape[:-1], p.out_features)
    assert torch.isfinite(y).all()
    oracle = w4a16_linear_ref(x.double(), p, None if bias is None else bias.double(), compute_dtype=torch.float64)
    same_dtype = w4a16_linear_ref(x, p, bias, compute_dtype=x.dtype)  # PyTorch: 16-bit weights, then matmul
    assert _err(y, oracle) <= 2 * _err(same_dtype, oracle) + 1e-6, (_err(y, oracle), _err(same_dtype, oracle))


CASES = [  # M, K, N, G, sym, act_order, bias, impl
    (1, 256, 96, 128, False, False, True, "gemv"),
    (1, 192, 40, 64, True, True, False, "gemv"),
    (1, 320, 48, -1, False, False, False, "gemv"),
    (1, 128, 32, 32, False, False, True, "gemm"),
    (3, 192, 72, 64, False, True, True, "gemm"),
    (3, 256, 32, 128, True, False, False, "gemm"),
    (17, 96, 40, 32, True, False, True, "gemm"),
    (17, 160, 24, -1, False, True, False, "gemm"),
]


@pytest.mark.parametrize("m,k,n,g,sym,act_order,bias,impl", CASES)
def test_kernel_interpreter(m, k, n, g, sym, act_order, bias, impl):
    gen = torch.Generator().manual_seed(m * 1000 + k + n)
    gg = k if g == -1 else g
    codes, zeros, scales = rand_grid(k, n, gg, sym=sym, gen=gen, zero_max=16)
    g_idx = act_order_g_idx(k, gg, gen) if act_order else None
    p = pack_w4(codes, zeros, scales, group_size=g, g_idx=g_idx)
    x = torch.randn(m, k, generator=gen).half()
    b = torch.randn(n, generator=gen).half() if bias else None
    _check_kernel(x, p, b, impl)


def test_kernel_formats_agree_and_split_k_is_clean():
    """GPTQ v1, GPTQ v2 and AWQ tensors of one weight give one result; the split-K workspace is left at
    zero, so repeated calls agree to the bit."""
    from flashscale.kernels.w4a16 import GemmConfig, w4a16_matmul
    from flashscale.kernels.w4a16_common import split_k_workspace

    gen = torch.Generator().manual_seed(6)
    k, n = 256, 64
    codes, zeros, scales = rand_grid(k, n, 64, sym=False, gen=gen)
    zeros = zeros.clamp(min=1)
    qw1, qz1 = naive_gptq_pack(codes, zeros, v1=True)
    qw2, qz2 = naive_gptq_pack(codes, zeros, v1=False)
    qwa, qza = naive_awq_pack(codes, zeros)
    p1 = from_gptq(qw1, qz1, scales, checkpoint_format="gptq")
    p2 = from_gptq(qw2, qz2, scales, checkpoint_format="gptq_v2")
    pa = from_awq(qwa, qza, scales)
    x = torch.randn(2, k, generator=gen).half()
    cfg = GemmConfig(bm=16, bn=32, bk=128)
    y1 = w4a16_matmul(x, p1, config=cfg, split_k=2)
    assert torch.equal(y1, w4a16_matmul(x, p2, config=cfg, split_k=2))
    assert torch.equal(y1, w4a16_matmul(x, pa, config=cfg, split_k=2))
    ws, cnt = split_k_workspace(x.device, 1)
    assert not ws.any() and not cnt.any()
    y_one = w4a16_matmul(x, p1, config=cfg, split_k=1)
    assert torch.allclose(y1.float(), y_one.float(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("kernel,m", [("gemv", 1), ("gemm", 3), ("gemm", 17)])
def test_split_k_slices_match_unsplit(kernel, m):
    """Slice-reduced split-K (per-split workspace slices, one ticket a tile) and the two-step prefetch
    ring: every split count gives the unsplit result up to fp32 reassociation, the sum is the same to
    the bit on a repeat call (fixed split order), the tickets are left at zero, and N / K tails, bias
    and act-order work."""
    from flashscale.kernels.w4a16 import GemmConfig, GemvConfig, w4a16_matmul
    from flashscale.kernels.w4a16_common import split_k_workspace

    gen = torch.Generator().manual_seed(40 + m)
    k, n, g = 448, 40, 64  # 7 groups; K not a multiple of 128, N not of 16
    codes, zeros, scales = rand_grid(k, n, g, sym=False, gen=gen, zero_max=16)
    p = pack_w4(codes, zeros, scales, group_size=g, g_idx=act_order_g_idx(k, g, gen))
    x = torch.randn(m, k, generator=gen).half()
    b = torch.randn(n, generator=gen).half()
    oracle = w4a16_linear_ref(x.double(), p, b.double(), compute_dtype=torch.float64)
    same_dtype = w4a16_linear_ref(x, p, b, compute_dtype=x.dtype)
    if kernel == "gemv":
        cfgs = [GemvConfig(bn=16, kt=1, prefetch=2, slices=True), GemvConfig(bn=32, kt=1, prefetch=1, slices=True)]
    else:
        cfgs = [GemmConfig(bm=16, bn=32, bk=128, slices=True)]
    y1 = w4a16_matmul(x, p, b, kernel=kernel, config=cfgs[0], split_k=1)
    for i, cfg in enumerate(cfgs):
        for split in (1, 3, 7) if i == 0 else (2,):
            y = w4a16_matmul(x, p, b, kernel=kernel, config=cfg, split_k=split)
            assert _err(y, oracle) <= 2 * _err(same_dtype, oracle) + 1e-6, (cfg, split)
            assert torch.allclose(y.float(), y1.float(), rtol=2e-3, atol=2e-3), (cfg, split)
            assert torch.equal(y, w4a16_matmul(x, p, b, kernel=kernel, config=cfg, split_k=split))
    ws, cnt = split_k_workspace(x.device, 1)
    assert not ws.any() and not cnt.any()


def test_split_k_slices_heuristic():
    from flashscale.kernels.w4a16 import choose_split_k_slices

    assert choose_split_k_slices(64, 64, 132) == 8  # 8192 x 8192 GEMV (BN 128): 512 programs <= 4 an SM
    assert choose_split_k_slices(128, 64, 132, bm=16) == 4  # 8192 x 8192, M = 16 (BN 64)
    assert choose_split_k_slices(32, 32, 132) == 8  # 4096 x 4096 GEMV: capped at 4 steps a split
    assert choose_split_k_slices(448, 64, 132, bm=16) == 1  # enough tiles already
    assert choose_split_k_slices(224, 64, 132) == 2  # 8192 x 28672 GEMV: 1.7 programs an SM -> 3.4
    assert choose_split_k_slices(16, 64, 132, bm=64) == 1  # no split past 32 tokens


DECODE_CASES = [  # M, K, N, G, sym, act_order, bias, bn, kt, prefetch, programs per SM (x4 interpreter SMs), repeat
    (1, 256, 96, 128, False, False, True, 32, 2, 1, 3, True),
    (1, 192, 40, 64, True, True, False, 16, 1, 2, 4, True),
    (1, 320, 48, -1, False, False, False, 32, 1, 1, 2, False),
    (3, 192, 72, 64, False, True, True, 64, 1, 1, 3, False),
    (3, 256, 32, 128, True, False, False, 16, 2, 2, 2, False),
    (12, 192, 40, 64, False, True, True, 32, 1, 2, 4, False),
    (16, 192, 24, -1, True, False, True, 16, 1, 1, 2, False),
]


@pytest.mark.parametrize("m,k,n,g,sym,act_order,bias,bn,kt,prefetch,per_sm,repeat", DECODE_CASES)
def test_decode_kernel_interpreter(m, k, n, g, sym, act_order, bias, bn, kt, prefetch, per_sm, repeat):
    """The stream-K tensor-core decode kernel (M <= 16) under the interpreter: its inline PTX is replaced
    by a lane-by-lane emulation of the same registers and mma.sync's fragment layout, so the nibble
    pairing, the K relabelling of x, the offset/zero-point correction, the stream-K partial tiles
    (several contributors a tile at these program counts) and the tails are what is checked."""
    from flashscale.kernels.w4a16 import DecodeConfig, decode_grid, w4a16_matmul
    from flashscale.kernels.w4a16_common import split_k_workspace

    gen = torch.Generator().manual_seed(m * 1000 + k + n + 7)
    gg = k if g == -1 else g
    codes, zeros, scales = rand_grid(k, n, gg, sym=sym, gen=gen, zero_max=16)
    g_idx = act_order_g_idx(k, gg, gen) if act_order else None
    p = pack_w4(codes, zeros, scales, group_size=g, g_idx=g_idx)
    x = torch.randn(m, k, generator=gen).half()
    b = torch.randn(n, generator=gen).half() if bias else None
    cfg = DecodeConfig(bn=bn, kt=kt, prefetch=prefetch)
    progs, items, steps, _ = decode_grid(x, p, cfg, per_sm)
    assert progs > -(-n // bn)  # more programs than tiles: tiles are shared
    y = w4a16_matmul(x, p, b, config=cfg, split_k=per_sm)
    oracle = w4a16_linear_ref(x.double(), p, None if b is None else b.double(), compute_dtype=torch.float64)
    same_dtype = w4a16_linear_ref(x, p, b, compute_dtype=x.dtype)
    assert y.shape == (m, n) and torch.isfinite(y).all()
    assert _err(y, oracle) <= 2 * _err(same_dtype, oracle) + 1e-6, (_err(y, oracle), _err(same_dtype, oracle))
    if repeat:
        assert torch.equal(y, w4a16_matmul(x, p, b, config=cfg, split_k=per_sm))  # contributor order is fixed
        y1 = w4a16_matmul(x, p, b, config=cfg, split_k=1)  # another stream-K split of the same items
        assert torch.allclose(y.float(), y1.float(), rtol=2e-3, atol=2e-3)
    _, cnt = split_k_workspace(x.device, 1)
    assert not cnt.any()  # every tile's ticket put back to zero


@pytest.mark.parametrize("m", [1, 11])
def test_decode_kernel_bf16_interpreter(m):
    """The bf16 path (its own magic and nibble positions) under the interpreter, whose fp32 -> bf16
    conversion truncates (the GPU rounds to nearest): the output must be the exact product truncated."""
    from flashscale.kernels.w4a16 import DecodeConfig, w4a16_matmul

    gen = torch.Generator().manual_seed(20 + m)
    codes, zeros, scales = rand_grid(256, 48, 128, sym=False, gen=gen, zero_max=16)
    p = pack_w4(codes, zeros, scales, group_size=128)
    x = torch.randn(m, 256, generator=gen).bfloat16()
    b = torch.randn(48, generator=gen).bfloat16()
    y = w4a16_matmul(x, p, b, config=DecodeConfig(bn=16, kt=2), split_k=2)
    oracle = w4a16_linear_ref(x.double(), p, b.double(), compute_dtype=torch.float64)
    truncated = (oracle.float().view(torch.int32) & -65536).view(torch.float32)  # what a perfect kernel gives here
    assert y.dtype == torch.bfloat16
    assert _err(y, oracle) <= 1.2 * _err(truncated, oracle) + 1e-6, (_err(y, oracle), _err(truncated, oracle))


def test_decode_dispatch():
    """The decode kernel's configs are autotune candidates of the M <= 16 buckets only, need groups of
    64 * kt (or one group), and the launcher names what it takes."""
    from flashscale.kernels.w4a16 import DecodeConfig, decode_candidates, w4a16_matmul

    gen = torch.Generator().manual_seed(9)
    codes, zeros, scales = rand_grid(128, 32, 32, sym=True, gen=gen)
    p32 = pack_w4(codes, zeros, scales, group_size=32)
    assert decode_candidates(p32) == []
    with pytest.raises(ValueError, match="decode kernel needs a group size"):
        w4a16_matmul(torch.randn(1, 128).half(), p32, kernel="decode")
    codes, zeros, scales = rand_grid(128, 32, 64, sym=True, gen=gen)
    p64 = pack_w4(codes, zeros, scales, group_size=64)
    assert decode_candidates(p64) and all(c.kt == 1 for c in decode_candidates(p64))
    with pytest.raises(ValueError, match="up to 16 tokens"):
        w4a16_matmul(torch.randn(17, 128).half(), p64, kernel="decode")
    y = w4a16_matmul(torch.randn(2, 128, generator=gen).half(), p64, kernel="decode")  # first candidate, untimed
    assert y.shape == (2, 32) and torch.isfinite(y).all()
    assert DecodeConfig().asm  # the interpreter runs the emulation whatever the config says


def test_tune_times_the_leaders_again(monkeypatch):
    """_tune times the RETIME_TOP fastest trials of the first round again in RETIME_ROUNDS interleaved rounds (each
    round starting one leader later) and keeps the best median: one lucky timing cannot decide, nor can the first
    round's winner alone; configs that do not fit are skipped; the choice is cached under the key."""
    from triton.runtime.errors import OutOfResources

    from flashscale.kernels import w4a16, w4a16_tune

    cands = [w4a16.GemmConfig(bm=16, bn=64, bk=128, num_stages=s) for s in (2, 3, 4, 5, 6)]
    times = {2: [11.0, 9.0, 9.2, 9.1], 3: [10.0, 8.5, 10.5, 10.4], 4: [12.0] * 4, 5: [20.0]}  # 6: OutOfResources
    calls: list[int] = []

    def fake_time(launch, c, s, ring=()):
        calls.append(c.num_stages)
        return times[c.num_stages][calls.count(c.num_stages) - 1]

    def launch(c, s, w=None):
        if c.num_stages == 6:
            raise OutOfResources(1, 0, "shared memory")

    monkeypatch.setattr(w4a16_tune, "_AUTOTUNE", True)  # the tuner's knobs, where _tune reads them
    monkeypatch.setattr(w4a16_tune, "WARM_MS", 0.0)
    monkeypatch.setattr(w4a16_tune, "_interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(w4a16_tune, "_split_options", lambda *a: [1])
    monkeypatch.setattr(w4a16_tune, "_time", fake_time)
    key = ("gemm", 16, 64, 128, 128, "bfloat16", "noperm", "test-gpu")
    monkeypatch.setitem(w4a16._TUNED, key, None)  # so that monkeypatch removes the key afterwards
    del w4a16._TUNED[key]
    cfg, split = w4a16._tune(key, cands, lambda c: 1, launch)
    assert (cfg.num_stages, split) == (2, 1)  # second in the first round, best median after (3's 8.5 a fluke)
    assert calls == [2, 3, 4, 5] + [3, 2, 4] + [2, 4, 3] + [4, 3, 2]  # leaders by first-round time, rotated
    assert w4a16._TUNED[key]["num_stages"] == 2 and w4a16._TUNED[key]["split_k"] == 1
    assert w4a16._tune(key, cands, lambda c: 1, launch)[0] == cfg  # cached: no more timing
    assert len(calls) == 13


def test_probe_modes_interpreter(monkeypatch):
    """benchmarks/w4a16_probe.py's kernel modes and their host-side checks: PROBE=1 reads every packed
    word once (checksum), PROBE=2 leaves partials that sum to the product (GEMV slices, decode slots)."""
    from bench_testutil import load_benchmark

    from flashscale.kernels.w4a16 import DecodeConfig, GemvConfig

    probe = load_benchmark("w4a16_probe")  # benchmarks/ on the path: the script imports its neighbour plotting.py
    gen = torch.Generator().manual_seed(12)
    k, n = 128, 32
    codes, zeros, scales = rand_grid(k, n, 64, sym=False, gen=gen)
    p = pack_w4(codes, zeros, scales, group_size=64)
    for m, kname, cfg, split in [(1, "gemv", GemvConfig(bn=16, kt=1, slices=True), 2),
                                 (9, "decode", DecodeConfig(bn=16, kt=1), 2)]:
        x = torch.randn(m, k, generator=gen).half()
        ref = w4a16_linear_ref(x.double(), p, compute_dtype=torch.float64)
        tol = 2 * _err(w4a16_linear_ref(x, p, compute_dtype=x.dtype), ref) + 1e-6
        y = torch.empty(m, n, dtype=x.dtype)
        for pr in (0, 1, 2):
            ok, err = probe.check(kname, x, p, y, cfg, split, pr, ref, tol, m)
            assert ok, (kname, m, pr, err)


def test_op_errors():
    gen = torch.Generator().manual_seed(7)
    codes, zeros, scales = rand_grid(64, 16, 32, sym=True, gen=gen)
    p = pack_w4(codes, zeros, scales, group_size=32)
    with pytest.raises(ValueError, match="in_features"):
        w4a16_linear(torch.randn(2, 32), p)
    with pytest.raises(ValueError, match="out_features"):
        w4a16_linear(torch.randn(2, 64), p, torch.zeros(15))
    with pytest.raises(TypeError, match="PackedW4"):
        w4a16_linear(torch.randn(2, 64), codes)
    with pytest.raises(ValueError, match="impl"):
        w4a16_linear(torch.randn(2, 64), p, impl="cuda")
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        w4a16_linear(torch.randn(2, 64), p, impl="triton")
    with pytest.raises(ValueError, match="one token"):
        w4a16_linear(torch.randn(2, 64).half(), p, impl="gemv")
    codes, zeros, scales = rand_grid(48, 16, 24, sym=True, gen=gen)
    with pytest.raises(ValueError, match="group size"):
        w4a16_linear(torch.randn(2, 48).half(), pack_w4(codes, zeros, scales, group_size=24), impl="triton")
    # the CPU reference takes any float dtype
    y = w4a16_linear(torch.randn(2, 64, dtype=torch.float64), p)
    assert y.dtype == torch.float64


# ---- GPU: Llama shapes (the benchmark's), both activation dtypes, act-order, tails

@pytest.fixture(scope="module")
def gpu_kernels():
    """One config a bucket (no autotune: fewer compiles), compiled in parallel up front."""
    from flashscale.kernels.w4a16 import precompile, set_autotune

    set_autotune(False)
    bf, fp = "bfloat16", "float16"
    problems = [dict(m=m, k=256, n=256, group_size=128, dtype=bf, act_order=False, bias=False) for m in (1, 5, 64, 300)]
    problems += [dict(m=m, k=960, n=1000, group_size=64, dtype=dt, act_order=True, bias=True)
                 for m in (1, 9, 200) for dt in (bf, fp)]
    problems += [dict(m=m, k=2048, n=1536, group_size=g, dtype=bf, act_order=False, bias=False)
                 for m in (1, 33) for g in (32, -1)]
    precompile(problems, all_candidates=False)
    yield
    set_autotune(True)


@pytest.mark.gpu
@pytest.mark.parametrize("k,n", [(4096, 4096), (4096, 14336), (14336, 4096)])
def test_gpu_llama_shapes(k, n, gpu_kernels):
    gen = torch.Generator(device="cuda").manual_seed(k + n)
    codes, zeros, scales = rand_grid(k, n, 128, sym=False, gen=gen)
    p = pack_w4(codes, zeros, scales, group_size=128)
    for m in (1, 5, 16, 64, 300):  # GEMV, decode split-K, mid, prefill tiles
        x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        _check_kernel(x, p, None, None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 9, 200])
def test_gpu_tails_act_order_bias(dtype, m, gpu_kernels):
    gen = torch.Generator(device="cuda").manual_seed(m)
    k, n, g = 960, 1000, 64  # K not a multiple of 128, N not of 16
    codes, zeros, scales = rand_grid(k, n, g, sym=False, gen=gen, zero_max=16)
    p = pack_w4(codes, zeros, scales, group_size=g, g_idx=act_order_g_idx(k, g, gen))
    x = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
    b = torch.randn(n, generator=gen, device="cuda").to(dtype)
    _check_kernel(x, p, b, None)
    from flashscale.kernels.w4a16_common import split_k_workspace

    ws, cnt = split_k_workspace(x.device, 1)
    torch.cuda.synchronize()
    assert not ws.any() and not cnt.any()  # split-K leaves its workspace clean for the next call


@pytest.mark.gpu
@pytest.mark.parametrize("g", [32, -1])
def test_gpu_group_sizes(g, gpu_kernels):
    gen = torch.Generator(device="cuda").manual_seed(11)
    k, n = 2048, 1536
    gg = k if g == -1 else g
    codes, zeros, scales = rand_grid(k, n, gg, sym=True, gen=gen)
    p = pack_w4(codes, zeros, scales, group_size=g)
    for m in (1, 33):
        _check_kernel(torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16), p, None, None)
