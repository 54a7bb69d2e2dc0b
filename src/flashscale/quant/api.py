"""`quantize_model`: RTN, GPTQ or AWQ of a Llama, block by block, to a quantized state (the model with
its linears' weights replaced by their dequantized values, and the integer codes/grids to pack).

GPTQ runs true-sequentially inside a block: the linears that read the same input form a group
(q/k/v; o; gate/up; down), and each group's Hessian is collected from a forward of the block whose
earlier groups are already quantized. A group shares one Hessian, so it is quantized in one GPTQ call
on its concatenated rows (GPTQ is row-independent given H: the result equals one call per linear).
The forward stops at the group's input (an exception raised in the hook), which saves most of the
block's compute for the early groups. With token_weighting="attention" (the default) q/k/v are two
calls: q_proj on the uniform Hessian, k_proj/v_proj on the attention-weighted one (QuantizeConfig).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import resource
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from flashscale.quant.awq import LINEARS, AWQConfig, awq_block
from flashscale.quant.calibrate import RunStats, attention_mass, micro_batches, residual_weights, run_blockwise
from flashscale.quant.gptq import GRID_SEARCHES, HessianAccumulator, gptq_quantize
from flashscale.quant.rtn import QuantizedWeight, check_bits, check_finite, check_group_size, quantize_rtn

METHODS = ("rtn", "gptq", "awq")
TOKEN_WEIGHTINGS = ("attention", "uniform", "attention_residual")
FORMATS = ("gptq", "gptq_v2", "awq")
# GPTQ's true-sequential groups: each reads the output of the groups before it
SEQUENTIAL = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
              ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))


@dataclass(kw_only=True)
class QuantizeConfig:
    method: str = "gptq"
    bits: int = 4
    group_size: int = 128
    sym: bool | None = None  # None: the method's usual choice (GPTQ/RTN symmetric, AWQ asymmetric)
    act_order: bool = False  # GPTQ only
    static_groups: bool = False  # GPTQ only
    damp_percent: float = 0.01  # GPTQ
    block_size: int = 128  # GPTQ lazy batch
    checkpoint_format: str = "gptq"  # the format the result will be written in ("gptq" v1 keeps zeros >= 1)
    # Weight of the first token of every calibration window in GPTQ's Hessians (1: the paper's uniform
    # weighting). That token becomes an attention sink (most of every query's attention mass) in many
    # LLMs, yet is 1/seqlen of H, so plain GPTQ may trade its k/v error for the other tokens' and raise
    # the block's output error above RTN's (seen on SmolLM2-135M; act-order avoids it too). Opt-in.
    sink_weight: float = 1.0
    # How GPTQ weights calibration tokens in the Hessian of k_proj/v_proj (and AWQ in its k/v losses):
    # "attention" (default) weights each token by the attention it receives in the float block
    # (calibrate.attention_mass, mean 1 over a window): a token's key and value reach every query in
    # proportion to it, so that is what their error costs. With uniform weights GPTQ moves rounding
    # error onto an attention sink's k/v (a low-energy input direction) and loses to RTN on SmolLM2
    # (docs/quant_quality.md). q_proj, o_proj and the MLP keep the uniform Hessian either way.
    # "uniform": the paper's objective, every token alike. "attention_residual": also weights every
    # token's error by 1/mean(h²) of the residual stream it is added to (calibrate.residual_weights),
    # the k/v mass by that of the queries reading it.
    token_weighting: str = "attention"
    # GPTQ: how a group's grid is fitted (gptq.GRID_SEARCHES): "minmax" (the paper), "mse" (the
    # reference quantizer's range-shrink search), "hessian" (that search scored by GPTQ's cost of each
    # column's rounding, 1/[U_jj]²: the default, docs/quant_quality.md)
    grid_search: str = "hessian"
    # GPTQ: aim each linear at the float model's output on the float model's input (W x_f) instead of
    # the float weight on the quantized input (W x, the paper's), so every layer also compensates the
    # error of the layers before it (GPTAQ's asymmetric calibration; gptq.gptq_quantize's shift). Costs
    # a float activation stream beside the quantized one and a float forward of each group.
    float_target: bool = False
    awq_grid: int = 20
    awq_clip: bool = True
    awq_duo_scaling: bool = False  # AWQ: also search AutoAWQ's duo-scaling candidates (awq.AWQConfig)
    # AWQ: clip-search q_proj/k_proj too (awq.AWQConfig.clip_qk; AutoAWQ skips them), k's loss weighted by
    # attention mass like v's; on SmolLM2's small protocol 4-bit ratio 0.512 -> 0.465 per-channel, 0.632 ->
    # 0.578 at g64 (docs/quant_quality.md)
    awq_clip_qk: bool = True
    awq_clip_mode: str = "max"  # AWQ: "max" (AutoAWQ's ±max|w| shrink) or "range" (awq.AWQConfig.clip_mode)
    awq_tokens: int = 65536  # calibration tokens AWQ's searches use (whole sequences, first ones)
    # AWQ: tokens of those the clip search's error is measured on (awq.AWQConfig.clip_tokens): 0 (default) all
    # of them, exactly, through each group's Gram matrix (so more tokens cost no memory); 512: AutoAWQ's
    # evenly spaced sample, whose 512 tokens a group of 64 weights can overfit (docs/quant_quality.md)
    awq_clip_tokens: int = 0
    # AWQ: search each block on the float model's activations (AutoAWQ's way: its inputs are computed
    # before any layer is quantized) instead of the quantized blocks' outputs (GPTQ's way, the default)
    awq_float_inputs: bool = False
    batch_tokens: int = 16384  # tokens a block forward processes at once

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not supported; takes one of {METHODS}")
        check_bits(self.bits)
        check_group_size(self.group_size)
        if self.sym is None:
            self.sym = self.method != "awq"
        if not (isinstance(self.sink_weight, (int, float)) and self.sink_weight >= 1.0):
            raise ValueError(f"sink_weight={self.sink_weight!r} must be a number >= 1")
        if self.awq_float_inputs and self.method != "awq":
            raise ValueError(f"awq_float_inputs=True is an AWQ option, got method={self.method!r} "
                             "(GPTQ's use of the float stream is float_target)")
        gptq_only = {"act_order": False, "static_groups": False, "sink_weight": 1.0, "grid_search": "hessian",
                     "float_target": False}
        for opt, off in gptq_only.items():
            if self.method != "gptq" and getattr(self, opt) != off:
                raise ValueError(f"{opt}={getattr(self, opt)!r} is a GPTQ option (one of {sorted(gptq_only)}), "
                                 f"got method={self.method!r}")
        if self.grid_search not in GRID_SEARCHES:
            raise ValueError(f"grid_search={self.grid_search!r} is not supported; takes one of {GRID_SEARCHES}")
        if self.token_weighting not in TOKEN_WEIGHTINGS:
            raise ValueError(f"token_weighting={self.token_weighting!r} is not supported; takes one of {TOKEN_WEIGHTINGS}")
        if self.checkpoint_format not in FORMATS:
            raise ValueError(f"checkpoint_format={self.checkpoint_format!r} is not supported; takes one of {FORMATS}")
        if self.checkpoint_format == "awq":
            if self.bits != 4:
                raise ValueError(f"checkpoint_format='awq' stores 4-bit weights only, got bits={self.bits}; "
                                 "use the GPTQ format")
            if self.act_order and not self.static_groups:
                raise ValueError("checkpoint_format='awq' has no g_idx, so act_order needs static_groups=True "
                                 "or the GPTQ format")
        if not (0.0 < self.damp_percent <= 1.0):
            raise ValueError(f"damp_percent={self.damp_percent!r} must be in (0, 1]")
        for f in ("block_size", "awq_grid", "awq_tokens", "batch_tokens"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{f}={v!r} must be a positive int")
        v = self.awq_clip_tokens
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"awq_clip_tokens={v!r} must be a positive int, or 0 for every calibration token")

    @property
    def v1_zeros(self) -> bool:
        """Asymmetric grids written in the GPTQ v1 layout keep their zero points >= 1 (pack.py)."""
        return self.checkpoint_format == "gptq" and not self.sym

    def settings(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(kw_only=True)
class QuantizeSummary:
    method: str
    bits: int
    group_size: int
    block_seconds: list[float]
    total_seconds: float
    peak_gpu_bytes: int | None  # None on the CPU
    peak_host_bytes: int
    resumed_blocks: int = 0
    device: str = "cpu"


@dataclass(kw_only=True)
class QuantizedModel:
    model: nn.Module  # weights of quantized linears hold their dequantized values
    records: dict[str, QuantizedWeight]  # "layers.3.mlp.up_proj" -> codes, scales, zeros, g_idx
    config: QuantizeConfig
    summary: QuantizeSummary = field(repr=False)


class _Stop(Exception):
    """Raised in a hook once a group's inputs are seen: the rest of the block's forward is not needed."""


def gptq_block_fn(cfg: QuantizeConfig):
    weighted = cfg.token_weighting != "uniform"
    residual = cfg.token_weighting == "attention_residual"

    @torch.no_grad()
    def run(block: nn.Module, x: torch.Tensor, cos, sin, name: str, x_float: torch.Tensor | None = None
            ) -> dict[str, QuantizedWeight]:
        if cfg.float_target and x_float is None:
            raise ValueError("float_target=True needs the float stream (run_blockwise(float_inputs=True))")
        mods = dict(block.named_modules())
        # float_target: the float block, fed the float stream, gives each group's float input x_f
        fmods = dict(copy.deepcopy(block).named_modules()) if cfg.float_target else None
        records = {}
        # "attention_residual": every token's error weighted by 1/mean(h²) of the residual it lands in
        r_mid = r_out = None
        if residual:
            r_mid, r_out = residual_weights(block, x, cos, sin, cfg.batch_tokens)  # (n, S) each, float block
        for gi, group in enumerate(SEQUENTIAL):
            lins = [mods[g] for g in group]
            cross = cfg.float_target
            acc = HessianAccumulator(lins[0].in_features, device=x.device, name=f"{name}.{group[0]}", cross=cross)
            # k/v's Hessian, tokens weighted by the attention they receive (QuantizeConfig.token_weighting)
            kv_acc = (HessianAccumulator(lins[0].in_features, device=x.device, name=f"{name}.{group[1]}", cross=cross)
                      if weighted and gi == 0 else None)
            # q/k/v and o write into the residual after the attention, gate/up and down after the MLP
            r = None if r_mid is None else (r_mid if gi < 2 else r_out)
            seen = [0]  # windows of x done: the micro-batch's rows of r
            float_in = [None]  # the float block's input to this group, for the micro-batch in flight

            def float_hook(_m, args, _out):
                float_in[0] = args[0]
                raise _Stop

            def hook(_m, args, _out):
                x = args[0]  # (b, S, K)
                rows = slice(seen[0], seen[0] + x.shape[0])
                seen[0] += x.shape[0]
                tw = None if r is None else r[rows]  # (b, S)
                # the float block's attention (q/k/v are still float here), on the unweighted inputs
                mass = (attention_mass(block.self_attn, x, cos, sin, query_weight=tw)
                        if kv_acc is not None else None)  # (b, S)
                xf = float_in[0]
                if cfg.sink_weight != 1.0:
                    x = x.clone()
                    x[:, 0] *= math.sqrt(cfg.sink_weight)  # H gains (w - 1)·x₀x₀ᵀ per window
                    if xf is not None:
                        xf = xf.clone()
                        xf[:, 0] *= math.sqrt(cfg.sink_weight)
                acc.add_batch(x, tw, x_float=xf)
                if kv_acc is not None:
                    kv_acc.add_batch(x, mass, x_float=xf)
                raise _Stop

            handle = lins[0].register_forward_hook(hook)
            fhandle = fmods[group[0]].register_forward_hook(float_hook) if fmods is not None else None
            try:
                chunks = micro_batches(x, cfg.batch_tokens)
                fchunks = micro_batches(x_float, cfg.batch_tokens) if fmods is not None else [None] * len(chunks)
                for c, fc in zip(chunks, fchunks):
                    if fc is not None:
                        try:
                            fmods[""](fc, cos, sin)
                        except _Stop:
                            pass
                    try:
                        block(c, cos, sin)
                    except _Stop:
                        pass
            finally:
                handle.remove()
                if fhandle is not None:
                    fhandle.remove()
            # (linear names, their shared Hessian): one GPTQ call each (rows are independent given H)
            calls = ([(group[:1], acc), (group[1:], kv_acc)] if kv_acc is not None else [(group, acc)])
            for names, a in calls:
                records.update(_gptq_linears(cfg, mods, names, a.H, name, shift=a.R))
            del acc, kv_acc, calls
        return records

    return run


def _gptq_linears(cfg: QuantizeConfig, mods: dict[str, nn.Module], names: tuple[str, ...], H: torch.Tensor,
                  block_name: str, shift: torch.Tensor | None = None) -> dict[str, QuantizedWeight]:
    """One GPTQ call on the concatenated rows of the linears `names` sharing Hessian H; their weights are
    replaced by the dequantized ones. Returns name -> QuantizedWeight."""
    lins = [mods[g] for g in names]
    label = f"{block_name}.{'/'.join(g.rsplit('.', 1)[-1] for g in names)}"
    w = torch.cat([lin.weight for lin in lins])  # (ΣN, K): rows of the group, one shared H
    res = gptq_quantize(w, H, bits=cfg.bits, group_size=cfg.group_size, sym=cfg.sym, act_order=cfg.act_order,
                        static_groups=cfg.static_groups, percdamp=cfg.damp_percent, block_size=cfg.block_size,
                        v1_zeros=cfg.v1_zeros, grid_search=cfg.grid_search, shift=shift, name=label)
    records, row = {}, 0
    for g, lin in zip(names, lins):
        n = lin.out_features
        q = res.qweight
        records[g] = QuantizedWeight(codes=q.codes[row:row + n].contiguous(), scales=q.scales[:, row:row + n].contiguous(),
                                     zeros=q.zeros[:, row:row + n].contiguous(), g_idx=q.g_idx.clone(),
                                     bits=q.bits, group_size=q.group_size, sym=q.sym)
        lin.weight.copy_(res.weight[row:row + n].to(lin.weight.dtype))
        row += n
    return records


def awq_block_fn(cfg: QuantizeConfig):
    acfg = AWQConfig(bits=cfg.bits, group_size=cfg.group_size, sym=cfg.sym, grid=cfg.awq_grid, clip=cfg.awq_clip,
                     batch_tokens=cfg.batch_tokens, v1_zeros=cfg.v1_zeros, token_weighting=cfg.token_weighting,
                     duo_scaling=cfg.awq_duo_scaling, clip_qk=cfg.awq_clip_qk,
                     clip_mode=cfg.awq_clip_mode, clip_tokens=cfg.awq_clip_tokens)

    def run(block: nn.Module, x: torch.Tensor, cos, sin, name: str, x_float: torch.Tensor | None = None
            ) -> dict[str, QuantizedWeight]:
        if cfg.awq_float_inputs:
            if x_float is None:
                raise ValueError("awq_float_inputs=True needs the float stream (run_blockwise(float_inputs=True))")
            x = x_float
        n = max(1, cfg.awq_tokens // x.shape[1])
        return awq_block(block, x[:n], cos, sin, acfg, name=name)

    return run


@torch.no_grad()
def rtn_model(model: nn.Module, cfg: QuantizeConfig) -> tuple[dict[str, QuantizedWeight], RunStats]:
    """RTN needs no calibration: every linear of every block, in place, on its current device."""
    records, stats = {}, RunStats()
    for i, block in enumerate(model.layers):
        t0 = time.perf_counter()
        mods = dict(block.named_modules())
        for lin_name in LINEARS:
            lin = mods[lin_name]
            full = f"layers.{i}.{lin_name}"
            r = quantize_rtn(lin.weight, bits=cfg.bits, group_size=cfg.group_size, sym=cfg.sym,
                             v1_zeros=cfg.v1_zeros, name=full)
            lin.weight.copy_(r.dequantize(lin.weight.dtype))
            records[full] = r.to("cpu")
        stats.block_seconds.append(time.perf_counter() - t0)
    return records, stats


def check_model(model: nn.Module, cfg: QuantizeConfig) -> None:
    """NaN/Inf weights and group sizes that do not divide a linear's inputs, named, before any work."""
    if not hasattr(model, "layers") or not hasattr(model, "config"):
        raise TypeError(f"model: takes a flashscale Llama, got {type(model).__name__}")
    for name, p in model.named_parameters():
        check_finite(p.detach(), name)
    for i, block in enumerate(model.layers):
        mods = dict(block.named_modules())
        for lin_name in LINEARS:
            lin = mods[lin_name]
            if not isinstance(lin, nn.Linear):
                raise TypeError(f"layers.{i}.{lin_name}: takes a float nn.Linear, got {type(lin).__name__} "
                                "(is the model already quantized?)")
            check_group_size(cfg.group_size, lin.in_features, name=f"layers.{i}.{lin_name}")


def _peak_host_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def quantize_model(model: nn.Module, method: str = "gptq", *, bits: int = 4, group_size: int = 128,
                   sym: bool | None = None, act_order: bool = False, calib_tokens: torch.Tensor | None = None,
                   device=None, work_dir=None, progress: bool = False, on_block_done=None,
                   **options) -> QuantizedModel:
    """Quantizes `model` in place and returns the quantized state and a summary.

    calib_tokens: LongTensor (nsamples, seqlen) of calibration windows (calibrate.calibration_tokens);
    required for GPTQ and AWQ. device: where each block is processed (default: cuda if available).
    work_dir: makes the run resumable (calibrate.py). options: the other QuantizeConfig fields
    (static_groups, damp_percent, block_size, checkpoint_format, awq_grid, awq_clip, awq_tokens,
    batch_tokens).
    """
    unknown = set(options) - {f.name for f in dataclasses.fields(QuantizeConfig)}
    if unknown:
        raise TypeError(f"quantize_model() got unknown options {sorted(unknown)}")
    cfg = QuantizeConfig(method=method, bits=bits, group_size=group_size, sym=sym, act_order=act_order, **options)
    check_model(model, cfg)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    if cfg.method == "rtn":
        records, stats = rtn_model(model, cfg)
    else:
        if calib_tokens is None:
            raise ValueError(f"method={cfg.method!r} needs calib_tokens (nsamples, seqlen) of calibration text")
        if calib_tokens.ndim == 2 and calib_tokens.shape[1] > model.config.max_position_embeddings:
            raise ValueError(f"calibration seqlen {calib_tokens.shape[1]} exceeds the model's "
                             f"max_position_embeddings={model.config.max_position_embeddings}")
        block_fn = gptq_block_fn(cfg) if cfg.method == "gptq" else awq_block_fn(cfg)
        records, stats = run_blockwise(model, calib_tokens, block_fn, device=device, batch_tokens=cfg.batch_tokens,
                                       work_dir=work_dir, settings=cfg.settings(), progress=progress,
                                       on_block_done=on_block_done, description=cfg.method,
                                       float_inputs=cfg.float_target or cfg.awq_float_inputs)
    total = time.perf_counter() - t0
    summary = QuantizeSummary(method=cfg.method, bits=cfg.bits, group_size=cfg.group_size,
                              block_seconds=stats.block_seconds, total_seconds=total,
                              peak_gpu_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
                              peak_host_bytes=_peak_host_bytes(), resumed_blocks=stats.resumed_blocks,
                              device=str(device))
    return QuantizedModel(model=model, records=records, config=cfg, summary=summary)
