"""The batch-1 decode step over a static KV cache, capturable in one CUDA graph (what serving engines and
gpt-fast do for latency): token and position live on the device, the cache is preallocated (L, G, T, D), and a
block is its linears (the model's own modules: float or QuantLinear, so W4A16 checkpoints decode through the
W4A16 kernels) plus three small Triton kernels (flashscale.kernels.decode). Replaying the graph costs one launch
a token instead of a few hundred Python-side ones.

    dec = StaticDecoder(model, max_len)         # model: a flashscale Llama on a GPU (or the CPU, interpreted)
    logits = dec.prefill(prompt_ids)            # Llama.forward over the prompt, its KV copied into the cache
    dec.capture()                               # CUDA only; step() replays the graph from then on
    logits = dec.step(token)                    # (1, V) float32 of the token at the next position

fuse=True builds fused q/k/v and gate/up linears (one GEMV each instead of three / two; a copy of those weights)
from float linears, each passed through `linear_fn` (e.g. QuantLinear.from_float): the benchmark's layout.
pdl=True launches the step's Triton kernels (the three here and the W4A16 GEMVs) with programmatic dependent
launch on sm_90+ (kernels.pdl: each grid is resident before its predecessor ends and starts the moment it does;
with l2_prefetch the W4A16 ones first ask for their weights to be brought into L2 while the small kernel before
them runs). The prefetch is off by default (35 % slower on the H200, docs/w4a16_decode.md round 6); pdl=None (the
default) follows accumulate: alone PDL gained nothing, with the accumulating ring kernel, which loads its first
weight words before it waits for the kernel ahead, it takes the 8B-shaped 4-bit step from 2.167 to 1.965 ms
(round 9; benchmarks/generate_w4a16.py times the variants).
accumulate=True (W4A16 linears: QuantLinear, e.g. through linear_fn; None, the default: on a GPU wherever every
block linear is one) runs each block linear as
QuantLinear.accumulate_: its GEMV red.adds fp32 partials straight into a per-layer float32 output (zeroed once a
step, one memset) instead of folding split-K partials itself at its end (a ticket and a re-read of the tile: ~2 us
of each ~8-40 us GEMV on the H200, docs/w4a16_decode.md round 9), and the next kernel reads the sum, rounded to the
model's dtype as the linear would have stored it. Measured (results/generate_w4a16-h200.json, 8B shape): 2.328 ->
2.161 ms a token (1.965 with pdl).
prologue=True (None, the default: with accumulate) runs the residual add + RMSNorm before q/k/v and gate/up and
SiLU(gate) * up before down inside those GEMVs (kernels.w4a16_prologue: each program computes the chunks of its
input it reads, after its PDL wait), over two residual buffers (x, x2); with a 4-bit lm_head the final norm too, the
head adding into the float32 logits. 5 launches a block instead of 8. trigger=True (None: with prologue) lets each
ring GEMV's successor launch once its programs run (a GEMV after a GEMV then loads its first weights during the
first one's tail): 1.956 -> 1.840 ms a token with both (docs/w4a16_decode.md round 10); pre_l2 (an attribute, 0):
items past its ring each ring GEMV asks of L2 before its wait.
Attributes (switchable between steps; a captured graph keeps what it recorded): glue (True) runs the step's first
and last work as two kernels of ours (kernels.decode.step_begin_kernel: the token's embedding and the zeroed float32
sums; step_end_kernel: argmax into tok with greedy, pos + 1; PDL-aware) instead of torch's index select, copy,
memset, argmax and add (which restart the chain of PDL launches at every step: 1.858 -> 1.826 ms a token on the 8B
step); attn_in_o (False) with prologue and context splits > 1: the attention kernel leaves its splits' partials and
the o GEMV combines them in its prologue (w4a16_prologue.XAttn) instead of the attention's last split after a
ticket (slower on the H200: docs/w4a16_decode.md round 11); set_attn_splits(n) changes the splits; attn_block the
attention's tile rows. tune_in_step() pins each GEMV's config by the captured step's time (1.782 -> 1.712 ms);
replay_ms(n) times n replays; enable_trace() records the programs' timestamps (benchmarks/decode_step_trace.py).
RoPE: cos / sin tables of max_len rows (model.rope), read at pos by the attention kernel.
Shapes: E hidden size, H query heads, G kv heads, D head_dim, L layers, T max_len, V vocab.
Files: this module holds the decoder (the checks, its buffers, tuning and diagnostics, step, prefill, capture);
the step's kernel launches (_step, _step_body and their helpers, LAUNCHES) are its base class StepLaunches in
decode_step.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from flashscale.infer.decode_step import StepLaunches
from flashscale.models.llama import KVCache, Llama


LINEARS = ("qkv", "o", "gu", "down")  # a block's linears (q/k/v and gate/up fused or tuples of the model's own)


def unsupported(model: nn.Module, max_len: int) -> str | None:
    """Why StaticDecoder cannot take this model (None: it can)."""
    if not isinstance(model, Llama):
        return f"model must be a flashscale Llama, got {type(model).__name__}"
    cfg = model.config
    d = cfg.head_dim
    if d & (d - 1) or d < 16:
        return f"head_dim {d}: the decode attention kernel takes a power of two >= 16"
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        return "num_attention_heads must be a multiple of num_key_value_heads"
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        return f"max_len must be an int >= 1, got {max_len!r}"
    if getattr(model.layers[0].self_attn, "n_heads", None) != cfg.num_attention_heads:
        return "a tensor-parallel (sharded) model: decode it with Llama.forward"
    return None


def _auto_splits(device: torch.device, heads: int, max_len: int) -> int:
    """Context splits a head for the decode attention (flash-decoding): about two programs an SM on a GPU (8 at
    32 heads on 132 SMs), no more than a split per 32 cache positions (a tile of rows at a full cache: the 8B step
    at 144 positions took 1.788 ms a token with 8 splits, 1.767 with 4, docs/w4a16_decode.md round 11); 2 on the
    CPU (the interpreter's tests)."""
    if device.type == "cuda":
        want = max(1, 2 * torch.cuda.get_device_properties(device).multi_processor_count // heads)
    else:
        want = 2
    want = min(want, 16, max(1, max_len // 32))
    return 1 << (want.bit_length() - 1)  # a power of two, at most want


def _check_splits(splits, allow_none: bool = False) -> None:
    if splits is None and allow_none:
        return
    if not isinstance(splits, int) or isinstance(splits, bool) or not 1 <= splits <= 64 or splits & (splits - 1):
        raise ValueError(f"StaticDecoder: attn_splits must be {'None (automatic) or ' if allow_none else ''}a power "
                         f"of two in [1, 64], got {splits!r}")


def _fuse(mods: list[nn.Linear], linear_fn: Callable[[nn.Linear], nn.Module] | None) -> nn.Module:
    w = torch.cat([m.weight.detach() for m in mods])
    has_bias = mods[0].bias is not None
    lin = nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device=w.device, dtype=w.dtype)
    lin.weight.data = w
    if has_bias:
        lin.bias.data = torch.cat([m.bias.detach() for m in mods])
    return linear_fn(lin) if linear_fn is not None else lin


class StaticDecoder(StepLaunches):
    """One-token decode of a Llama at batch 1 over a static cache of max_len positions (see the module doc)."""

    def __init__(self, model: Llama, max_len: int, *, fuse: bool = False,
                 linear_fn: Callable[[nn.Linear], nn.Module] | None = None, lm_head: nn.Module | None = None,
                 pdl: bool | None = None, l2_prefetch: bool = False, attn_splits: int | None = None,
                 accumulate: bool | None = None, prologue: bool | None = None, trigger: bool | None = None):
        why = unsupported(model, max_len)
        if why is not None:
            raise ValueError(f"StaticDecoder: {why}")
        if fuse and not all(type(m) is nn.Linear for b in model.layers for m in (
                b.self_attn.q_proj, b.self_attn.k_proj, b.self_attn.v_proj, b.mlp.gate_proj, b.mlp.up_proj)):
            raise ValueError("StaticDecoder: fuse=True builds fused copies from float nn.Linear layers (quantize them "
                             "through linear_fn); this model's are already replaced: use fuse=False")
        cfg = model.config
        if accumulate is not None and not isinstance(accumulate, bool):
            raise TypeError(f"StaticDecoder: accumulate must be a bool or None (automatic), got {accumulate!r}")
        if pdl is not None and not isinstance(pdl, bool):
            raise TypeError(f"StaticDecoder: pdl must be a bool or None (automatic: with accumulate), got {pdl!r}")
        if not isinstance(l2_prefetch, bool):
            raise TypeError(f"StaticDecoder: l2_prefetch must be a bool, got {l2_prefetch!r}")
        if prologue is not None and not isinstance(prologue, bool):
            raise TypeError(f"StaticDecoder: prologue must be a bool or None (automatic: with accumulate), got "
                            f"{prologue!r}")
        if trigger is not None and not isinstance(trigger, bool):
            raise TypeError(f"StaticDecoder: trigger must be a bool or None (automatic: with prologue), got "
                            f"{trigger!r}")
        _check_splits(attn_splits, allow_none=True)
        self.model, self.cfg, self.max_len, self.fused = model, cfg, max_len, fuse
        self.pdl, self.l2_prefetch = pdl, l2_prefetch
        self.lm_head = lm_head if lm_head is not None else model.lm_head
        self.blocks = []
        for b in model.layers:
            a, f = b.self_attn, b.mlp
            if fuse:
                qkv, gu = _fuse([a.q_proj, a.k_proj, a.v_proj], linear_fn), _fuse([f.gate_proj, f.up_proj], linear_fn)
                o = linear_fn(a.o_proj) if linear_fn is not None else a.o_proj
                down = linear_fn(f.down_proj) if linear_fn is not None else f.down_proj
            else:
                qkv, gu, o, down = (a.q_proj, a.k_proj, a.v_proj), (f.gate_proj, f.up_proj), a.o_proj, f.down_proj
            self.blocks.append(dict(ln1=b.input_layernorm, ln2=b.post_attention_layernorm, qkv=qkv, o=o, gu=gu,
                                    down=down))
        bad = [f"layer {i} {k}" for i, b in enumerate(self.blocks) for k in LINEARS if not hasattr(b[k], "accumulate_")]
        if accumulate is None:  # automatic: on a GPU wherever every block linear runs the red.add kernel (no bias)
            accumulate = (not bad and model.embed_tokens.weight.is_cuda
                          and all(b[k].bias is None for b in self.blocks for k in LINEARS))
        if accumulate and bad:
            raise ValueError(f"StaticDecoder: accumulate=True needs every block linear to be a QuantLinear (fused "
                             f"q/k/v and gate/up: fuse=True with linear_fn=QuantLinear.from_float); not: "
                             f"{', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}")
        self.accumulate = accumulate  # may be switched between steps where every block linear can (acc)
        if pdl is None:  # automatic: with accumulate (a GPU; kernels.pdl ignores it before sm_90)
            self.pdl = accumulate
        if prologue and not accumulate:
            raise ValueError("StaticDecoder: prologue=True runs the norms and SiLU * up inside the accumulating GEMVs: "
                             "it needs accumulate")
        self.prologue = accumulate if prologue is None else prologue  # may be switched with accumulate
        self.trigger = self.prologue if trigger is None else trigger
        self.pre_l2 = 0  # items past its ring each ring GEMV asks of L2 before its PDL wait (kernels.pdl)
        dev, dt = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=dev, dtype=dt)  # (L, G, T, D)
        self.v = torch.zeros(shape, device=dev, dtype=dt)
        self.attn_cnt = torch.zeros(cfg.num_attention_heads, device=dev, dtype=torch.int32)  # a ticket a head
        self.set_attn_splits(attn_splits or _auto_splits(dev, cfg.num_attention_heads, max_len))
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        cos, sin = model.rope(torch.arange(max_len, device=dev)[None], dt)  # (1, T, 1, D) each
        self.rope_cos, self.rope_sin = cos.reshape(max_len, -1).contiguous(), sin.reshape(max_len, -1).contiguous()
        self.glue = True  # the step's first and last kernels are ours (step_begin/_end); False: torch's ops
        self.attn_in_o = False  # prologue, splits > 1: the o GEMV combines the attention's partials (slower, 32)
        self.trace: torch.Tensor | None = None  # enable_trace()
        self.dyn = False  # q/k/v, o, gate/up and the head take their items dynamically (w4a16_ring DYN; zeroed a step)
        self.dyn_ctr = torch.zeros((cfg.num_hidden_layers + 1) * len(self.LAUNCHES), device=dev, dtype=torch.int32)
        self.attn_block = 32  # cached rows a tile of the decode attention (its registers: 167 at 32 on sm_90)
        self.argmax_best = torch.full((1,), -2 ** 63, device=dev, dtype=torch.int64)  # step_end's (left so)
        self.argmax_cnt = torch.zeros(1, device=dev, dtype=torch.int32)
        e = cfg.hidden_size
        self.x = torch.zeros(1, e, device=dev, dtype=dt)  # residual stream
        self.x2 = torch.zeros(1, e, device=dev, dtype=dt)  # its second buffer (prologue: a GEMV reads x, writes x2)
        self.h = torch.zeros(1, e, device=dev, dtype=dt)
        self.attn = torch.zeros(1, cfg.num_attention_heads * cfg.head_dim, device=dev, dtype=dt)
        self.act = torch.zeros(1, cfg.intermediate_size, device=dev, dtype=dt)
        # accumulate=True: each layer's linear outputs as float32 sums, (1, N) views of one buffer zeroed a step;
        # the logits the last view (a 4-bit lm_head without bias adds into them, prologue: the final norm in it)
        widths = [] if bad else [b[k].out_features for b in self.blocks for k in LINEARS]
        self.acc = torch.zeros(1, sum(widths) + cfg.vocab_size, device=dev, dtype=torch.float32)
        views = iter(torch.split(self.acc, widths + [cfg.vocab_size], dim=1))
        self.acc_views = [] if bad else [{k: next(views) for k in LINEARS} for _ in self.blocks]
        self.logits = self.acc[:, sum(widths):]  # (1, V)
        self.head_acc = (not bad and hasattr(self.lm_head, "accumulate_")
                         and getattr(self.lm_head, "bias", None) is None)
        self.greedy = False  # step writes argmax(logits) into tok (a replayed graph then runs a whole generation)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.length = 0  # positions filled (host-side mirror of pos)

    @torch.no_grad()
    def tune_in_step(self, replays: int = 16) -> dict:
        """Choose each accumulating GEMV's config by timing the whole captured step (GPU; accumulate): the W4A16
        tuner times a shape alone, where in the step a GEMV also overlaps its neighbours (PDL: weights loaded before
        the wait, the early trigger), so the fastest alone need not be the fastest here. For each ring-add key in
        turn (a shape and its prologue), every candidate config is pinned and `replays` replays of the step are timed;
        the best stays pinned (kernels.w4a16.pin_config). tok, pos, logits and the cache length are restored after;
        a captured graph is dropped (capture again). Returns {key: label of the chosen config}."""
        from flashscale.kernels import w4a16

        if not self.x.is_cuda or not self.accumulate:
            raise ValueError("tune_in_step needs a GPU decoder with accumulate")
        if self.length + replays + 3 > self.max_len:
            raise ValueError(f"tune_in_step runs {replays} + 3 steps from position {self.length}: a static cache of "
                             f"{self.max_len} positions is too short")
        saved = (self.tok.clone(), self.pos.clone(), self.logits.clone(), self.length)
        self._step()  # every key tuned alone first
        torch.cuda.synchronize()

        def step_ms() -> float:
            self.pos.copy_(saved[1])
            self.length, self.graph = saved[3], None
            self.capture()
            return self.replay_ms(replays)

        chosen = {}
        for key, cands in w4a16.ring_add_choices().items():
            times = []
            for cfg, split in cands:
                w4a16.pin_config(key, cfg, split)
                times.append((step_ms(), cfg.label, cfg, split))
            best = min(times, key=lambda t: t[0])
            w4a16.pin_config(key, best[2], best[3])
            chosen["|".join(map(str, key))] = best[1]
        for t, old in zip((self.tok, self.pos, self.logits), saved[:3]):
            t.copy_(old)
        self.length, self.graph = saved[3], None
        return chosen

    def replay_ms(self, n: int) -> float:
        """Replay the captured step n times (pos advances n: the cache must hold them); ms a replay (CUDA events)."""
        if self.graph is None:
            raise ValueError("replay_ms replays a captured step: capture() first")
        if self.length + n > self.max_len:
            raise ValueError(f"replay_ms: {n} steps from position {self.length} pass the static cache's "
                             f"{self.max_len} positions")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            self.graph.replay()
        end.record()
        torch.cuda.synchronize()
        self.length += n
        return start.elapsed_time(end) / n

    def set_attn_splits(self, splits: int) -> None:
        """Context splits a head for the decode attention from the next step on (a power of two in [1, 64]; a
        captured graph keeps its own: capture again)."""
        _check_splits(splits)
        self.splits = splits
        # flash-decoding partials (H * NS, D + 2), each split's (acc, max, sum)
        self.attn_ws = torch.zeros(self.cfg.num_attention_heads * splits, self.cfg.head_dim + 2,
                                   device=self.attn_cnt.device, dtype=torch.float32)

    def enable_trace(self, on: bool = True, max_programs: int = 1024) -> None:
        """Diagnostics (GPU, from the next step or capture on): TRACE builds of the ring GEMVs and the attention
        write their programs' timestamps into self.trace (L + 1, 5, max_programs, 16) int64, [layer, LAUNCHES
        index, program] (w4a16_ring.TRACE_FIELDS; the lm_head at [L, 0]); benchmarks/decode_step_trace.py reads it."""
        if not on:
            self.trace = None
            return
        if not self.x.is_cuda:
            raise ValueError("enable_trace needs the model on a CUDA device")
        self.trace = torch.zeros(len(self.blocks) + 1, len(self.LAUNCHES), max_programs, 16,
                                 device=self.x.device, dtype=torch.int64)

    def step(self, token: int | torch.Tensor | None = None) -> torch.Tensor:
        """The logits (1, V) float32 of `token` (None: the one already in tok) at the next position; a view of
        a static buffer that the next step overwrites."""
        if self.length >= self.max_len:
            raise ValueError(f"the static cache holds {self.max_len} positions, all used")
        if token is not None:
            self.tok.copy_(torch.as_tensor(token).reshape(1))
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()
        self.length += 1
        return self.logits

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Llama.forward over the prompt (1, S0) with a KVCache, its keys/values copied into the static cache;
        the logits (1, V) float32 of the last prompt token. Resets the decoder. With fuse=True the decoder's
        linears are not the model's, so the prompt goes through step() a token at a time instead."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must be (1, S0), got {tuple(getattr(input_ids, 'shape', ()))}")
        s0 = input_ids.shape[1]
        if not 1 <= s0 <= self.max_len:
            raise ValueError(f"a prompt of {s0} tokens does not fit a static cache of {self.max_len} positions")
        if self.fused:
            self.pos.zero_()
            self.length = 0
            for t in input_ids[0].tolist():
                self.step(t)
            return self.logits
        cache = KVCache.empty(self.cfg, 1, s0, device=self.x.device, dtype=self.x.dtype)
        logits = self.model(input_ids.to(self.x.device), cache=cache)[:, -1]  # (1, V)
        self.k.zero_()
        self.v.zero_()
        for i in range(self.cfg.num_hidden_layers):  # (1, S0, G, D) -> (G, S0, D)
            self.k[i, :, :s0] = cache.k[i][0].transpose(0, 1)
            self.v[i, :, :s0] = cache.v[i][0].transpose(0, 1)
        self.pos.fill_(s0)
        self.length = s0
        self.logits.copy_(logits)
        return self.logits

    def capture(self) -> None:
        """Record one step as a CUDA graph (warm-up steps first: autotuning and compiles stay outside it);
        tok, pos and the logits are restored afterwards. The warm-up wrote cache rows from pos on, which no step
        reads before writing its own row (attention reads rows < pos and the new one from registers)."""
        if not self.x.is_cuda:
            raise ValueError("capture needs the model on a CUDA device")
        if self.length + 3 > self.max_len:
            raise ValueError(f"capture runs 3 steps from position {self.length}: a static cache of "
                             f"{self.max_len} positions is too short")
        saved = (self.tok.clone(), self.pos.clone(), self.logits.clone())
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        for t, old in zip((self.tok, self.pos, self.logits), saved):
            t.copy_(old)
