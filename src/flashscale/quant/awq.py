"""AWQ (Lin et al., 2023, "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration") for one Llama block: per-input-channel scales that protect the weights salient
activations multiply, a weight clipping search, then one uniform group quantization.

Scaling (section 3.2): for a linear y = W x, W x = (W·diag(s)) (diag(s)⁻¹ x). The 1/s folds into the op
that produces x (an RMSNorm's weight, or a linear's output rows), so the float model is unchanged, while
the channels with large s get a finer grid relative to their weights. s = s_x^α with s_x the mean |x| of
each input channel, normalized by sqrt(max·min); α ∈ {0, 1/20, ..., 19/20} is picked by the MSE of the
output of the whole module the scaled linears feed (the attention for q/k/v, the MLP for gate/up),
with the linears' weights fake-quantized. α = 0 is s = 1 (plain RTN), so the search never scores worse
than RTN on its calibration data. Scale groups (the paper's / AutoAWQ's for Llama):

    input_layernorm          -> q_proj, k_proj, v_proj    scored on self_attn's output
    v_proj (rows)            -> o_proj                    on o_proj's output; only when v's outputs are
                                                          o's inputs one to one (not under GQA)
    post_attention_layernorm -> gate_proj, up_proj        on the MLP's output
    up_proj (rows)           -> down_proj                 on down_proj's output

Clipping (AutoAWQ's search): per (output row, group), the max |w| is shrunk by 0%, 5%, ... 45% and the
value that minimizes the group's partial output error Σ_j x_j (w_j - q(clip(w))_j) over sampled tokens
is kept. q_proj/k_proj are not clipped (their error reaches the output only through the softmax, which
a per-linear error does not measure; AutoAWQ skips them for the same reason). With
token_weighting="attention" (the default) v_proj's clip error weights each token by the attention it
receives in the float block (calibrate.attention_mass), as GPTQ's k/v Hessian does (api.py): a value
reaches every query in proportion to that mass, so an attention sink's value (one token a window, yet
most of the attention in SmolLM2's middle layers) counts for what it carries instead of 1/S of the loss.

Shapes: T tokens, K input features, N output features, G group size, NG groups, E hidden size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from flashscale.quant.calibrate import attention_mass, residual_weights
from flashscale.quant.rtn import (QuantizedWeight, check_bits, check_group_size, fake_quantize,
                                  fake_quantize_groups, grid, quantize_rtn)

CLIP_MODES = ("max", "range", "both")
NO_CLIP = ("self_attn.q_proj", "self_attn.k_proj")
# clip losses weighted by attention mass (token_weighting): a key and a value reach every query in proportion
# to the attention their token receives (k_proj is clipped only with clip_qk)
WEIGHTED_CLIP = ("self_attn.k_proj", "self_attn.v_proj")


@dataclass(kw_only=True)
class AWQConfig:
    bits: int = 4
    group_size: int = 128
    sym: bool = False  # AWQ's format is asymmetric (zero points)
    grid: int = 20  # α ∈ {0, 1/grid, ..., (grid-1)/grid}
    clip: bool = True
    clip_grid: int = 20  # shrink steps of 1/clip_grid ...
    max_shrink: float = 0.5  # ... below this fraction of the max, exclusive
    # tokens sampled (evenly) for the clip search's error (AutoAWQ's 512); 0: every calibration token, exactly
    # (the error is computed from each group's Gram matrix, so more tokens cost no more memory)
    clip_tokens: int = 512
    batch_tokens: int = 16384  # tokens per forward in the scale search (bounds activation memory)
    v1_zeros: bool = False  # keep zero points >= 1 for the GPTQ v1 layout (see rtn.grid)
    duo_scaling: bool = False  # also try AutoAWQ's s = s_x^α / s_w^(1-α) (twice the candidates)
    clip_qk: bool = False  # clip-search q_proj/k_proj too, on their own output error (AutoAWQ skips them)
    # "max": AutoAWQ's clip, w clamped to ±p·max|w| (an asymmetric grid's smaller side is clipped only once p·max
    # falls below it); "range": w clamped to p·[min, max], both sides shrunk alike (the range the grid spans);
    # "both": the candidates of either, per (row, group) the one with the least error
    clip_mode: str = "max"
    token_weighting: str = "attention"  # v_proj's clip loss: "attention" (tokens by attention mass) or "uniform"

    def __post_init__(self) -> None:
        check_bits(self.bits)
        check_group_size(self.group_size)
        for f in ("grid", "clip_grid", "clip_tokens", "batch_tokens"):
            v = getattr(self, f)
            least = 0 if f == "clip_tokens" else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise ValueError(f"AWQConfig.{f}={v!r} must be a positive int" + (" (or 0: every token)" if least == 0 else ""))
        if self.token_weighting not in ("attention", "uniform", "attention_residual"):
            raise ValueError(f"AWQConfig.token_weighting={self.token_weighting!r} takes 'attention', 'uniform' "
                             "or 'attention_residual'")
        if self.clip_mode not in CLIP_MODES:
            raise ValueError(f"AWQConfig.clip_mode={self.clip_mode!r} takes one of {CLIP_MODES}")
        if not 0.0 <= self.max_shrink < 1.0:
            raise ValueError(f"AWQConfig.max_shrink={self.max_shrink!r} must be in [0, 1)")


def channel_mean_abs(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) -> (K,) float32 mean |x| of each input channel."""
    return x.reshape(-1, x.shape[-1]).float().abs().mean(0)


def _chunks(x: torch.Tensor, batch_tokens: int) -> list[torch.Tensor]:
    """Split (B, S, K) along B so a forward sees about batch_tokens tokens."""
    per = max(1, batch_tokens // max(1, x.shape[1]))
    return list(x.split(per))


@torch.no_grad()
def _module_mse(fn: Callable[[torch.Tensor], torch.Tensor], xs: list[torch.Tensor], refs: list[torch.Tensor],
                ws: list[torch.Tensor | None] | None = None) -> float:
    total, count = 0.0, 0
    for i, (x, ref) in enumerate(zip(xs, refs)):
        d = (fn(x).float() - ref).pow(2)  # (b, S, N)
        if ws is not None and ws[i] is not None:
            d = d * ws[i][..., None]  # a weight per token
        total += float(d.sum())
        count += d.numel()
    return total / max(count, 1)


def weight_mean_scale(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """AutoAWQ's get_weight_scale: |w| over its (row, group) max, averaged over rows -> (K,) float32."""
    n, k = w.shape
    g = check_group_size(group_size, k)
    wg = w.float().abs().reshape(n, k // g, g)
    return (wg / wg.amax(-1, keepdim=True).clamp_min(1e-12)).reshape(n, k).mean(0)


@torch.no_grad()
def search_scales(x: torch.Tensor, linears: list[nn.Linear], fn: Callable[[torch.Tensor], torch.Tensor],
                  cfg: AWQConfig, token_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, list[float]]:
    """The best s (K,) float32 for `linears` reading x (B, S, K), scored by fn's output MSE (each token's
    error times token_weight (B, S) when given); with the loss of every α tried. Leaves the linears'
    weights as they were."""
    xs = _chunks(x, cfg.batch_tokens)
    ws = None if token_weight is None else _chunks(token_weight.to(x.device, torch.float32), cfg.batch_tokens)
    refs = [fn(c).float() for c in xs]
    s_x = channel_mean_abs(x)
    originals = [lin.weight.detach().clone() for lin in linears]
    candidates = [s_x.pow(i / cfg.grid) for i in range(cfg.grid)]
    if cfg.duo_scaling:  # AutoAWQ's duo_scaling family too: s_x^α / s_w^(1-α)
        s_w = weight_mean_scale(torch.cat([w.float() for w in originals]), cfg.group_size)
        candidates += [s_x.pow(i / cfg.grid) / (s_w.pow(1 - i / cfg.grid) + 1e-4) for i in range(cfg.grid)]
    best, best_loss, losses = None, float("inf"), []
    try:
        for s in candidates:
            s = s.clamp_min(1e-4)
            s = s / (s.max() * s.min()).sqrt()  # centre the scales around 1 (AutoAWQ)
            for lin, w in zip(linears, originals):
                wq = fake_quantize_groups(w.float() * s, bits=cfg.bits, group_size=cfg.group_size, sym=cfg.sym)
                lin.weight.copy_((wq / s).to(w.dtype))
            loss = _module_mse(fn, xs, refs, ws)
            losses.append(loss)
            if loss < best_loss:  # strict: ties keep the smaller α (closer to plain RTN)
                best, best_loss = s.clone(), loss
    finally:
        for lin, w in zip(linears, originals):
            lin.weight.copy_(w)
    if best is None:  # every loss NaN: the block's outputs are not finite
        raise ValueError("AWQ scale search: the module's outputs are NaN/Inf for every scale tried")
    return best, losses


@torch.no_grad()
def apply_scales(prev: nn.Module, linears: list[nn.Linear], s: torch.Tensor) -> None:
    """Fold s into the graph: prev's output channels / s, the linears' input columns * s."""
    s = s.to(prev.weight.device)
    if isinstance(prev, nn.Linear):
        prev.weight.div_(s[:, None].to(prev.weight.dtype))  # rows are prev's output features
        if prev.bias is not None:
            prev.bias.div_(s.to(prev.bias.dtype))
    else:  # RMSNorm: y = weight * x̂
        prev.weight.div_(s.to(prev.weight.dtype))
    for lin in linears:
        lin.weight.mul_(s[None, :].to(lin.weight.dtype))


def clip_gram(x: torch.Tensor, group_size: int, clip_tokens: int, token_weight: torch.Tensor | None = None,
              chunk: int = 8192) -> torch.Tensor:
    """The clip search's per-group Gram matrices of x (..., K) -> (NG, G, G) float32: H_g = Σ_t m_t x_tg x_tgᵀ / T
    over every token (clip_tokens=0) or clip_tokens of them evenly spaced (AutoAWQ's sampling), m_t the
    token's weight (default 1). The partial output error of a group, Σ_t m_t (x_tg · d_g)², is d_gᵀ H_g d_g."""
    k = x.shape[-1]
    g = check_group_size(group_size, k)
    ng = k // g
    x = x.reshape(-1, k)
    tw = None
    if token_weight is not None:
        tw = token_weight.reshape(-1).to(x.device, torch.float32)
        if tw.numel() != x.shape[0]:
            raise ValueError(f"token_weight: {tw.numel()} weights for {x.shape[0]} tokens")
    if clip_tokens:
        step = max(1, x.shape[0] // clip_tokens)
        x = x[::step]
        tw = None if tw is None else tw[::step]
    h = torch.zeros(ng, g, g, dtype=torch.float32, device=x.device)
    for i in range(0, x.shape[0], chunk):  # bounded float32 copies of x
        xc = x[i:i + chunk].float()
        xw = xc if tw is None else xc * tw[i:i + chunk, None]
        h.baddbmm_(xw.reshape(-1, ng, g).transpose(0, 1).transpose(1, 2), xc.reshape(-1, ng, g).transpose(0, 1))
    return h / max(1, x.shape[0])


@torch.no_grad()
def search_clip(w: torch.Tensor, x: torch.Tensor, cfg: AWQConfig, token_weight: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The best clipping range per (row, group) of w (N, K) for inputs x (..., K) -> (lo, hi), each (N, NG)
    float32 (cfg.clip_mode: ±p·max|w| or p·[min, max], p = 1, 1 - 1/clip_grid, ...), scored by the group's
    partial output error Σ_t m_t (Σ_{j in g} x_tj (w_j - q_j))² over cfg.clip_tokens sampled tokens (0: all),
    computed as d_gᵀ H_g d_g from the group's Gram matrix (clip_gram). token_weight (...), optional: the
    weight m_t of each token of x (default: all alike)."""
    n, k = w.shape
    g = check_group_size(cfg.group_size, k)
    ng = k // g
    hg = clip_gram(x, cfg.group_size, cfg.clip_tokens, token_weight)  # (NG, G, G)
    best_lo, best_hi = [], []
    rows = max(1, (1 << 24) // max(1, k))  # output rows a step: a few (R, K) float32 temporaries of ~64 MB
    for wb in w.float().split(rows):  # (R, K)
        wg = wb.reshape(-1, ng, g)  # (R, NG, G)
        top = wg.abs().amax(-1)  # (R, NG)
        origins = {"max": [(-top, top)], "range": [(wg.amin(-1), wg.amax(-1))],
                   "both": [(-top, top), (wg.amin(-1), wg.amax(-1))]}[cfg.clip_mode]
        lo_b, hi_b = origins[0][0].clone(), origins[0][1].clone()
        min_err = torch.full_like(top, float("inf"))
        shrinks = [1 - i / cfg.clip_grid for i in range(int(cfg.max_shrink * cfg.clip_grid))]
        for (org_lo, org_hi), p in ((o, p) for o in origins for p in shrinks):
            lo, hi = org_lo * p, org_hi * p  # (R, NG)
            cur = torch.maximum(torch.minimum(wg, hi[..., None]), lo[..., None])
            scale, zero = grid(cur, bits=cfg.bits, sym=cfg.sym, v1_zeros=cfg.v1_zeros)
            d = (fake_quantize(cur, scale[..., None], zero[..., None], cfg.bits) - wg).transpose(0, 1)  # (NG, R, G)
            err = (torch.bmm(d, hg) * d).sum(-1).t()  # (R, NG)
            better = err < min_err
            min_err = torch.where(better, err, min_err)
            lo_b, hi_b = torch.where(better, lo, lo_b), torch.where(better, hi, hi_b)
        best_lo.append(lo_b)
        best_hi.append(hi_b)
    return torch.cat(best_lo), torch.cat(best_hi)


@torch.no_grad()
def apply_clip(lin: nn.Linear, lo: torch.Tensor, hi: torch.Tensor) -> None:
    """Clamp lin's weight to [lo, hi] per (row, group), lo/hi (N, NG) from search_clip."""
    n, k = lin.weight.shape
    lo, hi = (t.to(lin.weight.device, lin.weight.dtype)[..., None] for t in (lo, hi))  # (N, NG, 1)
    w = lin.weight.reshape(n, lo.shape[1], -1)
    lin.weight.copy_(torch.maximum(torch.minimum(w, hi), lo).reshape(n, k))


def _capture_inputs(block: nn.Module, x: torch.Tensor, cos, sin, names: list[str], batch_tokens: int) -> dict[str, torch.Tensor]:
    """The inputs of block's sub-modules `names` over x (B, S, E) -> name -> (B, S, K)."""
    mods = dict(block.named_modules())
    got: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    handles = [mods[n].register_forward_hook(lambda _m, a, _o, n=n: got[n].append(a[0].detach()))
               for n in names]
    try:
        with torch.no_grad():
            for c in _chunks(x, batch_tokens):
                block(c, cos, sin)
    finally:
        for h in handles:
            h.remove()
    return {n: torch.cat(v) for n, v in got.items()}


@torch.no_grad()
def awq_scale_block(block: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cfg: AWQConfig,
                    *, feats: dict[str, torch.Tensor] | None = None,
                    residual: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Search and fold the AWQ scales of a Llama block, given its inputs x (B, S, E) and rope cos/sin.
    Returns prev-op name -> s. The block's float function is unchanged (up to the dtype's rounding).
    `feats` (the captured linear inputs), when given, are rescaled in place to match. `residual`:
    (r_mid, r_out) token weights (calibrate.residual_weights) for the attention's and the MLP's losses."""
    attn, mlp = block.self_attn, block.mlp
    if feats is None:
        feats = _capture_inputs(block, x, cos, sin, ["self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj",
                                                      "mlp.down_proj"], cfg.batch_tokens)
    r_mid, r_out = residual if residual is not None else (None, None)
    groups = [("input_layernorm", block.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj],
               lambda h: attn(h, cos, sin), "self_attn.q_proj", r_mid)]
    if attn.v_proj.out_features == attn.o_proj.in_features:  # MHA: v's outputs are o's inputs
        groups.append(("self_attn.v_proj", attn.v_proj, [attn.o_proj], attn.o_proj, "self_attn.o_proj", r_mid))
    groups += [("post_attention_layernorm", block.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj], mlp,
                "mlp.gate_proj", r_out),
               ("mlp.up_proj", mlp.up_proj, [mlp.down_proj], mlp.down_proj, "mlp.down_proj", r_out)]
    found = {}
    for prev_name, prev, linears, fn, feat_name, tw in groups:
        s, _ = search_scales(feats[feat_name], linears, fn, cfg, tw)
        apply_scales(prev, linears, s)
        feats[feat_name] = (feats[feat_name].float() / s.to(feats[feat_name].device)).to(feats[feat_name].dtype)
        found[prev_name] = s
    return found


LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_INPUT_OF = {"self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.q_proj",
             "self_attn.v_proj": "self_attn.q_proj", "self_attn.o_proj": "self_attn.o_proj",
             "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.gate_proj", "mlp.down_proj": "mlp.down_proj"}


@torch.no_grad()
def awq_block(block: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cfg: AWQConfig,
              *, name: str = "block") -> dict[str, QuantizedWeight]:
    """AWQ of one Llama block in place: scales folded, weights clipped, then every linear quantized
    (its weight replaced by the dequantized value). Returns linear name -> its QuantizedWeight."""
    feats = _capture_inputs(block, x, cos, sin, sorted(set(_INPUT_OF.values())), cfg.batch_tokens)
    residual = None  # (r_mid, r_out), (B, S) each: "attention_residual" (api.QuantizeConfig.token_weighting)
    if cfg.token_weighting == "attention_residual":
        residual = residual_weights(block, x, cos, sin, cfg.batch_tokens)
    mass = None  # (B, S): the attention each token receives in the float block
    if cfg.clip and cfg.token_weighting != "uniform":
        mass = attention_mass(block.self_attn, feats["self_attn.q_proj"], cos, sin,
                              query_weight=None if residual is None else residual[0])
    awq_scale_block(block, x, cos, sin, cfg, feats=feats, residual=residual)
    mods = dict(block.named_modules())
    records = {}
    for lin_name in LINEARS:
        lin = mods[lin_name]
        if cfg.clip and (cfg.clip_qk or lin_name not in NO_CLIP):
            if lin_name in WEIGHTED_CLIP:
                weight = mass
            elif residual is not None:
                weight = residual[0] if lin_name == "self_attn.o_proj" else residual[1]
            else:
                weight = None
            apply_clip(lin, *search_clip(lin.weight, feats[_INPUT_OF[lin_name]], cfg, weight))
        rec = quantize_rtn(lin.weight, bits=cfg.bits, group_size=cfg.group_size, sym=cfg.sym,
                           v1_zeros=cfg.v1_zeros, name=f"{name}.{lin_name}")
        lin.weight.copy_(rec.dequantize(lin.weight.dtype))
        records[lin_name] = rec
    return records
