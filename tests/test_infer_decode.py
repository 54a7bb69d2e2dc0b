"""StaticDecoder (flashscale.infer.decode): the batch-1 decode step of three Triton kernels plus the model's own
linears (float or QuantLinear) over a static cache equals Llama.forward with a KVCache, prompt prefill included,
fused and unfused; generate(cuda_graph=True) equals the eager loop; bad input is refused. On the CPU the kernels run
under Triton's interpreter (float32); the CUDA-graph capture runs where there is a GPU."""

import copy

import pytest
import torch
from torch import nn

from flashscale.infer.decode import StaticDecoder, unsupported
from flashscale.infer.generate import generate
from flashscale.models import Llama, LlamaConfig
from flashscale.models.llama import KVCache
from flashscale.quant.qlinear import QuantLinear

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _model(bias=False, tied=False, seed=3, dtype=torch.float32):
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, attention_bias=bias, mlp_bias=bias,
                      tie_word_embeddings=tied)
    return Llama(cfg).init_weights(seed=seed).eval().to(DEV, dtype)


def _ring_model():
    """A model whose 4-bit linears (group 128) the ring decode kernel takes (items of 128 inputs in one group)."""
    cfg = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    return Llama(cfg).init_weights(seed=3).eval().to(DEV)


def _reference(model, ids, steps):
    """Llama.forward with a KVCache: the prompt's last logits, then one token a call (the tokens given)."""
    dtype = model.embed_tokens.weight.dtype
    cache = KVCache.empty(model.config, 1, ids.shape[1] + len(steps), device=DEV, dtype=dtype)
    out = [model(ids, cache=cache)[:, -1]]
    for t in steps:
        out.append(model(torch.tensor([[t]], device=DEV), cache=cache)[:, -1])
    return out


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("bias,tied", [(False, False), (True, True)])
@torch.no_grad()
def test_step_equals_forward_with_kv_cache(bias, tied):
    model = _model(bias, tied)
    ids = torch.tensor([[5, 17, 33, 2, 60]], device=DEV)
    steps = [7, 81, 40, 12]
    want = _reference(model, ids, steps)
    dec = StaticDecoder(model, 16)
    got = [dec.prefill(ids).clone()] + [dec.step(t).clone() for t in steps]
    tol = 1e-4 if DEV == "cuda" else 1e-5  # GPU: cuBLAS and the kernels sum in other orders
    for g, w in zip(got, want):
        assert _rel(g, w) < tol
    assert dec.length == ids.shape[1] + len(steps) and int(dec.pos) == dec.length


@pytest.mark.parametrize("splits", [1, 4, 8])
@torch.no_grad()
def test_attention_splits_equal_forward(splits):
    """Flash-decoding: the context of each head split in 1, 4 or 8 chunks (the first step's 4 cached rows leave
    splits of 8 empty; the last split holds the new row), partials combined by the last split to arrive: the
    logits of Llama.forward, and the tickets left at zero for the next step."""
    model = _model()
    ids = torch.tensor([[5, 17, 33, 2]], device=DEV)
    steps = [7, 81, 40, 12, 9, 30, 1, 64, 3, 22]
    want = _reference(model, ids, steps)
    dec = StaticDecoder(model, 16, attn_splits=splits)
    assert dec.splits == splits
    got = [dec.prefill(ids).clone()] + [dec.step(t).clone() for t in steps]
    tol = 1e-4 if DEV == "cuda" else 1e-5
    for g, w in zip(got, want):
        assert _rel(g, w) < tol
    assert int(dec.attn_cnt.abs().sum()) == 0


@torch.no_grad()
def test_attention_splits_over_a_long_context():
    """A context longer than a split's 32-row block: 100 cached rows over 2 splits (50 each: two turns of the
    loop, the second masked) and over 1, against Llama.forward."""
    model = _model()
    ids = torch.randint(0, 96, (1, 100), generator=torch.Generator().manual_seed(1)).to(DEV)
    steps = [7, 81, 40]
    want = _reference(model, ids, steps)
    for splits in (1, 2):
        dec = StaticDecoder(model, 128, attn_splits=splits)
        got = [dec.prefill(ids).clone()] + [dec.step(t).clone() for t in steps]
        for g, w in zip(got[1:], want[1:]):
            assert _rel(g, w) < (1e-4 if DEV == "cuda" else 1e-5)


@pytest.mark.parametrize("pdl", [False, True])
@torch.no_grad()
def test_fused_quantized_layout_equals_the_quantized_model(pdl):
    """fuse=True with linear_fn=QuantLinear.from_float (the benchmark's layout): the same logits as the model
    whose linears were quantized one by one (RTN per output row: fusing rows does not change them). On a GPU in
    float16 (the W4A16 kernels take 16-bit activations), to within its rounding. pdl=True: on an sm_90 GPU every
    Triton kernel of the step waits for its predecessor through programmatic dependent launch (a missing wait
    would read stale activations); elsewhere the flag is ignored."""
    cuda = DEV == "cuda"
    model = _model(bias=True, dtype=torch.float16 if cuda else torch.float32)
    tol = 2e-2 if cuda else 1e-4
    qfn = lambda lin: QuantLinear.from_float(lin, group_size=32, sym=True)  # noqa: E731
    dec = StaticDecoder(model, 12, fuse=True, linear_fn=qfn, pdl=pdl)
    qmodel = copy.deepcopy(model)
    for block in qmodel.layers:
        for parent in (block.self_attn, block.mlp):
            for name, child in list(parent.named_children()):
                setattr(parent, name, qfn(child))
    ids = torch.tensor([[9, 3, 44]], device=DEV)
    want = _reference(qmodel, ids, [11, 70])
    got = [dec.prefill(ids).clone(), dec.step(11).clone(), dec.step(70).clone()]
    for g, w in zip(got, want):
        assert _rel(g, w) < tol
    with pytest.raises(ValueError, match="fuse=True"):
        StaticDecoder(qmodel, 12, fuse=True)


@torch.no_grad()
def test_accumulate_equals_the_plain_step():
    """accumulate=True: each QuantLinear adds into a float32 per-layer output (on a GPU the red.add ring kernel,
    kernels.w4a16.w4a16_addmm_; on the CPU forward's output added) and the step's kernels read the sums rounded to
    the model's dtype: the same logits as the plain fused step (on a GPU to within the summation order's rounding),
    over a prompt and two steps and again after the per-step zeroing."""
    cuda = DEV == "cuda"
    model = _ring_model().to(torch.float16 if cuda else torch.float32)  # no bias, G 128: the kernel path on a GPU
    qfn = lambda lin: QuantLinear.from_float(lin, group_size=128, sym=False)  # noqa: E731
    plain = StaticDecoder(model, 12, fuse=True, linear_fn=qfn, accumulate=False)
    acc = StaticDecoder(model, 12, fuse=True, linear_fn=qfn, accumulate=True, prologue=False)
    assert StaticDecoder(model, 12, fuse=True, linear_fn=qfn).accumulate == cuda  # automatic: on a GPU
    assert not StaticDecoder(model, 12).accumulate  # float linears
    ids = torch.tensor([[9, 3, 44]], device=DEV)
    want = [plain.prefill(ids).clone(), plain.step(11).clone(), plain.step(70).clone(), plain.step(5).clone()]
    got = [acc.prefill(ids).clone(), acc.step(11).clone(), acc.step(70).clone(), acc.step(5).clone()]
    for g, w in zip(got, want):
        assert _rel(g, w) < (2e-2 if cuda else 1e-6)
    with pytest.raises(ValueError, match="accumulate=True needs every block linear to be a QuantLinear"):
        StaticDecoder(model, 12, accumulate=True)
    with pytest.raises(TypeError, match="accumulate must be a bool or None"):
        StaticDecoder(model, 12, accumulate=1)


@torch.no_grad()
def test_generate_with_cuda_graph_equals_eager():
    model = _model()
    ids = torch.tensor([[4, 8, 15, 16]], device=DEV)
    eager = generate(model, ids, max_new_tokens=6)
    fast = generate(model, ids, max_new_tokens=6, cuda_graph=True)  # on the CPU: the same decoder, no graph
    assert torch.equal(eager, fast)
    sampled = [generate(model, ids, max_new_tokens=6, temperature=0.9, top_k=20, seed=s, cuda_graph=True)
               for s in (1, 1)]
    assert torch.equal(sampled[0], sampled[1])
    assert torch.equal(sampled[0], generate(model, ids, max_new_tokens=6, temperature=0.9, top_k=20, seed=1))


def test_errors():
    model = _model()
    assert unsupported(nn.Linear(2, 2), 4) is not None
    with pytest.raises(ValueError, match="max_len"):
        StaticDecoder(model, 0)
    with pytest.raises(TypeError, match="pdl must be a bool"):
        StaticDecoder(model, 4, pdl="yes")
    with pytest.raises(TypeError, match="l2_prefetch must be a bool"):
        StaticDecoder(model, 4, pdl=True, l2_prefetch=1)
    for bad in (0, 3, True, 128):
        with pytest.raises(ValueError, match="attn_splits must be"):
            StaticDecoder(model, 4, attn_splits=bad)
    dec = StaticDecoder(model, 4)
    with pytest.raises(ValueError, match=r"\(1, S0\)"):
        dec.prefill(torch.zeros(2, 3, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match="does not fit"):
        dec.prefill(torch.zeros(1, 5, dtype=torch.long, device=DEV))
    dec.prefill(torch.zeros(1, 4, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match="all used"):
        dec.step(1)
    odd = Llama(LlamaConfig(vocab_size=32, hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16))
    assert "power of two" in unsupported(odd, 8)
    with pytest.raises(ValueError, match="generate: cuda_graph"):
        generate(model, torch.zeros(2, 3, dtype=torch.long, device=DEV), max_new_tokens=2, cuda_graph=True)
    with pytest.raises(ValueError, match="tune_in_step needs a GPU decoder with accumulate"):
        StaticDecoder(model, 16).tune_in_step()  # float linears: no accumulate
    with pytest.raises(ValueError, match="attn_splits must be a power of two"):
        StaticDecoder(model, 16).set_attn_splits(3)


@torch.no_grad()
def test_prologue_equals_the_accumulating_step(monkeypatch):
    """prologue=True (accumulate's default): the RMSNorms and SiLU * up run inside the GEMVs (the ring kernel's
    prologue, w4a16_prologue) over two residual buffers, and the attention's split combine in the o GEMV: the same
    logits as accumulate with the small kernels (on the CPU the ring kernel runs under the interpreter: bitwise),
    near the plain step; each block's GEMVs take norm, attn, norm, silu prologues in that order (norm, none, norm,
    silu with the attention's own combine); with dyn (items from a counter a launch, zeroed by the step's first
    kernel) every GEMV but down takes its counter and the logits are the same up to the partials' order."""
    from flashscale.kernels import w4a16

    if DEV == "cpu":  # the ring kernel under the interpreter (QuantLinear takes it on CUDA only)
        monkeypatch.setattr(QuantLinear, "can_accumulate", lambda self, x2d: self.bias is None and bool(
            w4a16.ring_candidates(self.packed(), x2d.shape[0])))
    modes, addmm = [], w4a16.w4a16_addmm_

    def spy(out, x, p, *, prologue=None, trace=None, counter=None):
        modes.append(type(prologue).__name__ + ("+dyn" if counter is not None else ""))
        return addmm(out, x, p, prologue=prologue, trace=trace, counter=counter)

    monkeypatch.setattr(w4a16, "w4a16_addmm_", spy)
    model = _ring_model().to(torch.float16)
    qfn = lambda lin: QuantLinear.from_float(lin, group_size=128, sym=False)  # noqa: E731  ring items need G 128
    ids = torch.tensor([[9, 3, 44]], device=DEV)
    got = {}
    head = qfn(model.lm_head)  # a 4-bit lm_head: with prologue the final norm and the head are one GEMV
    for name, kw in (("plain", dict(accumulate=False)), ("acc", dict(accumulate=True, prologue=False)),
                     ("pro", dict(accumulate=True)), ("pro_head", dict(lm_head=head, accumulate=True)), ("acc_head", dict(
                         lm_head=head, accumulate=True, prologue=False)), ("pro_own_combine", dict(accumulate=True)),
                     ("pro_head_dyn", dict(lm_head=head, accumulate=True))):
        dec = StaticDecoder(model, 12, fuse=True, linear_fn=qfn, attn_splits=2, **kw)
        dec.attn_in_o = name not in ("pro_own_combine", "pro_head_dyn")  # the split combine in the o GEMV (XAttn)
        dec.dyn = name.endswith("dyn")  # items taken from a counter a launch (w4a16_ring DYN)
        assert dec.prologue == name.startswith("pro") and dec.trigger == dec.prologue  # automatic trigger
        got[name] = [dec.prefill(ids).clone(), dec.step(11).clone(), dec.step(70).clone()]
        if name == "pro_head":
            assert modes[-9:] == ["XNorm", "XAttn", "XNorm", "XSiLU"] * 2 + ["XNorm"]
        if name == "pro":
            assert modes[-8:] == ["XNorm", "XAttn", "XNorm", "XSiLU"] * 2
        if name == "pro_own_combine":
            assert modes[-8:] == ["XNorm", "NoneType", "XNorm", "XSiLU"] * 2
        if name == "pro_head_dyn":
            assert modes[-9:] == ["XNorm+dyn", "NoneType+dyn", "XNorm+dyn", "XSiLU"] * 2 + ["XNorm+dyn"]
    for a, b, tol in (("pro", "acc", 1e-7), ("pro_head", "acc_head", 1e-3), ("pro_own_combine", "acc", 1e-7),
                      ("pro_head_dyn", "pro_head", 1e-5)):  # dyn: the same items, partials summed in another order
        for x, y in zip(got[a], got[b]):
            assert _rel(x, y) < (1e-2 if DEV == "cuda" else tol)  # GPU: the red.adds' order
    for pro, plain in zip(got["pro"], got["plain"]):
        assert _rel(pro, plain) < 2e-2
    with pytest.raises(ValueError, match="prologue=True .* needs accumulate"):
        StaticDecoder(model, 12, fuse=True, linear_fn=qfn, accumulate=False, prologue=True)
    with pytest.raises(TypeError, match="prologue must be a bool or None"):
        StaticDecoder(model, 12, prologue="yes")


@pytest.mark.gpu
@torch.no_grad()
def test_capture_replays_the_same_steps():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = _model().to(torch.bfloat16)
    ids = torch.tensor([[5, 17, 33]], device=DEV)
    plain, graphed = StaticDecoder(model, 16), StaticDecoder(model, 16)
    a = [plain.prefill(ids).clone()] + [plain.step(t).clone() for t in (7, 8, 9)]
    graphed.prefill(ids)
    graphed.capture()
    b = [graphed.logits.clone()] + [graphed.step(t).clone() for t in (7, 8, 9)]
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("l2_prefetch,accumulate,prologue,trigger,pre_l2,splits,dyn", [
    (False, False, False, False, 0, None, False), (True, False, False, False, 0, None, False),
    (False, True, False, False, 0, None, False), (False, True, True, False, 0, None, False),
    (False, True, True, True, 0, None, False), (False, True, False, True, 0, None, False),
    (False, True, True, True, 4, None, False), (False, True, True, True, 0, 4, False),
    (False, False, False, False, 0, 4, False), (False, True, True, True, 0, None, True),
    (False, True, False, False, 0, None, True)])
@torch.no_grad()
def test_capture_with_pdl_replays_the_eager_steps(l2_prefetch, accumulate, prologue, trigger, pre_l2, splits, dyn):
    """The CUDA graph of a step whose kernels launch with programmatic dependent launch (kernels.pdl) gives the
    eager plain-launch logits, 4-bit linears included (the W4A16 GEMVs wait too, after their L2 prefetch; with
    accumulate, the ring kernel's red.adds after its weight loads: the same logits up to their summation order;
    with prologue, the norms and SiLU in the GEMVs; with trigger, each ring GEMV lets the next kernel in early;
    with context splits and prologue, the attention's split combine in the o GEMV; with dyn, the GEMVs' items taken
    from counters that the step's first kernel zeroes: replays must zero them again)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs an sm_90 GPU")
    model = (_ring_model() if accumulate else _model()).to(torch.bfloat16)  # accumulate: G 128, the ring's
    qfn = lambda lin: QuantLinear.from_float(lin, group_size=128 if accumulate else 32, sym=True)  # noqa: E731
    ids = torch.tensor([[5, 17, 33]], device=DEV)
    plain = StaticDecoder(model, 16, fuse=True, linear_fn=qfn, accumulate=False)
    graphed = StaticDecoder(model, 16, fuse=True, linear_fn=qfn, pdl=True, l2_prefetch=l2_prefetch,
                            accumulate=accumulate, prologue=prologue, trigger=trigger, attn_splits=splits)
    graphed.pre_l2 = pre_l2  # items past the ring asked of L2 before each ring GEMV's wait
    graphed.attn_in_o = splits is not None  # the o GEMV combines the attention's split partials (XAttn)
    graphed.dyn = dyn
    a = [plain.prefill(ids).clone()] + [plain.step(t).clone() for t in (7, 8, 9)]
    graphed.prefill(ids)
    graphed.capture()
    b = [graphed.logits.clone()] + [graphed.step(t).clone() for t in (7, 8, 9)]
    for x, y in zip(a, b):
        assert _rel(y, x) < 1e-2  # the GEMVs' split-K may add in another order; a stale read is far off


@pytest.mark.parametrize("case", ["random", "ties", "all_inf_but_one", "nan", "negative"])
def test_step_end_argmax_equals_torch(case):
    """step_end_kernel (the step's last kernel): tok <- the first index of the largest logit over several programs
    (torch.argmax's answer, NaN counted as the largest), pos += 1, its scratch left as found."""
    from flashscale.kernels.decode import step_end_kernel
    gen = torch.Generator().manual_seed(5)
    v = 1000
    lg = torch.randn(1, v, generator=gen)
    if case == "ties":
        lg[0, 900] = lg[0, 17] = lg[0, 333] = 50.0
    elif case == "all_inf_but_one":
        lg.fill_(-float("inf"))
        lg[0, 999] = -1e30
    elif case == "nan":
        lg[0, 600] = float("nan")
        lg[0, 10] = float("inf")
    elif case == "negative":
        lg = -torch.rand(1, v, generator=gen) - 1.0
    lg = lg.to(DEV)
    tok, pos = torch.zeros(1, dtype=torch.long, device=DEV), torch.full((1,), 7, dtype=torch.long, device=DEV)
    best = torch.full((1,), -2 ** 63, dtype=torch.int64, device=DEV)
    cnt = torch.zeros(1, dtype=torch.int32, device=DEV)
    step_end_kernel[(-(-v // 128),)](lg, tok, pos, best, cnt, v, BLOCK=128, GREEDY=True)
    assert tok.item() == lg.argmax(-1).item()
    assert pos.item() == 8 and best.item() == -2 ** 63 and cnt.item() == 0
    step_end_kernel[(1,)](lg, tok, pos, best, cnt, v, BLOCK=128, GREEDY=False)
    assert pos.item() == 9 and tok.item() == lg.argmax(-1).item()


@torch.no_grad()
def test_glue_kernels_equal_torch_ops_and_greedy_steps_take_the_argmax():
    """The step's own first and last kernels (embedding, zeroed sums; argmax, pos + 1) give torch's ops' logits
    bitwise, and greedy steps feed each argmax back as the next token."""
    model = _ring_model().to(torch.float16) if DEV == "cuda" else _ring_model()
    qfn = lambda lin: QuantLinear.from_float(lin, group_size=128, sym=True)  # noqa: E731
    decs = [StaticDecoder(model, 16, fuse=True, linear_fn=qfn, accumulate=True) for _ in range(2)]
    decs[1].glue = False
    outs = [[d.step(t).clone() for t in (5, 17, 33)] for d in decs]
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    for d in decs:
        d.greedy = True
    got = [d.step().clone() for d in decs]  # token 33 again at position 3, then tok <- argmax
    assert torch.equal(got[0], got[1])
    assert decs[0].tok.item() == decs[1].tok.item() == got[0].argmax(-1).item()
    assert decs[0].pos.item() == decs[1].pos.item() == 4


@pytest.mark.gpu
@torch.no_grad()
def test_tune_in_step_pins_configs_and_keeps_the_step():
    """tune_in_step (the accumulating GEMVs' configs by the whole step's time) pins one config per ring-add key, leaves
    the decoder where it was (tok, pos, length; no graph), and the step after it gives the same logits as before it
    (up to the red.adds' order)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs an sm_90 GPU")
    from flashscale.kernels import w4a16

    model = _ring_model().to(torch.bfloat16)
    qfn = lambda lin: QuantLinear.from_float(lin, group_size=128, sym=True)  # noqa: E731
    dec = StaticDecoder(model, 32, fuse=True, linear_fn=qfn, lm_head=qfn(model.lm_head))
    ids = torch.tensor([[5, 17, 33]], device=DEV)
    before = dec.prefill(ids).clone()
    pos, length = dec.pos.clone(), dec.length
    chosen = dec.tune_in_step(replays=4)
    assert chosen and all(k.startswith("ring-add") for k in chosen)
    assert set(chosen) <= {"|".join(map(str, k)) for k in w4a16.ring_add_choices()}
    assert torch.equal(dec.pos, pos) and dec.length == length and dec.graph is None
    assert torch.equal(dec.logits, before)
    a = dec.step(7).clone()
    ref = StaticDecoder(model, 32, fuse=True, linear_fn=qfn, lm_head=qfn(model.lm_head))
    ref.prefill(ids)
    assert _rel(a, ref.step(7)) < 1e-2
    with pytest.raises(ValueError, match="too short"):
        dec.tune_in_step(replays=40)
