"""The Gluon W4A16 GEMM (w4a16_wgmma.py) on a Hopper GPU: every candidate config against the float64 reference
(error <= 2x PyTorch's own 16-bit error, test_w4a16.py's rule), ragged M, bias, group sizes 128 / 64 / one group a
row, act-order, bf16 and fp16, forced split-K; and the argument errors (these run anywhere)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flashscale.kernels import w4a16_wgmma as wg
from flashscale.kernels.w4a16_pack import pack_w4
from flashscale.reference.w4a16 import w4a16_linear_ref

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def _weight(k, n, g, act_order=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    gg = k if g == -1 else g
    codes = torch.randint(0, 16, (k, n), generator=gen)
    zeros = torch.randint(0, 17, (k // gg, n), generator=gen)
    scales = (torch.rand(k // gg, n, generator=gen) * 0.02 + 0.001).half()
    g_idx = (torch.arange(k) // gg)[torch.randperm(k, generator=gen)].int() if act_order else None
    return pack_w4(codes, zeros, scales, group_size=g, g_idx=g_idx).to("cuda")


def _oracle(x, p, bias):
    return w4a16_linear_ref(x.double(), p, None if bias is None else bias.double(), compute_dtype=torch.float64)


def _check(x, p, bias, cfg):
    y = wg.w4a16_wgmma(x, p, bias, config=cfg)
    assert y.dtype == x.dtype and y.shape == (x.shape[0], p.out_features) and torch.isfinite(y).all()
    oracle = _oracle(x, p, bias)
    same = w4a16_linear_ref(x, p, bias, compute_dtype=x.dtype)
    assert _err(y, oracle) <= 2 * _err(same, oracle) + 1e-6, (cfg, _err(y, oracle), _err(same, oracle))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("cfg", wg.all_candidates(), ids=lambda c: c.label() + f"-g{c.group}")
@pytest.mark.parametrize("m", [1, 17, 64, 100, 257])
def test_candidates(cfg, m):
    p = _weight(1024, 384, 128, seed=m)
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    _check(x, p, torch.randn(384, device="cuda", dtype=torch.bfloat16), cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("cfg", [c for c in wg.all_candidates() if c.bm >= 128], ids=lambda c: c.label())
@pytest.mark.parametrize("k,split", [(64, 0), (128, 0), (1152, 0), (1088, 2)])
def test_large_tiles_step_parity_and_split(cfg, k, split):
    """The unrolled loop: 1 step (no pair), an even and an odd count of steps after the first; forced split-K
    (one tile a program there: a persistent candidate is split as its one-tile form, which config_error asks).
    300 x 320 is 6 tiles of bm256 x bn128: the stream-K candidate splits them over the SMs (2-4 a tile)."""
    p = _weight(k, 320, 64, seed=k)
    x = torch.randn(300, k, device="cuda", dtype=torch.bfloat16)
    _check(x, p, None, dataclasses.replace(cfg, split_k=split, persistent=cfg.persistent and split < 2,
                                           stream_k=cfg.stream_k and split < 2))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,bk,stages", [(256, 64, 6), (256, 128, 3), (128, 128, 4), (64, 128, 6)])
@pytest.mark.parametrize("k,split", [(64, 0), (128, 0), (1152, 0), (1088, 2)])
def test_pingpong_equals_the_plain_two_consumer_loop(bm, bk, stages, k, split):
    """Tensor-core turns change when each consumer issues, not what it computes: the output is bit-equal to the
    same config without turns (each consumer's accumulator sums the same K steps in the same order), over 1, 2,
    an even and an odd number of steps, ragged M and N, forced split-K, and correct against float64."""
    p = _weight(k, 320, 64, seed=k + bm)
    cfg = wg.WgmmaConfig(bm=bm, consumers=2, bk=bk, stages=stages, split_k=split)
    for m in (1, 70, 300):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        pp = dataclasses.replace(cfg, pingpong=True)
        _check(x, p, None, pp)
        assert torch.equal(wg.w4a16_wgmma(x, p, config=pp), wg.w4a16_wgmma(x, p, config=cfg)), (pp, m)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("cfg", [wg.WgmmaConfig(bm=256, consumers=2, bk=64, stages=6),
                                 wg.WgmmaConfig(bm=256, consumers=2, bk=128, stages=3, pingpong=True),
                                 wg.WgmmaConfig(bm=128, consumers=2, bk=128, stages=4)], ids=lambda c: c.label())
@pytest.mark.parametrize("k", [64, 320, 1088])
def test_persistent_equals_one_tile_a_program(cfg, k):
    """Persistent programs (grid = SMs, tiles t, t + grid, ...; the ring's steps and turns run on across tiles) give
    the bits of one tile a program: 2-3 tiles a program here (ragged M and N), 1, 3-5 and 9-17 K steps a tile."""
    p = _weight(k, 2100, 64, seed=k)
    x = torch.randn(4100, k, device="cuda", dtype=torch.bfloat16)
    pers = dataclasses.replace(cfg, persistent=True)
    _check(x, p, None, pers)
    assert torch.equal(wg.w4a16_wgmma(x, p, config=pers), wg.w4a16_wgmma(x, p, config=cfg)), pers


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("cfg", [wg.WgmmaConfig(bm=256, consumers=2, bk=128, stages=3, pingpong=True, persistent=True,
                                                stream_k=True),
                                 wg.WgmmaConfig(bm=256, consumers=2, bk=64, stages=6, persistent=True, stream_k=True),
                                 wg.WgmmaConfig(bm=128, consumers=2, bk=128, stages=4, persistent=True, stream_k=True)],
                         ids=lambda c: c.label())
@pytest.mark.parametrize("m,n,k", [(100, 8192, 1088), (300, 2100, 1088), (700, 8192, 1088), (4100, 2100, 1088),
                                   (4100, 2100, 4160)])
def test_stream_k_tail(cfg, m, n, k):
    """Stream-K tails (stream_k_plan): one token tile (runs over all tiles, 2 contributors a tile), fewer tiles than
    SMs in K pieces, whole waves then the partial wave's tiles in 2-5 pieces; 5-13 K steps a segment, ragged M and N,
    bias. Correct against float64, the same bits on a repeat (fix-up blocks summed in contributor order), the
    tickets left at zero, and within accumulation noise of the plain persistent kernel."""
    sms = wg._num_sms(torch.cuda.current_device())
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn)
    dp, skq, maxc = wg.stream_k_plan(tiles, -(-k // cfg.bk), sms, -(-m // cfg.bm))
    if skq == 0:
        pytest.skip(f"no stream-K tail for {tiles} tiles on {sms} SMs")
    p = _weight(k, n, 64, seed=m + k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if m == 4100 else None
    _check(x, p, bias, cfg)
    y = wg.w4a16_wgmma(x, p, bias, config=cfg)
    assert torch.equal(y, wg.w4a16_wgmma(x, p, bias, config=cfg)), (cfg, dp, skq, maxc)
    plain = wg.w4a16_wgmma(x, p, bias, config=dataclasses.replace(cfg, stream_k=False))
    torch.testing.assert_close(y.float(), plain.float(), rtol=2e-2, atol=2e-2 * plain.float().abs().max().item())
    torch.cuda.synchronize()
    assert int(wg._workspace(torch.device("cuda", torch.cuda.current_device()), 1, 1)[1].abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("cfg", [wg.WgmmaConfig(bm=16, consumers=1, stages=8, split_k=2),
                                 wg.WgmmaConfig(bm=64, consumers=2, stages=6, split_k=2),
                                 wg.WgmmaConfig(bm=16, consumers=1, stages=8, ctas=2),
                                 wg.WgmmaConfig(bm=256, consumers=2, stages=3, pingpong=True, persistent=True,
                                                stream_k=True)], ids=lambda c: c.label())
def test_fixups_repeat_bitwise(cfg):
    """Session 40-42's fix-up failure (two blocks an SM with a split: whole tiles wrong or never written, tickets
    left over, once a hang): 12 calls a config, plain and vec_y, into an output filled with NaN each time (a tile
    nobody writes cannot pass as the last call's bits), every one equal to the first, within the noise of float64,
    and the tickets back at zero after each. fp16 at K 1088 (a half-padded last K step), M 300, N 2048 / 2100."""
    dev = torch.device("cuda", torch.cuda.current_device())
    for k, n in ((1088, 2048), (4160, 2100)) if cfg.stream_k else ((1088, 2048), ):
        p = _weight(k, n, 64, seed=k + n)
        x = torch.randn(300, k, device="cuda", dtype=torch.float16)
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        first = None
        for rep in range(12):
            for c in (cfg, dataclasses.replace(cfg, vec_y=True)):
                out = torch.full((300, n), float("nan"), device="cuda", dtype=torch.float16)
                y = wg.w4a16_wgmma(x, p, bias, config=c, out=out)
                torch.cuda.synchronize()
                assert int(wg._workspace(dev, 1, 1)[1].abs().sum()) == 0, (c.label(), k, n, rep)
                if first is None:
                    first = y.clone()
                    _check(x, p, bias, c)
                assert torch.equal(y, first), (c.label(), k, n, rep, int((y != first).sum()))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("cfg", wg.all_candidates(), ids=lambda c: c.label())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_vec_y_is_bitwise_the_element_store(cfg, dtype):
    """vec_y=True (y by 16-byte stores after a layout conversion) writes the same values as the element stores of
    the accumulator's layout: every candidate, N a multiple of the tile (the token mask alone), N % 8 == 0 past the
    last tile (element stores in that tile), N % 8 != 0 (vec_y off at launch), ragged M, bias, automatic split-K
    (bm <= 64) and the stream-K tail at 300 tokens (the fix-ups' sums), an `out` 8 bytes off 16-byte alignment (vec_y
    off); y's other bytes kept. The fix-ups called again and again (session 40's mismatches: a forced split of two
    blocks an SM, now refused, and the stream-K tail at K 4160 x N 2100): test_fixups_repeat_bitwise."""
    vy = dataclasses.replace(cfg, vec_y=True)
    for k, n in ((1024, 384), (1088, 200), (1024, 270)):
        p = _weight(k, n, 64, seed=k + n)
        for m in (1, 17, 64, 70, 300):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            bias = torch.randn(n, device="cuda", dtype=dtype) if m in (17, 300) else None
            ref = wg.w4a16_wgmma(x, p, bias, config=cfg)
            got = wg.w4a16_wgmma(x, p, bias, config=vy)
            assert torch.equal(got, ref), (vy.label(), k, n, m, int((got != ref).sum()), _err(
                got, _oracle(x, p, bias)), _err(ref, _oracle(x, p, bias)), (got != ref).nonzero()[:4].tolist())
            if m == 17:  # out at an 8-byte offset (not 16-byte aligned): element stores, the neighbours untouched
                buf = torch.full((m * n + 8, ), 7.0, device="cuda", dtype=dtype)
                wg.w4a16_wgmma(x, p, bias, config=vy, out=buf[4:4 + m * n].view(m, n))
                assert torch.equal(buf[4:4 + m * n].view(m, n), ref)
                assert (buf[:4] == 7).all() and (buf[4 + m * n:] == 7).all()
    _check(x, p, bias, vy)


def test_stream_k_plan():
    """Whole tiles a multiple of the programs, every K step of the rest covered once by the programs' runs, at
    most MAXC contributors a tile, and only where the makespan (in K steps) drops; full last waves stay plain;
    with several token tiles only whole waves go tile by tile and the pieces are aligned (SKQ = ceil(steps / S));
    the kernel's first contributor and contributor count of each tile are the programs whose runs meet it."""
    assert wg.stream_k_plan(264, 32, 132, 4) == (264, 0, 0)  # two full waves
    assert wg.stream_k_plan(128, 32, 132, 1) == (128, 0, 0)  # 97 % of one wave: not worth the fix-up
    assert wg.stream_k_plan(448, 32, 132, 4) == (396, 16, 3)  # K 4096 x N 14336 at M 1024: 52 tiles in halves
    assert wg.stream_k_plan(1024, 64, 132, 16) == (1024, 0, 0)  # 100 tiles left: no two pieces fit
    assert wg.stream_k_plan(224, 64, 132, 1) == (0, 109, 2)  # M 256 x N 28672 (bm256): 1.7 waves run as 1.7
    for tiles in (1, 5, 34, 64, 131, 133, 200, 289, 448, 1000, 1792):
        for steps in (1, 2, 3, 9, 32, 113):
            for progs in (8, 132):
                for m_tiles in (1, 4):
                    dp, q, maxc = wg.stream_k_plan(tiles, steps, progs, m_tiles)
                    waves = -(-tiles // progs)
                    if q == 0:
                        assert dp == tiles
                        continue
                    assert dp % progs == 0 and 0 <= dp < tiles and progs * q >= (tiles - dp) * steps
                    assert dp // progs * steps + q < waves * steps
                    if m_tiles > 1:
                        assert dp == tiles // progs * progs and q >= min(steps, wg.SK_MIN_STEPS)
                    total = (tiles - dp) * steps
                    for r in range(tiles - dp):  # the kernel's contributors (_consumer_sk: first, count) are the
                        first = (r * steps) // q  # programs whose runs [p q, min((p + 1) q, total)) meet the tile
                        count = ((r + 1) * steps - 1) // q - first + 1
                        runs = [p for p in range(progs) if p * q < min((p + 1) * q, total, (r + 1) * steps)
                                and min((p + 1) * q, total) > r * steps]
                        assert runs == list(range(first, first + count)) and count <= maxc, (tiles, steps, r)
                    assert (tiles - dp) * maxc <= 4 * progs  # the fix-up workspace bound the docstring gives


def test_plan_split_counts_resident_blocks():
    """The automatic split fills the SMs: 8192^2 at M = 64 on 132 SMs, bm64-bn64 (128 tiles, 64 K steps of 128)
    is one wave unsplit; f128 (64 tiles, 128 steps of 64) splits in 2; two blocks an SM never split (their fix-up
    gave wrong sums, session 42), nor does bm >= 128 by itself; a forced split is kept up to the K steps and refused
    with ctas > 1."""
    C = wg.WgmmaConfig
    assert wg.plan_split(C(bm=64, consumers=1, stages=8), 128, 64, 132) == 1
    assert wg.plan_split(C(bm=64, consumers=1, bk=64, stages=6, ctas=2), 128, 128, 132) == 1
    assert wg.plan_split(C(bm=64, consumers=1, features=128, bk=64, stages=8), 64, 128, 132) == 2
    assert wg.plan_split(C(bm=64, consumers=1, features=128, bk=64, stages=8, ctas=2), 64, 128, 132) == 1
    assert wg.plan_split(C(bm=16, consumers=1, stages=8, ctas=2), 32, 9, 132) == 1
    assert "ctas=2 takes split_k 0 or 1" in wg.config_error(C(bm=16, consumers=1, stages=8, ctas=2, split_k=2))
    assert wg.plan_split(C(bm=128, consumers=1, stages=4), 16, 64, 132) == 1
    assert wg.plan_split(C(bm=128, consumers=1, stages=4, split_k=3), 16, 64, 132) == 3
    assert wg.plan_split(C(bm=64, consumers=2, stages=6, split_k=9), 16, 4, 132) == 4


def test_persistent_config_errors():
    assert "persistent" in wg.config_error(wg.WgmmaConfig(bm=256, consumers=1, persistent=True))
    assert "persistent" in wg.config_error(wg.WgmmaConfig(bm=256, consumers=2, bk=64, stages=6, split_k=2,
                                                          persistent=True))
    assert wg.config_error(wg.WgmmaConfig(bm=256, consumers=2, bk=64, stages=6, persistent=True)) is None
    assert "stream_k" in wg.config_error(wg.WgmmaConfig(bm=256, consumers=2, stream_k=True))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,n,g,act", [(4096, 4096, 128, False), (1024, 200, 64, False), (960, 272, -1, False),
                                       (1024, 256, 128, True), (8192, 1024, 128, False)])
@pytest.mark.parametrize("split", [0, 3])
def test_shapes_groups_split(dtype, k, n, g, act, split):
    p = _weight(k, n, g, act_order=act, seed=k + n)
    for m in (33, 256):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype) if m == 33 else None
        _check(x, p, bias, wg.WgmmaConfig(bm=64, consumers=2, stages=6, split_k=split))
    torch.cuda.synchronize()
    assert int(wg._workspace(torch.device("cuda", torch.cuda.current_device()), 1, 1)[1].abs().sum()) == 0


_H2_CONFIGS = list(dict.fromkeys(wg.candidates(64) + wg.candidates(256) + [wg.candidates(4096)[0]]))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("cfg", _H2_CONFIGS, ids=lambda c: c.label())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_h2_unpack_is_bitwise_the_fp32_unpack(cfg, dtype):
    """The packed 16-bit unpack (h2=True, kernels/w4a16_h2.py) makes the same A operands as the fp32 one, so the
    same config gives the same bits: asymmetric zero points 0..16, scales over float16's range (bf16: the split
    scale's low part non-zero), group 128 / 64 / one a row, act-order, bias, ragged M and N."""
    h2 = dataclasses.replace(cfg, h2=True)
    for k, n, g, act in ((1024, 384, 128, False), (1088, 200, 64, False), (960, 272, -1, True)):
        p = _weight(k, n, g, act_order=act, seed=k + n)
        p.sz.copy_(_wide_scales(p.sz, seed=n))
        for m in (17, 64, 257):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            bias = torch.randn(n, device="cuda", dtype=dtype) if m == 17 else None
            if wg.config_error(cfg, p.group_size, k) is not None:
                continue
            y32 = wg.w4a16_wgmma(x, p, bias, config=cfg)
            y16 = wg.w4a16_wgmma(x, p, bias, config=h2)
            assert torch.equal(y16, y32), (h2.label(), k, n, g, m, (y16.float() - y32.float()).abs().max().item())
            if m == 64:
                _check(x, p, bias, h2)


_F128 = [wg.WgmmaConfig(bm=64, consumers=1, features=128, bk=64, stages=8),
         wg.WgmmaConfig(bm=32, consumers=1, features=128, bk=128, stages=8, h2=True),
         wg.WgmmaConfig(bm=64, consumers=1, bk=64, stages=6, ctas=2),
         wg.WgmmaConfig(bm=64, consumers=1, features=128, bk=64, stages=8, ctas=2, h2=True),
         wg.WgmmaConfig(bm=16, consumers=1, stages=8, ctas=3),
         wg.WgmmaConfig(bm=16, consumers=1, stages=8, ctas=2, h2=True),
         wg.WgmmaConfig(bm=16, consumers=1, bk=64, stages=8, ctas=4, h2=True)]


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("cfg", _F128, ids=lambda c: c.label())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_one_consumer_of_128_features_and_two_blocks_an_sm(cfg, dtype):
    """features=128 / ctas=2-4: the same bits as one 64-feature consumer in one block an SM of the same bm / bk (the
    same K order per output; split-K forced to 1 on both, since tile counts and automatic splits differ), and
    within the 16-bit noise of the float64 reference with the automatic split; ragged N past a 128-feature tile."""
    f64 = dataclasses.replace(cfg, features=64, ctas=1, split_k=1)
    for k, n, g, act in ((1024, 384, 128, False), (1088, 200, 64, False), (960, 272, -1, True)):
        p = _weight(k, n, g, act_order=act, seed=k + n)
        for m in (1, 17, 64, 100):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            bias = torch.randn(n, device="cuda", dtype=dtype) if m == 17 else None
            if wg.config_error(cfg, p.group_size, k) is not None:
                continue
            y = wg.w4a16_wgmma(x, p, bias, config=dataclasses.replace(cfg, split_k=1))
            assert torch.equal(y, wg.w4a16_wgmma(x, p, bias, config=f64)), (cfg.label(), k, n, g, m)
            _check(x, p, bias, cfg)


def _wide_scales(sz: torch.Tensor, seed: int) -> torch.Tensor:
    """sz words with float16 scales drawn over 2^-14 .. 2^-2 (every exponent, full 11-bit mantissas), zero points
    kept: the bf16 split's low part is non-zero for most."""
    gen = torch.Generator().manual_seed(seed)
    s = (torch.rand(sz.shape, generator=gen) * 12 - 14).exp2().half().float()
    return ((s * 2048).view(torch.int32) & -32).to(sz.device) | (sz & 31)


def test_errors():
    p = pack_w4(torch.randint(0, 16, (128, 32)), torch.zeros(4, 32, dtype=torch.int64),
                torch.ones(4, 32).half(), group_size=32)
    with pytest.raises(ValueError, match="dtype"):
        wg.w4a16_wgmma(torch.randn(4, 128), p)
    with pytest.raises(ValueError, match="group_size=32"):
        wg.w4a16_wgmma(torch.randn(4, 128).half(), p)
    p64 = pack_w4(torch.randint(0, 16, (128, 32)), torch.zeros(2, 32, dtype=torch.int64),
                  torch.ones(2, 32).half(), group_size=64)
    with pytest.raises(ValueError, match="in_features"):
        wg.w4a16_wgmma(torch.randn(4, 64).half(), p64)
    with pytest.raises(ValueError, match="bias"):
        wg.w4a16_wgmma(torch.randn(4, 128).half(), p64, torch.zeros(7).half())
    with pytest.raises(ValueError, match="bm=48"):
        wg.w4a16_wgmma(torch.randn(4, 128).half(), p64, config=wg.WgmmaConfig(bm=48))
    if not HOPPER:
        with pytest.raises(ValueError, match="sm_90"):
            wg.w4a16_wgmma(torch.randn(4, 128).half(), p64)
    assert not wg.supported(torch.randn(4, 128), p64)


def test_dispatch_candidates_and_tuned_table_round_trip(monkeypatch):
    """w4a16_matmul's automatic dispatch: the wgmma configs join the candidates only on sm_90 from M = 2
    (none on the CPU or with FLASHSCALE_W4A16_WGMMA=0; =h2 adds each config's h2 twin; the vec_y twins from M = 65
    unless =plain; a bad value is refused), and
    a tuned wgmma entry survives tuned_configs() -> load_tuned_configs() as a WgmmaConfig (its split in "split_k")."""
    from flashscale.kernels import w4a16

    p = pack_w4(torch.randint(0, 16, (128, 64)), torch.zeros(1, 64, dtype=torch.int64),
                torch.ones(1, 64).half(), group_size=128)
    assert w4a16.wgmma_candidates(torch.randn(64, 128).half(), p, None) == []  # CPU tensor
    monkeypatch.setenv(w4a16.WGMMA_ENV, "yes")
    with pytest.raises(ValueError, match=w4a16.WGMMA_ENV):
        w4a16.wgmma_candidates(torch.randn(64, 128).half(), p, None)
    monkeypatch.setenv(w4a16.WGMMA_ENV, "0")
    if HOPPER:
        assert w4a16.wgmma_candidates(torch.randn(64, 128, device="cuda").half(), p.to("cuda"), None) == []
        monkeypatch.delenv(w4a16.WGMMA_ENV)
        got = w4a16.wgmma_candidates(torch.randn(64, 128, device="cuda").half(), p.to("cuda"), None)
        assert got == wg.candidates(64)
        got = w4a16.wgmma_candidates(torch.randn(9, 128, device="cuda").half(), p.to("cuda"), None)
        assert got == wg.candidates(16) and all(c.bm == 16 for c in got)  # 16-token tiles up to M = 16
        monkeypatch.setenv(w4a16.WGMMA_ENV, "h2")  # each config, then its packed 16-bit unpack twin
        got = w4a16.wgmma_candidates(torch.randn(64, 128, device="cuda").half(), p.to("cuda"), None)
        assert got[::2] == wg.candidates(64) and got[1::2] == [dataclasses.replace(c, h2=True) for c in got[::2]]
        monkeypatch.delenv(w4a16.WGMMA_ENV)
    assert w4a16._wgmma_configs(64, p, twin="h2")[1::2] == [dataclasses.replace(c, h2=True) for c in wg.candidates(64)]
    assert w4a16._wgmma_configs(64, p, twin="vy")[1::2] == [dataclasses.replace(c, vec_y=True)
                                                             for c in wg.candidates(64)]
    # the default: the vec_y twins from M = 65 (the 128-token bucket on), none below; "plain": never
    assert w4a16._wgmma_configs(64, p) == w4a16._wgmma_configs(64, p, twin="plain") == wg.candidates(64)
    for m in (65, 256, 1024, 4096):
        assert w4a16._wgmma_configs(m, p) == w4a16._wgmma_configs(m, p, twin="1") == \
            w4a16._wgmma_configs(m, p, twin="vy") != w4a16._wgmma_configs(m, p, twin="plain") == wg.candidates(m)
    cfg = wg.WgmmaConfig(bm=128, consumers=1, stages=4)
    key = ("gemm", 256, 64, 128, 128, "bfloat16", "noperm", "test-device")
    monkeypatch.setitem(w4a16._TUNED, key, dict(dataclasses.asdict(cfg), split_k=3))
    table = {k: v for k, v in w4a16.tuned_configs().items() if k.endswith("test-device")}
    w4a16._TUNED.pop(key)
    w4a16.load_tuned_configs(table)
    try:
        got, split = w4a16._tune(key, [], None, None)
        assert got == cfg and split == 3
    finally:
        w4a16._TUNED.pop(key, None)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("m", [2, 9, 17, 64, 300])
def test_w4a16_matmul_auto_and_forced_wgmma(m):
    """Automatic dispatch with the wgmma candidates in the autotune (whichever wins is correct), and
    kernel="wgmma" / a WgmmaConfig forced through w4a16_matmul, bias and act-order included."""
    from flashscale.kernels import w4a16

    p = _weight(1024, 384, 128, act_order=True, seed=m)
    x = torch.randn(m, 1024, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(384, dtype=torch.bfloat16, device="cuda")
    oracle = w4a16_linear_ref(x.double(), p, bias.double(), compute_dtype=torch.float64)
    same = w4a16_linear_ref(x, p, bias, compute_dtype=x.dtype)
    for y in (w4a16.w4a16_matmul(x, p, bias), w4a16.w4a16_matmul(x, p, bias, kernel="wgmma"),
              w4a16.w4a16_matmul(x, p, bias, config=wg.candidates(m)[-1])):
        assert _err(y, oracle) <= 2 * _err(same, oracle) + 1e-6


def test_weight_descriptors_are_kept_per_tile_shape_and_rebuilt_for_new_tensors():
    """The packed words' and scale/zero words' TMA descriptors live on the PackedW4 (host time a launch), one
    entry a tile shape, rebuilt (the old one dropped) when p's tensors are replaced."""
    if not wg.HAS_GLUON:
        pytest.skip("needs triton.experimental.gluon")
    p = pack_w4(torch.randint(0, 16, (256, 128)), torch.zeros(2, 128, dtype=torch.int64),
                torch.ones(2, 128).half(), group_size=128)
    a, b = wg.candidates(64)[0], wg.WgmmaConfig(bm=64, consumers=1, stages=8)
    lay = wg._layouts(a, torch.bfloat16)
    da = wg._weight_descs(p, a, lay[0], lay[2])
    assert wg._weight_descs(p, a, lay[0], lay[2]) is da and wg._weight_descs(p, b, lay[0], lay[2]) is not da
    p.qweight = p.qweight.clone()
    dn = wg._weight_descs(p, a, lay[0], lay[2])
    assert dn is not da and dn[0].base.data_ptr() == p.qweight.data_ptr() and len(p._wgmma_descs) == 2
