"""Perplexity (non-overlapping windows) and the unigram baseline."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flashscale.models.config import preset
from flashscale.models.llama import Llama
from flashscale.train.evaluate import perplexity, unigram_perplexity


@pytest.fixture(scope="module")
def model():
    return Llama(preset("tiny", max_position_embeddings=64)).init_weights(seed=0)


def _direct(model, ids, window):
    """Window by window, one at a time, through the model's full logits."""
    total, count = 0.0, 0
    for lo in range(0, len(ids), window):
        w = ids[lo: lo + window]
        if len(w) < 2:
            continue
        logits = model(w[None, :-1])[0].double()  # (len-1, V)
        total += F.cross_entropy(logits, w[1:], reduction="sum").item()
        count += len(w) - 1
    return math.exp(total / count), total / count, count


class Wrapped(nn.Module):
    """Not a flashscale Llama: exercises the generic logits path."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("n, window, batch", [(87, 16, 2), (64, 16, 8), (65, 16, 3), (10, 64, 4)])
def test_perplexity_equals_direct_computation(model, n, window, batch):
    ids = torch.randint(0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n))
    with torch.no_grad():
        ppl, nll, count = _direct(model, ids, window)
    res = perplexity(model, ids, window=window, batch_size=batch)
    assert res["tokens"] == count == n - math.ceil(n / window)  # every window loses its first token
    # Windows: every full one, plus the tail if it holds a target (87 = 5*16 + 7; 65 has a 1-token tail).
    assert res["windows"] == n // window + (n % window >= 2)
    assert res["nll"] == pytest.approx(nll, rel=1e-5) and res["ppl"] == pytest.approx(ppl, rel=1e-5)
    generic = perplexity(Wrapped(model), ids.numpy(), window=window, batch_size=batch)
    strided = perplexity(model, torch.stack([ids, ids], 1)[:, 0], window=window, batch_size=batch)
    assert strided == res  # a non-contiguous view gives the same windows
    assert generic["nll"] == pytest.approx(res["nll"], rel=1e-6) and generic["tokens"] == res["tokens"]


def test_perplexity_sees_no_context_across_windows(model):
    """Each window is scored on its own: scoring [a | b] in windows of len(a) equals a and b apart."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(0, 512, (40,), generator=g), torch.randint(0, 512, (40,), generator=g)
    both = perplexity(model, torch.cat([a, b]), window=40)
    ra, rb = perplexity(model, a, window=40), perplexity(model, b, window=40)
    assert both["nll"] * 78 == pytest.approx(ra["nll"] * 39 + rb["nll"] * 39, rel=1e-6)
    longer = perplexity(model, torch.cat([a, b]), window=64)  # different windows: different context
    assert longer["tokens"] == 78 and longer["nll"] != pytest.approx(both["nll"], rel=1e-6)


def test_perplexity_mode_and_grad(model):
    model.train()
    ids = torch.arange(100) % 512
    res = perplexity(model, ids, window=16)
    assert model.training  # restored
    assert math.isfinite(res["ppl"]) and res["ppl"] > 1
    model.eval()
    assert perplexity(model, ids, window=16) == res  # deterministic, and mode did not change the result


def test_perplexity_bad_args(model):
    ids = torch.arange(50)
    with pytest.raises(ValueError, match="window"):
        perplexity(model, ids, window=1)
    with pytest.raises(TypeError, match="window"):
        perplexity(model, ids, window=16.0)
    with pytest.raises(ValueError, match="batch_size"):
        perplexity(model, ids, window=16, batch_size=0)
    with pytest.raises(ValueError, match="token_ids"):
        perplexity(model, ids.view(5, 10), window=16)
    with pytest.raises(ValueError, match="token_ids"):
        perplexity(model, ids.float(), window=16)
    with pytest.raises(ValueError, match="token_ids"):
        perplexity(model, ids[:1], window=16)
    with pytest.raises(TypeError, match="token_ids"):
        perplexity(model, [1, 2, 3], window=16)
    with pytest.raises(ValueError, match=r"token_ids.*\[0, 512\).*\[0, 512\]"):
        perplexity(model, torch.tensor([0, 5, 512]), window=16)
    with pytest.raises(ValueError, match="token_ids"):
        perplexity(model, torch.tensor([3, -1]), window=16)
    with pytest.raises(TypeError, match="model"):
        perplexity(lambda x: x, ids, window=16)


def test_unigram_baseline_formula():
    # V = 4, train counts [2, 1, 1, 0] -> add-one: [3, 2, 2, 1] / (4 + 4)
    train, ev = np.array([0, 0, 1, 2]), np.array([0, 3, 3, 1])
    expected = math.exp(-(math.log(3 / 8) + 2 * math.log(1 / 8) + math.log(2 / 8)) / 4)
    assert unigram_perplexity(train, ev, 4) == pytest.approx(expected, rel=1e-12)
    assert unigram_perplexity(torch.tensor(train), torch.tensor(ev), 4) == pytest.approx(expected, rel=1e-12)
    # Tokens never seen in training get (0 + 1) / (N + V): here 1 / 1001 each.
    assert unigram_perplexity(np.array([5]), np.array([0, 1, 2]), 1000) == pytest.approx(1001, rel=1e-12)
    # uint16 memmap-like inputs work
    assert unigram_perplexity(train.astype(np.uint16), ev.astype(np.uint16), 4) == pytest.approx(expected)


def test_unigram_bad_args():
    with pytest.raises(ValueError, match=r"eval_tokens.*\[0, vocab_size=4\).*\[4, 4\]"):
        unigram_perplexity(np.array([0, 1]), np.array([4]), 4)
    with pytest.raises(ValueError, match="train_tokens"):
        unigram_perplexity(np.array([], dtype=np.int64), np.array([1]), 4)
    with pytest.raises(ValueError, match="train_tokens"):
        unigram_perplexity(np.array([0.5]), np.array([1]), 4)
    with pytest.raises(ValueError, match="vocab_size"):
        unigram_perplexity(np.array([0]), np.array([0]), 0)
