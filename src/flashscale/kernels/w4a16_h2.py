"""The packed 16-bit ("h2") W4A16 unpack: two weights an instruction where the fp32 magic-number unpack
(w4a16_common) takes one, exactly the same 16-bit values.

One pair = the two weights of one A-fragment register (k0 = 0, 1 of PackedW4's nibble j = 4 k3 + 2 n3 + k0:
nibbles 2m and 2m + 1, the low and high nibble of byte m of the word). Per word (8 weights):

    sh = w >> 4                                   1 SHF (outside the asm: one a word, shared by its 4 pairs)
    v  = prmt(w, sh, SEL[m])                      byte m of w to byte 0, byte m of sh to byte 2 (4 PRMT)
    v  = (v & 0x000F000F) | BIAS                  nibble 2m at bits 0-3, 2m + 1 at bits 16-19, under the
                                                  16-bit magic: BIAS + q exactly (4 LOP3)
    d  = v - C                                    C = BIAS + z: d = q - z exactly (4 HADD2)
  bf16:  u = d * S_LO;  w = fma(d, S_HI, u)       S_HI = bf16(s), S_LO = bf16(s - S_HI): (4 HMUL2, 4 HFMA2)
  fp16:  w = d * S                                (4 HMUL2)

that is 9 ALU-pipe instructions (SHF, PRMT, LOP3) a word against the fp32 unpack's 11 (+ its 4 F2FP packs),
and 8 (fp16) or 12 (bf16) packed FMA-pipe instructions against 8 FFMA.

Why it is exact (w = (q - z) * s rounded once to the 16-bit type, as the reference and the fp32 unpack give):
  * BIAS + q and BIAS + z are integers below 2^8 (bf16: BIAS 128, 8 significant bits) or 2^11 (fp16: 1024),
    so both are exact and d = q - z (|d| <= 16) is exact.
  * fp16: s is a float16 (PackedW4's scales), so d * s rounded once is the reference.
  * bf16: s has 11 significant bits and bf16 8, so s is split: S_HI = s rounded to bf16, S_LO = s - S_HI has at
    most 3 significant bits (|s - S_HI| <= half an ulp of bf16 at s, on s's own grid) and is a bf16 exactly;
    u = d * S_LO has at most 4 + 3 = 7 significant bits: exact; fma(d, S_HI, u) = d * s exactly before its one
    rounding. tests/kernels/test_w4a16_h2.py runs this asm text through `emulate` for every (q, z) and every
    positive float16 scale against the float64 reference.
"""

from __future__ import annotations

import numpy as np
import torch

BIAS = {"bf16": 0x4300, "fp16": 0x6400}  # 128.0 / 1024.0: a nibble OR-ed into the mantissa's low bits is + q
PTX_TYPE = {"bf16": "bf16", "fp16": "f16"}
SEL = (0x0400, 0x0501, 0x0602, 0x0703)  # prmt: result byte 0 <- w byte m, byte 2 <- sh byte m (bytes 1, 3: unused)


def pair_asm(m: int, ty: str) -> str:
    """PTX of pair m (0..3) of a word, for Gluon's inline_asm_elementwise with pack=2 on int32 inputs (each
    input gives the two elements of the pair, equal: one register each is read): $0 the packed output pair;
    $1/$2 the word, $3/$4 the word >> 4, $5/$6 C = BIAS + z in both halves, then bf16: $7/$8 S_LO, $9/$10 S_HI;
    fp16: $7/$8 S."""
    if ty not in BIAS:
        raise ValueError(f"ty={ty!r}: 'bf16' or 'fp16'")
    if m not in range(4):
        raise ValueError(f"m={m}: a pair of the word, 0..3")
    bias = BIAS[ty] * 0x10001
    lines = ["{", ".reg .b32 v, d, u;", f"prmt.b32 v, $1, $3, {SEL[m]:#06x};",
             f"lop3.b32 v, v, 0x000F000F, {bias:#010x}, 0xEA;", f"sub.rn.{PTX_TYPE[ty]}x2 d, v, $5;"]
    if ty == "bf16":
        lines += ["mul.rn.bf16x2 u, d, $7;", "fma.rn.bf16x2 $0, d, $9, u;"]
    else:
        lines += ["mul.rn.f16x2 $0, d, $7;"]
    return "\n".join(lines + ["}"])


def constraints(ty: str) -> str:
    return ",".join(["=r"] + ["r"] * (10 if ty == "bf16" else 8))


# ---- reference: the asm text above, executed on numpy arrays (what the CPU tests run)

def _round16(x: np.ndarray, ty: str) -> np.ndarray:
    """float64 values that float32 holds exactly -> uint16 bits of the 16-bit float, rounded to nearest even."""
    f32 = x.astype(np.float32)
    if not np.array_equal(f32.astype(np.float64), x):
        raise ValueError("emulate: an intermediate is not a float32 exactly (the rounding here would be double)")
    if ty == "fp16":
        with np.errstate(over="ignore"):  # d * s past float16's range: inf, as the reference's own cast gives
            return f32.astype(np.float16).view(np.uint16)
    return torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _value16(bits: np.ndarray, ty: str) -> np.ndarray:
    """uint16 bits -> float64 values."""
    if ty == "fp16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _halves(r: np.ndarray, ty: str) -> tuple[np.ndarray, np.ndarray]:
    return _value16((r & 0xFFFF).astype(np.uint16), ty), _value16((r >> 16).astype(np.uint16), ty)


def _pack(lo: np.ndarray, hi: np.ndarray, ty: str) -> np.ndarray:
    return _round16(lo, ty).astype(np.uint32) | (_round16(hi, ty).astype(np.uint32) << 16)


def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = np.zeros_like(a)
    for k in range(4):
        out |= src[(sel >> (4 * k)) & 7] << (8 * k)
    return out


def _lop3_ea(a: np.ndarray, b: int, c: int) -> np.ndarray:
    return (a & b) | c  # immLut 0xEA = (a & b) | c


def emulate(text: str, regs: dict[str, np.ndarray], ty: str) -> np.ndarray:
    """Run pair_asm's PTX on uint32 arrays: regs maps "$1".. to the inputs; returns $0. Knows only the
    instructions pair_asm writes (prmt, lop3 0xEA, sub / mul / fma .rn on x2 16-bit pairs), each with the PTX
    ISA's meaning; the 16-bit results are rounded once from exact float64 values."""
    env = {k: np.asarray(v, dtype=np.uint64).astype(np.uint32) for k, v in regs.items()}

    def val(tok: str):
        tok = tok.strip().rstrip(";")
        return int(tok, 0) if tok[0].isdigit() else env[tok]

    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        dst, src = args[0], [val(a) for a in args[1:]]
        if op == "prmt.b32":
            env[dst] = _prmt(src[0], src[1], src[2])
        elif op == "lop3.b32":
            if src[3] != 0xEA:
                raise ValueError(f"emulate: lop3 immLut {src[3]:#x} (only 0xEA)")
            env[dst] = _lop3_ea(src[0], src[1], src[2]).astype(np.uint32)
        elif op in (f"sub.rn.{PTX_TYPE[ty]}x2", f"mul.rn.{PTX_TYPE[ty]}x2", f"fma.rn.{PTX_TYPE[ty]}x2"):
            a, b = _halves(src[0], ty), _halves(src[1], ty)
            if op.startswith("sub"):
                r = [a[i] - b[i] for i in range(2)]
            elif op.startswith("mul"):
                r = [a[i] * b[i] for i in range(2)]
            else:
                c = _halves(src[2], ty)
                r = [a[i] * b[i] + c[i] for i in range(2)]
            env[dst] = _pack(r[0], r[1], ty)
        else:
            raise ValueError(f"emulate: unknown instruction {line!r}")
    return env["$0"]


def pair_constants(scale: np.ndarray, zero: np.ndarray, ty: str) -> dict[str, np.ndarray]:
    """float16 scales and integer zero points -> the asm's C / S_LO / S_HI (or S) registers, both halves equal,
    computed as the kernel computes them (s rounded to bf16; the remainder, exact, rounded again: exact)."""
    s = np.asarray(scale, dtype=np.float16).astype(np.float64)
    dup = lambda b: b.astype(np.uint32) | (b.astype(np.uint32) << 16)  # noqa: E731
    c = dup(_round16(np.asarray(zero, dtype=np.float64) + (128.0 if ty == "bf16" else 1024.0), ty))
    if ty == "fp16":
        return {"$5": c, "$6": c, "$7": dup(_round16(s, ty)), "$8": dup(_round16(s, ty))}
    hi = dup(_round16(s, ty))
    lo = dup(_round16(s - _value16(hi & 0xFFFF, ty), ty))
    return {"$5": c, "$6": c, "$7": lo, "$8": lo, "$9": hi, "$10": hi}
