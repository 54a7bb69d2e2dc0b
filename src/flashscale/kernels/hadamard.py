"""Random-sign Walsh-Hadamard transform along head_dim fused with FP8 (e4m3) block quantization.

The pre-pass of the FP8 attention (FlashAttention-3, section 3.3): each program reads one quantization
block, `block` rows of one head of x (B, S, H, D) in bf16/fp16/fp32, once; multiplies by the seeded
signs and the Hadamard matrix (Q and K only; V skips it), takes the block's amax, and writes the e4m3
block plus its fp32 descale = max(amax, FLOOR) / 448 once. Blocks too large for a program's registers are
read in pieces, twice (the amax, then the quantization: `chunk`, auto_chunk). Per-tensor quantization (the
baseline) is a second launch handed the global amax.

Two ways to multiply by H_D (D = 64, 128, 256), picked by `method`:
  "mma":       y = (x * signs) @ H on the tensor cores. H is built in registers from
               H[i, j] = (-1)^popcount(i & j) (no memory traffic); x * (+-1) and the +-1 entries are exact in
               the input dtype and products accumulate in fp32, so this is exact up to fp32 summation
               order. 2 D FLOPs an element on tensor cores is far below the pass's byte cost
               (3 bytes an element), so it stays memory-bound. The default.
  "kron":      D = 32..256: H_D = H_(D/16) (x) H_16, so x @ H_D is two 16-wide tensor-core products over the
               (R, D/16, 16) view of the rows (contract the low index with H_16, then the high one with H_(D/16)
               on the diagonal blocks of a 16 x 16 tile): 64 FLOPs a value instead of 2 D. The second product's
               fp32 inputs are split exactly into three bf16 parts (8 + 8 + 8 mantissa bits), each multiplied by
               the +-1 entries exactly, so the result is the exact sum up to fp32 rounding, as "mma"'s (not bit
               for bit: another summation order). Opt-in until measured.
  "butterfly": the fast Walsh-Hadamard transform, log2(D) stages of (a + b, a - b) on register tiles
               through reshape/permute/split/join: D log2 D adds, but every stage may cost the compiler a
               layout shuffle through shared memory. Kept and tested as the O(D log D) alternative; the
               benchmark times both.

V's layout for the FP8 tensor cores: Hopper's FP8 wgmma reads its B operand K-major only. In P @ V
the reduction (K) dimension is the key index, so V is written transposed, (B, Hkv, D, S_pad) with the
sequence contiguous (S_pad: S rounded up to 16 so every row starts 16-byte aligned, as TMA needs; the
padding is zeros). The attention kernel then loads (D, BLOCK_N) tiles and uses their transpose.

Interpreter (CPU tests, triton 3.6.0, seen 2026-11): float8e4nv stores run, but the interpreter's
rounding is wrong where rounding carries into the next binade (124.3 -> 64 instead of 128) and it
flushes e4m3 subnormals to 0. So the CPU tests run the kernel with out_dtype=float32 (the scaled values
before the cast; torch's correct e4m3 cast is applied outside and must then match the reference bit for
bit) and check the e4m3 store path only away from those cases; the GPU tests check the real e4m3 stores
bit for bit.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from flashscale.kernels.interpreter import interpreting
from flashscale.reference.attention_fp8 import E4M3_MAX, FLOOR, hadamard_matrix, padded_len, random_signs

_METHODS = ("mma", "kron", "butterfly")
# globals a kernel reads must be constexpr instances (the interpreter does not check this; the compiler does)
_FLOOR = tl.constexpr(FLOOR)
_E4M3_MAX = tl.constexpr(E4M3_MAX)


@triton.jit
def _hadamard_mma(x, D: tl.constexpr, LOG2D: tl.constexpr):
    """x (R, D) in fp16/bf16/fp32 -> x @ H_D (unnormalized) in fp32, on the tensor cores."""
    offs = tl.arange(0, D)
    p = offs[:, None] & offs[None, :]  # H[i, j] = (-1)^popcount(i & j); i & j < 256: fold 8 bits into bit 0,
    p = p ^ (p >> 4)                   # one (D, D) integer tile live (a tile a bit kept two: 255 registers and
    p = p ^ (p >> 2)                   # 188 B spilled at D 128, 128-row blocks, 8 warps)
    p = p ^ (p >> 1)
    h = (1 - 2 * (p & 1)).to(x.dtype)
    return tl.dot(x, h, input_precision="ieee" if x.dtype == tl.float32 else "tf32").to(tl.float32)


@triton.jit
def _hadamard_tile(A: tl.constexpr, DT: tl.constexpr):
    """(16, 16) in DT: H_A on each of the 16 // A diagonal blocks (A in 2..16), zeros elsewhere; H[i, j] =
    (-1)^popcount(i & j) inside a block."""
    i = tl.arange(0, 16)[:, None]
    j = tl.arange(0, 16)[None, :]
    p = (i % A) & (j % A)
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    return tl.where(i // A == j // A, 1 - 2 * (p & 1), 0).to(DT)


@triton.jit
def _dot_split3(a, h, DT: tl.constexpr):
    """a (M, K) fp32 @ h (K, N) with +-1 entries in DT, exactly up to fp32 rounding: a = hi + mid + lo in DT parts
    (each difference exact in fp32; in bf16 8 + 8 + 8 mantissa bits hold fp32's 24), three tensor-core products."""
    hi = a.to(DT)
    r = a - hi.to(tl.float32)
    mid = r.to(DT)
    lo = (r - mid.to(tl.float32)).to(DT)
    return tl.dot(hi, h) + tl.dot(mid, h) + tl.dot(lo, h)


@triton.jit
def _hadamard_kron(x, R: tl.constexpr, D: tl.constexpr, DT: tl.constexpr):
    """x (R, D = A * 16), A in 2..16 -> x @ H_D (unnormalized) in fp32 as two 16-wide products: value j = ja * 16 + jb
    of a row, H_D[i, j] = H_A[ia, ja] * H_16[ib, jb]; the first product contracts jb with H_16, the second ja with
    H_A on the diagonal blocks of a 16 x 16 tile (16 // A rows' (ib) groups of A at once). DT: the products' dtype
    (bf16 on the GPU; fp16 under the interpreter, whose bf16 products are wrong: there the split drops bits past
    fp16's range, ~2^-22 relative)."""
    A: tl.constexpr = D // 16
    h16 = _hadamard_tile(16, DT)
    x2 = tl.reshape(x, [R * A, 16])  # (r, ja) rows of jb
    if x.dtype == DT:
        z = tl.dot(x2, h16)  # +-1 products, exact; summed in fp32
    else:
        z = _dot_split3(x2.to(tl.float32), h16, DT)
    z = tl.reshape(tl.permute(tl.reshape(z, [R, A, 16]), [0, 2, 1]), [R * A, 16])  # (r, ib, ja), 16 // A ib a row
    y = _dot_split3(z, _hadamard_tile(A, DT), DT)  # (r, ib, ia)
    return tl.reshape(tl.permute(tl.reshape(y, [R, 16, A]), [0, 2, 1]), [R, D])  # (r, ia, ib)


@triton.jit
def _hadamard_butterfly(x, R: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr):
    """x (R, D) fp32 -> x @ H_D (unnormalized): stage i pairs columns c and c + 2^i within blocks of 2^(i+1)."""
    for i in tl.static_range(LOG2D):
        x = tl.reshape(x, [R, D // (2 << i), 2, 1 << i])  # (R, blocks, pair, offset)
        a, b = tl.split(tl.permute(x, [0, 1, 3, 2]))  # split takes the last axis (of size 2)
        x = tl.permute(tl.join(a + b, a - b), [0, 1, 3, 2])
        x = tl.reshape(x, [R, D])
    return x


@triton.jit
def _load_transform(X, b, h, rows, offs_d, SIGNS, stride_xb, stride_xs, stride_xh, S, inv_sqrt_d,
                    D: tl.constexpr, LOG2D: tl.constexpr, R: tl.constexpr, HADAMARD: tl.constexpr,
                    METHOD: tl.constexpr, HMAT: tl.constexpr = False, KRON_DT: tl.constexpr = tl.bfloat16):
    """Rows `rows` (R,) of one head -> (R, D) fp32: the signed, normalized Hadamard transform (HADAMARD) or the
    values as they are; rows past S read as 0 (and raise no amax). HMAT (method "mma"): SIGNS is the (D, D) matrix
    diag(signs) @ H_D in x's dtype (+-1 entries: the same products, exactly), read from memory (L2 after the first
    programs) instead of rebuilt in registers by every program."""
    ok = rows[:, None] < S
    x = tl.load(X + b * stride_xb + h * stride_xh + rows[:, None].to(tl.int64) * stride_xs + offs_d[None, :],
                mask=ok, other=0.0)
    if HADAMARD and HMAT:
        hm = tl.load(SIGNS + offs_d[:, None] * D + offs_d[None, :])
        y = tl.dot(x, hm, input_precision="ieee" if x.dtype == tl.float32 else "tf32").to(tl.float32) * inv_sqrt_d
    elif HADAMARD:
        signs = tl.load(SIGNS + offs_d).to(x.dtype)  # +-1: exact in every float dtype
        x = x * signs[None, :]
        if METHOD == "mma":
            y = _hadamard_mma(x, D, LOG2D)
        elif METHOD == "kron":
            y = _hadamard_kron(x, R, D, KRON_DT)
        else:
            y = _hadamard_butterfly(x.to(tl.float32), R, D, LOG2D)
        y = y * inv_sqrt_d
    else:
        y = x.to(tl.float32)
    return y


@triton.jit
def _hadamard_quant_kernel(
    X, Y, DESCALE, SIGNS, AMAX,
    stride_xb, stride_xs, stride_xh, stride_yb, stride_ys, stride_yh, stride_yd, stride_db, stride_dh,
    H, S, inv_sqrt_d,
    D: tl.constexpr, LOG2D: tl.constexpr, BLOCK: tl.constexpr, HADAMARD: tl.constexpr, METHOD: tl.constexpr,
    PER_TENSOR: tl.constexpr, KEY_PERM: tl.constexpr = False, CHUNK: tl.constexpr = 0, HMAT: tl.constexpr = False,
    STAGES: tl.constexpr = 1, KRON_DT: tl.constexpr = tl.bfloat16,
):
    """One quantization block of one head. CHUNK (< BLOCK, dividing it): the block in CHUNK-row pieces, twice
    (the amax, then the quantization; the second read mostly from L2), so a large block holds only a piece in
    registers (a whole 256-row block spills in ptxas); 0: the block at once."""
    blk = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_d = tl.arange(0, D)
    R: tl.constexpr = CHUNK if CHUNK > 0 else BLOCK
    if PER_TENSOR:
        amax = tl.load(AMAX)
    else:
        amax = tl.zeros([], dtype=tl.float32)
        if CHUNK > 0:
            for c in tl.range(BLOCK // R, num_stages=STAGES, loop_unroll_factor=1):
                rows = blk * BLOCK + c * R + tl.arange(0, R)
                y = _load_transform(X, b, h, rows, offs_d, SIGNS, stride_xb, stride_xs, stride_xh, S, inv_sqrt_d,
                                    D, LOG2D, R, HADAMARD, METHOD, HMAT, KRON_DT)
                amax = tl.maximum(amax, tl.max(tl.max(tl.abs(y), axis=1), axis=0))
    for c in tl.range(BLOCK // R, num_stages=STAGES, loop_unroll_factor=1):
        rows = blk * BLOCK + c * R + tl.arange(0, R)
        y = _load_transform(X, b, h, rows, offs_d, SIGNS, stride_xb, stride_xs, stride_xh, S, inv_sqrt_d,
                            D, LOG2D, R, HADAMARD, METHOD, HMAT, KRON_DT)
        if CHUNK == 0 and not PER_TENSOR:
            amax = tl.max(tl.max(tl.abs(y), axis=1), axis=0)
        # IEEE-rounded divisions, as torch does in the reference (Triton's "/" may be approximate on GPU)
        inv = tl.math.div_rn(tl.full([], _E4M3_MAX, tl.float32), tl.maximum(amax, _FLOOR))
        q = tl.minimum(tl.maximum(y * inv, -_E4M3_MAX), _E4M3_MAX).to(Y.dtype.element_ty)  # e4m3 (fp32: tests)
        if KEY_PERM:  # row c of a 32-row group to slot (c & ~15) | ((c >> 1) & 3) << 2 | ((c >> 3) & 1) << 1 | (c & 1)
            dst = (rows & ~15) | (((rows >> 1) & 3) << 2) | (((rows >> 3) & 1) << 1) | (rows & 1)
        else:
            dst = rows
        tl.store(Y + b * stride_yb + h * stride_yh + dst[:, None].to(tl.int64) * stride_ys
                 + offs_d[None, :].to(tl.int64) * stride_yd, q, mask=rows[:, None] < S)
    tl.store(DESCALE + b * stride_db + h * stride_dh + blk,
             tl.math.div_rn(tl.maximum(amax, _FLOOR), tl.full([], _E4M3_MAX, tl.float32)))


# Past this many values a whole block through the Hadamard transform runs out of registers (does not compile)
_WHOLE_MAX_HADAMARD = 128 * 256
_PIECE = 8192  # values of a piece: 8192 // D rows
# The rules below: measured on the H200 (2026-12-04, benchmarks/fp8_prepass_sweep.py,
# results/fp8-prepass-sweep-h200.json: 16k tokens x 2048, every config's bytes equal to the old default's; kernel
# time in a CUDA graph, us): V^T in 8192-value pieces at 4 warps 47.5 (D 128, 256-row blocks) / 49.7 (D 256, 128
# rows) against the old 8 warps' 65.9 / 65.9; Q/K whole blocks with 128 values a thread: D 128 x 128 rows at 4 warps
# 53.6 (old 8: 65.4), D 128 x 256 rows at 8 warps with the matrix read from memory 61.3 (old 16 warps: 78.0; the
# best of the sweep, 64-row pieces pipelined, 59.3), D 256 x 128 rows the same way 81.0 (old 16 warps: 126.5; built
# in registers at 8 warps 104.2). Torch's bf16 -> e4m3 cast of the same tensor: 32.4.


def auto_chunk(block: int, D: int, transpose: bool = False) -> int:
    """Rows a program of the pre-pass holds at once (0: the whole block, read once): V^T in pieces of 8192 values
    past that many; Q/K (the Hadamard path) whole up to 128 x 256 values (past that they do not compile), in pieces
    of 8192 values past it. Measured: the comment above."""
    if block * D <= (_PIECE if transpose else _WHOLE_MAX_HADAMARD):
        return 0
    return max(16, _PIECE // D)


def auto_warps(rows: int, D: int, transpose: bool = False) -> int:
    """Warps of a program holding `rows` rows: V^T 64 values a thread (4 warps for a piece; a whole block asked for
    with chunk=0 gets as many: at 4 warps a 128 x 256 one ran 0.75 ms, 16 warps 0.38), whole Q/K blocks 128 values a
    thread (at least 4 warps), the old rule (8 warps for a 8192-value Q/K piece) otherwise."""
    values = rows * D
    if transpose:
        return max(4, values // (32 * 64))
    if values > _PIECE:
        return max(4, values // (32 * 128))
    return 4 if values <= 64 * 64 else 8


def auto_hmat(rows: int, D: int, warps: int) -> bool:
    """The signed Hadamard matrix from memory where whole blocks take 8 warps or more (D 128 x 256 rows, D 256 x 128):
    61.3 / 81.0 us against 71.0 / 104.2 built in registers; at 4 warps (D 128 x 128) building it won, 53.6 / 63.1."""
    return rows * D > _PIECE and warps >= 8


def auto_config(block: int, D: int, *, transpose: bool = False, hadamard: bool = True, method: str = "mma",
                chunk: int | None = None, num_warps: int | None = None,
                hmat: bool | None = None) -> tuple[int, int, bool]:
    """(chunk, num_warps, hmat) a launch of hadamard_quant takes, the given ones kept (a chunk >= block: 0) and the
    others by the rules above (method "kron": 8192-value pieces, spill-free at 8 warps where whole 128 x 256 blocks
    spill). hmat only where it applies: the Hadamard path of method "mma"."""
    if chunk is None:
        chunk = min(_PIECE // D, block) if method == "kron" and hadamard else auto_chunk(block, D, transpose)
    if chunk >= block:
        chunk = 0
    rows = chunk or block
    warps = num_warps or auto_warps(rows, D, transpose)
    if hmat is None:
        hmat = method == "mma" and auto_hmat(rows, D, warps)
    return chunk, warps, bool(hadamard and hmat)


@functools.lru_cache(maxsize=32)
def _signs(D: int, seed: int, device: torch.device) -> torch.Tensor:
    """random_signs(D, seed) on `device`, made once (a host-to-device copy on every call otherwise)."""
    return random_signs(D, seed, device=device)


@functools.lru_cache(maxsize=32)
def _signed_hadamard(D: int, seed: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(D, D) diag(random_signs(D, seed)) @ H_D in `dtype` (+-1 entries, exact), contiguous: the kernel's HMAT."""
    h = hadamard_matrix(D, dtype=torch.float32, device=device)
    return (_signs(D, seed, device)[:, None] * h).to(dtype).contiguous()


def hadamard_quant(x: torch.Tensor, *, block: int, hadamard: bool, seed: int = 0, transpose: bool = False,
                   per_tensor: bool = False, method: str = "mma", num_warps: int | None = None,
                   signs: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float8_e4m3fn,
                   key_perm: bool = False, chunk: int | None = None, hmat: bool | None = None,
                   num_stages: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, S, H, D) fp16/bf16/fp32, D in {16, ..., 256} a power of 2 -> (y8, descale).

    y8: e4m3 (B, S, H, D), or with transpose=True (B, H, D, padded_len(S)) (V's layout, zero padding).
    descale: float32 (B, H, ceil(S / block)). Inputs are checked by flashscale.ops.attention_fp8.
    signs: the (D,) +-1 vector (default: random_signs(D, seed), the same for Q and K).
    out_dtype=float32 stores the scaled values before their e4m3 rounding (interpreter tests only).
    key_perm (with transpose): the keys of every 32-key group in the FA3 FP8 kernel's v_perm order
    (attention_fa3_fp8.permute_v_keys, written in place of the natural one at no cost), S padded to 32.
    chunk: rows a program holds at once (a power of two dividing block; the block is then read twice: its amax,
    then its quantization); 0: the whole block in one read; None: auto_chunk(block, D, transpose), the measured
    faster of the two (the same descales and values either way, up to the transform's fp32 rounding; method "kron":
    8192-value pieces, spill-free where whole blocks are not).
    num_warps: None = auto_warps. hmat (method "mma", seeded signs): programs read diag(signs) @ H_D as a (D, D)
    matrix from memory instead of building H_D in registers (the same products: bit for bit the same y); None =
    auto_hmat where it can apply. num_stages: software pipelining of the loop over a block's pieces (Triton's
    tl.range num_stages; 1: none)."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}; got {method!r}")
    B, S, H, D = x.shape
    if method == "kron" and hadamard and not 32 <= D <= 256:
        raise ValueError(f"method='kron' factors H_D into H_(D/16) (x) H_16: it takes head_dim 32..256, got {D}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if key_perm and not transpose:
        raise ValueError("key_perm permutes V's transposed layout: it needs transpose=True")
    nb = triton.cdiv(S, block)
    if transpose:
        sp = padded_len(S, 32 if key_perm else 16)
        y = torch.empty((B, H, D, sp), dtype=out_dtype, device=x.device)
        tail = S // 32 * 32 if key_perm else S  # (key_perm: the last group's padding slots lie anywhere in it)
        if sp > S:
            y[..., tail:].zero_()  # the kernel's K/V tail loads are masked, but TMA reads whole rows
        sy = (y.stride(0), y.stride(3), y.stride(1), y.stride(2))
    else:
        y = torch.empty((B, S, H, D), dtype=out_dtype, device=x.device)
        sy = (y.stride(0), y.stride(1), y.stride(2), y.stride(3))
    descale = torch.empty((B, H, nb), dtype=torch.float32, device=x.device)
    if B * H * nb == 0:
        return y, descale
    if not isinstance(num_stages, int) or not 1 <= num_stages <= 4:
        raise ValueError(f"num_stages must be an int in 1..4; got {num_stages!r}")
    if hmat and (method != "mma" or signs is not None):
        raise ValueError("hmat=True reads the seeded diag(signs) @ H matrix on the tensor cores: it takes method='mma' "
                         "and signs=None")
    if hmat and num_stages > 1 and D * D * 2 * num_stages > 160 * 1024:
        raise ValueError(f"hmat=True with num_stages={num_stages} at D {D}: the pipelined loop would buffer the "
                         f"{D * D * 2 // 1024} KB matrix {num_stages} times, past the shared memory; take num_stages=1")
    if chunk is not None and (not isinstance(chunk, int) or chunk < 0
                              or (chunk and (chunk & (chunk - 1) or block % chunk or chunk < 16))):
        raise ValueError(f"chunk must be 0 or a power of two >= 16 dividing block={block}; got {chunk!r}")
    chunk, warps, hmat = auto_config(block, D, transpose=transpose, hadamard=hadamard, method=method, chunk=chunk,
                                     num_warps=num_warps, hmat=False if signs is not None else hmat)
    if chunk == 0 and hadamard and block * D > _WHOLE_MAX_HADAMARD and x.is_cuda:
        raise ValueError(f"chunk=0: a whole {block} x {D} block through the Hadamard transform does not compile "
                         "(ptxas runs out of registers); leave chunk=None (pieces) or take a smaller block")
    if hmat:
        signs = _signed_hadamard(D, seed, x.dtype, x.device)
    elif signs is None:
        signs = _signs(D, seed, x.device)

    def launch(amax=None):
        _hadamard_quant_kernel[(nb, B * H)](
            x, y, descale, signs, amax if amax is not None else descale,
            x.stride(0), x.stride(1), x.stride(2), *sy, descale.stride(0), descale.stride(1),
            H, S, 1.0 / math.sqrt(D),
            D=D, LOG2D=D.bit_length() - 1, BLOCK=block, HADAMARD=hadamard, METHOD=method,
            PER_TENSOR=amax is not None, KEY_PERM=key_perm, CHUNK=chunk, HMAT=hmat, STAGES=num_stages,
            KRON_DT=tl.float16 if interpreting() else tl.bfloat16,
            num_warps=warps,
        )

    launch()
    if per_tensor:  # the block pass found every block's amax; the tensor's is their max
        amax = (descale.amax() * E4M3_MAX).reshape(1).contiguous()
        launch(amax)
    return y, descale


def compile_sm90(D: int, block: int, *, hadamard: bool = True, method: str = "mma", chunk: int = 0, num_warps: int = 8,
                 hmat: bool = False, num_stages: int = 1, transpose: bool = False, key_perm: bool = False,
                 dtype: str = "bf16"):
    """Compile the pre-pass kernel for sm_90 as a launch of hadamard_quant specializes it (pointers and strides
    16-divisible, the unit stride a constant) without a GPU: returns Triton's CompiledKernel (asm: ptx, cubin), for
    the offline compile test (registers, spills)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptrs = {"X": f"*{dtype}", "Y": "*fp8e4nv", "DESCALE": "*fp32", "SIGNS": f"*{dtype}" if hmat else "*fp32",
            "AMAX": "*fp32"}
    strides = ("stride_xb", "stride_xs", "stride_xh", "stride_yb", "stride_ys", "stride_yh", "stride_yd",
               "stride_db", "stride_dh")
    unit = "stride_ys" if transpose else "stride_yd"
    cx = dict(D=D, LOG2D=D.bit_length() - 1, BLOCK=block, HADAMARD=hadamard, METHOD=method, PER_TENSOR=False,
              KEY_PERM=key_perm, CHUNK=chunk, HMAT=hmat, STAGES=num_stages, KRON_DT=tl.bfloat16)
    sig = {**ptrs, **{n: "constexpr" if n == unit else "i32" for n in strides}, "H": "i32", "S": "i32",
           "inv_sqrt_d": "fp32", **{n: "constexpr" for n in cx}}
    names = list(sig)
    consts = {**cx, unit: 1}
    aligned = set(ptrs) | (set(strides) - {unit})
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in aligned}
    src = ASTSource(fn=_hadamard_quant_kernel, signature=sig, attrs=attrs,
                    constexprs={(names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
