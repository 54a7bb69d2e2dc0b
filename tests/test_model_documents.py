"""Document masking in the Llama (Megatron's reset_attention_mask + reset_position_ids): attention within the
documents a row holds (cut after each eos token), RoPE positions restarting in each, through ops.attention's
varlen layout. Checked against running every document as its own sequence (float32, the CPU reference path; the
GPU kernels in tests/kernels/test_attention_gpu.py), and in training against the same single-device engine."""

import pytest
import torch

from flashscale.models import Llama, preset
from flashscale.models.llama import document_spans

EOS = 3


def test_document_spans_cut_after_every_eos_and_at_row_ends():
    ids = torch.tensor([[5, EOS, 7, 8], [EOS, 1, 2, EOS], [4, 4, 4, 4]])
    cu, pos = document_spans(ids, EOS)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 2, 4, 5, 8, 12]
    assert pos.tolist() == [[0, 1, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3]]
    with pytest.raises(ValueError, match="input_ids must be"):
        document_spans(ids.float(), EOS)
    with pytest.raises(ValueError, match="eos_id"):
        document_spans(ids, -1)


def _model(**kw):
    cfg = preset("tiny", eos_token_id=EOS, num_attention_heads=4, num_key_value_heads=2, **kw)
    return Llama(cfg).init_weights(seed=3).eval()


def _docs_of(row: torch.Tensor) -> list[torch.Tensor]:
    cut = [i + 1 for i, t in enumerate(row.tolist()) if t == EOS and i + 1 < len(row)]
    return list(torch.tensor_split(row, cut))


def test_masked_logits_equal_each_document_alone():
    m = _model()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(4, m.config.vocab_size, (3, 29), generator=g)
    x[0, [4, 5, 17]] = EOS  # a one-token document (5), documents of 5, 12 and 11 tokens
    x[1, -1] = EOS  # an eos closing the row
    m.document_masking = True
    with torch.no_grad():
        masked = m(x)
        alone = torch.cat([torch.cat([m(d[None])[0] for d in _docs_of(row)]) for row in x])
        m.document_masking = False
        plain = m(x)
    torch.testing.assert_close(masked.reshape(-1, masked.shape[-1]), alone, rtol=1e-5, atol=1e-5)
    assert torch.equal(masked[2], plain[2]) or torch.allclose(masked[2], plain[2], atol=1e-6)  # row 2: one document
    assert not torch.allclose(masked[0, 6:], plain[0, 6:], atol=1e-3)  # and the mask does change row 0


@pytest.mark.parametrize("mode", ["none", "full", "attention"])
def test_gradients_through_checkpointing_modes(mode):
    m = _model()
    m.document_masking = True
    x = torch.randint(4, m.config.vocab_size, (2, 16))
    x[:, 7] = EOS
    ref = Llama(m.config).init_weights(seed=3)
    ref.document_masking = True
    m.train().activation_checkpointing = mode
    ref.train()
    ga = torch.autograd.grad(m(x).square().mean(), list(m.parameters()))
    gb = torch.autograd.grad(ref(x).square().mean(), list(ref.parameters()))
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_errors_name_what_is_missing():
    m = _model()
    m.document_masking = True
    from flashscale.models import KVCache
    cache = KVCache.empty(m.config, 1, 8)
    cu, _ = document_spans(torch.zeros(1, 4, dtype=torch.long), EOS)
    with pytest.raises(ValueError, match="not with a KV cache"):
        m(torch.zeros(1, 4, dtype=torch.long), cache=cache, cu_seqlens=cu)
    bare = Llama(preset("tiny")).eval()
    bare.document_masking = True
    if bare.config.eos_token_id is None:
        with pytest.raises(ValueError, match="eos_token_id"):
            bare(torch.zeros(1, 4, dtype=torch.long))


def test_trainer_config_turns_it_on(tmp_path):
    from flashscale.train.engine import OptimConfig, SingleDeviceEngine

    m = _model()
    m.document_masking = True
    x = torch.randint(4, m.config.vocab_size, (4, 12))
    x[:, 5] = EOS
    eng = SingleDeviceEngine(m, OptimConfig())
    loss = float(eng.eval_loss(x, x))
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten())
    assert abs(loss - float(want)) < 1e-5
    m.document_masking = False
    assert abs(float(eng.eval_loss(x, x)) - loss) > 1e-4  # the engine did mask
