"""The Llama model against HF transformers' LlamaForCausalLM (float32)."""

import pytest
import torch

from flashscale.models import KVCache, Llama, preset

transformers = pytest.importorskip("transformers")

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _hf_model(cfg):
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg.to_hf_dict()))
    return hf.eval()


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("extra", [{}, {"rope_scaling": LLAMA3_SCALING, "attention_bias": True, "mlp_bias": True}])
def test_logits_match_transformers(tie, extra):
    cfg = preset("tiny", tie_word_embeddings=tie, **extra)
    ours = Llama(cfg).init_weights(seed=1).eval()
    hf = _hf_model(cfg)
    sd = {k if k == "lm_head.weight" else f"model.{k}": v for k, v in ours.state_dict().items()}
    hf.load_state_dict(sd, strict=True)
    x = torch.randint(0, cfg.vocab_size, (2, 37))
    with torch.no_grad():
        a, b = ours(x), hf(x).logits
    assert ((a - b).norm() / b.norm()).item() < 1e-5


def test_kv_cache_decode_equals_full_forward():
    cfg = preset("tiny")
    m = Llama(cfg).init_weights(seed=2).eval()
    x = torch.randint(0, cfg.vocab_size, (3, 20))
    with torch.no_grad():
        full = m(x)
        cache = KVCache.empty(cfg, 3, 32)
        parts = [m(x[:, :13], cache=cache)] + [m(x[:, i:i + 1], cache=cache) for i in range(13, 20)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)


def test_cache_overflow_is_a_clear_error():
    cfg = preset("tiny")
    m = Llama(cfg).eval()
    cache = KVCache.empty(cfg, 1, 4)
    with pytest.raises(ValueError, match="KV cache holds 4 tokens"):
        m(torch.zeros(1, 5, dtype=torch.long), cache=cache)


def test_param_count_formula():
    for name in ("tiny", "demo"):
        for tie in (False, True):
            cfg = preset(name, tie_word_embeddings=tie, attention_bias=True)
            assert cfg.num_params() == sum(p.numel() for p in Llama(cfg).parameters())


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown model preset 'nope'"):
        preset("nope")
