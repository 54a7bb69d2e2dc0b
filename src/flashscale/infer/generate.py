"""Autoregressive generation with the model's contiguous KV cache: one prefill over the prompt, then one
token per step. Greedy (temperature 0) or sampling with temperature / top-k / top-p, reproducible from a
seed through a private torch.Generator (the global RNG is left alone).

Shapes: B batch, S0 prompt length, V vocab.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from flashscale.models.llama import KVCache, Llama


def _check(input_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id, vocab: int) -> list[int]:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise TypeError(f"input_ids must be a 2-D LongTensor (B, S0), got "
                        f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} "
                        f"of shape {tuple(getattr(input_ids, 'shape', ()))}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must hold at least one token per sequence, got shape {tuple(input_ids.shape)}")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"input_ids holds ids in [{lo}, {hi}]; the model's vocabulary is [0, {vocab})")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if any(not isinstance(e, int) or isinstance(e, bool) or not 0 <= e < vocab for e in eos):
        raise ValueError(f"eos_token_id must be None, an id or a list of ids in [0, {vocab}), got {eos_token_id!r}")
    return eos


def filter_logits(logits: torch.Tensor, *, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """logits (B, V) with everything outside the top-k and outside the top-p nucleus set to -inf.

    The nucleus is the smallest set of most likely tokens whose probability reaches top_p (the token
    that crosses top_p is kept, so at least one token survives), as in Holtzman et al. and HF."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, *, temperature: float, top_k: int | None, top_p: float | None,
                generator: torch.Generator | None) -> torch.Tensor:
    """(B,) next token ids from float32 logits (B, V): argmax at temperature 0, else a draw."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model: Llama, input_ids: torch.Tensor, *, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None,
             eos_token_id: int | Sequence[int] | None = None, seed: int | None = None,
             cuda_graph: bool = False) -> torch.Tensor:
    """Continues each prompt of input_ids (B, S0); returns (B, S0 + n), n <= max_new_tokens.

    A sequence that produced an EOS id keeps it and is padded with eos_token_id (the first, if a list)
    afterwards, as transformers does; generation stops early once every sequence has finished.
    temperature 0 is greedy (top_k/top_p then have no effect). seed: the draws are reproducible.
    cuda_graph (batch 1): decode through flashscale.infer.decode.StaticDecoder, one CUDA graph replay a token on
    a GPU (the same decoder, eagerly, on the CPU); the same tokens as the default path up to rounding.
    """
    if not isinstance(model, Llama):
        raise TypeError(f"model must be a flashscale Llama, got {type(model).__name__}")
    config = model.config
    eos = _check(input_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id, config.vocab_size)
    if cuda_graph:
        return _generate_static(model, input_ids, max_new_tokens, temperature, top_k, top_p, eos, seed)
    weight = model.embed_tokens.weight
    input_ids = input_ids.to(weight.device)
    if max_new_tokens == 0:
        return input_ids.clone()
    B, S0 = input_ids.shape
    generator = None
    if seed is not None and temperature > 0:
        generator = torch.Generator(device=weight.device).manual_seed(seed)
    eos_t = torch.tensor(eos, device=weight.device, dtype=torch.long)

    # The last new token is never fed back, so the cache needs S0 + max_new_tokens - 1 positions.
    cache = KVCache.empty(config, B, S0 + max_new_tokens - 1, device=weight.device, dtype=weight.dtype)
    logits = model(input_ids, cache=cache)[:, -1]  # (B, V) float32
    finished = torch.zeros(B, dtype=torch.bool, device=weight.device)
    out = [input_ids]
    for step in range(max_new_tokens):
        token = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)  # (B,)
        if eos:
            token = torch.where(finished, eos_t[0], token)
            finished |= torch.isin(token, eos_t)
        out.append(token[:, None])
        if step == max_new_tokens - 1 or (eos and bool(finished.all())):
            break
        logits = model(token[:, None], cache=cache)[:, -1]
    return torch.cat(out, dim=1)


def _generate_static(model: Llama, input_ids: torch.Tensor, max_new_tokens: int, temperature: float,
                     top_k: int | None, top_p: float | None, eos: list[int], seed: int | None) -> torch.Tensor:
    """generate(cuda_graph=True): prefill by Llama.forward, then StaticDecoder steps (graph replays on CUDA)."""
    from flashscale.infer.decode import StaticDecoder, unsupported

    B, S0 = input_ids.shape
    on_cuda = model.embed_tokens.weight.is_cuda
    # the last new token is never fed back; capture's 3 warm-up steps need room past the end
    max_len = S0 + max(max_new_tokens - 1, 0) + (3 if on_cuda else 0)
    why = "batch > 1 (the static decoder is batch 1)" if B != 1 else unsupported(model, max_len)
    if why is not None:
        raise ValueError(f"generate: cuda_graph=True cannot take this call: {why}; use cuda_graph=False")
    device = model.embed_tokens.weight.device
    input_ids = input_ids.to(device)
    if max_new_tokens == 0:
        return input_ids.clone()
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None and temperature > 0 else None
    dec = StaticDecoder(model, max_len)
    logits = dec.prefill(input_ids)
    if on_cuda:
        dec.capture()
    out = [input_ids]
    for step in range(max_new_tokens):
        token = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)  # (1,)
        out.append(token[:, None])
        if step == max_new_tokens - 1 or (eos and int(token) in eos):
            break
        logits = dec.step(token)
    return torch.cat(out, dim=1)
