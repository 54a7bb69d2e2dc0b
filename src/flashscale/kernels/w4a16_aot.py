"""Ahead-of-time sm_90 compiles of the W4A16 kernels, without a GPU (Triton ships ptxas and cuobjdump),
and a census of the main loop's machine code: what docs/w4a16_decode.md counts and what
tests/kernels/test_w4a16_compile.py asserts.

    python -m flashscale.kernels.w4a16_aot            # table of every decode candidate

Run it with TRITON_INTERPRET unset (the CPU test conftest sets it: the test runs this in a subprocess).
"""

from __future__ import annotations

import collections
import re
from dataclasses import asdict

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flashscale.kernels.aot import branch_target, ptxas_stats, sass, sass_instructions, sass_loops, sass_opcode
from flashscale.kernels.w4a16 import (DecodeConfig, GemmConfig, GemvConfig, _DECODE_CANDIDATES, _GEMM_CANDIDATES,
                                      _GEMV_CANDIDATES)
from flashscale.kernels.w4a16_gemm import w4a16_gemm_kernel
from flashscale.kernels.w4a16_gemv import w4a16_decode_kernel, w4a16_gemv_kernel

_PTRS = ("x_ptr", "pk_ptr", "sz_ptr", "perm_ptr", "y_ptr", "bias_ptr", "ws_ptr", "cnt_ptr")
_ALIGNED_INTS = ("N", "K", "stride_pn", "stride_sg", "stride_xm", "stride_ym")  # 16-divisible at the shapes


def compile_sm90(cfg: GemvConfig | GemmConfig | DecodeConfig, *, dtype: str = "bf16", group_size: int = 128,
                 bm: int = 8, probe: int = 0, pdl: bool = False, l2pf: bool = False):
    """Compile one config the way the launcher specializes it for an even Llama shape (K, N multiples
    of 128, no act-order, no bias); returns Triton's CompiledKernel (asm: ptx, cubin, ttgir).
    bm: the decode kernel's token tile (8: M <= 8, 16: M <= 16); probe: its PROBE mode; pdl: the GEMV / decode
    kernels' programmatic-dependent-launch prologue (kernels.pdl), l2pf with its L2 prefetch."""
    ptr_types = {"x_ptr": f"*{dtype}", "pk_ptr": "*i32", "sz_ptr": "*i32", "perm_ptr": "*i32", "y_ptr": f"*{dtype}",
                 "bias_ptr": f"*{dtype}", "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
    num_stages = getattr(cfg, "num_stages", 1)
    if isinstance(cfg, DecodeConfig):
        kern = w4a16_decode_kernel
        ptr_types = {k: v for k, v in ptr_types.items() if k != "perm_ptr"}
        ptr_types["x_ptr"] = "*i32"
        ints = ("M", "N", "K", "stride_xm", "stride_ym", "stride_pn", "stride_sg", "S", "U", "CMAX")
        cx = dict(G=group_size, HAS_BIAS=False, BF16=dtype == "bf16", BN=cfg.bn, KT=cfg.kt, BM=bm, EVEN_K=True,
                  EVEN_N=True, PREFETCH=cfg.prefetch, ASM=cfg.asm, PROBE=probe, PDL=pdl, L2PF=l2pf)
    elif isinstance(cfg, GemvConfig):
        kern = w4a16_gemv_kernel
        ints = ("N", "K", "stride_pn", "stride_sg", "MAGIC", "SPLIT_K")
        cx = dict(G=group_size, HAS_PERM=False, HAS_BIAS=False, BN=cfg.bn, KT=cfg.kt, EVEN_K=True, EVEN_N=True,
                  PREFETCH=cfg.prefetch, SLICES=cfg.slices, PROBE=probe, PDL=pdl, L2PF=l2pf)
    else:
        kern = w4a16_gemm_kernel
        ints = ("M", "N", "K", "stride_xm", "stride_ym", "stride_pn", "stride_sg", "MAGIC", "SPLIT_K")
        cx = dict(G=group_size, HAS_PERM=False, HAS_BIAS=False, BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, GROUP=cfg.group,
                  EVEN_K=True, EVEN_N=True, SLICES=cfg.slices)
    sig = {**ptr_types, **{n: "i32" for n in ints}, **{n: "constexpr" for n in cx}}
    names = list(sig)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in _PTRS or n in _ALIGNED_INTS}
    src = ASTSource(fn=kern, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": num_stages})


def main_loop(sass_text: str) -> collections.Counter:
    """Opcode histogram of the largest loop (the body between a backward branch and its target), less
    the blocks it skips with forward branches longer than 64 instructions: the decode kernel's
    once-a-tile flush sits inside its loop; per-item work is what the hot path counts."""
    ins = sass_instructions(sass_text)
    loops = sass_loops(ins)
    if not loops:
        return collections.Counter()
    body = max(loops, key=lambda b: b[-1][0] - b[0][0])
    hi = body[-1][0]
    fwd = [(a, branch_target(t)) for a, t in body if (branch_target(t) or 0) > a]
    skips = [(a, t) for a, t in fwd if t <= hi and t - a > 64 * 16]
    return collections.Counter(sass_opcode(t) for a, t in body if not any(s < a < e for s, e in skips))


def weights_per_thread_step(cfg: GemvConfig | GemmConfig | DecodeConfig) -> int:
    bk = cfg.bk if isinstance(cfg, GemmConfig) else 64 * cfg.kt
    return cfg.bn * bk // (32 * cfg.num_warps)


def census(cfg: GemvConfig | GemmConfig | DecodeConfig, **kw) -> dict:
    """Compile and count: per-thread instructions of one main-loop step, per weight, by class.
    kw: compile_sm90's (dtype, group_size, bm for the decode kernel)."""
    k = compile_sm90(cfg, **kw)
    text = sass(k.asm["cubin"])
    loop = main_loop(text)
    w = weights_per_thread_step(cfg)

    def n(pred):
        return sum(c for op, c in loop.items() if pred(op))

    total = sum(loop.values())
    return dict(
        config=asdict(cfg), kernel=_kind(cfg), bm=kw.get("bm", 8) if isinstance(cfg, DecodeConfig) else None,
        dtype=kw.get("dtype", "bf16"), shared=k.metadata.shared,
        **{n: v for n, v in ptxas_stats(k.asm["ptx"]).items() if n != "log"},
        weights_per_thread_step=w, loop_instructions=total,
        per_weight=total / w,
        ldg128=n(lambda o: o.startswith("LDG.") and o.endswith(".128")),
        ldgsts128=n(lambda o: o.startswith("LDGSTS") and o.endswith(".128")),
        ldg_narrow=n(lambda o: o.startswith("LDG.") and not o.endswith((".128", ".64"))),
        lop3=loop["LOP3.LUT"], ffma=loop["FFMA"], fmul_fadd=loop["FMUL"] + loop["FADD"], prmt=loop["PRMT"],
        uniform=n(lambda o: o.startswith("U")),
        cvt=n(lambda o: o.startswith(("I2F", "F2F", "F2I")) and "PACK_AB" not in o),
        f2fp_pack=n(lambda o: "PACK_AB" in o),
        shifts=n(lambda o: o.startswith(("SHF", "IMAD.SHL"))),
        hgmma=n(lambda o: o.startswith("HGMMA")), hmma=n(lambda o: o.startswith("HMMA")),
        wgmma_waits=loop["WARPGROUP.DEPBAR.LE"],
        smem=n(lambda o: o.startswith(("LDS", "STS", "LDSM"))), bar=n(lambda o: o.startswith("BAR")),
        hmma_per_word=n(lambda o: o.startswith("HMMA")) * 8 / w,
        moves=n(lambda o: o.startswith(("IMAD.MOV", "MOV"))),
        local=len(re.findall(r"\b(?:LDL|STL)\b", text)),
        atomics_ptx=len(re.findall(r"\b(?:atom|red)\.global", k.asm["ptx"])),
    )


def _kind(cfg) -> str:
    return "decode" if isinstance(cfg, DecodeConfig) else "gemv" if isinstance(cfg, GemvConfig) else "gemm"


def decode_candidates() -> list[tuple[GemvConfig | GemmConfig | DecodeConfig, dict]]:
    """(config, census kwargs) of every GEMV candidate, every candidate of the decode GEMM buckets
    (M <= 32), every decode-kernel candidate at M <= 8 and the first one at M <= 16 (bm 16)."""
    seen, out = set(), []
    for c in [*_GEMV_CANDIDATES, *_GEMM_CANDIDATES[16], *_GEMM_CANDIDATES[32], *_DECODE_CANDIDATES]:
        if c not in seen:
            seen.add(c)
            out.append((c, {}))
    out.append((_DECODE_CANDIDATES[0], {"bm": 16}))
    return out


if __name__ == "__main__":
    cols = ("registers", "spill_stores", "shared", "loop_instructions", "per_weight", "ldg128", "ldgsts128",
            "ldg_narrow", "lop3", "ffma", "fmul_fadd", "cvt", "f2fp_pack", "shifts", "prmt", "hgmma", "hmma",
            "wgmma_waits", "smem", "moves", "uniform")
    print("config | " + " | ".join(cols))
    for c, kw in decode_candidates():
        r = census(c, **kw)
        cfg = {k: v for k, v in r["config"].items() if v not in (False,) and k != "group"}
        bm = f" bm{r['bm']}" if r["bm"] else ""
        print(f"{r['kernel']}{bm} {cfg} | " + " | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k])
                                                          for k in cols), flush=True)
