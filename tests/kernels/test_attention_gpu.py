"""The attention kernels on a CUDA GPU at real sizes (bf16 and fp16), determinism, torch.compile, and the
Llama model running through them. Same tolerance rule as the CPU tests (attention_checks), with the
float64 reference on the GPU as the oracle and the reference in the input dtype as the baseline."""

from __future__ import annotations

import pytest
import torch

try:
    from .attention_checks import assert_close_rule, randn, run_all
except ImportError:  # tests/kernels is not a package
    from attention_checks import assert_close_rule, randn, run_all

from flashscale.ops import attention

pytestmark = pytest.mark.gpu
CUDA = "cuda"

# (B, Sq, Sk, H, Hkv, D, dtype, causal): MHA and GQA, every head-dim family (96 is padded to 128 and
# read through TMA with out-of-range columns zero-filled), sequence lengths that are not block multiples.
CASES = [
    (2, 1024, 1024, 16, 16, 128, torch.bfloat16, False),
    (2, 1024, 1024, 16, 4, 128, torch.bfloat16, True),
    (1, 2048, 2048, 8, 8, 64, torch.float16, True),
    (1, 512, 512, 4, 2, 256, torch.bfloat16, False),
    (1, 999, 1500, 4, 1, 96, torch.bfloat16, True),
    (3, 1500, 999, 4, 2, 64, torch.float16, True),  # Sq > Sk: leading rows see no key
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}_q{c[1]}_k{c[2]}_h{c[3]}x{c[4]}_d{c[5]}_"
                         f"{str(c[6])[6:]}_{'causal' if c[7] else 'full'}")
def test_matches_reference(case):
    B, Sq, Sk, H, Hkv, D, dtype, causal = case
    q = randn(B, Sq, H, D, dtype=dtype, device=CUDA)
    k, v = randn(B, Sk, Hkv, D, dtype=dtype, device=CUDA), randn(B, Sk, Hkv, D, dtype=dtype, device=CUDA)
    assert_close_rule(run_all(q, k, v, causal=causal))


def test_features_at_size():
    B, S, H, Hkv, D = 2, 777, 8, 2, 128
    q = randn(B, S, H, D, dtype=torch.bfloat16, device=CUDA)
    k, v = (randn(B, S, Hkv, D, dtype=torch.bfloat16, device=CUDA) for _ in range(2))
    kw = dict(causal=True, window=(200, -1), softcap=30.0, alibi_slopes=torch.rand(H, device=CUDA) * 0.1,
              dropout_p=0.1, seed=42)
    assert_close_rule(run_all(q, k, v, dlse=True, **kw))


def test_varlen_at_size():
    lens = [0, 1, 300, 1024, 77]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=CUDA)
    T, H, Hkv, D = sum(lens), 8, 2, 128
    q = randn(T, H, D, dtype=torch.bfloat16, device=CUDA)
    k, v = (randn(T, Hkv, D, dtype=torch.bfloat16, device=CUDA) for _ in range(2))
    res = run_all(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1024, max_seqlen_k=1024)
    assert_close_rule(res)


def test_deterministic_backward_is_bitwise_reproducible():
    q, k, v = (randn(2, 1024, 8, 128, dtype=torch.bfloat16, device=CUDA) for _ in range(3))
    do = torch.randn_like(q)
    runs = []
    for _ in range(3):
        out = attention(q, k, v, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), do))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


def test_torch_compile_inductor_no_graph_break():
    q, k, v = (randn(2, 256, 8, 64, dtype=torch.bfloat16, device=CUDA) for _ in range(3))

    def f(q, k, v):
        return (attention(q, k, v, causal=True) * 2).float().square().mean()

    explanation = torch._dynamo.explain(f)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(f, fullgraph=True)
    a, b = f(q, k, v), compiled(q, k, v)
    ga = torch.autograd.grad(a, (q, k, v))
    gb = torch.autograd.grad(b, (q, k, v))
    assert torch.allclose(a, b, rtol=1e-3, atol=0)
    for x, y in zip(ga, gb):
        assert torch.equal(x, y) or (x - y).abs().max() <= 2 * torch.finfo(torch.bfloat16).eps * x.abs().max()


def test_llama_runs_through_the_kernels(monkeypatch):
    """The model's attention (GQA, causal) on the GPU goes through the Triton kernels: float32 logits
    match the CPU model (reference path), a bf16 step trains under torch.compile without graph breaks."""
    from flashscale.kernels import attention_fwd as fwd_mod
    from flashscale.models import Llama, preset

    calls = []
    real = fwd_mod.attention_fwd
    monkeypatch.setattr(fwd_mod, "attention_fwd", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    cfg = preset("tiny", num_attention_heads=4, num_key_value_heads=2)
    model = Llama(cfg).init_weights(seed=0).eval()
    x = torch.randint(0, cfg.vocab_size, (2, 100))
    with torch.no_grad():
        ref = model(x)
        gpu = model.to(CUDA)(x.to(CUDA)).cpu()
    assert calls, "the model did not reach the Triton forward kernel"
    assert ((gpu - ref).norm() / ref.norm()).item() < 1e-5

    model = model.to(torch.bfloat16).train()
    compiled = torch.compile(model, fullgraph=True)
    y = torch.randint(0, cfg.vocab_size, (2, 100), device=CUDA)
    logits = compiled(x.to(CUDA))
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("seqlen,head_dim", [(100, 64), (1600, 128)], ids=["fa2", "fa3"])
def test_llama_document_masking_through_the_varlen_kernels(seqlen, head_dim):
    """The model with document masking (attention within documents cut at eos, positions restarting) on the GPU,
    GQA through the varlen kernels: float32 logits (FA2's varlen kernels) equal to every document run alone; then a
    bf16 training step (on sm_90 with a 1561-row document the Hopper varlen forward:
    ops.attention.FA3_AUTO_VARLEN_MIN_SEQLEN_Q at d128 causal) eager and under torch.compile(fullgraph=True) with
    the spans passed in (no graph break)."""
    from flashscale.models import Llama, preset
    from flashscale.models.llama import document_spans
    from flashscale.ops import attention_op

    eos = 3
    cfg = preset("tiny", num_attention_heads=4, num_key_value_heads=2, eos_token_id=eos, head_dim=head_dim,
                 max_position_embeddings=2048)
    model = Llama(cfg).init_weights(seed=0).to(CUDA).eval()
    model.document_masking = True
    g = torch.Generator().manual_seed(0)
    x = torch.randint(4, cfg.vocab_size, (2, seqlen), generator=g)
    x[0, [seqlen // 3, seqlen // 3 + 1, seqlen - 9]] = eos  # a one-token document among them
    x[1, seqlen - 40] = eos  # row 1's first document: the longest (the varlen rule reads max_seqlen_q)
    x = x.to(CUDA)
    reference_before = attention_op.PATHS["fwd", "reference"]
    with torch.no_grad():
        masked = model(x)
        alone = []
        for row in x.cpu():
            cut = [i + 1 for i, t in enumerate(row.tolist()) if t == eos and i + 1 < seqlen]
            alone += [model(d[None].to(CUDA))[0] for d in torch.tensor_split(row, cut)]
    assert attention_op.PATHS["fwd", "reference"] == reference_before, "a reference forward on the GPU"
    ref = torch.cat(alone)
    assert ((masked.reshape(-1, masked.shape[-1]) - ref).norm() / ref.norm()).item() < 1e-4

    model = model.to(torch.bfloat16).train()
    spans = dict(zip(("cu_seqlens", "positions"), document_spans(x, eos)))
    explanation = torch._dynamo.explain(model)(x, **spans)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(model, fullgraph=True)
    y = torch.randint(0, cfg.vocab_size, x.shape, device=CUDA)
    losses = []
    longest = int((spans["cu_seqlens"][1:] - spans["cu_seqlens"][:-1]).max())
    for fwd in (model, compiled):
        fa3_before = attention_op.PATHS["fwd", "fa3"]
        model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(fwd(x, **spans).flatten(0, 1), y.flatten())
        loss.backward()
        losses.append((loss.item(), [p.grad.float().norm() for p in model.parameters() if p.grad is not None]))
        if fwd is model and seqlen >= 1536 and torch.cuda.get_device_capability()[0] == 9:
            assert attention_op.PATHS["fwd", "fa3"] > fa3_before, f"the Hopper varlen forward (longest {longest})"
    assert abs(losses[0][0] - losses[1][0]) < 1e-2 * abs(losses[0][0])
    assert all(torch.isfinite(n) for n in losses[1][1])
