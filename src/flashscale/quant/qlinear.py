"""QuantLinear: the runtime 4-bit linear (buffers only), and replace_linears to put it into a Llama.

The persistent buffers are the GPTQ checkpoint tensors, so state_dict() round-trips a GPTQ layer:
    qweight int32 (K/8, N), qzeros int32 (K/G, N/8), scales fp16 (K/G, N), g_idx int32 (K,), [bias (N,)]
(checkpoint_format "gptq" stores zero - 1, "gptq_v2" the zero itself). At construction and after every
load_state_dict they are repacked once into the kernels' layout (flashscale.kernels.w4a16_pack; the
non-persistent buffers pk_*), which forward uses: CUDA -> the W4A16 Triton kernels, CPU -> the
reference (dequantize, then F.linear). AWQ checkpoints convert to the GPTQ tensors on the way in.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from flashscale.kernels.w4a16_pack import (GPTQ_FORMATS, PackedW4, awq_codes, from_gptq as pack_from_gptq,
                                           to_gptq)
from flashscale.ops.w4a16 import w4a16_linear


def _check_bits(bits: int) -> None:
    if bits != 4:
        raise NotImplementedError(f"QuantLinear runs 4-bit weights; got bits={bits}")


def _repack_after_load(module: "QuantLinear", _incompatible) -> None:
    module.repack()


class QuantLinear(nn.Module):
    """y = x @ W^T + b with W (out_features, in_features) stored as GPTQ 4-bit tensors."""

    def __init__(self, in_features: int, out_features: int, *, group_size: int = 128, bias: bool = False,
                 checkpoint_format: str = "gptq", bits: int = 4, device=None):
        super().__init__()
        _check_bits(bits)
        if checkpoint_format not in GPTQ_FORMATS:
            raise ValueError(f"checkpoint_format={checkpoint_format!r}; expected one of {GPTQ_FORMATS}")
        g = in_features if group_size == -1 else group_size
        if in_features % 8 or out_features % 8:
            raise ValueError(f"in_features={in_features} and out_features={out_features} must be multiples of 8 "
                             "(eight 4-bit values per int32 word)")
        if g <= 0 or in_features % g:
            raise ValueError(f"group_size={group_size} must be -1 or a positive divisor of in_features={in_features}")
        self.in_features, self.out_features = in_features, out_features
        self.group_size, self.bits, self.checkpoint_format = group_size, bits, checkpoint_format
        ng = in_features // g
        self.register_buffer("qweight", torch.zeros(in_features // 8, out_features, dtype=torch.int32, device=device))
        self.register_buffer("qzeros", torch.zeros(ng, out_features // 8, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.zeros(ng, out_features, dtype=torch.float16, device=device))
        self.register_buffer("g_idx", (torch.arange(in_features, device=device) // g).to(torch.int32))
        if bias:
            self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float16, device=device))
        else:
            self.bias = None
        self.register_buffer("pk_qweight", None, persistent=False)
        self.register_buffer("pk_sz", None, persistent=False)
        self.register_buffer("pk_perm", None, persistent=False)
        self.register_load_state_dict_post_hook(_repack_after_load)

    @torch.no_grad()
    def repack(self) -> "QuantLinear":
        """Rebuild the kernel layout from the GPTQ buffers (after they changed)."""
        p = pack_from_gptq(self.qweight, self.qzeros, self.scales, self.g_idx,
                           checkpoint_format=self.checkpoint_format, group_size=self.group_size)
        self.pk_qweight, self.pk_sz, self.pk_perm = p.qweight, p.sz, p.perm
        return self

    def packed(self) -> PackedW4:
        """The kernel-layout weight; the same object while the pk_* buffers are (kernels keep per-weight host
        state on it, e.g. w4a16_wgmma's TMA descriptors)."""
        if self.pk_qweight is None:
            self.repack()
        p = self.__dict__.get("_packed")
        if p is None or p.qweight is not self.pk_qweight or p.sz is not self.pk_sz or p.perm is not self.pk_perm:
            p = PackedW4(qweight=self.pk_qweight, sz=self.pk_sz, perm=self.pk_perm, in_features=self.in_features,
                         out_features=self.out_features, group_size=self.in_features // self.scales.shape[0])
            self.__dict__["_packed"] = p
        return p

    def _apply(self, fn, recurse=True):
        # model.to(torch.bfloat16) must not round the float16 scales (the checkpoint's values and
        # what repack reads): they follow the device, never the dtype
        scales = self.scales
        super()._apply(fn, recurse)
        self.scales = scales.to(self.qweight.device)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return w4a16_linear(x, self.packed(), self.bias, impl=None if x.is_cuda else "reference")

    @torch.no_grad()
    def accumulate_(self, x: torch.Tensor, out: torch.Tensor, prologue=None,
                    trace: torch.Tensor | None = None, counter: torch.Tensor | None = None) -> torch.Tensor:
        """out (M, N) float32 += x (M, K) @ W^T (+ bias), in place; on CUDA at M <= 8 without bias by
        kernels.w4a16.w4a16_addmm_ (no split-K fold at the kernel's end: a decode step's consumers read the fp32
        sum, infer.decode.StaticDecoder(accumulate=True)), otherwise through forward. prologue
        (kernels.w4a16_prologue.XNorm / XSiLU / XAttn): x (contiguous (M, K)) is first written from it, by the
        kernel's programs where it can (no act-order), else by the prologue's PyTorch reference. trace: the ring
        kernel's per-program timestamps (w4a16_addmm_'s diagnostics), counter: its items taken dynamically (a zeroed
        int32; w4a16_addmm_'s); both unused where the kernel does not run. Returns out."""
        from flashscale.kernels import w4a16_prologue

        x2d = x.reshape(-1, x.shape[-1])
        if tuple(out.shape) != (x2d.shape[0], self.out_features) or out.dtype != torch.float32:
            raise ValueError(f"out must be float32 ({x2d.shape[0]}, {self.out_features}), got {out.dtype} "
                             f"{tuple(out.shape)}")
        kernel = self.can_accumulate(x2d)
        if prologue is not None:
            if x2d.data_ptr() != x.data_ptr() or not x2d.is_contiguous():
                raise ValueError("accumulate_ with a prologue writes x: x must be a contiguous (M, K) buffer")
            if not kernel or self.packed().perm is not None:  # the kernel's programs cannot: PyTorch first
                w4a16_prologue.check(prologue, x2d)  # (w4a16_addmm_ checks it where the kernel runs it)
                w4a16_prologue.reference(prologue, x2d)
                prologue = None
        if kernel:
            from flashscale.kernels.w4a16 import w4a16_addmm_

            return w4a16_addmm_(out, x2d if x2d.stride(-1) == 1 else x2d.contiguous(), self.packed(),
                                prologue=prologue, trace=trace, counter=counter)
        return out.add_(self(x2d).float())

    def can_accumulate(self, x2d: torch.Tensor) -> bool:
        """Whether accumulate_ runs the red.add kernel for x2d (else it adds forward's output)."""
        from flashscale.kernels.w4a16 import ring_candidates

        return (x2d.is_cuda and self.bias is None and x2d.dtype in (torch.float16, torch.bfloat16)
                and bool(ring_candidates(self.packed(), x2d.shape[0])))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}, checkpoint_format={self.checkpoint_format}, "
                f"act_order={self.pk_perm is not None}, bias={self.bias is not None}")

    @classmethod
    @torch.no_grad()
    def from_gptq(cls, *, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  g_idx: torch.Tensor | None = None, bias: torch.Tensor | None = None, bits: int = 4,
                  group_size: int | None = None, checkpoint_format: str = "gptq") -> "QuantLinear":
        """A layer from a GPTQ checkpoint's tensors (AutoGPTQ / GPTQModel / transformers layout)."""
        _check_bits(bits)
        for name, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                raise ValueError(f"{name} must be a 2-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
        k, n = qweight.shape[0] * 8, qweight.shape[1]
        ng = scales.shape[0]
        if ng <= 0 or k % ng:
            raise ValueError(f"scales has {ng} groups, which does not divide in_features={k}")
        g = k // ng
        if group_size is not None and group_size != -1 and group_size != g:
            raise ValueError(f"group_size={group_size} disagrees with the tensors (in_features={k}, {ng} groups)")
        gs = -1 if (group_size == -1 or (group_size is None and ng == 1)) else g
        mod = cls(k, n, group_size=gs, bias=bias is not None, checkpoint_format=checkpoint_format, device="meta")
        mod.qweight, mod.qzeros = qweight.to(torch.int32), qzeros.to(torch.int32)
        mod.scales = scales.to(torch.float16)
        mod.g_idx = (g_idx if g_idx is not None else torch.arange(k, device=qweight.device) // g).to(torch.int32)
        if bias is not None:
            mod.bias = bias.detach().clone()
        return mod.repack()

    @classmethod
    @torch.no_grad()
    def from_awq(cls, *, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                 bias: torch.Tensor | None = None, group_size: int | None = None, bits: int = 4) -> "QuantLinear":
        """A layer from an AutoAWQ GEMM checkpoint's tensors, stored as gptq_v2 (AWQ keeps zeros as is)."""
        _check_bits(bits)
        codes, zeros, scales16, g = awq_codes(qweight, qzeros, scales, group_size)
        k = codes.shape[0]
        t = to_gptq(codes, zeros, scales16, torch.arange(k, device=codes.device) // g, checkpoint_format="gptq_v2")
        return cls.from_gptq(**t, bias=bias, group_size=-1 if group_size == -1 else g, checkpoint_format="gptq_v2")

    @classmethod
    @torch.no_grad()
    def from_float(cls, linear: nn.Linear, *, bits: int = 4, group_size: int = 128, sym: bool = True) -> "QuantLinear":
        """Round-to-nearest 4-bit quantization of an nn.Linear (GPTQ's grid: sym -> zero 8,
        scale = 2 max|w| / 15; asym -> scale = (max - min) / 15, zero = round(-min / scale)), for tests
        and speed runs. flashscale.quant's RTN/GPTQ/AWQ are the real quantizers."""
        _check_bits(bits)
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        n, k = linear.weight.shape
        g = k if group_size == -1 else group_size
        if g <= 0 or k % g:
            raise ValueError(f"group_size={group_size} must be -1 or a positive divisor of in_features={k}")
        w = linear.weight.detach().float().t().reshape(k // g, g, n)  # (NG, G, N)
        wmin = w.amin(1).clamp(max=0)
        wmax = w.amax(1).clamp(min=0)
        if sym:
            wmax = torch.maximum(wmax, -wmin)
            scale = 2 * wmax / 15
        else:
            scale = (wmax - wmin) / 15
        scale = torch.where(scale == 0, torch.ones_like(scale), scale).half().float()  # (NG, N), exactly fp16
        zero = torch.full_like(scale, 8.0) if sym else torch.round(-wmin / scale).clamp(0, 15)
        codes = torch.clamp(torch.round(w / scale[:, None]) + zero[:, None], 0, 15).reshape(k, n)
        t = to_gptq(codes.to(torch.int64), zero.to(torch.int64), scale.half(),
                    torch.arange(k, device=codes.device) // g, checkpoint_format="gptq_v2")
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float16)
        return cls.from_gptq(**t, bias=bias, group_size=group_size, checkpoint_format="gptq_v2")


def replace_linears(model: nn.Module, quantized_state: Mapping[str, torch.Tensor], *,
                    checkpoint_format: str = "gptq", bits: int = 4) -> list[str]:
    """Swap every nn.Linear of `model` whose GPTQ tensors are in `quantized_state` for a QuantLinear.

    quantized_state maps "<module>.qweight", ".qzeros", ".scales" (and optionally ".g_idx", ".bias") to
    tensors, with or without HF's "model." prefix (e.g. "layers.0.self_attn.q_proj.qweight"). A layer
    without a ".bias" entry keeps its float bias. Returns the replaced module names, in model order.
    """
    if not isinstance(quantized_state, Mapping):
        raise TypeError(f"quantized_state must be a mapping of tensor names, got {type(quantized_state).__name__}")
    stems = {}
    for key in quantized_state:
        if key.endswith(".qweight"):
            stem = key[: -len(".qweight")]
            stems[stem.removeprefix("model.") if stem.startswith("model.layers") else stem] = stem
    modules = dict(model.named_modules())
    unknown = sorted(s for s in stems if s not in modules)
    if unknown:
        raise ValueError(f"quantized_state has layers the model does not: {unknown[:5]}")
    done = []
    for name in (n for n in modules if n in stems):
        old = modules[name]
        if not isinstance(old, nn.Linear):
            raise ValueError(f"{name} is a {type(old).__name__}, not an nn.Linear")
        src = stems[name]
        try:
            t = {leaf: quantized_state[f"{src}.{leaf}"] for leaf in ("qweight", "qzeros", "scales")}
        except KeyError as e:
            raise ValueError(f"quantized_state lacks {e.args[0]}") from None
        dev = old.weight.device if old.weight.device.type != "meta" else t["qweight"].device
        bias = quantized_state.get(f"{src}.bias", old.bias)
        new = QuantLinear.from_gptq(**{k: v.to(dev) for k, v in t.items()},
                                    g_idx=None if f"{src}.g_idx" not in quantized_state else quantized_state[f"{src}.g_idx"].to(dev),
                                    bias=None if bias is None else bias.detach().to(dev), bits=bits,
                                    checkpoint_format=checkpoint_format)
        if (new.in_features, new.out_features) != (old.in_features, old.out_features):
            raise ValueError(f"{name}: the quantized tensors are {new.out_features}x{new.in_features}, the layer "
                             f"is {old.out_features}x{old.in_features}")
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, new)
        done.append(name)
    return done
