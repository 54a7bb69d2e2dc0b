"""The Hadamard + e4m3 block-quantization pre-pass (kernels/hadamard.py) against its reference, on CPU.

The kernel runs under TRITON_INTERPRET=1 (tests/conftest.py). Its e4m3 stores are checked through
out_dtype=float32 (the scaled values before the cast; torch's e4m3 cast then has to reproduce the
reference bit for bit), because the interpreter's own float8 cast mis-rounds (see kernels/hadamard.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from flashscale.kernels.hadamard import auto_chunk, auto_hmat, auto_warps, hadamard_quant, padded_len
from flashscale.reference.attention_fp8 import (E4M3, E4M3_MAX, FLOOR, dequantize_blocks_ref, hadamard_matrix,
                                                hadamard_ref, quantize_blocks_ref, random_signs)


@pytest.mark.parametrize("n", [16, 64, 128, 256])
def test_hadamard_matrix_orthogonal(n):
    h = hadamard_matrix(n, dtype=torch.float64)
    assert torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64))
    assert torch.equal(h, h.T) and set(h.unique().tolist()) == {-1.0, 1.0}


def test_rotation_preserves_scores():
    """(Q R)(K R)^T = Q K^T with R = diag(signs) H / sqrt(D): the same signs for Q and K."""
    q, k = torch.randn(2, 9, 3, 64, dtype=torch.float64), torch.randn(2, 11, 3, 64, dtype=torch.float64)
    s = random_signs(64, 5).double()
    qr, kr = hadamard_ref(q, s), hadamard_ref(k, s)
    ref = torch.einsum("bqhd,bkhd->bhqk", q, k)
    assert torch.allclose(torch.einsum("bqhd,bkhd->bhqk", qr, kr), ref, rtol=0, atol=1e-12 * ref.abs().max())
    assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), rtol=1e-13)  # orthogonal: norms kept
    other = hadamard_ref(k, random_signs(64, 6).double())  # different signs: scores change
    assert not torch.allclose(torch.einsum("bqhd,bkhd->bhqk", qr, other), ref, atol=1e-3)


def test_rotation_spreads_an_outlier():
    x = torch.zeros(1, 1, 1, 128, dtype=torch.float64)
    x[..., 7] = 30.0
    y = hadamard_ref(x, random_signs(128, 0).double())
    assert torch.allclose(y.abs(), torch.full_like(y, 30.0 / math.sqrt(128)))


def test_block_quant_math():
    """descale = amax / 448 per (block of rows, head); round trip within e4m3's relative step."""
    x = torch.randn(2, 40, 3, 32) * torch.logspace(-3, 2, 3)[None, None, :, None]  # heads at different scales
    x[1, 16:32, 2] = 0.0  # an all-zero block
    x8, d = quantize_blocks_ref(x, 16)
    assert x8.dtype == E4M3 and d.shape == (2, 3, 3)
    for b in range(2):
        for h in range(3):
            for j in range(3):
                amax = x[b, 16 * j:16 * (j + 1), h].abs().max().clamp_min(FLOOR)
                assert d[b, h, j] == amax / E4M3_MAX
    assert d[1, 2, 1] == FLOOR / E4M3_MAX and torch.all(x8[1, 16:32, 2].float() == 0)
    back = dequantize_blocks_ref(x8, d, 16)
    dd = d.transpose(1, 2).repeat_interleave(16, dim=1)[:, :40, :, None]
    # e4m3: 3 mantissa bits -> relative error <= 2^-4 in the normal range; below 2^-6 (scaled) subnormal
    # steps of 2^-9, i.e. an absolute error <= 2^-10 * descale
    bound = 2.0 ** -4 * x.abs() + 2.0 ** -10 * dd
    assert torch.all((back - x).abs() <= bound)
    assert (back - x).abs().max() > 0  # it does round


def test_per_tensor_quant():
    x = torch.randn(1, 40, 2, 16)
    x8, d = quantize_blocks_ref(x, 16, per_tensor=True)
    assert torch.all(d == x.abs().max() / E4M3_MAX)
    assert x8.float().abs().max() == E4M3_MAX  # the largest element lands on e4m3's maximum


def _kernel_vs_ref(x, *, block, hadamard, method="mma", transpose=False, per_tensor=False, seed=3):
    y, d = hadamard_quant(x, block=block, hadamard=hadamard, seed=seed, method=method, transpose=transpose,
                          per_tensor=per_tensor, out_dtype=torch.float32)
    xr = hadamard_ref(x, random_signs(x.shape[-1], seed)) if hadamard else x
    r8, rd = quantize_blocks_ref(xr, block, per_tensor=per_tensor)
    if transpose:  # (B, H, D, S_pad) -> (B, S, H, D); the padding must be zeros
        S = x.shape[1]
        assert y.shape[-1] == padded_len(S) and torch.all(y[..., S:] == 0)
        y = y[..., :S].permute(0, 3, 1, 2)
    return y, d, r8, rd


@pytest.mark.parametrize("method", ["mma", "butterfly"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("d", [16, 64])
def test_kernel_hadamard_quant(method, dtype, d):
    x = torch.randn(2, 37, 2, d).to(dtype)
    x[0, 3, 1, 5] = 40.0  # an outlier
    y, desc, r8, rd = _kernel_vs_ref(x, block=16, hadamard=True, method=method)
    assert torch.allclose(desc, rd, rtol=1e-6, atol=0)
    # the fp32 transform's summation order may move a value across an e4m3 rounding boundary: allow
    # one e4m3 step on a few elements, never more
    diff = (y.to(E4M3).float() - r8.float()).abs()
    assert torch.all(diff <= 2.0 ** -3 * r8.float().abs() + 2.0 ** -9)
    assert (diff > 0).float().mean() < 0.01


@pytest.mark.parametrize("transpose", [False, True], ids=["rows", "v_transposed"])
@pytest.mark.parametrize("per_tensor", [False, True], ids=["block", "tensor"])
def test_kernel_quant_only_bitwise(transpose, per_tensor):
    """Without the transform the kernel's arithmetic is the reference's: identical e4m3 bits."""
    x = torch.randn(1, 40, 3, 32, dtype=torch.float16) * 3
    y, d, r8, rd = _kernel_vs_ref(x, block=16, hadamard=False, transpose=transpose, per_tensor=per_tensor)
    assert torch.equal(d, rd)
    assert torch.equal(y.to(E4M3).view(torch.uint8), r8.view(torch.uint8))


def test_kernel_e4m3_store_path():
    """The real float8 store under the interpreter: equal to the reference except where the interpreter's
    cast is known wrong (carry into the next binade: half the value; subnormals: 0)."""
    x = torch.randn(1, 32, 2, 16, dtype=torch.float16)
    y, d = hadamard_quant(x, block=16, hadamard=False)
    r8, rd = quantize_blocks_ref(x, 16)
    a, b = y.float(), r8.float()
    known = ((a == b / 2) & (torch.frexp(b)[0].abs() == 0.5)) | ((a == 0) & (b.abs() < 2.0 ** -6))
    assert y.dtype == E4M3 and torch.all((a == b) | known)
    assert (a == b).float().mean() > 0.9


def test_all_zero_and_ragged_blocks():
    x = torch.zeros(1, 21, 1, 16, dtype=torch.float16)  # 16 + 5 rows, all zero
    y, d, r8, rd = _kernel_vs_ref(x, block=16, hadamard=True)
    assert torch.all(d == FLOOR / E4M3_MAX) and torch.all(y == 0)


@pytest.mark.parametrize("S", [40, 64, 70])
def test_kernel_writes_v_in_the_fp8_kernels_permuted_key_order(S):
    """key_perm: the transposed V with the keys of each 32-key group where the FA3 FP8 kernel's v_perm reads them:
    the same bits as permuting the natural layout afterwards (attention_fa3_fp8.permute_v_keys), zeros elsewhere."""
    from flashscale.kernels.attention_fa3_fp8 import permute_v_keys, v_key_of_slot

    x = torch.randn(2, S, 3, 32, dtype=torch.float16) * 3
    nat, d0 = hadamard_quant(x, block=16, hadamard=False, transpose=True, out_dtype=torch.float32)
    perm, d1 = hadamard_quant(x, block=16, hadamard=False, transpose=True, out_dtype=torch.float32, key_perm=True)
    assert torch.equal(d0, d1) and perm.shape[-1] == -(-S // 32) * 32
    assert torch.equal(perm, permute_v_keys(nat, S))
    k = next(k for k in range(32) if v_key_of_slot(k) != k)
    assert not torch.equal(perm[..., k], nat[..., k])  # it does move keys
    with pytest.raises(ValueError, match="transpose=True"):
        hadamard_quant(x, block=16, hadamard=False, key_perm=True)


@pytest.mark.parametrize("kw", [dict(hadamard=True), dict(hadamard=False, transpose=True, key_perm=True),
                                dict(hadamard=True, per_tensor=True)], ids=["hadamard", "vt_perm", "per_tensor"])
def test_chunked_blocks_give_the_same_bits(kw):
    """A block read in pieces (the amax over all of them first, then each piece quantized) gives the whole
    block's descales bit for bit and its values (ragged last block included): bitwise without the transform; with
    it within a few fp32 roundings (the interpreter's matmul may sum a 16-row piece in another order than 64 rows;
    the GPU test checks the bits). Bad chunks are refused by name."""
    x = torch.randn(2, 150, 2, 32, dtype=torch.float16) * 3
    x[1, 70, 0, 3] = 60.0  # an outlier in the second piece of a block
    whole = hadamard_quant(x, block=64, chunk=0, out_dtype=torch.float32, **kw)
    for chunk in (16, 32):
        pieces = hadamard_quant(x, block=64, chunk=chunk, out_dtype=torch.float32, **kw)
        assert torch.equal(pieces[1], whole[1]), chunk
        if kw["hadamard"]:
            torch.testing.assert_close(pieces[0], whole[0], rtol=2.0 ** -20, atol=0)  # a few fp32 roundings
        else:
            assert torch.equal(pieces[0], whole[0]), chunk
    assert auto_chunk(256, 128, transpose=True) == 64 and auto_chunk(128, 256, transpose=True) == 32
    assert auto_chunk(256, 128) == 0 and auto_chunk(256, 256) == 32 and auto_chunk(128, 128, transpose=True) == 64
    assert auto_chunk(128, 64, transpose=True) == 0
    # whole Q/K blocks at 128 values a thread, the matrix from memory from 8 warps; V^T pieces at 4 warps
    assert (auto_warps(128, 128), auto_warps(256, 128), auto_warps(128, 256), auto_warps(64, 128, True)) == (4, 8, 8, 4)
    assert not auto_hmat(128, 128, 4) and auto_hmat(256, 128, 8) and auto_hmat(128, 256, 8)
    for bad in (24, 128, -16, 8):
        with pytest.raises(ValueError, match="chunk"):
            hadamard_quant(x, block=64, chunk=bad, **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_signed_matrix_from_memory_and_staged_pieces_give_the_same_bits(dtype):
    """hmat=True (diag(signs) @ H read from memory: the same +-1 products as the signs applied to x, then H built in
    registers) and num_stages > 1 (the pieces' loads pipelined) change where values come from, not what is summed:
    the same scaled values bit for bit, the same descales. Misuse is refused by name."""
    x = torch.randn(1, 96, 2, 64, dtype=dtype) * 2
    x[0, 40, 1, 7] = 50.0
    for chunk in (0, 16):
        ref = hadamard_quant(x, block=32, hadamard=True, seed=5, chunk=chunk, out_dtype=torch.float32)
        for kw in (dict(hmat=True), dict(num_stages=2), dict(hmat=True, num_stages=3)):
            got = hadamard_quant(x, block=32, hadamard=True, seed=5, chunk=chunk, out_dtype=torch.float32, **kw)
            assert torch.equal(got[1], ref[1]) and torch.equal(got[0], ref[0]), (chunk, kw)
    v = hadamard_quant(x, block=32, hadamard=False, transpose=True, out_dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(v, hadamard_quant(x, block=32, hadamard=False, transpose=True,
                                                                  out_dtype=torch.float32, hmat=True, num_stages=2)))
    with pytest.raises(ValueError, match="hmat=True .* method='mma'"):
        hadamard_quant(x, block=32, hadamard=True, method="butterfly", hmat=True)
    with pytest.raises(ValueError, match="buffer the 128 KB matrix 2 times"):
        hadamard_quant(torch.randn(1, 32, 1, 256), block=32, hadamard=True, hmat=True, num_stages=2)
    with pytest.raises(ValueError, match="num_stages must be an int in 1..4"):
        hadamard_quant(x, block=32, hadamard=True, num_stages=0)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_kron_method_is_the_same_transform(dtype, d):
    """method="kron" (H_D as H_(D/16) (x) H_16: two 16-wide products over the (R, D/16, 16) view of each row, the
    second on H_(D/16)'s diagonal blocks) gives the matrix method's values up to fp32 summation order: here within
    2^-20 of the largest (under the interpreter its split is in fp16, exact to ~2^-22 of the inputs; on the GPU bf16,
    exact), whole blocks and pieces; the same descales to 1e-6. It takes head_dim 32..256."""
    x = torch.randn(1, 40, 2, d, dtype=dtype) * 3
    x[0, 5, 1, 7] = 90.0
    for chunk in (0, 16):
        ref = hadamard_quant(x, block=32, hadamard=True, seed=2, out_dtype=torch.float32, chunk=chunk)
        got = hadamard_quant(x, block=32, hadamard=True, seed=2, out_dtype=torch.float32, chunk=chunk, method="kron")
        torch.testing.assert_close(got[1], ref[1], rtol=1e-6, atol=0)
        torch.testing.assert_close(got[0], ref[0], rtol=2.0 ** -20, atol=448 * 2.0 ** -20)
    with pytest.raises(ValueError, match=r"method='kron' .* takes head_dim 32\.\.256, got 16"):
        hadamard_quant(torch.randn(1, 16, 1, 16), block=16, hadamard=True, method="kron")
