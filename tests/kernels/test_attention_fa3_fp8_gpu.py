"""The FP8 FA3-style Gluon forward (kernels.attention_fa3_fp8) on an sm_90 GPU against the emulation
(flashscale.reference.attention_fp8, the same key tiles, so the same running max and e4m3 roundings of P),
the float64 attention of the same bf16 inputs, and the Triton FP8 kernel (kernels.attention_fp8).

Tolerances from the emulation's own error, as tests/kernels/test_attention_fp8_gpu.py does for the Triton FP8
kernel (not bitwise: Hopper's FP8 tensor cores accumulate with fewer mantissa bits and in another order, so a
score may land on the other side of an e4m3 rounding of P): the kernel is as accurate as the emulation against
float64 (RMSE within 10%), and kernel and emulation sit much closer to each other than either to the exact
result. Shapes: GQA/MQA, causal and not, Sq != Sk (bottom-right diagonal; Sq > Sk leaves leading rows empty:
out 0, lse -inf), ragged lengths, head dims 64/128/256, every TUNING_CONFIGS variant, several tiles a persistent
program, quantization blocks other than 128 (per-row Q descales, 256-key tiles), expanded per-tensor descales,
all-zero V blocks, fp16/fp32 outputs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from flashscale.reference.attention import attention_ref
from flashscale.reference.attention_fp8 import Fp8Inputs, attention_fp8_quantized_ref, unpermute_v_keys

fp8 = pytest.importorskip("flashscale.kernels.attention_fa3_fp8")
pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _hopper():
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and fp8.HAS_GLUON):
        pytest.skip("needs an sm_90 GPU and Gluon")


def _rmse(a, b):
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


def _inputs(B, Sq, Sk, H, Hkv, D, *, block_m=128, block_n=128, seed=0, zero_v_blocks=(), v_key_perm=False):
    from flashscale.ops import quantize_fp8

    g = torch.Generator(device=CUDA).manual_seed(seed)
    q = torch.randn(B, Sq, H, D, device=CUDA, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Sk, Hkv, D, device=CUDA, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Sk, Hkv, D, device=CUDA, dtype=torch.bfloat16, generator=g)
    for blk in zero_v_blocks:  # all-zero V quantization blocks: descale 2^-64 / 448
        v[:, blk * block_n:(blk + 1) * block_n] = 0
    return q, k, v, quantize_fp8(q, k, v, block_m=block_m, block_n=block_n, v_key_perm=v_key_perm)


def _emulation(x, Sk, causal, tile, scale=None):
    v8 = unpermute_v_keys(x.v8, Sk) if x.v_key_perm else x.v8
    xi = Fp8Inputs(q8=x.q8, k8=x.k8, v8=v8[..., :Sk].permute(0, 3, 1, 2), q_descale=x.q_descale,
                   k_descale=x.k_descale, v_descale=x.v_descale, block_m=x.block_m, block_n=x.block_n)
    return attention_fp8_quantized_ref(xi, causal=causal, softmax_scale=scale, tile_n=tile, return_lse=True)


def _args(x):
    return x.q8, x.k8, x.v8, x.q_descale, x.k_descale, x.v_descale


def _check(B, Sq, Sk, H, Hkv, D, causal, *, config=None, block_m=128, block_n=128, scale=None, triton=True,
           zero_v_blocks=()):
    """Run the kernel, check it against the emulation / float64 / the Triton FP8 kernel; returns (out, lse, x)."""
    _hopper()
    cfg = config or fp8.default_config(D, block_n, causal)  # quantized in the V^T key order cfg reads
    q, k, v, x = _inputs(B, Sq, Sk, H, Hkv, D, block_m=block_m, block_n=block_n, zero_v_blocks=zero_v_blocks,
                         v_key_perm=cfg.v_perm)
    assert fp8.supported(*_args(x), causal=causal, block_m=block_m, block_n=block_n, config=config,
                         v_key_perm=x.v_key_perm)
    out, lse = fp8.attention_fa3_fp8_fwd(*_args(x), causal=causal, softmax_scale=scale, block_m=block_m,
                                         block_n=block_n, config=config, v_key_perm=x.v_key_perm)
    torch.cuda.synchronize()
    emu, emu_lse = _emulation(x, Sk, causal, cfg.block_n, scale)
    exact = attention_ref(q.double(), k.double(), v.double(), causal=causal, softmax_scale=scale)
    assert out.shape == (B, Sq, H, D) and out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert lse.shape == (B, H, Sq) and lse.dtype == torch.float32
    e_out, e_emu = _rmse(out, exact), _rmse(emu, exact)
    assert e_out <= 1.1 * e_emu + 1e-6, (cfg, e_out, e_emu)
    assert _rmse(out, emu) <= 0.5 * e_emu, (cfg, _rmse(out, emu), e_emu)
    fin = torch.isfinite(emu_lse)
    assert torch.equal(torch.isfinite(lse), fin), "empty rows (lse -inf) differ from the emulation's"
    if fin.any():
        assert (lse[fin] - emu_lse[fin]).abs().max().item() <= 2e-2
    if causal and Sq > Sk:  # leading rows see no key
        assert torch.all(out[:, :Sq - Sk] == 0) and torch.all(lse[:, :, :Sq - Sk] == float("-inf"))
    if triton:  # beside the Triton FP8 kernel on the same key tiles: as accurate, and as close to the emulation
        from flashscale.kernels.attention_fp8 import Fp8Config
        from flashscale.ops import attention_fp8_quantized

        tri_m = min(128, block_m)
        tri_cfg = Fp8Config(block_m=tri_m, block_n=cfg.block_n, num_warps=8 if tri_m == 128 else 4, num_stages=2)
        tri = attention_fp8_quantized(*_args(x), causal=causal, softmax_scale=scale, block_m=block_m,
                                      block_n=block_n, config=tri_cfg, v_key_perm=x.v_key_perm)
        e_tri = _rmse(tri, exact)
        assert e_out <= 1.1 * e_tri + 1e-6, (cfg, e_out, e_tri)
        assert _rmse(out, tri) <= 0.5 * e_emu, (cfg, _rmse(out, tri), e_emu)
    return out, lse, x


CASES = [  # (B, Sq, Sk, H, Hkv, D, causal): tests/kernels/test_attention_fp8_gpu.py's, then edge cases
    (2, 1024, 1024, 16, 16, 128, False),
    (2, 1024, 1024, 16, 4, 128, True),
    (1, 2048, 2048, 8, 8, 64, True),
    (1, 1000, 1000, 8, 2, 256, False),
    (1, 777, 1500, 4, 1, 128, True),   # Sq < Sk, ragged
    (2, 1500, 999, 4, 2, 64, True),    # Sq > Sk: leading rows see no key
    (1, 1000, 1000, 4, 4, 256, True),
    (2, 777, 1500, 8, 2, 128, False),
    (1, 1, 333, 4, 1, 128, True),      # one query row, MQA
    (1, 100, 50, 2, 1, 64, False),     # fewer keys than one block
    (3, 200, 200, 2, 1, 256, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}_q{c[1]}_k{c[2]}_h{c[3]}x{c[4]}_d{c[5]}_"
                         f"{'causal' if c[6] else 'full'}")
def test_kernel_matches_emulation(case):
    _check(*case)


VARIANTS = [(d, name) for d, table in fp8.TUNING_CONFIGS.items() for name in table]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"d{v[0]}_{v[1]}")
def test_variants(variant, causal):
    # Every config the sweep times (ping-pong off, no overlap, persistent, other tiles/rings): the same math.
    d, name = variant
    cfg = fp8.TUNING_CONFIGS[d][name]
    _check(1, 1100, 1100, 4, 2, d, causal, config=cfg, block_n=max(128, cfg.block_n))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_many_tiles_a_program(causal):
    # 16 query tiles x 32 heads = 512 tiles on 132 SMs: every program runs 3-4 tiles, so the ring, Q and turn
    # phases run on across tiles (and the output tile is reused once its TMA store has read it).
    cfg = fp8.TUNING_CONFIGS[128]["pp_persist"]
    _check(2, 2048, 2048, 16, 4, 128, causal, config=cfg, triton=False)


@pytest.mark.parametrize("persistent", [False, True], ids=["grid", "persistent"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_grouped_order_same_bits(causal, persistent):
    # The head-grouped tile order (l2_groups, the default) moves tiles between SMs, not their arithmetic: out
    # and lse bitwise those of the flat order. 3 x 20 heads x 8 query tiles: 17 heads a group, the last short.
    cfg = replace(fp8.default_config(128, 128, causal), persistent=persistent)
    out, lse, x = _check(3, 1000, 1000, 20, 4, 128, causal, config=cfg, triton=False)
    out_f, lse_f = fp8.attention_fa3_fp8_fwd(*_args(x), causal=causal, config=replace(cfg, l2_groups=False))
    assert torch.equal(out, out_f) and torch.equal(lse, lse_f)


@pytest.mark.parametrize("blocks", [(64, 128), (256, 128), (128, 256), (64, 256)], ids=lambda b: f"qm{b[0]}_kn{b[1]}")
def test_other_quantization_blocks(blocks):
    # Q descales per 64 rows (two a tile: the per-row descale vector) or per 256 rows (two tiles share one);
    # K/V descales per 256 keys with 128-key tiles (two tiles a descale) or 256-key tiles.
    block_m, block_n = blocks
    _check(1, 1000, 1300, 4, 2, 128, True, block_m=block_m, block_n=block_n)
    if block_n == 256:
        _check(1, 1000, 1300, 4, 2, 128, False, config=fp8.TUNING_CONFIGS[128]["pp_n256_serial"], block_m=block_m,
               block_n=block_n)


def test_expanded_per_tensor_descales_and_scale():
    # per-tensor quantization with its descales as stride-0 views (any strides are taken): bitwise the same
    # output as with the materialised descales; and a non-default softmax scale
    _hopper()
    from flashscale.ops import quantize_fp8

    q, k, v = (torch.randn(1, 700, 4, 128, device=CUDA, dtype=torch.bfloat16) for _ in range(3))
    x = quantize_fp8(q, k, v, block_quant=False)
    out, lse = fp8.attention_fa3_fp8_fwd(*_args(x), causal=True, softmax_scale=0.05)
    exp = [t[:1, :1, :1].expand_as(t) for t in (x.q_descale, x.k_descale, x.v_descale)]
    out2, lse2 = fp8.attention_fa3_fp8_fwd(x.q8, x.k8, x.v8, *exp, causal=True, softmax_scale=0.05)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    _check(1, 700, 700, 4, 4, 128, True, scale=0.05)


def test_zero_v_blocks():
    # all-zero V blocks (descale 2^-64 / 448): the lazily applied V descale keeps the accumulator finite
    _check(1, 1024, 1024, 4, 2, 128, False, zero_v_blocks=(1, 4))
    _check(1, 1024, 1024, 4, 2, 256, True, zero_v_blocks=(0, 5))


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_output_dtypes(out_dtype):
    _hopper()
    _, _, _, x = _inputs(1, 900, 900, 4, 2, 128)
    ref, ref_lse = fp8.attention_fa3_fp8_fwd(*_args(x), causal=True, out_dtype=torch.float32)
    out, lse = fp8.attention_fa3_fp8_fwd(*_args(x), causal=True, out_dtype=out_dtype)
    assert out.dtype == out_dtype and torch.equal(lse, ref_lse)
    assert torch.equal(out, ref.to(out_dtype))  # the same fp32 result, rounded once


def test_empty_inputs_and_unsupported():
    _hopper()
    _, _, _, x = _inputs(1, 64, 64, 2, 1, 128)
    q8, k8, v8, qd, kd, vd = _args(x)
    out, lse = fp8.attention_fa3_fp8_fwd(q8, k8[:, :0], v8[..., :0], qd, kd[..., :0], vd[..., :0])
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))
    out, lse = fp8.attention_fa3_fp8_fwd(q8[:, :0], k8, v8, qd[..., :0], kd, vd)
    assert out.shape == (1, 0, 2, 128)
    assert "head_dim" in fp8.unsupported(q8[..., :32], k8[..., :32], v8[:, :, :32], qd, kd, vd)
    assert "contiguous" in fp8.unsupported(q8.transpose(1, 2).contiguous().transpose(1, 2), k8, v8, qd, kd, vd)
    assert "divide" in fp8.unsupported(q8, k8, v8, qd, kd, vd, block_n=128,
                                       config=fp8.TUNING_CONFIGS[128]["pp_n256_serial"])
    assert "float8_e4m3fn" in fp8.unsupported(q8.to(torch.bfloat16), k8, v8, qd, kd, vd)


if fp8.HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from flashscale.kernels.attention_fa3_fp8 import _exp2_fma

    @gluon.jit
    def _exp2_fma_probe(X, Y, n, BLOCK: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
        offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
        x = gl.load(X + offs, mask=offs < n, other=0.0)
        gl.store(Y + offs, _exp2_fma(x), mask=offs < n)


def test_exp2_fma_helper_on_the_device():
    # the kernel's software exp2 compiled for the GPU = its float32 replay (tests/kernels/test_attention_fa3_fp8_exp2.py
    # bounds the replay against exp2): bit for bit up to the replay's rare double rounding of an fma (1 ulp)
    _hopper()
    g = torch.Generator(device=CUDA).manual_seed(0)
    x = torch.cat([torch.linspace(-130.0, 8.0, 1 << 20, device=CUDA), torch.rand(1 << 20, device=CUDA, generator=g)
                   * 138.0 - 130.0, torch.tensor([float("-inf"), -127.0, -126.5, 0.0, 8.0], device=CUDA)])
    y = torch.empty_like(x)
    _exp2_fma_probe[((x.numel() + 511) // 512, )](x, y, x.numel(), BLOCK=512, num_warps=4)
    want = fp8.exp2_fma_emulated(x)
    ulp = (y.view(torch.int32).long() - want.view(torch.int32).long()).abs()
    assert ulp.max().item() <= 1 and (ulp > 0).float().mean().item() < 1e-3
    assert torch.equal(y[-5:-3], torch.zeros(2, device=CUDA))  # -inf and -127 give exactly 0
    normal = x >= -126
    rel = ((y.double() - torch.exp2(x.double())) / torch.exp2(x.double()))[normal].abs().max().item()
    assert rel <= fp8.EXP2_FMA_REL_ERR, rel


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mufu_relief_variants_against_the_default(causal):
    # late_pv_wait only moves a wait: bitwise the default's output. exp2_fma changes P by <= 1.02e-4 (relative) where
    # it applies, which moves an e4m3 rounding of P for ~0.03 % of those elements: in the CPU emulation (B 1, S 1024,
    # H 2) the output moves by 3 % of the FP8 error (rmse vs float64), at 3/8 of the columns
    _hopper()
    q, k, v, x = _inputs(2, 1500, 1500, 8, 2, 128)
    table = fp8.TUNING_CONFIGS[128]
    ref, ref_lse = fp8.attention_fa3_fp8_fwd(*_args(x), causal=causal, config=table["pp"])
    late, late_lse = fp8.attention_fa3_fp8_fwd(*_args(x), causal=causal, config=table["pp_late"])
    assert torch.equal(late, ref) and torch.equal(late_lse, ref_lse)
    # tree_max (SASS audit) only reorders the exact row max: bitwise the default's output too
    tree, tree_lse = fp8.attention_fa3_fp8_fwd(*_args(x), causal=causal, config=table["pp_tree"])
    assert torch.equal(tree, ref) and torch.equal(tree_lse, ref_lse)
    emu, _ = _emulation(x, 1500, causal, 128)
    e_fp8 = _rmse(emu, attention_ref(q.double(), k.double(), v.double(), causal=causal))
    for name in ("pp_fma2", "pp_late_fma3"):
        out, lse = fp8.attention_fa3_fp8_fwd(*_args(x), causal=causal, config=table[name])
        assert torch.isfinite(out).all()
        assert _rmse(out, ref) <= 0.1 * e_fp8, (name, _rmse(out, ref), e_fp8)
        assert (lse - ref_lse).abs().max().item() <= 1e-3, name


OD_CONFIGS = [(d, name) for d, table in fp8.TUNING_CONFIGS.items() for name in table if table[name].o_direct]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", OD_CONFIGS, ids=lambda v: f"d{v[0]}_{v[1]}")
def test_o_direct_same_bits(variant, causal):
    # o_direct stores the output from the accumulator's registers instead of a shared-memory tile and a TMA store;
    # the math is the same, so the output is bitwise that of its TMA-store twin (2 stages: the ring's depth changes
    # no order either). Two batches, ragged Sq (masked last rows, the next batch's rows right after them), GQA, and
    # a slice wholly past Sq (1303 % 128 < 64)
    _hopper()
    d, name = variant
    cfg = fp8.TUNING_CONFIGS[d][name]
    twin = replace(cfg, o_direct=False, stages=2)
    assert fp8.config_error(d, twin) is None
    qbn = max(128, cfg.block_n)
    x = _inputs(2, 1303, 1300, 8, 2, d, block_n=qbn, v_key_perm=cfg.v_perm)[3]
    kw = dict(causal=causal, block_n=qbn, v_key_perm=cfg.v_perm)
    out, lse = fp8.attention_fa3_fp8_fwd(*_args(x), config=cfg, **kw)
    ref, ref_lse = fp8.attention_fa3_fp8_fwd(*_args(x), config=twin, **kw)
    assert torch.isfinite(out).all() and out.abs().sum() > 0
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse), name


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_v_perm_against_the_default(D, causal):
    # v_perm (V^T's keys permuted within 32-key groups, P's bytes not shuffled): the same products P[r, c] V[c, :],
    # paired in the same wgmma K slots' order up to a permutation inside each 32-key step, so the output moves only
    # by the FP8 tensor core's accumulation order: far under the FP8 error. Sk ragged (the last group's padding
    # keys, zero in V and masked in P, sit among real ones), GQA
    _hopper()
    Sk = 1500 - 7
    q, k, v, x = _inputs(2, 1500, Sk, 8, 2, D)
    table = fp8.TUNING_CONFIGS[D]
    ref, ref_lse = fp8.attention_fa3_fp8_fwd(*_args(x), causal=causal, config=table["pp"])
    args = list(_args(x))
    args[2] = fp8.permute_v_keys(args[2], Sk)
    out, lse = fp8.attention_fa3_fp8_fwd(*args, causal=causal, config=table["pp_vperm"], v_key_perm=True)
    emu, _ = _emulation(x, Sk, causal, 128)
    e_fp8 = _rmse(emu, attention_ref(q.double(), k.double(), v.double(), causal=causal))
    assert torch.isfinite(out).all()
    assert _rmse(out, ref) <= 0.05 * e_fp8, (_rmse(out, ref), e_fp8)
    assert torch.equal(lse, ref_lse)  # S and the softmax statistics do not involve V
    short = args[2][..., :1500]  # >= Sk keys but not the last group whole (a view: rows stay 1504 keys apart)
    assert "32-key groups" in fp8.unsupported(args[0], args[1], short, *args[3:], causal=causal,
                                              config=table["pp_vperm"], v_key_perm=True)
    # a config and a layout that disagree are refused, not run
    assert "v_key_perm=False" in fp8.unsupported(*args, causal=causal, config=table["pp_vperm"])
    assert "v_key_perm=True" in fp8.unsupported(*args, causal=causal, config=table["pp"], v_key_perm=True)
    # the pre-pass writes that order itself, and the default config for a permuted V^T is a v_perm one
    x2 = _inputs(2, 1500, Sk, 8, 2, D, v_key_perm=True)[3]
    assert torch.equal(x2.v8.view(torch.uint8), args[2].view(torch.uint8))
    out2, _ = fp8.attention_fa3_fp8_fwd(*_args(x2), causal=causal, v_key_perm=True)
    assert fp8.default_config(D, 128, causal, v_perm=True).v_perm
    assert torch.equal(out2, fp8.attention_fa3_fp8_fwd(*args, causal=causal, v_key_perm=True,
                                                       config=fp8.default_config(D, 128, causal, v_perm=True))[0])


@pytest.mark.parametrize("causal", [False, True])
def test_ops_dispatch_takes_the_gluon_kernel(causal):
    """ops.attention_fp8_quantized / attention_fp8 with impl="auto" on sm_90 run this kernel (bitwise its
    output), impl="triton" the Triton one; both within the emulation's error of float64."""
    _hopper()
    from flashscale.kernels.attention_fa3_fp8 import attention_fa3_fp8_fwd
    from flashscale.ops import attention_fp8, attention_fp8_quantized, quantize_fp8

    torch.manual_seed(0)
    q = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 1000, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    x = quantize_fp8(q, k, v)
    args = (x.q8, x.k8, x.v8, x.q_descale, x.k_descale, x.v_descale)
    auto = attention_fp8_quantized(*args, causal=causal)
    direct, _ = attention_fa3_fp8_fwd(*args, causal=causal)
    assert torch.equal(auto, direct)
    exact = attention_ref(q.double(), k.double(), v.double(), causal=causal)
    emu = attention_fp8_quantized(*args, causal=causal, impl="emulation")
    for out in (auto, attention_fp8_quantized(*args, causal=causal, impl="triton")):
        assert _rmse(out, exact) <= 1.1 * _rmse(emu, exact) + 1e-6
    # attention_fp8 quantizes K/V in the blocks its kernel's default reads (D 128: 256 rows, V^T's keys permuted)
    bn = fp8.quant_block_n(128, causal)
    assert bn == 256 and fp8.default_config(128, bn, causal) == fp8.DEFAULT_CONFIGS[(128, causal)]
    x2 = quantize_fp8(q, k, v, block_n=bn, v_key_perm=fp8.DEFAULT_CONFIGS[(128, causal)].v_perm)
    direct2, _ = attention_fa3_fp8_fwd(*x2.args(), causal=causal, block_n=bn, v_key_perm=x2.v_key_perm)
    assert torch.equal(attention_fp8(q, k, v, causal=causal), direct2)  # the same pre-pass and kernel
    emu2 = attention_fp8_quantized(*x2.args(), causal=causal, block_n=bn, impl="emulation", v_key_perm=x2.v_key_perm)
    assert _rmse(direct2, exact) <= 1.1 * _rmse(emu2, exact) + 1e-6


@pytest.mark.parametrize("causal", [False, True])
def test_ops_at_d256_take_v_keys_permuted(causal):
    """D 256's default config reads V^T's keys permuted: attention_fp8 quantizes in that order and runs it (bitwise
    the kernel on quantize_fp8(..., v_key_perm=True)); the permuted tensors through the Triton kernel and the
    emulation (which restore the natural order first) give what the natural ones give."""
    _hopper()
    from flashscale.ops import attention_fp8, attention_fp8_quantized, quantize_fp8

    assert fp8.default_config(256, 128, causal).v_perm
    torch.manual_seed(0)
    q = torch.randn(2, 1000, 8, 256, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 999, 2, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    xp, xn = quantize_fp8(q, k, v, v_key_perm=True), quantize_fp8(q, k, v)
    direct, _ = fp8.attention_fa3_fp8_fwd(*xp.args(), causal=causal, v_key_perm=True)
    assert torch.equal(attention_fp8(q, k, v, causal=causal), direct)
    assert torch.equal(attention_fp8_quantized(*xp.args(), causal=causal, v_key_perm=True), direct)
    for impl in ("triton", "emulation"):
        assert torch.equal(attention_fp8_quantized(*xp.args(), causal=causal, v_key_perm=True, impl=impl),
                           attention_fp8_quantized(*xn.args(), causal=causal, impl=impl)), impl
    exact = attention_ref(q.double(), k.double(), v.double(), causal=causal)
    emu = attention_fp8_quantized(*xn.args(), causal=causal, impl="emulation")
    assert _rmse(direct, exact) <= 1.1 * _rmse(emu, exact) + 1e-6
