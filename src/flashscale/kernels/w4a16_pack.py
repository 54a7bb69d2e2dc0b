"""W4A16 weights: the GPTQ / AWQ checkpoint formats in, one kernel-friendly layout out (repacked once).

Names: K input features, N output features, G group size (G = K for one group per row), NG = K / G.
Logical weight (y = x @ W): W[k, n] = (q[k, n] - z[g(k), n]) * s[g(k), n], q, z integers, s float16.

Checkpoint formats read here (4 bits):
  GPTQ    qweight int32 (K/8, N): q[k, n] at bits 4*(k % 8) of word [k // 8, n] (lowest first)
          qzeros  int32 (NG, N/8): z[g, n] at bits 4*(n % 8) of word [g, n // 8]; "gptq" (v1) stores
                  z - 1 (so a stored 15 reads back as 16), "gptq_v2" stores z
          scales  fp16 (NG, N); g_idx int32 (K,) the group of every input row (act-order: not monotone)
  AWQ     qweight int32 (K, N/8): q[k, n] at bits 4*REV[n % 8] of word [k, n // 8],
          REV = [0, 4, 1, 5, 2, 6, 3, 7] (the inverse of AutoAWQ's pack order [0, 2, 4, 6, 1, 3, 5, 7]);
          qzeros int32 (NG, N/8) the same order, stored as is; scales fp16 (NG, N); no g_idx.

Kernel layout (PackedW4), chosen so one 16-byte load per thread is the A operand of the tensor-core
MMA (A = W^T tile, rows n, columns k; m16n8k16 / wgmma register-A fragment, kWidth 2):
  qweight int32 (N_pad/16, K_pad/64, 32, 4), N_pad = ceil16(N), K_pad = ceil64(K) (zero padded).
          Word [nb, kt, lane, i] with g = lane // 4, t = lane % 4 holds 8 nibbles; nibble
          j = 4*k3 + 2*n3 + k0 (bits 4j..4j+3) is q[k, n] at
              n = 16*nb + 8*n3 + g,    k = 64*kt + 16*i + 8*k3 + 2*t + k0
          i.e. exactly the 8 values lane `lane` holds of a 16x16 A fragment, four K-steps of it in
          the 4 words of one 16-byte vector. The kernels turn nibbles into floats with one shift per
          two nibbles and one LOP3 each (w4a16_common.py says how), so the nibble order is fixed here.
  sz      int32 (NG, N_pad): the float32 bits of s * 2^11 (a float16 scale in float32 has 13 zero
          mantissa bits at the bottom) with the zero point in the low 5 bits (0..16: v1's 16 fits).
          4 bytes per group and column: one load gives scale and zero. Within each 16 columns the
          two rows a lane holds are adjacent: column 16*nb + 2*g + n3 is output n = 16*nb + 8*n3 + g,
          so a lane loads both with one 8-byte access.
  perm    int32 (K,) or None: act-order rows are sorted by group once here (k' -> original row
          perm[k']), so every group is G consecutive rows; the kernels read x[:, perm[k']].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FRAG_N = 16  # rows (output features) of one packed fragment
FRAG_K = 64  # input features of one packed fragment row (4 words x 16)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # nibble slot holding column n % 8 in AWQ's GEMM layout
GPTQ_FORMATS = ("gptq", "gptq_v2")
_ZERO_BITS = 5  # zero points 0..16 (GPTQ v1 reads a stored 15 as 16)


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 in [0, 2^32) -> int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _nibbles(words: torch.Tensor, count: int = 8) -> torch.Tensor:
    """int32 words (...) -> int64 nibbles (..., count), lowest bits first."""
    shifts = torch.arange(count, device=words.device, dtype=torch.int64) * 4
    return (words.to(torch.int64)[..., None] >> shifts) & 0xF


@dataclass(kw_only=True)
class PackedW4:
    """One linear's 4-bit weight in the kernels' layout (see the module docstring)."""

    qweight: torch.Tensor  # (N_pad/16, K_pad/64, 32, 4) int32
    sz: torch.Tensor  # (NG, N_pad) int32
    perm: torch.Tensor | None  # (K,) int32 or None
    in_features: int  # K
    out_features: int  # N
    group_size: int  # G (K when the checkpoint says -1)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def num_groups(self) -> int:
        return self.in_features // self.group_size

    @property
    def nbytes(self) -> int:
        """Bytes a kernel reads for the weight: packed codes and group scale/zero words."""
        return self.qweight.numel() * 4 + self.sz.numel() * 4

    def to(self, device) -> "PackedW4":
        return PackedW4(qweight=self.qweight.to(device), sz=self.sz.to(device),
                        perm=None if self.perm is None else self.perm.to(device),
                        in_features=self.in_features, out_features=self.out_features, group_size=self.group_size)


def _check_int(t: torch.Tensor, name: str, shape: tuple[int, ...] | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")


def _check_scales(scales: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    if not isinstance(scales, torch.Tensor):
        raise TypeError(f"scales must be a torch.Tensor, got {type(scales).__name__}")
    if tuple(scales.shape) != shape:
        raise ValueError(f"scales has shape {tuple(scales.shape)}, expected {shape}")
    if scales.dtype == torch.float16:
        return scales
    if scales.dtype in (torch.float32, torch.float64):
        s16 = scales.to(torch.float16)
        if torch.equal(s16.to(scales.dtype), scales):
            return s16
        raise ValueError("scales must hold float16 values (the checkpoint formats store float16); "
                         f"got {scales.dtype} values that float16 does not represent exactly")
    raise TypeError(f"scales must be float16, got {scales.dtype}")


def group_permutation(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """(K,) group of each row -> the stable sort of rows by group (None when already k // G).

    Raises ValueError unless every group has exactly `group_size` rows (then sorted row k' is in
    group k' // G, which is what the kernels assume).
    """
    k = g_idx.numel()
    expect = torch.arange(k, device=g_idx.device) // group_size
    if torch.equal(g_idx.long(), expect):
        return None
    if int(g_idx.min()) < 0 or int(g_idx.max()) >= k // group_size:
        raise ValueError(f"g_idx values must lie in [0, {k // group_size}); got [{int(g_idx.min())}, {int(g_idx.max())}]")
    perm = torch.sort(g_idx.long(), stable=True).indices
    if not torch.equal(g_idx.long()[perm], expect):
        raise ValueError(f"g_idx must give every group exactly {group_size} rows (the GPTQ layout); "
                         "this one has groups of unequal size")
    return perm.to(torch.int32)


def pack_w4(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, *, group_size: int,
            g_idx: torch.Tensor | None = None) -> PackedW4:
    """codes (K, N) ints in [0, 16), zeros (NG, N) ints in [0, 16], scales (NG, N) float16,
    g_idx (K,) or None (k // G) -> PackedW4. group_size -1 means one group per row."""
    if codes.dim() != 2:
        raise ValueError(f"codes must be 2-D (K, N), got shape {tuple(codes.shape)}")
    k, n = codes.shape
    g = k if group_size == -1 else group_size
    if not isinstance(g, int) or g <= 0 or k % g:
        raise ValueError(f"group_size={group_size} must be -1 or a positive divisor of K={k}")
    if k % 8:
        raise ValueError(f"K={k} (in_features) must be a multiple of 8 for 4-bit packing")
    ng = k // g
    scales = _check_scales(scales, (ng, n))
    if tuple(zeros.shape) != (ng, n):
        raise ValueError(f"zeros has shape {tuple(zeros.shape)}, expected {(ng, n)}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("codes must lie in [0, 15]")
    if zeros.numel() and (int(zeros.min()) < 0 or int(zeros.max()) > 16):
        raise ValueError("zero points must lie in [0, 16]")
    dev = codes.device
    perm = None
    if g_idx is not None:
        if tuple(g_idx.shape) != (k,):
            raise ValueError(f"g_idx has shape {tuple(g_idx.shape)}, expected ({k},)")
        perm = group_permutation(g_idx.to(dev), g)
    q = codes.to(torch.int64)
    if perm is not None:
        q = q[perm.long()]
    n_pad, k_pad = _ceil(n, FRAG_N), _ceil(k, FRAG_K)
    nb_count, kt_count = n_pad // FRAG_N, k_pad // FRAG_K
    words = torch.empty((nb_count, kt_count, 32, 4), dtype=torch.int32, device=dev)
    shifts = torch.arange(8, device=dev, dtype=torch.int64) * 4
    step = max(1, (1 << 22) // max(1, k_pad * FRAG_N))  # fragment rows per chunk: bounds int64 temporaries
    for nb0 in range(0, nb_count, step):
        nb1 = min(nb_count, nb0 + step)
        blk = torch.zeros((k_pad, (nb1 - nb0) * FRAG_N), dtype=torch.int64, device=dev)
        n0, n1 = nb0 * FRAG_N, min(n, nb1 * FRAG_N)
        blk[:k, : n1 - n0] = q[:, n0:n1]
        c = blk.reshape(kt_count, 4, 2, 4, 2, nb1 - nb0, 2, 8)  # kt, i, k3, t, k0, nb, n3, g
        c = c.permute(5, 0, 7, 3, 1, 2, 6, 4)  # nb, kt, g, t, i, k3, n3, k0
        c = c.reshape(nb1 - nb0, kt_count, 32, 4, 8)  # nibble j = 4*k3 + 2*n3 + k0
        words[nb0:nb1] = _to_int32((c << shifts).sum(-1))
    s12 = (scales.to(dev).float() * 2048.0).contiguous().view(torch.int32)
    sz = torch.zeros((ng, n_pad), dtype=torch.int32, device=dev)
    sz[:, :n] = s12 | zeros.to(dev).to(torch.int32)
    sz = sz.reshape(ng, n_pad // 16, 2, 8).transpose(2, 3).reshape(ng, n_pad).contiguous()  # (n3, g) -> (g, n3)
    return PackedW4(qweight=words, sz=sz, perm=perm, in_features=k, out_features=n, group_size=g)


def unpack_w4(p: PackedW4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PackedW4 -> codes (K, N) uint8 in the original row order, zeros (NG, N) int32,
    scales (NG, N) float16, g_idx (K,) int32. The exact inverse of pack_w4."""
    k, n = p.in_features, p.out_features
    nb_count, kt_count = p.qweight.shape[:2]
    nib = _nibbles(p.qweight)  # (NB, KT, 32, 4, 8)
    c = nib.reshape(nb_count, kt_count, 8, 4, 4, 2, 2, 2)  # nb, kt, g, t, i, k3, n3, k0
    c = c.permute(1, 4, 5, 3, 7, 0, 6, 2).reshape(kt_count * FRAG_K, nb_count * FRAG_N)  # k, n
    q = c[:k, :n]
    g_sorted = torch.arange(k, device=q.device, dtype=torch.int32) // p.group_size
    if p.perm is not None:
        perm = p.perm.long()
        q_orig = torch.empty_like(q)
        q_orig[perm] = q
        g_idx = torch.empty_like(g_sorted)
        g_idx[perm] = g_sorted
        q = q_orig
    else:
        g_idx = g_sorted
    sz = p.sz.reshape(p.sz.shape[0], -1, 8, 2).transpose(2, 3).reshape(p.sz.shape)[:, :n]  # (g, n3) -> (n3, g)
    zeros = sz & ((1 << _ZERO_BITS) - 1)
    scales = ((sz & -(1 << _ZERO_BITS)).view(torch.float32) / 2048.0).to(torch.float16)
    return q.to(torch.uint8), zeros, scales, g_idx


def gptq_codes(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               g_idx: torch.Tensor | None = None, *, checkpoint_format: str = "gptq",
               group_size: int | None = None):
    """GPTQ tensors -> codes (K, N), zeros (NG, N), scales (NG, N) fp16, g_idx (K,), group size G."""
    if checkpoint_format not in GPTQ_FORMATS:
        raise ValueError(f"checkpoint_format={checkpoint_format!r}; expected one of {GPTQ_FORMATS}")
    _check_int(qweight, "qweight")
    _check_int(qzeros, "qzeros")
    if qweight.dim() != 2 or qzeros.dim() != 2:
        raise ValueError(f"qweight and qzeros must be 2-D; got shapes {tuple(qweight.shape)}, {tuple(qzeros.shape)}")
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    ng = scales.shape[0] if scales.dim() == 2 else -1
    if n % 8:
        raise ValueError(f"N={n} (out_features) must be a multiple of 8 for packed GPTQ zero points")
    if ng <= 0 or k % ng:
        raise ValueError(f"scales shape {tuple(scales.shape)} does not give a group count dividing K={k}")
    g = k // ng
    if group_size is not None and group_size != -1 and group_size != g:
        raise ValueError(f"group_size={group_size} disagrees with the tensors (K={k}, {ng} groups -> {g})")
    _check_int(qzeros, "qzeros", (ng, n // 8))
    scales = _check_scales(scales, (ng, n))
    codes = _nibbles(qweight).permute(0, 2, 1).reshape(k, n)  # word [k//8, n], nibble k % 8
    zeros = _nibbles(qzeros).reshape(ng, n)
    if checkpoint_format == "gptq":
        zeros = zeros + 1
    if g_idx is not None:
        if not isinstance(g_idx, torch.Tensor) or g_idx.dim() != 1 or g_idx.numel() != k:
            raise ValueError(f"g_idx must be a 1-D tensor of {k} group indices")
        g_idx = g_idx.to(torch.int32)
    return codes, zeros, scales, g_idx, g


def awq_codes(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
              group_size: int | None = None):
    """AWQ GEMM tensors -> codes (K, N), zeros (NG, N), scales (NG, N) fp16, group size G."""
    _check_int(qweight, "qweight")
    _check_int(qzeros, "qzeros")
    if qweight.dim() != 2 or qzeros.dim() != 2 or scales.dim() != 2:
        raise ValueError("AWQ qweight, qzeros and scales must be 2-D")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    ng = scales.shape[0]
    if ng <= 0 or k % ng:
        raise ValueError(f"scales shape {tuple(scales.shape)} does not give a group count dividing K={k}")
    g = k // ng
    if group_size is not None and group_size != -1 and group_size != g:
        raise ValueError(f"group_size={group_size} disagrees with the tensors (K={k}, {ng} groups -> {g})")
    _check_int(qzeros, "qzeros", (ng, n // 8))
    scales = _check_scales(scales, (ng, n))
    slot = torch.tensor(AWQ_REVERSE_ORDER, device=qweight.device)
    codes = _nibbles(qweight)[..., slot].reshape(k, n)  # column 8c + j from slot REV[j]
    zeros = _nibbles(qzeros)[..., slot].reshape(ng, n)
    return codes, zeros, scales, g


def from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
              g_idx: torch.Tensor | None = None, *, checkpoint_format: str = "gptq",
              group_size: int | None = None) -> PackedW4:
    """Repack a GPTQ checkpoint's tensors (v1 "gptq" or "gptq_v2") for the kernels."""
    codes, zeros, scales, g_idx, g = gptq_codes(qweight, qzeros, scales, g_idx,
                                                checkpoint_format=checkpoint_format, group_size=group_size)
    return pack_w4(codes, zeros, scales, group_size=g, g_idx=g_idx)


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
             group_size: int | None = None) -> PackedW4:
    """Repack an AWQ GEMM checkpoint's tensors for the kernels."""
    codes, zeros, scales, g = awq_codes(qweight, qzeros, scales, group_size)
    return pack_w4(codes, zeros, scales, group_size=g)


def to_gptq(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, *,
            checkpoint_format: str = "gptq_v2") -> dict[str, torch.Tensor]:
    """codes (K, N), zeros (NG, N), scales (NG, N), g_idx (K,) -> GPTQ tensors (the inverse of gptq_codes)."""
    if checkpoint_format not in GPTQ_FORMATS:
        raise ValueError(f"checkpoint_format={checkpoint_format!r}; expected one of {GPTQ_FORMATS}")
    k, n = codes.shape
    shifts = torch.arange(8, device=codes.device, dtype=torch.int64) * 4
    qweight = _to_int32((codes.to(torch.int64).reshape(k // 8, 8, n) << shifts[None, :, None]).sum(1))
    z = zeros.to(torch.int64)
    if checkpoint_format == "gptq":
        if int(z.min()) < 1:
            raise ValueError("GPTQ v1 stores zero - 1, so it cannot hold a zero point of 0; use gptq_v2")
        z = z - 1
    elif int(z.max()) > 15:
        raise ValueError("gptq_v2 stores zero points in 4 bits; a zero point of 16 needs the v1 format")
    qzeros = _to_int32((z.reshape(z.shape[0], n // 8, 8) << shifts).sum(-1))
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales.to(torch.float16), "g_idx": g_idx.to(torch.int32)}
