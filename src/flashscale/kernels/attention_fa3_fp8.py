"""FlashAttention-3's FP8 forward (section 3.3) for Hopper (sm_90) in Gluon: the ping-pong kernel of
kernels/attention_fa3.py with e4m3 operands on both GEMMs.

Inputs are those of flashscale.ops.attention_fp8_quantized (the pre-pass of kernels/hadamard.py):
q8 (B, Sq, H, D), k8 (B, Sk, Hkv, D) e4m3; V TRANSPOSED, v8 (B, Hkv, D, Sk_pad >= Sk) e4m3 with the key
index contiguous; fp32 descales q_descale (B, H, ceil(Sq / QBLOCK_M)), k/v_descale (B, Hkv, ceil(Sk /
QBLOCK_N)) (any strides) with QBLOCK_M / QBLOCK_N the quantization blocks (ops' block_m / block_n).
Output out (B, Sq, H, D) in bf16 (fp16, fp32) and lse (B, H, Sq) fp32 natural log. It computes what
flashscale.reference.attention_fp8.attention_fp8_quantized_ref computes with tile_n = BLOCK_N (the same
key tiles, so the same running max and the same e4m3 rounding of P):
    S_j = (q8 k8_j^T) * (q_descale[row] * k_descale[j] * scale * log2 e)       FP8 wgmma, fp32 accumulator
    m   = max(m, rowmax S_j);  P_j = exp2(S_j - m + 8)                          FA3's Max_offset: P in (0, 2^8]
    l   = l * alpha + rowsum(P_j)  (fp32 P)
    O   = O * alpha + (e4m3(P_j) v8_j) * v_descale[j]                           FP8 wgmma, fp32 accumulator
    out = O / l;  lse = (m + log2 l - 8) ln 2;  rows that see no key: out 0, lse -inf.
BLOCK_N must divide QBLOCK_N (one K and one V descale a key tile, as in the reference, whose tile_n must
divide block_n); quantize with block_n=256 to run the 256-key tiles.

Schedule (kernels/attention_fa3.py's ping-pong path; its barrier protocol, module docstring there, is
reused unchanged: K/V ring of STAGES slots with k/v_ready (expect-tx) and k/v_empty (count = CONSUMERS)
mbarriers, q_ready/q_empty per consumer, tensor-core turns through turn[c]):
  * producer, 1 warp at 24 registers: TMA loads of each consumer's Q slice (box (1, SUB_M, D) of the
    (B, Sq, H * D) view), K tiles (1, BLOCK_N, D) of (B, Sk, Hkv * D), V^T tiles (D, BLOCK_N) of the 2-D view
    (B * Hkv * D, Sk) of v8 (row (b * Hkv + hk) * D; columns >= Sk read as TMA zeros, so the padding of
    Sk_pad is never read), GQA by coordinate (hk = h // (H / Hkv)).
  * CONSUMERS (2 or 3) 4-warp consumer partitions of SUB_M = BLOCK_M / CONSUMERS query rows each:
    S_j = Q K_j^T as an SS-wgmma (both operands K-major: Q and K rows are D-contiguous); P_j cast to e4m3
    in registers and moved into the FP8 A-operand layout (DotOperandLayout(k_width=4)): the fp32 accumulator
    layout is not the FP8 A layout (FA3 section 3.3, "layout conformance"), so _p_to_a runs FA3's
    permute_Aregs_fp8 as inline PTX (2 quad shuffles + 2 byte permutes a 64-bit pair; gl.convert_layout
    would cost ~5x the instructions) and renames the indices for free (no shared memory), then
    O += P_j V_j as an RS-wgmma whose B operand is the V^T tile (K-major: keys contiguous, why V is stored
    transposed). With OVERLAP (default) S_{j+1} is issued before the softmax of block j and one turn is
    {S_j, O += P_{j-1} V_{j-1}} (FA3's intra-warpgroup overlap); PINGPONG hands the tensor cores from one
    consumer to the next through turn[] (pingpong=False: the same partitions run freely, no turns).
  * Descales: q_descale is loaded once a tile as a per-row vector (any QBLOCK_M); the K and V descales of
    key tile j are two scalars (loaded before the tile's barrier waits, so their latency hides there).
    S's scale folds into one multiply-add with the max subtraction: P = exp2(raw * rs - (m - 8)) with
    rs = q_descale * k_descale * scale * log2 e > 0 (rowmax(raw) * rs == rowmax(raw * rs) exactly: rounding
    is monotonic). V's descale is applied lazily: the accumulator holds O / v_descale[j] while block j is
    added, so the rescale after each PV product is a single multiply by alpha * v_descale[j-1] / v_descale[j]
    (the bf16 kernel's alpha rescale, one factor changed), and the epilogue multiplies by v_descale[last] / l.
    (Edge: an all-zero V block has v_descale = 2^-64 / 448, and the accumulator holds O * ~2^73 while it
    is the current block: finite while |O| (unnormalised: up to 256 * Sk * max|V|) stays below ~2^54.)
  * Epilogue: out staged in the consumer's own (SUB_M, D) output tile in shared memory (out dtype: not Q's
    fp8 slice) and TMA-stored (rows >= Sq clipped). The Q slice is released (q_empty) as soon as the last
    QK^T of the tile has retired, so a persistent program loads the next Q during the last PV product.

Causal aligned bottom-right (key j visible to query i iff j <= i + Sk - Sq), only key blocks intersecting
the band are visited, masks only on blocks j >= n_full (ragged last block, causal diagonal band).
Accumulation: FP8 wgmma with Triton's sm_90 default (max_num_imprecise_acc = 2^30: Hopper's fast FP8
accumulation, as FA3 and the Triton FP8 kernel); the GPU tests measure its effect against the emulation.

Shapes: B batch, S sequence, H query heads, Hkv K/V heads, G = H // Hkv, D head dim (64, 128 or 256).

Files (one concern each; this one keeps the checks and the host side, and re-exports the others' names):
  attention_fa3_fp8_config.py    FA3Fp8Config, TUNING_CONFIGS / DEFAULT_CONFIGS, default_config, config_error
  attention_fa3_fp8_exp2.py      the software exp2 (_exp2_fma, exp2_fma_emulated) and the HAS_GLUON probe
  attention_fa3_fp8_softmax.py   the online-softmax step and P's move into the FP8 A-operand layout (_p_to_a)
  attention_fa3_fp8_producer.py  the TMA producer warp and the tile map
  attention_fa3_fp8_kernel.py    the consumer warpgroups and _fa3_fp8_fwd_kernel
  attention_fa3_fp8.py           unsupported, attention_fa3_fp8_fwd, precompile, compile_sm90
"""

from __future__ import annotations

import math

import torch

from flashscale.kernels.attention_fa3 import _num_sms, head_group
from flashscale.kernels.attention_fa3_fp8_config import (DEFAULT_CONFIGS, E4M3, HEAD_DIMS, LOG2E, OUT_DTYPES,
                                                         P_SHIFT_LOG2, SMALL_BLOCK_CONFIGS, SMEM_LIMIT, TUNING_CONFIGS,
                                                         FA3Fp8Config, config_error, default_config, quant_block_n,
                                                         smem_bytes)
from flashscale.kernels.attention_fa3_fp8_exp2 import (EXP2_FMA_CLAMP, EXP2_FMA_POLY, EXP2_FMA_REL_ERR, EXP2_FMA_ROUND,
                                                       HAS_GLUON, exp2_fma_emulated)
from flashscale.kernels.attention_tune import capability
from flashscale.reference.attention_fp8 import (padded_len, permute_v_keys, unpermute_v_keys,  # noqa: F401
                                                v_key_of_slot)

try:  # Gluon is experimental; HAS_GLUON (attention_fa3_fp8_exp2's probe) says whether all of it is there
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed triton
    pass

if HAS_GLUON:
    from flashscale.kernels.attention_fa3_fp8_exp2 import _exp2_fma
    from flashscale.kernels.attention_fa3_fp8_kernel import _fa3_fp8_fwd_kernel
    from flashscale.kernels.attention_fa3_fp8_softmax import (_ACC_TO_A_16, _ACC_TO_A_32, _ACC_TO_A_PERM_16,
                                                              _ACC_TO_A_PERM_32)

# What other modules import from here, wherever its code lives (the configs: attention_fa3_fp8_config.py; the
# software exp2: attention_fa3_fp8_exp2.py; the Gluon kernel: attention_fa3_fp8_kernel.py and the modules it uses).
__all__ = ["DEFAULT_CONFIGS", "E4M3", "EXP2_FMA_CLAMP", "EXP2_FMA_POLY", "EXP2_FMA_REL_ERR", "EXP2_FMA_ROUND",
           "FA3Fp8Config", "HAS_GLUON", "HEAD_DIMS", "LOG2E", "OUT_DTYPES", "P_SHIFT_LOG2", "SMALL_BLOCK_CONFIGS",
           "SMEM_LIMIT", "TUNING_CONFIGS", "attention_fa3_fp8_fwd", "compile_sm90", "config_error", "default_config",
           "exp2_fma_emulated", "padded_len", "permute_v_keys", "precompile", "quant_block_n", "smem_bytes",
           "supported", "unpermute_v_keys", "unsupported", "v_key_of_slot"]
if HAS_GLUON:
    __all__ += ["_ACC_TO_A_16", "_ACC_TO_A_32", "_ACC_TO_A_PERM_16", "_ACC_TO_A_PERM_32", "_exp2_fma",
                "_fa3_fp8_fwd_kernel"]


_GL_DTYPES = {}


def _gl_dtype(dtype: torch.dtype):
    if not _GL_DTYPES:
        _GL_DTYPES.update({torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32,
                           E4M3: gl.float8e4nv})
    return _GL_DTYPES[dtype]


def _layout(shape, dtype: torch.dtype):
    """NVMMA (swizzled) shared layout of a TMA box, as wgmma reads it."""
    return gl.NVMMASharedLayout.get_default_for(list(shape), _gl_dtype(dtype))


def unsupported(q8, k8, v8, q_descale=None, k_descale=None, v_descale=None, *, causal: bool = False,
                block_m: int = 128, block_n: int = 128, out_dtype: torch.dtype = torch.bfloat16,
                config: FA3Fp8Config | None = None, v_key_perm: bool = False) -> str | None:
    """Why attention_fa3_fp8_fwd cannot run these inputs, or None. Shapes and dtypes beyond what this
    kernel needs are validated by flashscale.ops.attention_fp8_quantized."""
    if not all(isinstance(t, torch.Tensor) for t in (q8, k8, v8)):
        return "q8, k8, v8 must be tensors"
    if q8.dim() != 4 or k8.dim() != 4 or v8.dim() != 4:
        return "fa3 fp8 takes q8 (B, Sq, H, D), k8 (B, Sk, Hkv, D), v8 transposed (B, Hkv, D, Sk_pad)"
    B, Sq, H, D = q8.shape
    Sk, Hkv = k8.shape[1], k8.shape[2]
    if D not in HEAD_DIMS:
        return f"head_dim={D}: fa3 fp8 takes 64, 128 or 256"
    if k8.shape[0] != B or k8.shape[3] != D or Hkv == 0 or H % Hkv:
        return f"k8 {tuple(k8.shape)} does not fit q8 {tuple(q8.shape)}"
    if tuple(v8.shape[:3]) != (B, Hkv, D) or v8.shape[3] < Sk:
        return f"v8 must be (B, Hkv, D, >= Sk) = ({B}, {Hkv}, {D}, >= {Sk}); got {tuple(v8.shape)}"
    if any(t.dtype != E4M3 for t in (q8, k8, v8)):
        return "q8, k8, v8 must be float8_e4m3fn"
    if out_dtype not in OUT_DTYPES:
        return f"out_dtype {out_dtype}: bfloat16, float16 or float32"
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device != q8.device):
            return f"{name} must be a float32 tensor on {q8.device}"
    if not (q8.is_cuda and k8.is_cuda and v8.is_cuda) or capability(q8.device)[0] != 9:
        return f"fa3 fp8 needs a Hopper GPU (compute capability 9.x); q8 is on {q8.device}"
    if not HAS_GLUON:
        return "fa3 fp8 needs triton.experimental.gluon with warp_specialize (Triton >= 3.6)"
    if not (q8.is_contiguous() and k8.is_contiguous()):
        return "fa3 fp8 needs contiguous q8 and k8"
    if v8.stride(3) != 1 or v8.stride(2) % 16 or v8.stride(1) != D * v8.stride(2) or v8.stride(0) != Hkv * v8.stride(1):
        return "fa3 fp8 needs v8 (B, Hkv, D, Sk_pad) row-major with rows 16-byte aligned (Sk_pad % 16 == 0)"
    if any(t.data_ptr() % 16 for t in (q8, k8, v8)):
        return "fa3 fp8 needs 16-byte aligned q8, k8, v8"
    cfg = config or default_config(D, block_n, causal, v_perm=bool(v_key_perm))
    if cfg.v_perm != bool(v_key_perm):
        return (f"config.v_perm={cfg.v_perm} reads V^T's keys {'permuted' if cfg.v_perm else 'in natural order'} "
                f"but v_key_perm={bool(v_key_perm)} says v8 holds them {'permuted' if v_key_perm else 'in order'}")
    if cfg.v_perm and v8.shape[3] < padded_len(Sk, 32):
        return (f"v_key_perm: v8 must hold whole 32-key groups (permute_v_keys), >= {padded_len(Sk, 32)} keys; got "
                f"{v8.shape[3]}")
    return config_error(D, cfg, quant_block_n=block_n, out_dtype=out_dtype)


def supported(q8, k8, v8, q_descale=None, k_descale=None, v_descale=None, **kw) -> bool:
    """Whether attention_fa3_fp8_fwd can run these inputs (see unsupported)."""
    return unsupported(q8, k8, v8, q_descale, k_descale, v_descale, **kw) is None


def attention_fa3_fp8_fwd(q8, k8, v8, q_descale, k_descale, v_descale, *, causal: bool = False,
                          softmax_scale: float | None = None, block_m: int = 128, block_n: int = 128,
                          out_dtype: torch.dtype = torch.bfloat16, config: FA3Fp8Config | None = None,
                          v_key_perm: bool = False):
    """out (B, Sq, H, D) in out_dtype and lse (B, H, Sq) fp32 of the FP8 forward (module docstring).

    Arguments as flashscale.ops.attention_fp8_quantized: q8 (B, Sq, H, D), k8 (B, Sk, Hkv, D), v8 transposed
    (B, Hkv, D, Sk_pad) e4m3; q_descale (B, H, ceil(Sq / block_m)), k/v_descale (B, Hkv, ceil(Sk / block_n))
    fp32; block_m / block_n the quantization blocks. config: an FA3Fp8Config (default_config(D, block_n, causal,
    v_key_perm)). v_key_perm: v8's keys permuted within 32-key groups (permute_v_keys; quantize_fp8(...,
    v_key_perm=True)), which configs with v_perm read and the others do not."""
    why = unsupported(q8, k8, v8, q_descale, k_descale, v_descale, causal=causal, block_m=block_m,
                      block_n=block_n, out_dtype=out_dtype, config=config, v_key_perm=v_key_perm)
    if why is not None:
        raise ValueError(f"attention_fa3_fp8_fwd: {why}")
    B, Sq, H, D = q8.shape
    out = torch.empty((B, Sq, H, D), dtype=out_dtype, device=q8.device)
    lse = torch.empty((B, H, Sq), device=q8.device, dtype=torch.float32)
    if B == 0 or Sq == 0 or H == 0:
        return out, lse
    if k8.shape[1] == 0:  # no keys: every row is empty (and a TMA box needs a non-empty tensor)
        return out.zero_(), lse.fill_(float("-inf"))
    grid, args, constexprs = _launch(q8, k8, v8, q_descale, k_descale, v_descale, out, lse, causal, softmax_scale,
                                     block_m, block_n, config, v_key_perm)
    _fa3_fp8_fwd_kernel[grid](*args, **constexprs)
    return out, lse


def precompile(q8, k8, v8, q_descale, k_descale, v_descale, *, causal: bool = False, block_m: int = 128,
               block_n: int = 128, out_dtype: torch.dtype = torch.bfloat16,
               config: FA3Fp8Config | None = None, v_key_perm: bool = False) -> None:
    """Compile (into Triton's cache, without launching) the kernel attention_fa3_fp8_fwd would run."""
    why = unsupported(q8, k8, v8, q_descale, k_descale, v_descale, causal=causal, block_m=block_m,
                      block_n=block_n, out_dtype=out_dtype, config=config, v_key_perm=v_key_perm)
    if why is not None:
        raise ValueError(f"precompile: {why}")
    B, Sq, H, D = q8.shape
    out = torch.empty((B, Sq, H, D), dtype=out_dtype, device=q8.device)
    lse = torch.empty((B, H, Sq), device=q8.device, dtype=torch.float32)
    grid, args, constexprs = _launch(q8, k8, v8, q_descale, k_descale, v_descale, out, lse, causal, None, block_m,
                                     block_n, config, v_key_perm)
    _fa3_fp8_fwd_kernel.warmup(*args, grid=grid, **constexprs)


def _launch(q8, k8, v8, qd, kd, vd, out, lse, causal, softmax_scale, block_m, block_n, config, v_key_perm):
    """(grid, arguments, constexprs) of the kernel for non-empty inputs."""
    B, Sq, H, D = q8.shape
    Sk, Hkv = k8.shape[1], k8.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    cfg = config or default_config(D, block_n, causal, bool(v_key_perm))
    sub = cfg.sub_m
    # (B, S, heads * D) views: the box (1, rows, D) at [b, row, head * D] stays inside batch b, so TMA
    # zero-fills rows past this sequence's end and clips stores there.
    q_desc = TensorDescriptor(q8, [B, Sq, H * D], [Sq * H * D, H * D, 1], [1, sub, D], _layout([1, sub, D], E4M3))
    o_desc = TensorDescriptor(out, [B, Sq, H * D], [Sq * H * D, H * D, 1], [1, sub, D],
                              _layout([1, sub, D], out.dtype))
    k_desc = TensorDescriptor(k8, [B, Sk, Hkv * D], [Sk * Hkv * D, Hkv * D, 1], [1, cfg.block_n, D],
                              _layout([1, cfg.block_n, D], E4M3))
    # V^T as a 2-D (B * Hkv * D, Sk) view: columns >= Sk (the padding) read as zeros. With v_perm the keys of the
    # last 32-key group sit anywhere in it: the view spans the whole group (permute_v_keys zero-fills the padding)
    v_cols = padded_len(Sk, 32) if cfg.v_perm else Sk
    v_desc = TensorDescriptor(v8, [B * Hkv * D, v_cols], [v8.stride(2), 1], [D, cfg.block_n],
                              _layout([D, cfg.block_n], E4M3))
    n_m = triton.cdiv(Sq, cfg.block_m)
    n_sms = _num_sms(q8.device)
    grid = (min(n_m * B * H, n_sms), ) if cfg.persistent else (n_m * B * H, )
    args = (q_desc, k_desc, v_desc, o_desc, out, lse, lse.stride(0), lse.stride(1), qd, *qd.stride(), kd, *kd.stride(),
            vd, *vd.stride(), H, H // Hkv, B * H, head_group(B * H, n_m, n_sms, cfg.l2_groups), Sq, Sk,
            float(scale) * LOG2E)
    return grid, args, _constexprs(D, bool(causal), cfg, block_m, block_n)


def _constexprs(head_dim: int, causal: bool, cfg: FA3Fp8Config, block_m: int, block_n: int) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "STAGES": cfg.stages,
            "QBLOCK_M": block_m, "QBLOCK_N": block_n, "CAUSAL": causal, "OVERLAP": cfg.overlap,
            "PINGPONG": cfg.pingpong, "CONSUMERS": cfg.consumers, "PERSISTENT": cfg.persistent,
            "EXP2_FMA": cfg.exp2_fma, "LATE_PV_WAIT": cfg.late_pv_wait, "TREE_MAX": cfg.tree_max,
            "V_PERM": cfg.v_perm, "O_DIRECT": cfg.o_direct,
            "PRODUCER_REGS": cfg.producer_regs, "CONSUMER_REGS": cfg.worker_consumer_regs, "num_warps": cfg.num_warps}


def compile_sm90(head_dim: int, causal: bool, *, config: FA3Fp8Config | None = None, block_m: int = 128,
                 block_n: int | None = None, out_dtype: torch.dtype = torch.bfloat16):
    """Ahead-of-time compile for sm_90 (no GPU needed: Triton ships ptxas). block_n: the quantization block
    (default: max(128, config.block_n)). Returns triton's CompiledKernel (.asm["ptx"], .asm["cubin"],
    .metadata.shared). For tests and tools."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    cfg = config or DEFAULT_CONFIGS[(head_dim, bool(causal))]
    qbn = block_n or max(128, cfg.block_n)
    bad = config_error(head_dim, cfg, quant_block_n=qbn, out_dtype=out_dtype)
    if bad is not None:
        raise ValueError(f"compile_sm90: {cfg}: {bad}")
    oty = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[out_dtype]

    def desc(ty, shape, dtype):
        return f"tensordesc<{ty}[{','.join(map(str, shape))}],{_layout(shape, dtype)!r}>"

    sub, D = cfg.sub_m, head_dim
    signature = {"q_desc": desc("fp8e4nv", [1, sub, D], E4M3), "k_desc": desc("fp8e4nv", [1, cfg.block_n, D], E4M3),
                 "v_desc": desc("fp8e4nv", [D, cfg.block_n], E4M3), "o_desc": desc(oty, [1, sub, D], out_dtype),
                 "O": f"*{oty}", "LSE": "*fp32", "stride_lb": "i32", "stride_lh": "i32",
                 "QD": "*fp32", "sqd_b": "i32", "sqd_h": "i32", "sqd_n": "i32",
                 "KD": "*fp32", "skd_b": "i32", "skd_h": "i32", "skd_n": "i32",
                 "VD": "*fp32", "svd_b": "i32", "svd_h": "i32", "svd_n": "i32",
                 "H": "i32", "GROUP": "i32", "BH": "i32", "HG": "i32", "seqlen_q": "i32", "seqlen_k": "i32", "qk_scale": "fp32"}
    constexprs = _constexprs(head_dim, bool(causal), cfg, block_m, qbn)
    signature.update({name: "constexpr" for name in constexprs})
    src = GluonASTSource(fn=_fa3_fp8_fwd_kernel, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})
