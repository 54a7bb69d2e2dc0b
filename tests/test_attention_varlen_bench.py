"""benchmarks/attention_varlen.py's CPU-checkable parts: the lengths, the FLOP count, and that the padded SDPA
anchors compute the same attention as the packed varlen reference (so their times are for the same work)."""


import pytest
import torch
from bench_testutil import load_benchmark

bench = load_benchmark("attention_varlen")


@pytest.mark.parametrize("max_seqlen", [1024, 4096, 16384])
def test_lengths_fill_the_tokens_in_range(max_seqlen):
    lens = bench.lengths(max_seqlen)
    assert sum(lens) == bench.TOKENS and max(lens) <= max_seqlen
    assert all(n >= max_seqlen // 4 for n in lens[:-1]) and lens[-1] >= 1
    assert lens == bench.lengths(max_seqlen)  # seeded


def test_useful_flops_counts_each_sequence():
    assert bench.useful_flops([3, 5], 2, 8, False) == 4.0 * (9 + 25) * 2 * 8
    assert bench.useful_flops([3, 5], 2, 8, True) == 2.0 * (9 + 25) * 2 * 8


@pytest.mark.parametrize("causal", [False, True])
def test_padded_sdpa_is_the_varlen_attention(causal):
    from flashscale.reference.attention import attention_ref

    lens = [5, 1, 9, 3]
    q, k, v, cu = bench.packed(lens, 2, 8, device="cpu", dtype=torch.float64)
    ref = attention_ref(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=9, max_seqlen_k=9)
    fn = bench.forward_fn("sdpa_math_padded", q, k, v, cu, lens, causal)
    out = fn().transpose(1, 2)  # (B, S, H, D)
    got = torch.cat([out[i, :n] for i, n in enumerate(lens)])
    torch.testing.assert_close(got, ref)
    if causal:  # the flash anchor's unmasked causal call is exact on the real rows too (math backend here)
        pq, pk, pv = (bench.padded(t, cu, lens) for t in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(pq, pk, pv, is_causal=True).transpose(1, 2)
        torch.testing.assert_close(torch.cat([o[i, :n] for i, n in enumerate(lens)]), ref)
    else:
        with pytest.raises(ValueError, match="flash backend takes no mask"):
            bench.forward_fn("sdpa_flash_padded", q, k, v, cu, lens, causal)
