"""Perplexity, by the protocol of the GPTQ/AWQ papers, and the unigram baseline it is judged against.

perplexity(): the evaluation text is tokenized once and cut into non-overlapping windows of `window`
tokens; each window is scored on its own (no context carried across windows), every token after the
first of a window being a target. Unlike GPTQ's script, the last partial window is scored too, so
every token of the text but the window heads counts. ppl = exp(total NLL / scored tokens).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Rows of logits computed at once on the hidden-state path: bounds the (rows, V) float32 temporary
# to ~256 MB even for a 128k vocabulary and 8 x 2048-token batches.
_LOGIT_ELEMENTS = 1 << 26


def _as_long_1d(name: str, ids) -> torch.Tensor:
    if isinstance(ids, np.ndarray):
        ids = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name}: takes a 1-D LongTensor (or numpy array), got {type(ids).__name__}")
    if ids.ndim != 1 or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"{name}: takes a 1-D integer tensor, got {ids.dtype} of shape {tuple(ids.shape)}")
    return ids.long()


def _int_arg(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: takes an int, got {type(value).__name__} {value!r}")
    if value < lo:
        raise ValueError(f"{name}: takes an int >= {lo}, got {value}")
    return value


def _model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    if p is None:
        p = next(model.buffers(), None)
    return p.device if p is not None else torch.device("cpu")


def _batch_nll_sum(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Sum of next-token NLL over a batch of windows x (B, S): targets x[:, 1:]. float64 scalar."""
    inputs, targets = x[:, :-1], x[:, 1:]  # (B, S-1) each
    # Our Llama: run the trunk once, then the vocabulary projection in row chunks, so the (B, S, V)
    # logits tensor never exists whole (it is 3.2 GB at B=8, S=2048, V=49k).
    from flashscale.models.llama import Llama

    if isinstance(model, Llama):
        h = model(inputs, hidden_only=True)  # (B, S-1, E)
        h, t = h.reshape(-1, h.shape[-1]), targets.reshape(-1)  # (B*(S-1), E), (B*(S-1),)
        rows = max(1, _LOGIT_ELEMENTS // model.config.vocab_size)
        total = torch.zeros((), dtype=torch.float64, device=x.device)
        for lo in range(0, h.shape[0], rows):
            logits = model.lm_head(h[lo: lo + rows]).float()  # (rows, V), as Llama.forward computes them
            total += F.cross_entropy(logits, t[lo: lo + rows], reduction="sum").double()
        return total
    out = model(inputs)
    logits = out if isinstance(out, torch.Tensor) else out.logits  # HF models return an output object
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           reduction="sum").double()


@torch.no_grad()
def perplexity(model: nn.Module, token_ids: torch.Tensor, *, window: int, batch_size: int = 8,
               device=None, progress: bool = False) -> dict:
    """Perplexity of model on token_ids (1-D) in non-overlapping windows of `window` tokens.
    Returns {"ppl": float, "nll": mean NLL in nats per scored token, "tokens": scored tokens,
    "windows": windows scored}. The model is put in eval mode (and its mode restored afterwards)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: takes a torch.nn.Module, got {type(model).__name__}")
    ids = _as_long_1d("token_ids", token_ids)
    window = _int_arg("window", window, 2)
    batch_size = _int_arg("batch_size", batch_size, 1)
    if ids.numel() < 2:
        raise ValueError(f"token_ids: takes >= 2 tokens (one input, one target), got {ids.numel()}")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    lo_id, hi_id = int(ids.min()), int(ids.max())
    if lo_id < 0 or (isinstance(vocab, int) and hi_id >= vocab):  # else: an index error deep in a kernel
        raise ValueError(f"token_ids: ids must lie in [0, {vocab}) (the model's vocab_size), "
                         f"got [{lo_id}, {hi_id}]")
    device = torch.device(device) if device is not None else _model_device(model)

    n = ids.numel()
    n_full = n // window
    tail = n - n_full * window  # a tail of 1 token has no target: nothing to score
    batches = [(lo, min(lo + batch_size, n_full)) for lo in range(0, n_full, batch_size)]
    full = ids[: n_full * window].reshape(n_full, window)  # (W, window)

    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device: no sync a batch
    scored = 0
    bar = None
    if progress:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("perplexity", total=n_full + (tail >= 2))
    try:
        for lo, hi in batches:
            x = full[lo:hi].to(device, non_blocking=True)  # (b, window)
            total += _batch_nll_sum(model, x)
            scored += (hi - lo) * (window - 1)
            if bar is not None:
                bar.advance(task, hi - lo)
        if tail >= 2:
            x = ids[n_full * window:][None].to(device)  # (1, tail)
            total += _batch_nll_sum(model, x)
            scored += tail - 1
            if bar is not None:
                bar.advance(task, 1)
    finally:
        if bar is not None:
            bar.stop()
        model.train(was_training)
    nll = float(total) / scored
    ppl = math.exp(nll) if nll < 700 else math.inf  # exp overflows a float past ~709
    return {"ppl": ppl, "nll": nll, "tokens": scored, "windows": n_full + (tail >= 2)}


def unigram_perplexity(train_tokens, eval_tokens, vocab_size: int) -> float:
    """Perplexity on eval_tokens of the add-one (Laplace) smoothed unigram model fit on train_tokens:
    p(v) = (count_train(v) + 1) / (len(train) + vocab_size). The floor a language model must beat by
    far to show it learnt more than token frequencies."""
    vocab_size = _int_arg("vocab_size", vocab_size, 1)
    arrays = []
    for name, t in (("train_tokens", train_tokens), ("eval_tokens", eval_tokens)):
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name}: takes a 1-D integer array, got {a.dtype} of shape {a.shape}")
        if a.size == 0:
            raise ValueError(f"{name}: takes a non-empty array, got 0 tokens")
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name}: ids must lie in [0, vocab_size={vocab_size}), got [{lo}, {hi}]")
        arrays.append(a)
    train, ev = arrays
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64)  # (V,)
    log_p = np.log(counts + 1.0) - math.log(train.size + vocab_size)  # (V,)
    return math.exp(-float(log_p[ev].mean()))
