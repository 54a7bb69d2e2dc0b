"""End-to-end decode speed: a Llama-3-8B-shaped model (random weights) at batch 1, greedy, in bf16 and
with its linears in 4 bits (QuantLinear, group 128, the W4A16 kernels), both in this run.

    python benchmarks/generate_w4a16.py [--layers 32] [--tokens 128] [--keep-lm-head] [--out DIR]
    TRITON_INTERPRET=1 python benchmarks/generate_w4a16.py --device cpu   # self-check, tiny model

Decode step (this file, so it is one CUDA graph): q/k/v and gate/up weights fused into one linear
each (as serving engines do), a static KV cache (L, G, T, D), token and position on the device, and
three small Triton kernels for the rest of a block (residual add + RMSNorm; RoPE + cache write +
attention for one query; SiLU(gate) * up): 8 launches a block, the same for both precisions. The step
writes argmax(logits) and position + 1 back into its inputs, so replaying the graph N times is the
whole generation; tokens/s = N / (CUDA-event time). Before timing, the step is checked against
Llama.forward with a KVCache (attention through torch SDPA there) on the first positions. The
embedding stays bf16; the lm_head is quantized too unless --keep-lm-head.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import flashscale.models.llama as llama_mod  # noqa: E402
from flashscale.kernels.w4a16 import precompile, tuned_configs  # noqa: E402
from flashscale.models.config import LlamaConfig, preset  # noqa: E402
from flashscale.models.llama import KVCache, Llama  # noqa: E402
from flashscale.quant.qlinear import QuantLinear  # noqa: E402


@triton.jit
def _add_rmsnorm(x_ptr, r_ptr, w_ptr, h_ptr, E, eps, HAS_R: tl.constexpr, BLOCK: tl.constexpr):
    """x <- x + r (rounded to x's dtype, as the model's residual add); h = RMSNorm(x) * w (HF order)."""
    offs = tl.arange(0, BLOCK)
    m = offs < E
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if HAS_R:
        x = (x.to(tl.float32) + tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + offs, x, mask=m)
    xf = x.to(tl.float32)
    rs = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / E + eps)
    h = (xf * rs).to(h_ptr.dtype.element_ty).to(tl.float32) * tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rope(x, x_rot, cos, sin, D: tl.constexpr):
    d = tl.arange(0, D)
    return x * cos + tl.where(d < D // 2, -x_rot, x_rot) * sin


@triton.jit
def _decode_attention(qkv_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, out_ptr, pos_ptr, T_MAX, scale,
                      H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BT: tl.constexpr):
    """One query head a program: RoPE on q and the new k, the group's first head writes k/v at pos, then
    softmax(q K^T) V over positions 0..pos (cache rows < pos, the new row from registers: no race)."""
    hq = tl.program_id(0)
    g = hq // (H // G)
    pos = tl.load(pos_ptr)
    d = tl.arange(0, D)
    rot = (d + D // 2) % D
    cos = tl.load(cos_ptr + d).to(tl.float32)
    sin = tl.load(sin_ptr + d).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    q = _rope(tl.load(qkv_ptr + hq * D + d).to(tl.float32), tl.load(qkv_ptr + hq * D + rot).to(tl.float32), cos, sin, D)
    q = q.to(dt).to(tl.float32)
    kb = (H + g) * D
    k_new = _rope(tl.load(qkv_ptr + kb + d).to(tl.float32), tl.load(qkv_ptr + kb + rot).to(tl.float32), cos, sin, D)
    k_new = k_new.to(dt)
    v_new = tl.load(qkv_ptr + (H + G + g) * D + d)
    row = (g * T_MAX + pos) * D
    if hq % (H // G) == 0:
        tl.store(kc_ptr + row + d, k_new)
        tl.store(vc_ptr + row + d, v_new)
    s_new = tl.sum(q * k_new.to(tl.float32), axis=0) * scale
    m_i = s_new
    l_i = s_new * 0.0 + 1.0
    acc = v_new.to(tl.float32)
    for t0 in range(0, pos, BT):
        t = t0 + tl.arange(0, BT)
        tm = t < pos
        off = (g * T_MAX + t)[:, None] * D + d[None, :]
        kt = tl.load(kc_ptr + off, mask=tm[:, None], other=0.0).to(tl.float32)  # (BT, D)
        s = tl.where(tm, tl.sum(kt * q[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        vt = tl.load(vc_ptr + off, mask=tm[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * vt, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    tl.store(out_ptr + hq * D + d, (acc / l_i).to(dt))


@triton.jit
def _silu_mul(gu_ptr, out_ptr, F_: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < F_
    g = tl.load(gu_ptr + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + F_ + offs, mask=m, other=0.0)
    a = (g / (1.0 + tl.exp(-g))).to(u.dtype)  # F.silu in the model's dtype, then * up
    tl.store(out_ptr + offs, (a.to(tl.float32) * u.to(tl.float32)).to(u.dtype), mask=m)


def _fuse(mods: list[nn.Linear], quantize: bool, group_size: int) -> nn.Module:
    w = torch.cat([m.weight.detach() for m in mods])
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    lin.weight.data = w
    return QuantLinear.from_float(lin, group_size=group_size, sym=True) if quantize else lin


class Decoder:
    """One-token decode of `model` over a static cache, capturable in a CUDA graph."""

    def __init__(self, model: Llama, max_len: int, *, quantize: bool, group_size: int, lm_head: nn.Module):
        cfg = model.config
        self.m, self.cfg, self.max_len, self.lm_head = model, cfg, max_len, lm_head
        self.blocks = []
        for b in model.layers:
            a, f = b.self_attn, b.mlp
            self.blocks.append(dict(
                ln1=b.input_layernorm.weight, ln2=b.post_attention_layernorm.weight,
                qkv=_fuse([a.q_proj, a.k_proj, a.v_proj], quantize, group_size),
                o=QuantLinear.from_float(a.o_proj, group_size=group_size, sym=True) if quantize else a.o_proj,
                gu=_fuse([f.gate_proj, f.up_proj], quantize, group_size),
                down=QuantLinear.from_float(f.down_proj, group_size=group_size, sym=True) if quantize else f.down_proj))
        dev, dt = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=dev, dtype=dt)  # (L, G, T, D)
        self.v = torch.zeros(shape, device=dev, dtype=dt)
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        e = cfg.hidden_size
        self.x = torch.zeros(1, e, device=dev, dtype=dt)  # residual stream
        self.h = torch.zeros(1, e, device=dev, dtype=dt)
        self.attn = torch.zeros(1, cfg.num_attention_heads * cfg.head_dim, device=dev, dtype=dt)
        self.act = torch.zeros(1, cfg.intermediate_size, device=dev, dtype=dt)
        self.graph = None

    def _norm(self, w, r=None) -> None:
        e = self.cfg.hidden_size
        _add_rmsnorm[(1,)](self.x, self.x if r is None else r, w, self.h, e, self.cfg.rms_norm_eps,
                           HAS_R=r is not None, BLOCK=triton.next_power_of_2(e), num_warps=8)

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Logits (1, V) of the token `tok` at `pos`; then tok <- argmax, pos <- pos + 1 (in place)."""
        cfg, m = self.cfg, self.m
        h_q, h_kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.x.copy_(m.embed_tokens(self.tok))
        cos, sin = m.rope(self.pos[None], self.x.dtype)  # (1, 1, 1, D)
        r = None
        for i, b in enumerate(self.blocks):
            self._norm(b["ln1"], r)
            qkv = b["qkv"](self.h)  # (1, (H + 2G) D)
            _decode_attention[(h_q,)](qkv, cos, sin, self.k[i], self.v[i], self.attn, self.pos, self.max_len,
                                      d ** -0.5, H=h_q, G=h_kv, D=d, BT=64, num_warps=4)
            self._norm(b["ln2"], b["o"](self.attn))
            gu = b["gu"](self.h)  # (1, 2F)
            f = cfg.intermediate_size
            _silu_mul[(triton.cdiv(f, 1024),)](gu, self.act, F_=f, BLOCK=1024, num_warps=4)
            r = b["down"](self.act)
        self._norm(m.norm.weight, r)
        logits = self.lm_head(self.h).float()  # (1, V)
        self.tok.copy_(logits.argmax(-1))
        self.pos.add_(1)
        return logits

    def capture(self) -> None:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):  # allocator, autotune and compiles happen outside the capture
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()

    def reset(self, token: int) -> None:
        self.k.zero_()
        self.v.zero_()
        self.tok.fill_(token)
        self.pos.zero_()


def _sdpa(q, k, v, *, causal=False, softmax_scale=None):
    """(B, S, H, D) attention through torch SDPA, bottom-right causal (Llama.forward's contract)."""
    sq, sk = q.shape[1], k.shape[1]
    mask = None
    if causal and sq > 1:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                       scale=softmax_scale, enable_gqa=True)
    return o.transpose(1, 2)


@torch.no_grad()
def check_against_model(dec: Decoder, model: Llama, prompt: list[int]) -> float:
    """Worst relative difference of step() logits vs Llama.forward with a KVCache over the prompt."""
    dev = dec.x.device
    cache = KVCache.empty(model.config, 1, dec.max_len, device=dev, dtype=dec.x.dtype)
    dec.reset(prompt[0])
    worst = 0.0
    saved, llama_mod.attention = llama_mod.attention, _sdpa
    try:
        for t in prompt:
            dec.tok.fill_(t)
            got = dec.step()[0]
            want = model(torch.tensor([[t]], device=dev), cache=cache)[0, -1].float()
            worst = max(worst, ((got - want).norm() / want.norm()).item())
    finally:
        llama_mod.attention = saved
    return worst


@torch.no_grad()
def time_decode(dec: Decoder, tokens: int, first: int) -> float:
    dec.reset(first)
    dec.capture()
    dec.reset(first)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(tokens):
        dec.graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / tokens  # ms per token


def weight_bytes(dec: Decoder) -> int:
    mods = [dec.lm_head] + [b[k] for b in dec.blocks for k in ("qkv", "o", "gu", "down")]
    n = 0
    for mod in mods:
        if isinstance(mod, QuantLinear):
            n += mod.pk_qweight.numel() * 4 + mod.pk_sz.numel() * 4
        else:
            n += mod.weight.numel() * mod.weight.element_size()
    return n


def _quantize_model(model: Llama, group_size: int, lm_head: bool) -> None:
    for name, mod in list(model.named_modules()):
        for leaf, child in list(mod.named_children()):
            full = f"{name}.{leaf}" if name else leaf
            if isinstance(child, nn.Linear) and (lm_head or full != "lm_head"):
                setattr(mod, leaf, QuantLinear.from_float(child, group_size=group_size, sym=True))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--layers", type=int, default=32, help="blocks (32 = Llama-3-8B)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--keep-lm-head", action="store_true", help="leave the lm_head in bf16")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu: a tiny model, eager, a self-check only")
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu with TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    if not cpu:  # the GEMV configs, compiled in parallel before the model takes the GPU's time
        precompile([dict(m=1, k=256, n=256, group_size=args.group_size, dtype="bfloat16", act_order=False,
                         bias=False)])
    cfg = (LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128) if cpu
           else preset("llama3-8B", num_hidden_layers=args.layers))
    dtype = torch.float16 if cpu else torch.bfloat16  # the interpreter mishandles bf16 casts
    torch.manual_seed(0)
    with torch.device(args.device):
        torch.set_default_dtype(dtype)
        model = Llama(cfg)
        torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, cfg.initializer_range)
    model.eval()
    max_len = (8 if cpu else args.tokens) + 16
    prompt = [int(t) for t in torch.randint(0, cfg.vocab_size, (6,))]
    rows, checks = [], {}
    for quantize in (False, True):
        impl = "flashscale-w4a16" if quantize else "bf16"
        lm_head = model.lm_head
        if quantize and not args.keep_lm_head:
            lm_head = QuantLinear.from_float(model.lm_head, group_size=args.group_size, sym=True)
        dec = Decoder(model, max_len, quantize=quantize, group_size=args.group_size, lm_head=lm_head)
        if quantize:
            _quantize_model(model, args.group_size, lm_head=not args.keep_lm_head)  # the check's reference
            torch.cuda.empty_cache() if not cpu else None
        checks[impl] = check_against_model(dec, model, prompt)
        print(f"  {impl}: decode step vs Llama.forward, worst relative logit difference {checks[impl]:.2e}", flush=True)
        if checks[impl] > 0.25:  # far past rounding (bf16 over 32 blocks gives ~1e-2): a broken step
            raise SystemExit(f"{impl}: the decode step disagrees with Llama.forward")
        if cpu:
            continue
        ms = time_decode(dec, args.tokens, prompt[-1])
        nbytes = weight_bytes(dec)
        rows.append(dict(impl=impl, layers=args.layers, batch=1, tokens=args.tokens, ms_per_token=ms,
                         tokens_per_s=1e3 / ms, weight_bytes=nbytes, TBps=nbytes / (ms * 1e9),
                         lm_head="bf16" if (args.keep_lm_head or not quantize) else "w4a16"))
        print(f"  {impl:18s} {1e3 / ms:8.1f} tok/s  {ms:7.3f} ms/token  {nbytes / 1e9:6.2f} GB read/token  "
              f"{nbytes / (ms * 1e9):5.2f} TB/s", flush=True)
        del dec
    if cpu:
        print("cpu self-check passed")
        return 0
    gpu = torch.cuda.get_device_name()
    tag = "h200" if "H200" in gpu else gpu.lower().replace(" ", "-")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"generate_w4a16-{tag}.json"
    path.write_text(json.dumps(dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                                    date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                    model=f"llama3-8B shape, {args.layers} layers, random weights",
                                    group_size=args.group_size, rows=rows, step_checks=checks,
                                    tuned=tuned_configs()), indent=1))
    b, q = rows
    print(f"\nLlama-3-8B-shaped decode, batch 1, {args.tokens} tokens, CUDA graph, {gpu}")
    print(f"{'impl':18s} {'tok/s':>8} {'ms/tok':>8} {'GB/tok':>7} {'TB/s':>6}")
    for r in rows:
        print(f"{r['impl']:18s} {r['tokens_per_s']:8.1f} {r['ms_per_token']:8.3f} {r['weight_bytes'] / 1e9:7.2f} "
              f"{r['TBps']:6.2f}")
    print(f"speedup {q['tokens_per_s'] / b['tokens_per_s']:.2f}x  wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
