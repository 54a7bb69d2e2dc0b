"""generate(): greedy equals a cache-free argmax loop and transformers; EOS per sequence; sampling
follows the filtered softmax and is reproducible from a seed."""

import pytest
import torch

from flashscale.infer.generate import filter_logits, generate
from flashscale.models import Llama, preset


@pytest.fixture(scope="module")
def model():
    return Llama(preset("tiny")).init_weights(seed=7).eval()


def _prompt(b=2, s=5, seed=0):
    return torch.randint(3, 512, (b, s), generator=torch.Generator().manual_seed(seed))


def test_greedy_equals_full_forward_argmax(model):
    x = _prompt()
    out = generate(model, x, max_new_tokens=12)
    assert out.shape == (2, 17) and torch.equal(out[:, :5], x)
    seq = x
    with torch.no_grad():
        for _ in range(12):  # no cache: the whole sequence every step
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


def test_greedy_equals_transformers(model):
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**model.config.to_hf_dict())).eval()
    sd = {k if k == "lm_head.weight" else f"model.{k}": v for k, v in model.state_dict().items()}
    hf.load_state_dict(sd)
    x = _prompt(1, 6, seed=3)
    ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=15, do_sample=False,
                      eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(model, x, max_new_tokens=15), ref)


def test_eos_stops_each_sequence(model):
    x = _prompt(3, 4, seed=1)
    free = generate(model, x, max_new_tokens=10)
    eos = int(free[0, 4 + 2])  # what sequence 0 produces at its third step
    out = generate(model, x, max_new_tokens=10, eos_token_id=eos)
    for b in range(3):
        hits = (free[b, 4:] == eos).nonzero()
        stop = int(hits[0]) if len(hits) else None
        if stop is None:
            assert torch.equal(out[b, : free.shape[1]], free[b])
        else:  # identical up to and including EOS, then padded with EOS
            assert torch.equal(out[b, : 4 + stop + 1], free[b, : 4 + stop + 1])
            assert (out[b, 4 + stop:] == eos).all()
    if all((free[b, 4:] == eos).any() for b in range(3)):
        assert out.shape[1] < free.shape[1]  # everyone finished: stopped early
    ids = [int(free[0, 4 + 4]), eos]  # a list of EOS ids: stops at the first of either
    first = min(i for i in range(10) if int(free[0, 4 + i]) in ids)
    single = generate(model, x[:1], max_new_tokens=10, eos_token_id=ids)
    assert torch.equal(single[0], free[0, : 4 + first + 1])


def test_sampling_is_seeded_and_leaves_global_rng_alone(model):
    x = _prompt()
    state = torch.get_rng_state()
    a = generate(model, x, max_new_tokens=8, temperature=1.0, seed=123)
    assert torch.equal(torch.get_rng_state(), state)
    b = generate(model, x, max_new_tokens=8, temperature=1.0, seed=123)
    c = generate(model, x, max_new_tokens=8, temperature=1.0, seed=124)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_top_k_one_and_tiny_top_p_are_greedy(model):
    x = _prompt()
    greedy = generate(model, x, max_new_tokens=6)
    assert torch.equal(generate(model, x, max_new_tokens=6, temperature=5.0, top_k=1, seed=0), greedy)
    assert torch.equal(generate(model, x, max_new_tokens=6, temperature=5.0, top_p=1e-6, seed=0), greedy)


def test_first_draw_follows_the_filtered_softmax(model):
    """2000 draws of the first token from one prompt: frequencies match softmax(logits / T), and only
    the top-k tokens ever appear."""
    n, temperature = 2000, 1.5
    x = _prompt(1, 3).expand(n, 3).contiguous()
    with torch.no_grad():
        p = (model(x[:1])[0, -1] / temperature).softmax(-1)
    drawn = generate(model, x, max_new_tokens=1, temperature=temperature, seed=0)[:, -1]
    freq = torch.bincount(drawn, minlength=p.numel()).float() / n
    assert (freq - p).abs().max() < 4 * (p.max() * (1 - p.max()) / n) ** 0.5 + 1e-3
    drawn_k = generate(model, x, max_new_tokens=1, temperature=temperature, top_k=5, seed=1)[:, -1]
    top5 = set(p.topk(5).indices.tolist())
    assert set(drawn_k.tolist()) <= top5 and len(set(drawn_k.tolist())) > 1


def test_filter_logits():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    ninf = float("-inf")
    assert filter_logits(logits, top_k=2)[0, 2:].eq(ninf).all()
    kept = filter_logits(logits, top_p=0.7)  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: keep two
    assert torch.isfinite(kept[0, :2]).all() and kept[0, 2:].eq(ninf).all()
    kept = filter_logits(logits, top_p=0.8)  # 0.8 reached exactly by two tokens
    assert torch.isfinite(kept[0]).sum() == 2
    assert torch.isfinite(filter_logits(logits, top_p=0.81)[0]).sum() == 3
    assert torch.isfinite(filter_logits(logits, top_p=0.01)[0]).sum() == 1


def test_zero_new_tokens_and_validation(model):
    x = _prompt()
    assert torch.equal(generate(model, x, max_new_tokens=0), x)
    bad = [
        (dict(input_ids=x.float()), TypeError, "2-D LongTensor"),
        (dict(input_ids=x[0]), TypeError, "2-D LongTensor"),
        (dict(input_ids=x[:, :0]), ValueError, "at least one token"),
        (dict(input_ids=x + 1000), ValueError, r"vocabulary is \[0, 512\)"),
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens"),
        (dict(temperature=-0.5), ValueError, "temperature"),
        (dict(temperature=float("nan")), ValueError, "temperature"),
        (dict(top_k=0), ValueError, "top_k"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(eos_token_id=512), ValueError, "eos_token_id"),
    ]
    for kw, exc, msg in bad:
        args = {"input_ids": x, "max_new_tokens": 2, **kw}
        with pytest.raises(exc, match=msg):
            generate(model, args.pop("input_ids"), **args)
    with pytest.raises(TypeError, match="flashscale Llama"):
        generate(torch.nn.Linear(2, 2), x, max_new_tokens=1)
