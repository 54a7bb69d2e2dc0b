"""W4A16 decode (M <= 16) in Gluon, the items in flight in a shared-memory ring (docs/w4a16_decode.md "Round 8").

y (M, N) = x (M, K) @ dequant(W) (K, N) (+ bias) for a PackedW4 weight; opt-in (w4a16_gring()), not in w4a16_matmul's
dispatch: measured on the H200 (session 29, the probe's q-dec rows) it is correct everywhere and slower than the
register ring everywhere (8192^2 M = 1: 23.0 us against 15.8, with 80-96 KB an SM in flight against 64), so bytes in
flight were not what held the ring back. Kept as the measured alternative. Hopper (sm_90) with Gluon only: no
interpreter path (the CPU tests compile it for sm_90 and read the machine code; the GPU tests check it against
float64).

Why: the register ring (w4a16_ring) measured 15.8 us at 8192^2 against 9.65 us for the same bytes loads-only: its
in-flight bytes live in registers, so during the math only the next item is in flight (~32 KB an SM) and a deeper
ring costs residency. Triton's pipeliner can move the loads to cp.async, but the tensor it reads back from shared
memory gets a layout of the compiler's choosing (the mma.sync fragment needs warps over fragment rows and a lane's
4 words in its own registers: docs "Round 8"). Gluon states the layout.

Files: w4a16_gring_config.py (GRingConfig, the candidates, configs_for), w4a16_gring_kernel.py (the Gluon kernel
under the Gluon import guard, and the design it implements in its module docstring); this module checks the
arguments, launches, compiles ahead of time (compile_sm90, census, the python -m table) and re-exports the names
that callers import from it.
"""

from __future__ import annotations

import torch
import triton

from flashscale.kernels.w4a16 import _device_info, stream_k_grid, x_words
from flashscale.kernels.w4a16_common import split_k_slices, split_k_workspace
from flashscale.kernels.w4a16_gring_config import GRING_CONFIGS, GRING_CONFIGS_16, SMEM_PER_SM, GRingConfig, configs_for
from flashscale.kernels.w4a16_gring_kernel import HAS_GLUON
from flashscale.kernels.w4a16_pack import PackedW4
from flashscale.kernels.w4a16_ring import check_operands

if HAS_GLUON:
    from flashscale.kernels.w4a16_gring_kernel import w4a16_gring_kernel

# Names tests and benchmarks import from here (tests/kernels/test_w4a16_gring.py, benchmarks/w4a16_probe.py), kept
# importable since the split into w4a16_gring_config / w4a16_gring_kernel (the kernel where Gluon is there).
__all__ = [
    "GRING_CONFIGS", "GRING_CONFIGS_16", "HAS_GLUON", "SMEM_PER_SM", "GRingConfig", "census", "check_args",
    "compile_sm90", "configs_for", "launch", "unsupported", "w4a16_gring",
]
if HAS_GLUON:
    __all__ += ["w4a16_gring_kernel"]


# ---- launcher

def unsupported(x: torch.Tensor, p: PackedW4, cfg: GRingConfig) -> str | None:
    """Why this kernel cannot take the call (beyond check_args' argument errors), or None."""
    if not HAS_GLUON:
        return "this triton has no Gluon"
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] != 9:
        return "needs a Hopper GPU (sm_90)"
    return None


def check_args(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, cfg: GRingConfig, per_sm: int) -> None:
    """ValueError / TypeError naming the argument for anything the kernel does not take."""
    check_operands(x, p, bias, cfg.kt, "this decode kernel")
    nb = cfg.bn // 16
    if cfg.bn < 16 or cfg.bn & (cfg.bn - 1) or nb % cfg.num_warps:
        raise ValueError(f"config.bn={cfg.bn} must be a power of two >= 16 with bn / 16 a multiple of num_warps="
                         f"{cfg.num_warps} (warps split the fragment rows)")
    if cfg.kt not in (1, 2):
        raise ValueError(f"config.kt={cfg.kt} must be 1 or 2")
    if not isinstance(cfg.stages, int) or not 2 <= cfg.stages <= 8:
        raise ValueError(f"config.stages={cfg.stages!r} must be an int in 2..8")
    if not isinstance(per_sm, int) or per_sm < 1:
        raise ValueError(f"per_sm={per_sm!r} must be a positive int")


def w4a16_gring(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None, *,
                config: GRingConfig | None = None, per_sm: int | None = None) -> torch.Tensor:
    """x (M <= 16, K) fp16/bf16 -> y (M, N) in x's dtype = x @ dequant(W) + bias (Hopper, Gluon).
    config: default the first candidate of M's bucket; per_sm: programs an SM (default config.per_sm)."""
    cfg = config or configs_for(x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 2 else 1)[0]
    per_sm = cfg.per_sm if per_sm is None else per_sm
    check_args(x, p, bias, cfg, per_sm)
    why = unsupported(x, p, cfg)
    if why is not None:
        raise ValueError(f"w4a16_gring: {why}")
    y = torch.empty((x.shape[0], p.out_features), dtype=x.dtype, device=x.device)
    if x.shape[0]:
        launch(x, p, bias, y, cfg, per_sm)
    return y


def _launch_args(m: int, k: int, n: int, p: PackedW4, cfg: GRingConfig, per_sm: int, num_sms: int, dtype):
    progs, items, steps, cmax = stream_k_grid(k, n, cfg.bn, cfg.kt, per_sm, num_sms)
    tb = 1 if m <= 8 else 2
    cx = dict(G=p.group_size, BF16=dtype == torch.bfloat16, BN=cfg.bn, KT=cfg.kt, TB=tb, STAGES=cfg.stages,
              CM=triton.next_power_of_2(cmax), ATOMIC=cfg.atomic, EVEN_K=k % (64 * cfg.kt) == 0,
              EVEN_N=p.sz.shape[1] % cfg.bn == 0)
    return progs, items, steps, cx


def launch(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, y: torch.Tensor, cfg: GRingConfig, per_sm: int):
    """One launch into y (M, N) (arguments as check_args takes them, M >= 1); returns the compiled kernel."""
    m, k = x.shape
    n = p.out_features
    xw = x_words(x, p)
    progs, items, steps, cx = _launch_args(m, k, n, p, cfg, per_sm, _device_info(x.device)[1], x.dtype)
    tiles = triton.cdiv(n, cfg.bn)
    slot = cfg.bn * 8 * cx["TB"]
    zero_f, cnt = split_k_workspace(x.device, tiles * slot)  # element tickets (and ATOMIC's tiles): left zero
    ws = zero_f if cfg.atomic else split_k_slices(x.device, tiles * cx["CM"] * slot)
    return w4a16_gring_kernel[(progs,)](
        xw, p.qweight, p.sz, y, bias if bias is not None else y, ws, cnt,
        m, n, k, xw.stride(0), y.stride(0), p.qweight.stride(0), p.sz.stride(0), steps, items,
        HAS_BIAS=bias is not None, num_warps=cfg.num_warps, **cx)


# ---- ahead-of-time sm_90 compiles (no GPU needed)

def compile_sm90(cfg: GRingConfig, *, dtype: str = "bf16", tokens: int = 8, group_size: int = 128, cm: int = 16):
    """Compile one config as an even Llama-shape launch specializes it; returns Triton's CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ptrs = {"x_ptr": "*i32", "pk_ptr": "*i32", "sz_ptr": "*i32", "y_ptr": f"*{dtype}", "bias_ptr": f"*{dtype}",
            "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
    ints = ("M", "N", "K", "stride_xm", "stride_ym", "stride_pn", "stride_sg", "S", "U")
    cx = dict(G=group_size, HAS_BIAS=False, BF16=dtype == "bf16", BN=cfg.bn, KT=cfg.kt, TB=1 if tokens <= 8 else 2,
              STAGES=cfg.stages, CM=cm, ATOMIC=cfg.atomic, EVEN_K=True, EVEN_N=True, num_warps=cfg.num_warps)
    sig = {**ptrs, **{a: "i32" for a in ints}}
    names = list(sig)
    aligned = set(ptrs) | {"N", "K", "stride_xm", "stride_ym", "stride_pn", "stride_sg"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if a in aligned}
    sig.update({a: "constexpr" for a in cx})
    src = GluonASTSource(fn=w4a16_gring_kernel, signature=sig, constexprs=cx, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})


def census(cfg: GRingConfig, **kw) -> dict:
    """Compile for sm_90 and count: registers, spills, shared memory, and the item loop's instructions (the loop
    holding the HMMAs, less the split-K flush: forward-branch regions with atomics and no HMMA)."""
    import collections

    from flashscale.kernels.aot import ptxas_stats, sass, sass_instructions, sass_opcode
    from flashscale.kernels.w4a16_ring import hot_loop

    k = compile_sm90(cfg, **kw)
    hot = [t for _, t in hot_loop(sass_instructions(sass(k.asm["cubin"])), "HMMA", "")[0]]
    ops = collections.Counter(sass_opcode(t) for t in hot)
    stats = ptxas_stats(k.asm["ptx"])

    def n(*prefixes):
        return sum(c for o, c in ops.items() if o.startswith(prefixes))

    weights = cfg.bn * 64 * cfg.kt // (32 * cfg.num_warps)  # a thread's weights an item
    never = sum(t.startswith("@!PT") for t in hot)  # never-executed padding Triton puts before cp.async
    return dict(label=cfg.label, tokens=kw.get("tokens", 8), **{a: b for a, b in stats.items() if a != "log"},
                shared=k.metadata.shared, loop_instructions=len(hot) - never, per_weight=(len(hot) - never) / weights,
                ldgsts=n("LDGSTS"), ldgsts128=sum(c for o, c in ops.items() if o.startswith("LDGSTS") and ".128" in o),
                ldg=n("LDG") - n("LDGSTS", "LDGDEPBAR"), lds128=ops["LDS.128"], hmma=n("HMMA"), bar=n("BAR"),
                lop3=ops["LOP3.LUT"], shifts=n("SHF", "IMAD.SHL"), resident=cfg.resident(stats["registers"]))


if __name__ == "__main__":  # PYTHONPATH=src python -m flashscale.kernels.w4a16_gring (TRITON_INTERPRET unset)
    for tokens, cfgs in ((8, GRING_CONFIGS), (16, GRING_CONFIGS_16)):
        for c in cfgs:
            r = census(c, tokens=tokens)
            print(f"{c.label:36s} M<={tokens:2d} | {r['registers']:3d} regs {r['spill_stores']}/{r['spill_loads']} "
                  f"spills {r['shared'] // 1024:3d} KB smem, {r['resident']} resident | loop {r['loop_instructions']} "
                  f"({r['per_weight']:.2f}/weight) LDGSTS {r['ldgsts']} (128-bit {r['ldgsts128']}) LDS.128 "
                  f"{r['lds128']} HMMA {r['hmma']} BAR {r['bar']} LOP3 {r['lop3']} shifts {r['shifts']}", flush=True)
