"""Ahead-of-time sm_90 compiles of the W4A16 wgmma GEMM (no GPU needed) and what the machine code says:
compile_sm90 (one config as a launch on (K, N) specializes it), census (registers, spills, shared memory and the main
loop's SASS: HGMMAs, waits, moves, dequant instructions and their overlap with the wgmma) and _main, the census of
every candidate (`python -m flashscale.kernels.w4a16_wgmma`, whose __main__ block calls it). Apart from the kernel
and its launcher: tooling for tests and docs.
"""

from __future__ import annotations

import re

import torch

from flashscale.kernels.w4a16_wgmma_config import (WgmmaConfig, _grid_flags, _szr, all_candidates, config_error,
                                                   launch_options)
from flashscale.kernels.w4a16_wgmma_unpack import HAS_GLUON

if HAS_GLUON:
    import triton

    from flashscale.kernels.w4a16_wgmma_kernel import _layouts, w4a16_wgmma_kernel


# ---- ahead-of-time sm_90 compiles (no GPU needed) and what the machine code says

def compile_sm90(cfg: WgmmaConfig, *, n: int = 8192, k: int = 8192, group_size: int = 128,
                 dtype: torch.dtype = torch.bfloat16, bias: bool = False, split_k: int = 1):
    """Compile one config for sm_90 as a launch on (K, N) specializes it. Returns Triton's CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    bad = config_error(cfg, group_size, k)
    if bad is not None:
        raise ValueError(f"compile_sm90: {cfg}: {bad}")
    ty = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    w_l, x_l, sz_l = _layouts(cfg, dtype)
    sig = {"w_desc": f"tensordesc<i32[{cfg.bn // 16},{cfg.bk // 64},128],{w_l!r}>",
           "x_desc": f"tensordesc<{ty}[{cfg.bm},{cfg.bk}],{x_l!r}>",
           "sz_desc": f"tensordesc<i32[{_szr(cfg, group_size)},{cfg.bn}],{sz_l!r}>",
           "y_ptr": f"*{ty}", "bias_ptr": f"*{ty}", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
           "K": "i32", "MAGIC": "i32", "SPLIT_K": "i32", "DP": "i32", "SKQ": "i32", "MAXC": "i32"}
    persistent, stream_k = _grid_flags(cfg, split_k)
    cx = dict(G=group_size, HAS_BIAS=bias, BM=cfg.bm, BK=cfg.bk, STAGES=cfg.stages, CONSUMERS=cfg.consumers,
              GROUP=cfg.group, PRODUCER_REGS=cfg.producer_regs, CONSUMER_REGS=cfg.consumer_regs, HAS_SPLIT=split_k > 1,
              PINGPONG=cfg.pingpong, PERSISTENT=persistent, STREAM_K=stream_k, H2=cfg.h2,
              VEC_Y=cfg.vec_y and n % 8 == 0)
    names = list(sig)
    sig.update({key: "constexpr" for key in cx})
    attrs = {(names.index(a), ): [["tt.divisibility", 16]] for a in ("y_ptr", "bias_ptr", "ws_ptr", "cnt_ptr")}
    src = GluonASTSource(fn=w4a16_wgmma_kernel, signature=sig, constexprs=cx, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, **launch_options(cfg)})


_DEQUANT_OPS = ("LOP3", "SHF", "FFMA", "F2FP", "HADD2", "HMUL2", "HFMA2")  # the last three: the h2 unpack's


def _is_move(instruction: str) -> bool:
    """A register copy: MOV, IMAD.MOV, or PRMT with the identity selector 0x7610 of one register."""
    from flashscale.kernels.aot import sass_opcode

    op = sass_opcode(instruction)
    if op in ("MOV", "IMAD.MOV", "IMAD.MOV.U32"):
        return True
    m = re.search(r"PRMT\s+R\d+,\s*(R\d+),\s*0x7610,\s*(R\d+)", instruction)
    return bool(m) and m.group(1) == m.group(2)


def census(cfg: WgmmaConfig, **kw) -> dict:
    """Registers, spills, SMEM and the consumer main loop's SASS: HGMMA count, K steps (commit groups) and waits a
    loop body, register moves, dequant instructions and how many of them are issued while a wgmma group is in flight
    (between its first HGMMA and the WARPGROUP.DEPBAR that retires it): the overlap."""
    from flashscale.kernels.aot import ptxas_stats, sass, sass_key_loops, sass_opcode

    kern = compile_sm90(cfg, **kw)
    ptx = kern.asm["ptx"]
    stats = ptxas_stats(ptx)
    text = sass(kern.asm["cubin"])
    loops = sass_key_loops(text, "HGMMA")
    res = dict(config=cfg.label(), bm=cfg.bm, bk=cfg.bk, consumers=cfg.consumers, features=cfg.features,
               fp16=kw.get("dtype") == torch.float16, pingpong=cfg.pingpong,
               stream_k=_grid_flags(cfg, kw.get("split_k", 1))[1],
               registers=stats["registers"],
               spill_stores=stats["spill_stores"], spill_loads=stats["spill_loads"], stack=stats["stack"],
               local=len(re.findall(r"\b[LS]TL\b", text)), shared=kern.metadata.shared,
               serialized="serialized" in stats["log"], stg128=len(re.findall(r"\bSTG\.E\.128\b", text)),
               stg16=len(re.findall(r"\bSTG\.E\.U16\b", text)), stsm=len(re.findall(r"\bSTSM\b", text)),
               setmaxnreg=sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
               loops=[])
    for body in loops:
        ops = [sass_opcode(t) for _, t in body]
        deq = [o.split(".")[0] in _DEQUANT_OPS for o in ops]
        # the overlap: dequant ops issued while a wgmma group is in flight (issued, not yet retired by a
        # WARPGROUP.DEPBAR.LE n); two passes over the body so the groups carried around the back edge count
        between, flight, open_ = 0, 0, False
        for rep in range(2):
            for (_, t), o, d in zip(body, ops, deq):
                if "HGMMA" in o:
                    flight += not open_
                    open_ = "gsb0" not in t  # the last HGMMA of a commit group carries gsb0
                elif o.startswith("WARPGROUP.DEPBAR"):
                    flight = min(flight, int(t.split(",")[-1].strip(), 0))
                elif d and rep and (flight or open_):
                    between += 1
        res["loops"].append(dict(
            instructions=len(ops), hgmma=sum("HGMMA" in o for o in ops), steps=sum("HGMMA" in o and "gsb0" in t for o, (_, t) in zip(ops, body)),
            waits=sum(o.startswith("WARPGROUP.DEPBAR") for o in ops),
            lds128=sum(o.startswith("LDS.128") for o in ops), sts=sum(o.startswith("STS") for o in ops),
            bar=sum(o.startswith("BAR") for o in ops), moves=sum(_is_move(t) for _, t in body),
            dequant={d: sum(o.split(".")[0] == d for o in ops) for d in _DEQUANT_OPS},
            dequant_between_issue_and_wait=between, dequant_total=sum(deq)))
    return res


def _main() -> None:  # python -m flashscale.kernels.w4a16_wgmma: the census of every candidate
    import json
    import sys

    rows = []
    for n, k in ((8192, 8192), (28672, 8192)):
        for cfg in all_candidates():
            r = census(cfg, n=n, k=k)
            r["shape"] = f"{k}x{n}"
            rows.append(r)
            lp = r["loops"]
            print(f"{k}x{n} {r['config']:24s} regs {r['registers']:3d} spill {r['spill_stores']}/{r['spill_loads']} "
                  f"local {r['local']} smem {r['shared']} maxnreg {r['setmaxnreg']} serialized {r['serialized']} | "
                  + "; ".join(f"loop {x['steps']} steps, {x['instructions']} instr, {x['hgmma']} HGMMA, "
                              f"{x['lds128']} LDS.128, {x['sts']} STS, {x['bar']} BAR, {x['moves']} moves, dequant "
                              f"{x['dequant_total']} ({x['dequant_between_issue_and_wait']} between issue and wait) "
                              f"{x['dequant']}" for x in lp), flush=True)
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)
