"""The FA3-style Gluon forward (kernels.attention_fa3) on an sm_90 GPU against the float64 reference.

Tolerance rule of the other attention tests (attention_checks.assert_close_rule): error against the
float64 oracle at most 2x the error of the reference computed in the input dtype, plus one rounding.
Covers every head dim, causal and not, GQA/MQA, ragged Sq/Sk (tiles past the end read as TMA zeros and
must be masked), Sq > Sk under causal (leading rows see no key: out 0, lse -inf), and both pipelines.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

try:
    from .attention_checks import assert_close_rule
except ImportError:  # tests/kernels is not a package
    from attention_checks import assert_close_rule

from flashscale.reference.attention import attention_ref

fa3 = pytest.importorskip("flashscale.kernels.attention_fa3")
pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and fa3.HAS_GLUON


def _inputs(B, Sq, Sk, H, Hkv, D, dtype=torch.bfloat16):
    """q, k, v of _check (seed 0): tests that rerun a case with another config draw them again."""
    torch.manual_seed(0)
    return (torch.randn(B, Sq, H, D, dtype=dtype, device=CUDA), torch.randn(B, Sk, Hkv, D, dtype=dtype, device=CUDA),
            torch.randn(B, Sk, Hkv, D, dtype=dtype, device=CUDA))


def _check(B, Sq, Sk, H, Hkv, D, dtype, causal, *, scale=None, config=None):
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    q, k, v = _inputs(B, Sq, Sk, H, Hkv, D, dtype)
    assert fa3.supported(q, k, v)
    out, lse = fa3.attention_fa3_fwd(q, k, v, causal=causal, softmax_scale=scale, config=config)
    torch.cuda.synchronize()
    res = {"ours": (out, lse)}
    for name, cast in (("oracle", torch.float64), ("base", dtype)):
        res[name] = attention_ref(q.to(cast), k.to(cast), v.to(cast), causal=causal, softmax_scale=scale,
                                  return_lse=True, upcast=False)
    assert out.shape == q.shape and lse.shape == (B, H, Sq) and lse.dtype == torch.float32
    assert_close_rule(res, names=("out", "lse"))
    return out, lse


# (B, Sq, Sk, H, Hkv, D, dtype, causal)
CASES = [
    (2, 1024, 1024, 16, 16, 128, torch.bfloat16, False),
    (2, 1024, 1024, 16, 4, 128, torch.bfloat16, True),
    (1, 2048, 2048, 8, 8, 64, torch.float16, True),
    (1, 1000, 1000, 8, 2, 64, torch.bfloat16, False),  # ragged: last tile and last key block partial
    (1, 1000, 1000, 8, 8, 64, torch.bfloat16, True),
    (1, 512, 512, 4, 2, 256, torch.bfloat16, False),
    (1, 1000, 1000, 4, 4, 256, torch.bfloat16, True),
    (2, 777, 1500, 8, 2, 128, torch.bfloat16, True),  # Sq < Sk: bottom-right diagonal
    (2, 777, 1500, 8, 2, 128, torch.bfloat16, False),
    (2, 1500, 777, 8, 2, 128, torch.bfloat16, True),  # Sq > Sk: leading rows see no key
    (1, 1, 333, 4, 1, 128, torch.bfloat16, True),  # one query row (decode-like), MQA
    (1, 100, 50, 2, 1, 64, torch.bfloat16, False),  # fewer keys than one block
    (3, 200, 200, 2, 1, 256, torch.float16, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}_q{c[1]}_k{c[2]}_h{c[3]}x{c[4]}_d{c[5]}_"
                         f"{str(c[6])[6:]}_{'causal' if c[7] else 'full'}")
def test_matches_reference(case):
    _check(*case)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
@pytest.mark.parametrize("head_dim", fa3.HEAD_DIMS)
def test_pipelines(head_dim, overlap):
    # Both consumer schedules (FA3's intra-warpgroup overlap on and off): the same math.
    cfg = replace(fa3.DEFAULT_CONFIGS[head_dim], overlap=overlap)
    _check(1, 1100, 1100, 4, 2, head_dim, torch.bfloat16, True, config=cfg)


@pytest.mark.parametrize("head_dim,stages", [(64, 2), (64, 4), (128, 3)])
def test_ring_depths(head_dim, stages):
    # The ring wraps at another period: barrier phases must still line up (5+ wraps at 1100 keys).
    cfg = replace(fa3.DEFAULT_CONFIGS[head_dim], stages=stages)
    _check(1, 1100, 1100, 4, 2, head_dim, torch.bfloat16, False, config=cfg)


def test_custom_scale_and_single_consumer():
    _check(1, 600, 900, 4, 2, 128, torch.bfloat16, False, scale=0.05)
    cfg = replace(fa3.DEFAULT_CONFIGS[128], consumers=1, block_m=64)
    _check(1, 600, 900, 4, 2, 128, torch.bfloat16, True, config=cfg)


# Ping-pong is the default, so test_matches_reference runs it; the same matrix through the cooperative
# fallback (one 8-warp consumer partition over two warpgroups: TUNING_CONFIGS' "coop", since the D = 64
# default's three consumers have no cooperative form) and the default on the persistent grid.
VARIANTS = {"coop": lambda d: fa3.TUNING_CONFIGS[d]["coop"],
            "persistent": lambda d: replace(fa3.DEFAULT_CONFIGS[d], persistent=True)}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}_q{c[1]}_k{c[2]}_h{c[3]}x{c[4]}_d{c[5]}_"
                         f"{str(c[6])[6:]}_{'causal' if c[7] else 'full'}")
def test_matches_reference_variants(case, variant):
    _check(*case, config=VARIANTS[variant](case[5]))


@pytest.mark.parametrize("name,head_dim", [(n, d) for d, cfgs in fa3.TUNING_CONFIGS.items() for n in cfgs
                                            if n not in ("pp", "coop", "pp_persist")])  # those: tests above
def test_tuning_configs(name, head_dim):
    # Every other config the sweep times (benchmarks/attention_fa3_sweep.py): ragged, GQA, causal with
    # Sq < Sk and Sq > Sk (leading tiles see no key), and non-causal.
    cfg = fa3.TUNING_CONFIGS[head_dim][name]
    _check(1, 1100, 1300, 4, 2, head_dim, torch.bfloat16, True, config=cfg)
    _check(2, 700, 333, 4, 2, head_dim, torch.bfloat16, True, config=cfg)
    _check(1, 1000, 1000, 4, 1, head_dim, torch.bfloat16, False, config=cfg)


@pytest.mark.parametrize("dynamic", [False, True], ids=["snake", "dynamic"])
@pytest.mark.parametrize("head_dim,stages,consumers", [(128, 2, 2), (128, 3, 2), (64, 3, 3), (256, 2, 2)])
def test_persistent_many_tiles(head_dim, stages, consumers, dynamic):
    # 4 x 16 heads x 8..12 query tiles: several tiles a program on 132 SMs, so the ring, Q and turn barrier
    # phases run on across tiles (including stage counts that do not divide the blocks of a tile).
    block_m = 64 * consumers
    cfg = replace(fa3.DEFAULT_CONFIGS[head_dim], block_m=block_m, consumers=consumers, stages=stages,
                  persistent=True, dynamic=dynamic)
    _check(4, 1500, 1500, 16, 4, head_dim, torch.bfloat16, True, config=cfg)
    _check(4, 1500, 1500, 16, 4, head_dim, torch.bfloat16, False, config=cfg)
    # Sq > Sk under causal: tiles with no visible key block (no ring use, no turns) between tiles with some
    _check(4, 1500, 700, 16, 4, head_dim, torch.bfloat16, True, config=cfg)


@pytest.mark.parametrize("persistent", [False, True, "dynamic"], ids=["grid", "persistent", "dynamic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", fa3.HEAD_DIMS)
def test_head_grouped_order_same_bits(head_dim, causal, persistent):
    # The head-grouped tile order (l2_groups, the default) changes only which SM runs a tile and when: every
    # tile's arithmetic is the same, so out and lse are bitwise those of the flat order. 3 x 20 heads x 8 query
    # tiles (D 64: 6 of 192 rows) on 132 SMs: several groups, the last one short (60 heads, 17 or 22 a group).
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    cfg = replace(fa3.DEFAULT_CONFIGS[head_dim], persistent=bool(persistent), dynamic=persistent == "dynamic")
    n_m = -(-1000 // cfg.block_m)
    assert 60 % fa3.head_group(60, n_m, torch.cuda.get_device_properties(0).multi_processor_count) != 0
    out, lse = _check(3, 1000, 1000, 20, 4, head_dim, torch.bfloat16, causal, config=cfg)
    out_f, lse_f = fa3.attention_fa3_fwd(*_inputs(3, 1000, 1000, 20, 4, head_dim), causal=causal,
                                         config=replace(cfg, l2_groups=False))
    assert torch.equal(out, out_f) and torch.equal(lse, lse_f)
    if persistent == "dynamic":  # and those of one tile a program: a schedule, not arithmetic
        out_g, lse_g = fa3.attention_fa3_fwd(*_inputs(3, 1000, 1000, 20, 4, head_dim), causal=causal,
                                             config=replace(cfg, persistent=False, dynamic=False))
        assert torch.equal(out, out_g) and torch.equal(lse, lse_g)


def test_no_keys():
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    q = torch.randn(1, 5, 2, 64, dtype=torch.bfloat16, device=CUDA)
    k = torch.randn(1, 0, 2, 64, dtype=torch.bfloat16, device=CUDA)
    out, lse = fa3.attention_fa3_fwd(q, k, k.clone(), causal=False)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_supported_rejects():
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    assert not fa3.supported(q, q, q)  # CPU
    if _hopper():
        g = q.to(CUDA)
        assert fa3.supported(g, g, g)
        assert not fa3.supported(g.float(), g.float(), g.float())
        assert not fa3.supported(g[..., :48].contiguous(), g[..., :48].contiguous(), g[..., :48].contiguous())
        assert not fa3.supported(g.transpose(1, 2), g.transpose(1, 2), g.transpose(1, 2))
        with pytest.raises(ValueError, match="attention_fa3_fwd: dtype torch.float32: fa3 takes float16 or bfloat16"):
            fa3.attention_fa3_fwd(g.float(), g.float(), g.float())


@pytest.mark.parametrize("causal", [False, True])
def test_ops_attention_fa3_path_forward_and_fa2_backward(causal, monkeypatch):
    """ops.attention(impl="fa3") and impl="auto" with FLASHSCALE_FA3=1: the FA3 forward, FA2's backward
    on its out/lse; out, lse and the gradients against float64 by the same rule."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from flashscale.ops import attention

    torch.manual_seed(0)
    B, S, H, Hkv, D, dtype = 2, 1000, 8, 2, 128, torch.bfloat16
    base = [torch.randn(B, S, h, D, device=CUDA, dtype=dtype) for h in (H, Hkv, Hkv)]
    do = torch.randn(B, S, H, D, device=CUDA, dtype=dtype)

    def run(fn, cast):
        q, k, v = (t.to(cast).requires_grad_() for t in base)
        out, lse = fn(q, k, v)
        out.backward(do.to(cast))
        return out.detach(), lse.detach(), q.grad, k.grad, v.grad

    ref = lambda q, k, v: attention_ref(q, k, v, causal=causal, return_lse=True, upcast=False)  # noqa: E731
    oracle, low = run(ref, torch.float64), run(ref, dtype)
    for mode in ("fa3", "env"):
        if mode == "env":
            monkeypatch.setenv("FLASHSCALE_FA3", "1")
            ours = run(lambda q, k, v: attention(q, k, v, causal=causal, return_lse=True), dtype)
        else:
            ours = run(lambda q, k, v: attention(q, k, v, causal=causal, return_lse=True, impl="fa3"), dtype)
        assert_close_rule({"ours": ours, "oracle": oracle, "base": low})


def test_ops_attention_fa3_copies_misaligned_inputs():
    """Contiguous views 2 bytes off a 16-byte boundary (TMA's requirement): ops.attention(impl="fa3") takes them
    (its decision reads no data pointer, so torch.compile traces it) and the op copies them: bitwise the output of
    aligned copies."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from flashscale.ops import attention
    from flashscale.ops.attention_op import PATHS

    torch.manual_seed(0)
    shape = (1, 256, 4, 64)
    n = math.prod(shape)
    q, k, v = (torch.randn(n + 1, device=CUDA, dtype=torch.bfloat16)[1:].view(shape) for _ in range(3))
    assert all(t.is_contiguous() and t.data_ptr() % 16 for t in (q, k, v))
    before = PATHS["fwd", "fa3"]
    out = attention(q, k, v, causal=True, impl="fa3")
    assert PATHS["fwd", "fa3"] == before + 1
    assert torch.equal(out, attention(q.clone(), k.clone(), v.clone(), causal=True, impl="fa3"))


# ---- varlen: packed q (Tq, H, D), k/v (Tk, Hkv, D) with int32 cu_seqlens (ping-pong path only) -------------

def _packed(lens_q, lens_k, H, Hkv, D, dtype, seed=0):
    torch.manual_seed(seed)
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=CUDA)
          for lens in (lens_q, lens_k)]
    q = torch.randn(sum(lens_q), H, D, dtype=dtype, device=CUDA)
    k = torch.randn(sum(lens_k), Hkv, D, dtype=dtype, device=CUDA)
    v = torch.randn(sum(lens_k), Hkv, D, dtype=dtype, device=CUDA)
    return q, k, v, cu[0], cu[1]


def _check_varlen(lens_q, lens_k, H, Hkv, D, dtype, causal, *, config=None):
    """fa3 varlen against the float64 varlen reference by the file's rule, out filled with a NaN sentinel
    first: every row of every sequence must be written (and rows past Tq cannot exist)."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, H, Hkv, D, dtype)
    assert fa3.supported(q, k, v, varlen=True)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    sentinel = torch.full_like(q, float("nan"))
    out, lse = fa3.attention_fa3_fwd(q, k, v, causal=causal, config=config, out=sentinel, **kw)
    torch.cuda.synchronize()
    assert out.data_ptr() == sentinel.data_ptr() and lse.shape == (H, q.shape[0]) and lse.dtype == torch.float32
    assert not torch.isnan(out).any(), "a row of some sequence was never written"
    res = {"ours": (out, lse)}
    for name, cast in (("oracle", torch.float64), ("base", dtype)):
        res[name] = attention_ref(q.to(cast), k.to(cast), v.to(cast), causal=causal, return_lse=True, upcast=False,
                                  **kw)
    assert_close_rule(res, names=("out", "lse"))
    return q, k, v, cu_q, cu_k, out, lse


# (lens_q, lens_k, H, Hkv, D, dtype, causal)
VARLEN_CASES = [
    # empty and length-1 sequences, ragged ones, one of exactly a block; GQA 4:1
    ([0, 1, 300, 77, 1000, 128, 5], [0, 1, 300, 77, 1000, 128, 5], 8, 2, 128, torch.bfloat16, True),
    ([0, 1, 300, 77, 1000, 128, 5], [0, 1, 300, 77, 1000, 128, 5], 8, 2, 128, torch.bfloat16, False),
    # seqlen_q != seqlen_k both ways (causal bottom-right per sequence), queries with no key at all, keys with
    # no query; MQA
    ([513, 0, 1, 2048, 31, 7], [700, 5, 0, 1500, 31, 1], 4, 1, 64, torch.bfloat16, True),
    ([513, 0, 1, 2048, 31, 7], [700, 5, 0, 1500, 31, 1], 4, 1, 64, torch.float16, False),
    ([1, 257, 64, 1100, 0], [40, 257, 300, 1100, 3], 4, 1, 256, torch.bfloat16, True),
    ([3000, 2, 129], [2500, 900, 129], 8, 2, 256, torch.float16, False),
    # long sequences, many tiles (several a program on the persistent grid), GQA 4:1
    ([4096, 17, 2500, 1], [4096, 4000, 2500, 1], 16, 4, 128, torch.bfloat16, True),
    # more sequences than a warp's chunk of the in-kernel search (32), single-row ones among them
    ([1] * 40 + [200, 65], [3] * 40 + [1, 300], 4, 4, 64, torch.bfloat16, True),
]
VARLEN_VARIANTS = {"default": lambda d: fa3.DEFAULT_CONFIGS[d],
                   "persistent": lambda d: replace(fa3.DEFAULT_CONFIGS[d], persistent=True)}


def _varlen_id(c):
    return (f"{len(c[0])}seq_q{sum(c[0])}_k{sum(c[1])}_h{c[2]}x{c[3]}_d{c[4]}_{str(c[5])[6:]}_"
            f"{'causal' if c[6] else 'full'}")


@pytest.mark.parametrize("variant", sorted(VARLEN_VARIANTS))
@pytest.mark.parametrize("case", VARLEN_CASES, ids=_varlen_id)
def test_varlen_matches_reference(case, variant):
    _check_varlen(*case, config=VARLEN_VARIANTS[variant](case[4]))


@pytest.mark.parametrize("variant", sorted(VARLEN_VARIANTS))
@pytest.mark.parametrize("head_dim", fa3.HEAD_DIMS)
def test_varlen_writes_only_its_rows(head_dim, variant):
    """One sequence at a time out of a packed batch (offsets cu_seqlens[b], cu_seqlens[b + 1]: the kernel
    takes offsets that start above 0 and end below Tq), out filled with a NaN sentinel: the sequence's rows
    match the dense reference of that slice, and every other row, the ones just past its end first, keeps
    the sentinel (a slice the sequence ends in must not be TMA-stored: the next sequence's rows follow)."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    lens_q, lens_k = [1, 130, 64, 0, 300, 2], [5, 100, 64, 7, 300, 1]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, head_dim, torch.bfloat16)
    cfg = VARLEN_VARIANTS[variant](head_dim)
    oq, ok = cu_q.tolist(), cu_k.tolist()
    for causal in (False, True):
        for b in range(len(lens_q)):
            out = torch.full_like(q, float("nan"))
            got, lse = fa3.attention_fa3_fwd(q, k, v, causal=causal, config=cfg, out=out,
                                             cu_seqlens_q=cu_q[b:b + 2].clone(), cu_seqlens_k=cu_k[b:b + 2].clone(),
                                             max_seqlen_q=lens_q[b], max_seqlen_k=lens_k[b])
            torch.cuda.synchronize()
            s, e = oq[b], oq[b + 1]
            assert torch.isnan(got[:s]).all() and torch.isnan(got[e:]).all(), f"sequence {b} wrote outside its rows"
            if e == s:
                continue
            sl_q, sl_k = q[s:e][None], k[ok[b]:ok[b + 1]][None]
            sl_v = v[ok[b]:ok[b + 1]][None]
            res = {"ours": (got[s:e][None], lse[:, s:e][None])}
            for name, cast in (("oracle", torch.float64), ("base", torch.bfloat16)):
                res[name] = attention_ref(sl_q.to(cast), sl_k.to(cast), sl_v.to(cast), causal=causal,
                                          return_lse=True, upcast=False)
            assert_close_rule(res, names=("out", "lse"))


@pytest.mark.parametrize("name,head_dim", [(n, d) for d, cfgs in fa3.TUNING_CONFIGS.items() for n in cfgs
                                            if fa3.TUNING_CONFIGS[d][n].is_pingpong and fa3.TUNING_CONFIGS[d][n].l2_groups
                                            and not fa3.TUNING_CONFIGS[d][n].dynamic])
def test_varlen_tuning_configs(name, head_dim):  # (l2_groups, dynamic: the dense grid's; varlen has its own)
    # Every ping-pong config the sweep times (2 or 3 consumers, 64/128-row slices, 64..256-key blocks, ring
    # depths, serial pipeline, persistent): ragged, GQA, causal with Sq < Sk and Sq > Sk in one batch.
    cfg = fa3.TUNING_CONFIGS[head_dim][name]
    _check_varlen([700, 1, 0, 333, 1100], [1300, 9, 4, 200, 1100], 4, 2, head_dim, torch.bfloat16, True, config=cfg)


def test_varlen_refusals_and_empty_inputs():
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    q, k, v, cu_q, cu_k = _packed([5, 3], [4, 0], 2, 1, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="ping-pong"):
        fa3.attention_fa3_fwd(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, config=fa3.TUNING_CONFIGS[64]["coop"])
    with pytest.raises(ValueError, match="int32"):
        fa3.attention_fa3_fwd(q, k, v, cu_seqlens_q=cu_q.long(), cu_seqlens_k=cu_k)
    # no key token at all: every row is empty
    out, lse = fa3.attention_fa3_fwd(q, k[:0], v[:0], cu_seqlens_q=cu_q, cu_seqlens_k=torch.zeros_like(cu_k))
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))
    # no query token
    out, lse = fa3.attention_fa3_fwd(q[:0], k, v, cu_seqlens_q=torch.zeros_like(cu_q), cu_seqlens_k=cu_k)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)
    # max_seqlen_q left out: read from cu_seqlens_q
    _, lse_a = fa3.attention_fa3_fwd(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    _, lse_b = fa3.attention_fa3_fwd(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, max_seqlen_q=5)
    assert torch.equal(lse_a, lse_b) and torch.isinf(lse_a[:, 5:]).all()  # sequence 1 has no key


@pytest.mark.parametrize("causal", [False, True])
def test_ops_attention_fa3_varlen_backward_matches_triton(causal):
    """ops.attention(impl="fa3") on the packed layout: the fa3 varlen forward, FA2's varlen backward on its
    out/lse (lse (H, Tq), as FA2's forward returns it), gradients through out and lse. fa3 and impl="triton"
    each against float64 by the file's rule, and fa3's against triton's by the same rule."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    try:
        from .attention_checks import run_all
    except ImportError:
        from attention_checks import run_all

    lens_q, lens_k = [0, 1, 257, 700, 64], [3, 1, 300, 700, 0]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 8, 2, 128, torch.bfloat16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    kw = dict(causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    res = {impl: run_all(q, k, v, dlse=True, impl=impl, **kw) for impl in ("fa3", "triton")}
    for impl in res:
        assert_close_rule(res[impl])
    assert_close_rule({"ours": res["fa3"]["ours"], "oracle": res["triton"]["ours"], "base": res["fa3"]["base"],
                       "delta_term": res["fa3"]["delta_term"]})


def test_ops_attention_auto_takes_varlen_to_fa3(monkeypatch):
    # impl="auto" sends the packed layout to fa3 where the dense rule would (FA3_AUTO_VARLEN), and FA2 below it
    if not _hopper():
        pytest.skip("needs an sm_90 GPU and Gluon")
    from flashscale.ops import attention

    calls = []
    real = fa3.fwd_unchecked  # what ops.attention calls (it checked the inputs itself)

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fa3, "fwd_unchecked", spy)
    monkeypatch.delenv("FLASHSCALE_FA3", raising=False)
    q, k, v, cu_q, cu_k = _packed([300, 4000], [300, 4000], 4, 2, 128, torch.bfloat16)
    kw = dict(causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=4000, max_seqlen_k=4000)
    out = attention(q, k, v, **kw)
    assert calls, "auto kept a 4000-row varlen call (head_dim 128) off the fa3 forward"
    torch.testing.assert_close(out, attention(q, k, v, impl="triton", **kw), atol=2e-2, rtol=2e-2)
    calls.clear()
    q, k, v, cu_q, cu_k = _packed([100, 200], [100, 200], 4, 2, 128, torch.bfloat16)
    attention(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=200, max_seqlen_k=200)
    assert not calls, "auto sent a 200-row varlen call to fa3 (FA2 is faster there)"


def test_launch_cache_keeps_specializations_apart(monkeypatch):
    # kernels.launch reuses a compiled kernel per specialization of the integer arguments: seqlens divisible by
    # 16, not, and 1 (Triton turns an int 1 into a constant) in turns, each against the reference, twice
    from flashscale.kernels import launch as L
    monkeypatch.setattr(L, "ENABLED", True)
    for Sq in (1024, 1000, 1, 1024, 1000, 1):
        _check(2, Sq, Sq if Sq > 1 else 300, 4, 2, 128, torch.bfloat16, True)
    keys = [k for k in L._CACHE if k[0] is fa3._fa3_fwd_kernel]
    assert len({k[2] for k in keys}) >= 3
