"""The GPTQ and AWQ (GEMM) checkpoint formats of a quantized linear, byte-compatible with
AutoGPTQ/GPTQModel, AutoAWQ, transformers and vLLM.

GPTQ (AutoGPTQ's layout; K input features, N output features, G group size, NG = K / G groups):
    qweight  int32 (K·b/32, N)   codes along K, packed into words, lowest bits first
    qzeros   int32 (NG, N·b/32)  integer zero points along N, same packing;
                                 v1 ("gptq"): stored as zero - 1; v2 ("gptq_v2", GPTQModel): as is
    scales   fp16  (NG, N)
    g_idx    int32 (K,)          group of each input column (act-order makes it a permutation's image)
    dequantized W[n, k] = (code[k, n] - zero[g_idx[k], n]) * scale[g_idx[k], n]
Bits 2, 4, 8 fill a word with 32/b values. 3 bits is AutoGPTQ's layout: 32 values are a 96-bit little-
endian stream over 3 words, value i at stream bits [3i, 3i+3), so values 10 and 21 straddle two words.
Both are the same rule, "value i of a run of 32 sits at bit b·i of a b-word little-endian stream",
which is how this file packs every width.

AWQ GEMM (AutoAWQ's WQLinear_GEMM; 4 bits only, no g_idx, zero points stored as is):
    qweight  int32 (K, N/8)   8 codes along N per word, nibble j holding column AWQ_ORDER[j]
    qzeros   int32 (NG, N/8)  same order
    scales   fp16  (NG, N)
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7] interleaves the columns for the dequantizing kernel's
lop3-based unpack (two fp16 pairs per instruction).
"""

from __future__ import annotations

import torch

from flashscale.quant.rtn import QuantizedWeight, check_bits, default_g_idx

GPTQ_FORMATS = ("gptq", "gptq_v2")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # nibble holding column j: AWQ_ORDER's inverse


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words in [0, 2^32) -> int32 with the same bits (two's complement)."""
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


_CHUNK = 1 << 22  # values handled at once: bounds the int64 temporaries of a big layer to ~100 MB


def _pack_rows(v: torch.Tensor, bits: int) -> torch.Tensor:
    """(R, L) int64 values -> (R, L·bits/32) int64 words."""
    r, length = v.shape
    if bits == 3:
        # the 96-bit stream of each run of 32 values: bit j of value i -> stream bit 3i + j
        bitplanes = (v.reshape(r, length // 32, 32, 1) >> torch.arange(3, device=v.device)) & 1  # (R, U, 32, 3)
        stream = bitplanes.reshape(r, length // 32, 3, 32)  # (R, U, word, bit-in-word)
        return (stream << torch.arange(32, device=v.device)).sum(-1).reshape(r, -1)  # (R, 3U)
    run = 32 // bits
    shifts = torch.arange(run, device=v.device) * bits
    return (v.reshape(r, length // run, run) << shifts).sum(-1)  # (R, L/run)


def _unpack_rows(w: torch.Tensor, bits: int) -> torch.Tensor:
    """(R, W) int64 words in [0, 2^32) -> (R, W·32/bits) int64 values."""
    r, n = w.shape
    if bits == 3:
        stream = (w.reshape(r, n // 3, 3, 1) >> torch.arange(32, device=w.device)) & 1  # (R, U, 3, 32)
        bitplanes = stream.reshape(r, n // 3, 32, 3)
        return (bitplanes << torch.arange(3, device=w.device)).sum(-1).reshape(r, -1)
    shifts = torch.arange(32 // bits, device=w.device) * bits
    return ((w[..., None] >> shifts) & (2 ** bits - 1)).reshape(r, -1)


def _by_chunks(fn, x: torch.Tensor, bits: int) -> torch.Tensor:
    rows = max(1, _CHUNK // max(1, x.shape[1]))
    return torch.cat([fn(c, bits) for c in x.split(rows)]) if x.shape[0] else fn(x, bits)


def pack_along(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Integer values in [0, 2^bits) -> int32 words along `dim` (32 values -> `bits` words).

    The length of `dim` must be a multiple of 32 for 3 bits, of 32/bits otherwise.
    """
    check_bits(bits)
    v = values.movedim(dim, -1).to(torch.int64)
    lead, length = v.shape[:-1], v.shape[-1]
    run = 32 if bits == 3 else 32 // bits  # values per packing unit
    if length % run:
        raise ValueError(f"cannot pack {length} values of {bits} bits: takes a multiple of {run}")
    if v.numel() and (int(v.min()) < 0 or int(v.max()) >= 2 ** bits):
        raise ValueError(f"values to pack lie in [{int(v.min())}, {int(v.max())}], outside [0, {2 ** bits - 1}]")
    words = _by_chunks(_pack_rows, v.reshape(-1, length), bits)
    return _to_int32(words.reshape(*lead, -1)).movedim(-1, dim).contiguous()


def unpack_along(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words -> int32 values in [0, 2^bits) along `dim` (the inverse of pack_along)."""
    check_bits(bits)
    if words.dtype != torch.int32:
        raise TypeError(f"packed tensor must be int32, got {words.dtype}")
    w = words.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF
    lead, n = w.shape[:-1], w.shape[-1]
    if bits == 3 and n % 3:
        raise ValueError(f"3-bit packed length {n} is not a multiple of 3 words")
    values = _by_chunks(_unpack_rows, w.reshape(-1, n), bits)
    return values.reshape(*lead, -1).to(torch.int32).movedim(-1, dim).contiguous()


def check_gptq_format(checkpoint_format: str) -> str:
    if checkpoint_format not in GPTQ_FORMATS:
        raise ValueError(f"checkpoint_format={checkpoint_format!r} is not a GPTQ format; takes one of {GPTQ_FORMATS}")
    return checkpoint_format


def pack_gptq(qw: QuantizedWeight, *, checkpoint_format: str = "gptq", name: str = "layer") -> dict[str, torch.Tensor]:
    """QuantizedWeight -> {qweight, qzeros, scales, g_idx} in the GPTQ layout (on the CPU)."""
    check_gptq_format(checkpoint_format)
    n, k = qw.shape
    bits = qw.bits
    zeros = qw.zeros.cpu().to(torch.int64)  # (NG, N)
    if checkpoint_format == "gptq":
        if int(zeros.min()) < 1:
            raise ValueError(f"{name}: a zero point of 0 cannot be stored in the GPTQ v1 layout (it stores "
                             "zero - 1); quantize with v1_zeros=True, use sym=True, or write checkpoint_format="
                             "'gptq_v2'")
        zeros = zeros - 1
    try:
        qweight = pack_along(qw.codes.cpu().t(), bits, dim=0)  # (K·b/32, N)
        qzeros = pack_along(zeros, bits, dim=1)  # (NG, N·b/32)
    except ValueError as e:
        raise ValueError(f"{name}: {e} (in_features={k}, out_features={n})") from None
    return {"qweight": qweight, "qzeros": qzeros, "scales": qw.scales.cpu().to(torch.float16).contiguous(),
            "g_idx": qw.g_idx.cpu().to(torch.int32).clone()}


def infer_group_size(g_idx: torch.Tensor, num_groups: int) -> int:
    """The group size a GPTQ tensor set was written with (-1 for a single group)."""
    k = g_idx.numel()
    if num_groups == 1:
        return -1
    if k % num_groups:
        raise ValueError(f"g_idx of {k} columns does not split into {num_groups} equal groups")
    return k // num_groups


def unpack_gptq(tensors: dict[str, torch.Tensor], *, bits: int, checkpoint_format: str = "gptq",
                group_size: int | None = None, sym: bool = True, name: str = "layer") -> QuantizedWeight:
    """{qweight, qzeros, scales[, g_idx]} in the GPTQ layout -> QuantizedWeight.

    v1 zero points are read as stored + 1 without masking, as AutoGPTQ's dequantizer does (so a
    stored 2^b - 1 reads as 2^b)."""
    check_gptq_format(checkpoint_format)
    missing = [t for t in ("qweight", "qzeros", "scales") if t not in tensors]
    if missing:
        raise ValueError(f"{name}: GPTQ tensors missing: {missing}")
    qweight, qzeros, scales = tensors["qweight"], tensors["qzeros"], tensors["scales"]
    codes = unpack_along(qweight, bits, dim=0)  # (K, N)
    k, n = codes.shape
    zeros = unpack_along(qzeros, bits, dim=1)  # (NG, N)
    ng = scales.shape[0]
    if scales.shape != (ng, n) or zeros.shape != (ng, n):
        raise ValueError(f"{name}: inconsistent GPTQ shapes: qweight {tuple(qweight.shape)}, qzeros "
                         f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)} for {bits} bits")
    if checkpoint_format == "gptq":
        zeros = zeros + 1
    g_idx = tensors.get("g_idx")
    if g_idx is None:
        gs = group_size if group_size not in (None, -1) else k // ng
        g_idx = (torch.arange(k) // gs).to(torch.int32)
    g_idx = g_idx.to(torch.int32).cpu()
    if g_idx.shape != (k,) or (k and (int(g_idx.min()) < 0 or int(g_idx.max()) >= ng)):
        raise ValueError(f"{name}: g_idx of shape {tuple(g_idx.shape)} does not index {ng} groups of {k} columns")
    gs = infer_group_size(g_idx, ng) if group_size is None else group_size
    return QuantizedWeight(codes=codes.t().to(torch.uint8).contiguous(), scales=scales.float(), zeros=zeros,
                           g_idx=g_idx, bits=bits, group_size=gs, sym=sym)


def pack_awq(qw: QuantizedWeight, *, name: str = "layer") -> dict[str, torch.Tensor]:
    """QuantizedWeight -> {qweight, qzeros, scales} in AutoAWQ's GEMM layout (4 bits, no act-order)."""
    n, k = qw.shape
    if qw.bits != 4:
        raise ValueError(f"{name}: the AWQ GEMM format stores 4-bit weights only, got bits={qw.bits}; "
                         "use the GPTQ format")
    if not torch.equal(qw.g_idx.cpu(), default_g_idx(k, qw.group_size)):
        raise ValueError(f"{name}: the AWQ format has no g_idx, so act-order weights (non-contiguous groups) "
                         "need the GPTQ format")
    if n % 8:
        raise ValueError(f"{name}: AWQ packs 8 output features per word; out_features={n} is not a multiple of 8")
    order = torch.tensor(AWQ_ORDER)

    def pack(v: torch.Tensor) -> torch.Tensor:  # (R, N) -> (R, N/8)
        v = v.reshape(v.shape[0], n // 8, 8)[..., order]  # nibble j <- column AWQ_ORDER[j]
        return pack_along(v.reshape(v.shape[0], n), 4, dim=1)

    return {"qweight": pack(qw.codes.cpu().t().to(torch.int64)),  # (K, N/8)
            "qzeros": pack(qw.zeros.cpu().to(torch.int64)),  # (NG, N/8)
            "scales": qw.scales.cpu().to(torch.float16).contiguous()}


def unpack_awq(tensors: dict[str, torch.Tensor], *, group_size: int | None = None, name: str = "layer") -> QuantizedWeight:
    """{qweight, qzeros, scales} in the AWQ GEMM layout -> QuantizedWeight (4 bits, asymmetric)."""
    missing = [t for t in ("qweight", "qzeros", "scales") if t not in tensors]
    if missing:
        raise ValueError(f"{name}: AWQ tensors missing: {missing}")
    rev = torch.tensor(AWQ_REVERSE_ORDER)

    def unpack(w: torch.Tensor) -> torch.Tensor:  # (R, N/8) -> (R, N)
        v = unpack_along(w, 4, dim=1)
        return v.reshape(v.shape[0], -1, 8)[..., rev].reshape(v.shape[0], -1)

    codes, zeros, scales = unpack(tensors["qweight"]), unpack(tensors["qzeros"]), tensors["scales"]  # (K, N), (NG, N)
    k, n = codes.shape
    ng = scales.shape[0]
    if scales.shape != (ng, n) or zeros.shape != (ng, n) or k % ng:
        raise ValueError(f"{name}: inconsistent AWQ shapes: qweight {tuple(tensors['qweight'].shape)}, qzeros "
                         f"{tuple(tensors['qzeros'].shape)}, scales {tuple(scales.shape)}")
    gs = (k // ng if ng > 1 else -1) if group_size is None else group_size
    return QuantizedWeight(codes=codes.t().to(torch.uint8).contiguous(), scales=scales.float(), zeros=zeros,
                           g_idx=default_g_idx(k, gs if ng > 1 else -1), bits=4, group_size=gs, sym=False)
