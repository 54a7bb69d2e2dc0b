"""The calibration runner: a model quantized block by block, so only one block (and the calibration
activations) is ever on the accelerator and a model larger than its memory quantizes.

    tokens (n, S) ─embed─▶ x₀ (n, S, E) ─block 0: stats, quantize, forward─▶ x₁ ─block 1─▶ ... x_L

Each block is moved to the device, its linears are quantized by `block_fn` (GPTQ: true-sequential
groups, each seeing the already-quantized outputs of the groups before it; AWQ: scale search, clip,
RTN; see api.py), and its outputs *with the quantized weights* become the next block's inputs (the
error of earlier blocks is what later blocks are calibrated against, as in GPTQ's reference code).
The block then goes back to the CPU. Embeddings, final norm and lm_head are never quantized.

Float stream (opt-in, `float_inputs=True`): the float model's activations x_f are carried beside the
quantized ones, x_f of block i+1 = float block i (x_f), and passed to `block_fn` as `x_float`, for
objectives that aim the quantized block at the float model's outputs rather than at the float weights
applied to the quantized inputs (GPTQ's float_target, api.py). Costs a second activation buffer and one
float forward a block.

Resumable: with a `work_dir`, after each block its quantized tensors and its non-quantized parameters
(norm weights and biases, which AWQ rescales), then the next block's inputs, then `progress.json` are
written, each atomically (temp file + rename); progress.json is the commit point. A restart with the
same settings reloads the finished blocks and the inputs and continues at the first unfinished block,
with results identical to an uninterrupted run.

Shapes: n calibration sequences, S tokens each, E hidden size.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F

from flashscale.models.llama import apply_rope
from flashscale.quant.rtn import QuantizedWeight

# block_fn(block, x, cos, sin, name) -> records; with float_inputs, also x_float= (the float stream)
BlockFn = Callable[..., dict[str, QuantizedWeight]]
PROGRESS_FILE = "progress.json"


# ----------------------------------------------------------------------------------- calibration data

def calibration_tokens(tokenizer, *, text: str, nsamples: int, seqlen: int, seed: int = 0,
                       source: str = "text") -> torch.Tensor:
    """`nsamples` random windows of `seqlen` tokens of `text` (GPTQ's sampling: uniform start offsets
    into the tokenized text, seeded) -> LongTensor (nsamples, seqlen)."""
    for arg, v in (("nsamples", nsamples), ("seqlen", seqlen)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{arg}={v!r} must be a positive int")
    # Tokenized in paragraph-aligned chunks through encode_batch (parallel in the tokenizers library);
    # each chunk keeps its trailing separator, so the ids are those of the text up to chunk seams.
    chunks, cur, size = [], [], 0
    for para in text.split("\n\n"):
        cur.append(para)
        size += len(para) + 2
        if size >= 1 << 16:
            chunks.append("\n\n".join(cur) + "\n\n")
            cur, size = [], 0
    if cur:
        chunks.append("\n\n".join(cur))
    ids = [i for enc in tokenizer.encode_batch(chunks, add_special_tokens=False) for i in enc.ids]
    if len(ids) <= seqlen:
        raise ValueError(f"calibration text {source}: {len(ids)} tokens, fewer than seqlen={seqlen} + 1; "
                         "use a longer text or a shorter --seqlen")
    stream = torch.tensor(ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - seqlen, (nsamples,), generator=gen)
    return torch.stack([stream[s:s + seqlen] for s in starts.tolist()])


# ----------------------------------------------------------------------------------------- forwards

def rope_for(model: nn.Module, seqlen: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (1, S, 1, D) of positions 0..S-1, computed where the model's buffers live."""
    positions = torch.arange(seqlen, device=model.inv_freq.device)[None]
    cos, sin = model.rope(positions, dtype)
    return cos.to(device), sin.to(device)


def micro_batches(x: torch.Tensor, batch_tokens: int) -> list[torch.Tensor]:
    """x (n, S, E) split along n so each piece holds about batch_tokens tokens."""
    return list(x.split(max(1, batch_tokens // x.shape[1])))


@torch.no_grad()
def forward_block(block: nn.Module, x: torch.Tensor, cos, sin, batch_tokens: int) -> torch.Tensor:
    """block over all of x (n, S, E), a micro-batch at a time -> (n, S, E)."""
    out = torch.empty_like(x)
    i = 0
    for c in micro_batches(x, batch_tokens):
        out[i:i + c.shape[0]] = block(c, cos, sin)
        i += c.shape[0]
    return out


@torch.no_grad()
def residual_weights(block: nn.Module, x: torch.Tensor, cos, sin, batch_tokens: int = 16384
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """How much an error added to each token's residual stream counts downstream, for a Llama block on
    x (n, S, E): r_t = 1 / mean(h_t²) of the residual h after the attention add and after the MLP add
    -> (r_mid, r_out), each (n, S) float32 with mean 1.

    Every reader of the residual (the next norm, the final norm) divides it by its RMS, so an error δ on
    token t costs about |δ|² / mean(h_t²): an error on a token with a massive activation (SmolLM2's
    sink, ~100x the median norm from layer 12 on) costs ~1e-4 of the same error elsewhere.
    Uses block's current weights (call it on the float block)."""
    r_mid, r_out = [], []
    for c in micro_batches(x, batch_tokens):
        mid = c + block.self_attn(block.input_layernorm(c), cos, sin)
        out = mid + block.mlp(block.post_attention_layernorm(mid))
        r_mid.append(1.0 / mid.float().pow(2).mean(-1).clamp_min(1e-12))
        r_out.append(1.0 / out.float().pow(2).mean(-1).clamp_min(1e-12))
    r_mid, r_out = torch.cat(r_mid), torch.cat(r_out)
    return r_mid / r_mid.mean(), r_out / r_out.mean()


@torch.no_grad()
def attention_mass(attn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                   query_chunk: int = 512, query_weight: torch.Tensor | None = None) -> torch.Tensor:
    """The attention each token receives: m_j = mean over query heads of Σ_i P_ij, with P the causal
    softmax of `attn` (a Llama Attention) on its input x (n, S, E) -> (n, S) float32.

    Every row of P sums to 1, so m averages 1 over a window; an attention sink gets a large share (up
    to ~S/2 in SmolLM2). query_weight (n, S), optional: row i of P counts query_weight[i] times
    (m_j = mean over heads of Σ_i w_i P_ij). Computed from the module's weights directly (F.linear, no forward hooks fire),
    q/k in x's dtype as the module's forward computes them, the rest in float32, one head and `query_chunk`
    queries at a time so memory stays (n, chunk, S).
    """
    if x.ndim != 3:
        raise ValueError(f"x: takes the attention input (n, S, E), got shape {tuple(x.shape)}")
    n, s, _ = x.shape
    d = attn.head_dim
    # q/k in the module's own precision (what its forward computes; tensor cores for a bf16 model), then float32
    q = F.linear(x.to(attn.q_proj.weight.dtype), attn.q_proj.weight, attn.q_proj.bias).float()
    k = F.linear(x.to(attn.k_proj.weight.dtype), attn.k_proj.weight, attn.k_proj.bias).float()
    q = apply_rope(q.view(n, s, -1, d), cos.float(), sin.float())  # (n, S, H, D)
    k = apply_rope(k.view(n, s, -1, d), cos.float(), sin.float())  # (n, S, G, D)
    heads, kv_heads = q.shape[2], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"attention_mass: {heads} query heads do not share {kv_heads} kv heads evenly")
    rep = heads // kv_heads
    mass = torch.zeros(n, s, dtype=torch.float32, device=x.device)
    pos = torch.arange(s, device=x.device)
    for h in range(heads):
        kh = k[:, :, h // rep]  # (n, S, D): GQA, query head h reads kv head h // rep
        for i0 in range(0, s, query_chunk):
            qh = q[:, i0:i0 + query_chunk, h]  # (n, C, D)
            scores = torch.bmm(qh, kh.transpose(1, 2)) / math.sqrt(d)  # (n, C, S)
            future = pos[None, :] > pos[i0:i0 + qh.shape[1], None]  # (C, S): causal mask
            scores.masked_fill_(future, float("-inf"))
            p = scores.softmax(-1)
            if query_weight is not None:
                p = p * query_weight[:, i0:i0 + qh.shape[1], None].float()
            mass += p.sum(1)
    return mass / heads


@torch.no_grad()
def embed(model: nn.Module, tokens: torch.Tensor, device, batch_tokens: int) -> torch.Tensor:
    """tokens (n, S) -> block 0's inputs (n, S, E) on device, the embedding table moved there only
    for the lookup."""
    emb = model.embed_tokens
    home = emb.weight.device
    emb.to(device)
    try:
        return torch.cat([emb(c.to(device)) for c in tokens.split(max(1, batch_tokens // tokens.shape[1]))])
    finally:
        emb.to(home)


# ------------------------------------------------------------------------------------ resume state

def _atomic_save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def _atomic_json(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _block_file(work_dir: Path, i: int) -> Path:
    return work_dir / f"block_{i:05d}.safetensors"


def _inputs_file(work_dir: Path, i: int) -> Path:
    return work_dir / f"inputs_{i:05d}.safetensors"


def save_block_state(work_dir: Path, i: int, block: nn.Module, records: dict[str, QuantizedWeight]) -> None:
    tensors, meta = {}, {}
    quantized_weights = {f"{n}.weight" for n in records}
    for n, t in block.state_dict().items():
        if n not in quantized_weights:
            tensors[f"param.{n}"] = t
    for n, r in records.items():
        tensors.update({f"q.{n}.codes": r.codes, f"q.{n}.scales": r.scales, f"q.{n}.zeros": r.zeros,
                        f"q.{n}.g_idx": r.g_idx})
        meta[n] = json.dumps({"bits": r.bits, "group_size": r.group_size, "sym": r.sym})
    _atomic_save(tensors, _block_file(work_dir, i), metadata=meta)


@torch.no_grad()
def load_block_state(work_dir: Path, i: int, block: nn.Module) -> dict[str, QuantizedWeight]:
    """Restores block i's saved parameters and quantized weights into `block`; returns its records."""
    from safetensors import safe_open

    path = _block_file(work_dir, i)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    tensors = load_file(str(path))
    params = dict(block.named_parameters())
    params.update(dict(block.named_buffers()))
    records = {}
    for n, m in meta.items():
        info = json.loads(m)
        records[n] = QuantizedWeight(codes=tensors[f"q.{n}.codes"], scales=tensors[f"q.{n}.scales"],
                                     zeros=tensors[f"q.{n}.zeros"], g_idx=tensors[f"q.{n}.g_idx"], **info)
        w = params[f"{n}.weight"]
        w.copy_(records[n].dequantize(w.dtype))
    for k, t in tensors.items():
        if k.startswith("param."):
            params[k[len("param."):]].copy_(t)
    return records


def fingerprint_of(model: nn.Module, tokens: torch.Tensor, settings: dict) -> dict:
    """What a work dir's results depend on: the settings, the calibration tokens, the model's config
    and a digest of a sample of its weights."""
    h = hashlib.sha256(tokens.cpu().numpy().tobytes()).hexdigest()[:16]
    w = hashlib.sha256()
    for t in (model.embed_tokens.weight, model.layers[0].self_attn.q_proj.weight, model.layers[-1].mlp.down_proj.weight):
        w.update(t.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return {"settings": settings, "tokens": h, "weights": w.hexdigest()[:16],
            "config": model.config.to_hf_dict(), "tokens_shape": list(tokens.shape)}


# ------------------------------------------------------------------------------------------ runner

@dataclass(kw_only=True)
class RunStats:
    block_seconds: list[float] = field(default_factory=list)  # per block; 0.0 for blocks resumed from disk
    resumed_blocks: int = 0
    embed_seconds: float = 0.0


def run_blockwise(model: nn.Module, tokens: torch.Tensor, block_fn: BlockFn, *, device, batch_tokens: int = 16384,
                  work_dir: str | os.PathLike | None = None, settings: dict | None = None, progress: bool = False,
                  on_block_done: Callable[[int, float], None] | None = None, description: str = "quantize",
                  float_inputs: bool = False) -> tuple[dict[str, QuantizedWeight], RunStats]:
    """Quantizes model's blocks in place (weights replaced by their dequantized values) and returns
    full linear name ("layers.3.mlp.up_proj") -> QuantizedWeight, and timing. The model stays on the
    CPU (or wherever it was); each block visits `device` in turn. float_inputs: also carry the float
    model's activations and pass them to block_fn as x_float (module docstring)."""
    if tokens.ndim != 2 or tokens.is_floating_point():
        raise ValueError(f"calibration tokens must be an integer tensor (nsamples, seqlen), got {tokens.dtype} "
                         f"of shape {tuple(tokens.shape)}")
    n, seqlen = tokens.shape
    if n == 0 or seqlen < 2:
        raise ValueError(f"calibration tokens of shape {tuple(tokens.shape)}: takes at least 1 sequence of >= 2 tokens")
    cfg = model.config
    if int(tokens.max()) >= cfg.vocab_size or int(tokens.min()) < 0:
        raise ValueError(f"calibration token ids lie in [{int(tokens.min())}, {int(tokens.max())}], outside the "
                         f"model's vocabulary [0, {cfg.vocab_size})")
    device = torch.device(device)
    stats = RunStats()
    layers = model.layers
    wd = Path(work_dir) if work_dir is not None else None
    start = 0
    fp = fingerprint_of(model, tokens, settings or {}) if wd is not None else None
    if wd is not None:
        wd.mkdir(parents=True, exist_ok=True)
        prog = wd / PROGRESS_FILE
        if prog.exists():
            state = json.loads(prog.read_text())
            if state.get("fingerprint") != json.loads(json.dumps(fp)):
                raise ValueError(f"work dir {str(wd)!r} holds a run with other settings, calibration data or "
                                 "model; remove it or pass another work dir")
            start = int(state["done"])
            stats.block_seconds = [float(s) for s in state.get("block_seconds", [])][:start]

    records: dict[str, QuantizedWeight] = {}
    for i in range(start):  # finished blocks: their results from disk, no compute
        for name, r in load_block_state(wd, i, layers[i]).items():
            records[f"layers.{i}.{name}"] = r
    stats.resumed_blocks = start
    if start == len(layers):
        return records, stats

    dtype = next(layers[0].parameters()).dtype
    t0 = time.perf_counter()
    x_f = None  # the float stream (n, S, E), with float_inputs
    if start == 0:
        x = embed(model, tokens, device, batch_tokens).to(dtype)  # (n, S, E)
        x_f = x.clone() if float_inputs else None
    else:
        saved = load_file(str(_inputs_file(wd, start)))
        x = saved["x"].to(device)
        if float_inputs:
            x_f = saved["x_float"].to(device)
    stats.embed_seconds = time.perf_counter() - t0
    cos, sin = rope_for(model, seqlen, dtype, device)

    bar = _progress(progress)
    task = bar.add_task(description, total=len(layers), completed=start) if bar else None
    try:
        if bar:
            bar.start()
        for i in range(start, len(layers)):
            t0 = time.perf_counter()
            block = layers[i]
            home = next(block.parameters()).device
            block.to(device)
            if float_inputs:
                x_f_next = forward_block(block, x_f, cos, sin, batch_tokens)  # still the float block
                block_records = block_fn(block, x, cos, sin, f"layers.{i}", x_float=x_f)
                x_f = x_f_next
                del x_f_next
            else:
                block_records = block_fn(block, x, cos, sin, f"layers.{i}")
            x = forward_block(block, x, cos, sin, batch_tokens)  # the quantized block's outputs
            if not bool(torch.isfinite(x).all()) or (x_f is not None and not bool(torch.isfinite(x_f).all())):
                raise ValueError(f"layers.{i}: the quantized block's outputs hold NaN/Inf")
            block.to(home)
            block_records = {k: r.to("cpu") for k, r in block_records.items()}
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
            stats.block_seconds.append(seconds)
            for name, r in block_records.items():
                records[f"layers.{i}.{name}"] = r
            if wd is not None:
                save_block_state(wd, i, block, block_records)
                _atomic_save({"x": x} if x_f is None else {"x": x, "x_float": x_f}, _inputs_file(wd, i + 1))
                _atomic_json({"done": i + 1, "fingerprint": fp, "block_seconds": stats.block_seconds},
                             wd / PROGRESS_FILE)
                stale = _inputs_file(wd, i)
                if stale.exists():
                    stale.unlink()
            if bar:
                bar.update(task, advance=1, description=f"{description} block {i + 1}/{len(layers)} "
                                                        f"({seconds:.1f}s)")
            if on_block_done is not None:
                on_block_done(i, seconds)
    finally:
        if bar:
            bar.stop()
    return records, stats


def _progress(enabled: bool):
    if not enabled:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=False)
