"""Ahead-of-time sm_90 compiles of the register-ring decode kernel (no GPU needed) and what the machine code says:
compile_sm90, the hot loop of its SASS (hot_loop, shared with w4a16_gring), the census of a config and the census's
jobs. Apart from the kernel and its launcher: tooling for tests and `python -m flashscale.kernels.w4a16_ring`.
"""

from __future__ import annotations

import triton

from flashscale.kernels.w4a16_ring_config import RingConfig, configs_for
from flashscale.kernels.w4a16_ring_kernel import w4a16_ring_kernel


def compile_sm90(cfg: RingConfig, *, dtype: str = "bf16", bm: int = 8, group_size: int = 128, trace: bool = False,
                 add: bool = False, pdl: bool = False, xmode: int = 0, trigger: bool = False, k: int = 4096,
                 pre_l2: int = 0, pch: int | None = None, dyn: int = 0):
    """Compile one config as a launch on an even Llama shape specializes it (K, N multiples of 256, pointers and
    strides 16-divisible, no bias): returns Triton's CompiledKernel (asm: ptx, cubin). xmode: the prologue (0 none,
    1 XNorm with r, 2 XSiLU, 3 XAttn of 8 splits, head dim 128) for K = k inputs, pch inputs a prologue round
    (default 1024, XAttn 128); dyn: the DYN build with chunks of that many items (0: static)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptrs = {"x_ptr": "*i32", "pk_ptr": "*i32", "sz_ptr": "*i32", "y_ptr": "*fp32" if add else f"*{dtype}",
            "bias_ptr": f"*{dtype}", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "trace_ptr": "*i64"}
    pro = {"xo_ptr": f"*{dtype}", "pa_ptr": "*fp32" if xmode in (2, 3) else f"*{dtype}",
           "pr_ptr": "*fp32" if xmode else f"*{dtype}", "pw_ptr": f"*{dtype}", "po_ptr": f"*{dtype}"}
    ints = ("M", "N", "K", "stride_xm", "stride_ym", "stride_pn", "stride_sg", "S", "U", "CMAX")
    late = {"LATE_CUT": "i32"}
    cx = dict(G=group_size, HAS_BIAS=False, BF16=dtype == "bf16", BN=cfg.bn, KT=cfg.kt, BM=bm, RING=cfg.ring,
              ATOMIC=cfg.atomic, EVEN_K=True, EVEN_N=True, ASM=cfg.asm, L2AHEAD=cfg.l2_ahead, TRACE=trace,
              ADD=add, PDL=pdl, XMODE=xmode, HAS_R=xmode == 1,
              NBLK={1: min(triton.next_power_of_2(k), 8192), 3: 8}.get(xmode, 16),
              PCH=pch or {0: 128, 3: 128}.get(xmode, 1024),
              TRIGGER=trigger, L2PRE=pre_l2, PHD=128 if xmode == 3 else 1, DYN=dyn > 0, CH=max(dyn, 2),
              LATE=cfg.late)
    sig = {**ptrs, **{n: "i32" for n in ints}, **pro, "eps": "fp32", "ctr_ptr": "*i32", **late,
           **{n: "constexpr" for n in cx}}
    names = list(sig)
    aligned = set(ptrs) | set(pro) | {"N", "K", "stride_xm", "stride_ym", "stride_pn", "stride_sg"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in aligned}
    src = ASTSource(fn=w4a16_ring_kernel, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()},
                    attrs=attrs)
    opts = {"num_warps": cfg.num_warps, "num_stages": 1, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def hot_loop(ins: list[tuple[int, str]], prefix: str = "LDG",
             suffix: str = ".128") -> tuple[list[tuple[int, str]], int]:
    """The main loop (the backward branch's body holding the most opcodes prefix...suffix: LDG.128 here, HMMA for
    w4a16_gring, whose loads are cp.async), less the flush: forward-branch regions holding an atomic and no HMMA (a
    tile's end, once a tile, not once an item). Returns (body, flush instrs)."""
    from flashscale.kernels.aot import branch_target, sass_loops, sass_opcode

    body = max(sass_loops(ins), key=lambda b: sum(sass_opcode(t).startswith(prefix) and sass_opcode(t).endswith(suffix)
                                                   for _, t in b))
    skips = []
    for a, t in body:
        e = branch_target(t)
        if e is not None and e > a:
            ops = [sass_opcode(x) for b, x in body if a < b < e]
            if any(o.startswith(("ATOM", "RED")) for o in ops) and not any(o.startswith("HMMA") for o in ops):
                skips.append((a, e))
    keep = [(a, t) for a, t in body if not any(s < a < e for s, e in skips)]
    return keep, len(body) - len(keep)


def loop_mix(k) -> dict:
    """A compiled kernel's hot loop (hot_loop): text (SASS), body (the loop's opcodes in order), ops (opcode counts),
    flush (instructions skipped), rate (w4a16_stream.sass_load_rate), stats (ptxas), n(*prefixes, suffix=) (opcodes
    counted by prefix and suffix), shared and local (LDL / STL count): what the census of this kernel and of
    w4a16_strip read."""
    import collections
    import re

    from flashscale.kernels.aot import ptxas_stats, sass, sass_instructions, sass_opcode
    from flashscale.kernels.w4a16_stream import sass_load_rate

    text = sass(k.asm["cubin"])
    body, flush = hot_loop(sass_instructions(text))
    order = [sass_opcode(t) for _, t in body]
    ops = collections.Counter(order)

    def n(*prefixes, suffix=""):
        return sum(c for o, c in ops.items() if o.startswith(prefixes) and o.endswith(suffix))

    return dict(text=text, body=order, ops=ops, flush=flush, rate=sass_load_rate(body),
                stats=ptxas_stats(k.asm["ptx"]), n=n, shared=k.metadata.shared,
                local=len(re.findall(r"\b(?:LDL|STL)\b", text)))


def census(cfg: RingConfig, **kw) -> dict:
    """Compile for sm_90 and count: registers, spills, local memory, shared memory, atomics, and the hot loop's
    instruction mix a RING-item iteration, its modelled loads in flight a thread and load waits an iteration."""
    import re
    from dataclasses import asdict

    k = compile_sm90(cfg, **kw)
    mix = loop_mix(k)
    ops, rate, stats, n, flush = mix["ops"], mix["rate"], mix["stats"], mix["n"], mix["flush"]
    weights = cfg.ring * cfg.bn * 64 * cfg.kt // (32 * cfg.num_warps)  # a thread's weights an iteration
    return dict(config=asdict(cfg), label=cfg.label, bm=kw.get("bm", 8), dtype=kw.get("dtype", "bf16"),
                **{n_: v for n_, v in stats.items() if n_ != "log"}, shared=mix["shared"], local=mix["local"],
                atomics_ptx=len(re.findall(r"\b(?:atom|red)\.global", k.asm["ptx"])),
                loop_instructions=sum(ops.values()), flush_instructions=flush, per_weight=sum(ops.values()) / weights,
                ldg128=n("LDG", suffix=".128"), ldg_other=n("LDG") - n("LDG", suffix=".128"), hmma=n("HMMA"),
                lop3=ops["LOP3.LUT"], shifts=n("SHF", "IMAD.SHL"), prmt=ops["PRMT"], moves=n("MOV", "IMAD.MOV"),
                uniform=n("U"), fp32=n("FFMA", "FMUL", "FADD"), smem=n("LDS", "STS"), bar=n("BAR"),
                loads_in_flight=rate["loads_in_flight"], ldg_per_iter=rate["ldg_per_iter"],
                cycles_per_iter=rate["cycles_per_iter"], waits_per_iter=rate["waits_per_iter"],
                resident=cfg.resident(stats["registers"]), per_sm_options=cfg.per_sm_options(stats["registers"]))


def aot_jobs() -> list[tuple[RingConfig, dict]]:
    """(config, compile kwargs) of the census: every candidate of each token bucket (bf16, G = 128; kt1 configs at
    G = 64, the group size they are for)."""
    return [(c, dict(bm=bm, group_size=128 if c.kt == 2 else 64)) for bm in (8, 16) for c in configs_for(bm)]
