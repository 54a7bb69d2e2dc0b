"""Ahead-of-time sm_90 compiles of the loads-only streaming kernels (w4a16_stream_kernels.py; no GPU needed: Triton
ships ptxas and cuobjdump) and what their machine code says: registers, spills, shared memory, the load
instructions, and sass_load_rate, a static model of a loop's loads in flight (also w4a16_ring_aot's). Apart from the
kernels and the launcher: tools and tests only, nothing a launch needs.
"""

from __future__ import annotations

import triton

from flashscale.kernels.w4a16_stream_config import StreamConfig
from flashscale.kernels.w4a16_stream_kernels import (HAS_GLUON, _chunk_rows, smem_layout, stream_ldg_kernel,
                                                     stream_tma_kernel)

if HAS_GLUON:
    from flashscale.kernels.w4a16_stream_kernels import stream_gluon_kernel


# ---- ahead-of-time sm_90 compiles (no GPU needed) and what the machine code says

def compile_sm90(cfg: StreamConfig, *, even: bool = True):
    """Compile one config for sm_90 the way a launch on a Llama shape specializes it (pointers and strides
    16-divisible; even: no box crosses the view's edge). Returns Triton's CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    if cfg.kind == "triton":
        sig = {"src": "*i32", "out": "*i32", "ROWS": "i32", "COLS": "i32", "RS": "i32", "S": "i32", "U": "i32",
               "ZERO": "i32"}
        cx = dict(BR=cfg.br, BC=cfg.bc, RING=cfg.stages, EVEN=even, FLAT=cfg.view == "flat")
        fn, src_cls, opts = stream_ldg_kernel, ASTSource, {"num_warps": cfg.num_warps, "num_stages": 1}
    else:
        if cfg.kind == "tma":
            desc = f"tensordesc<i32[{cfg.br},{cfg.bc}]>"
            cx = dict(BR=cfg.br, BC=cfg.bc, STAGES=cfg.stages, FLAT=cfg.view == "flat")
            fn, src_cls = stream_tma_kernel, ASTSource
        else:
            from triton.experimental.gluon._runtime import GluonASTSource

            desc = f"tensordesc<i32[{cfg.br},{cfg.bc}],{smem_layout(cfg)!r}>"
            cx = dict(BR=cfg.br, BC=cfg.bc, STAGES=cfg.stages, CR=_chunk_rows(cfg), PRODUCER_REGS=24,
                      num_warps=cfg.num_warps)
            fn, src_cls = stream_gluon_kernel, GluonASTSource
        sig = {"desc": desc, "out": "*i32", "S": "i32", "U": "i32"}
        opts = {"num_warps": cfg.num_warps}
    names = list(sig) + list(cx)
    sig.update({k: "constexpr" for k in cx})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("src", "out", "RS") if n in names}
    if src_cls is ASTSource:
        src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()}, attrs=attrs)
    else:
        src = src_cls(fn=fn, signature=sig, constexprs=cx, attrs=attrs)
    return triton.compile(src, target=target, options=opts)


def _regs_of(operands: str) -> list[int]:
    import re

    return [int(x) for x in re.findall(r"\bR(\d+)\b", operands)]


def sass_load_rate(body: list[tuple[int, str]], latency: int = 1000, iters: int = 24) -> dict:
    """A static model of a loop's global loads: instructions issue one a cycle in program order, an instruction
    that reads (or overwrites) a register whose LDG is in flight waits until the load is back `latency` cycles
    after it issued. Returns the loop's LDGs an iteration, its steady-state cycles an iteration and
    loads_in_flight = LDGs a latency (Little's law: what a thread keeps in flight, as the ptxas schedule
    allows), and waits_per_iter: the instructions of a steady-state iteration (the third) that stall on a load.
    This is what exposes a register ring rotated by moves (the move waits for the load it copies) or two boxes'
    XORs fused into one LOP3 (the older waits for the newer)."""
    import re

    ready: dict[int, int] = {}
    t, starts, nld, waits = 0, [], 0, 0
    for it in range(iters):
        starts.append(t)
        for _, txt in body:
            txt = re.sub(r"^@!?U?P\w+\s+", "", txt)
            op = txt.split()[0]
            parts = txt[len(op):].split(",")
            dst, srcs = _regs_of(parts[0]), _regs_of(",".join(parts[1:]))
            writes = not op.startswith(("ST", "BRA", "RED", "ATOM"))
            used = set(srcs) | (set(dst) if writes else set())  # reads, and WAW on a load's destination
            need = max([0] + [ready.get(r, 0) for r in used])
            waits += it == 2 and need > t + 1
            t = max(t + 1, need)
            if op.startswith("LDG"):
                width = 4 if op.endswith(".128") else 2 if op.endswith(".64") else 1
                for r in range(dst[0], dst[0] + width):
                    ready[r] = t + latency
                nld += it == 0
            elif writes:
                for r in dst:
                    ready[r] = 0
    per_iter = (starts[-1] - starts[iters // 2]) / (iters - 1 - iters // 2)
    return dict(ldg_per_iter=nld, cycles_per_iter=per_iter, loads_in_flight=nld * latency / per_iter,
                waits_per_iter=waits)


def census(cfg: StreamConfig) -> dict:
    """Compile for sm_90 and count: registers, spills, shared memory, the load instructions of the whole kernel
    and, for the plain kernel, the modelled loads in flight of its main loop (sass_load_rate) and what that
    makes an SM at each per_sm option (KB: loads x 16 bytes x threads x programs)."""
    import collections
    import re
    from dataclasses import asdict

    from flashscale.kernels.aot import ptxas_stats, sass, sass_instructions, sass_loops, sass_opcode

    k = compile_sm90(cfg)
    text = sass(k.asm["cubin"])
    ins = sass_instructions(text)
    ops = collections.Counter(sass_opcode(t) for _, t in ins)
    stats = ptxas_stats(k.asm["ptx"])
    r = dict(config=asdict(cfg), label=cfg.label, kind=cfg.kind, shared=k.metadata.shared,
             **{n: v for n, v in stats.items() if n != "log"},
             ldg128=sum(c for o, c in ops.items() if o.startswith("LDG") and o.endswith(".128")),
             ldg_other=sum(c for o, c in ops.items() if o.startswith("LDG") and not o.endswith(".128")),
             ldgsts=sum(c for o, c in ops.items() if o.startswith("LDGSTS")),
             utmaldg=sum(c for o, c in ops.items() if o.startswith("UTMALDG")),
             lds128=ops["LDS.128"], local=len(re.findall(r"\b(?:LDL|STL)\b", text)),
             per_sm_options=cfg.per_sm_options(stats["registers"], k.metadata.shared),
             design_in_flight_kb={p: cfg.in_flight_kb(p, stats["registers"], k.metadata.shared)
                                  for p in cfg.per_sm_options(stats["registers"], k.metadata.shared)})
    if cfg.kind == "triton":
        body = max(sass_loops(ins), key=lambda b: sum(sass_opcode(t).startswith("LDG") for _, t in b))
        rate = sass_load_rate(body)
        r.update(loop_instructions=len(body), **rate,
                 sass_in_flight_kb={p: rate["loads_in_flight"] * 16 * 32 * cfg.num_warps * p / 1024
                                    for p in r["per_sm_options"] if p})
    return r
