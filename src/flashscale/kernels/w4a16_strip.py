"""W4A16 decode (M <= 16) with no split-K across programs: each program owns 16 R output rows over the whole of K and
its warps split K (docs/w4a16_decode.md "Round 14"; the kernel and its design: w4a16_strip_kernel.py).

    y = w4a16_strip(x, p, bias, config=StripConfig(...))

StripConfig, the candidates (STRIP_CONFIGS, M <= 8; STRIP_CONFIGS_16, 9 <= M <= 16), the launcher, and the sm_90
census (`PYTHONPATH=src python -m flashscale.kernels.w4a16_strip`, TRITON_INTERPRET unset: registers, spills and
the hot loop's instruction mix of every candidate).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import triton

from flashscale.kernels import pdl as _pdl
from flashscale.kernels.w4a16_configs import _interpreting
from flashscale.kernels.w4a16_launch import x_words
from flashscale.kernels.w4a16_pack import PackedW4
from flashscale.kernels.w4a16_ring import check_operands
from flashscale.kernels.w4a16_ring_config import resident_programs
from flashscale.kernels.w4a16_strip_kernel import w4a16_strip_kernel, x_perm_kernel


@dataclass(frozen=True, kw_only=True)
class StripConfig:
    rows: int = 1  # R: 16-row fragment rows a program (x shared by R rows a thread; fewer programs)
    kt: int = 2  # 64-wide fragment columns a warp's sub-item (BK = 64 kt inside one group)
    num_warps: int = 4  # W: the warps splitting K
    ring: int = 2  # iterations in flight a program (slots rotated by position), 1..3
    asm: bool = True  # inline PTX (mma.sync); the interpreter always runs the emulation
    xperm: bool = False  # x gathered into the B order first (x_perm_words): 2 LDG.128 and no PRMT a column and lane
    maxnreg: int | None = None  # register cap handed to ptxas: more programs an SM (e.g. 128: four 4-warp programs)
    fence: bool = False  # a never-taken store after the first slot's refill keeps ptxas from sinking it (round 14e)
    reg_level: int | None = None  # ptxas --register-usage-level (0..10, ptxas's default 5); 10: 1-5 % fewer loop
    # instructions at the same registers and some refills issued earlier (sm_90 census, round 14e)

    @property
    def item_bytes(self) -> int:
        """Packed bytes a program reads an iteration (W warps x R rows x KT fragments of 512 B)."""
        return self.num_warps * self.rows * self.kt * 512

    def resident(self, regs: int) -> int:
        return resident_programs(regs, self.num_warps)

    def in_flight_kb(self, regs: int) -> float:
        """KB of packed words in flight an SM by design (resident programs x ring x an iteration's bytes)."""
        return self.resident(regs) * self.ring * self.item_bytes / 1024

    @property
    def label(self) -> str:
        return f"strip r{self.rows} kt{self.kt} w{self.num_warps} ring{self.ring}" + (" xp" if self.xperm else "") \
            + (f" maxnreg{self.maxnreg}" if self.maxnreg else "") \
            + (f" rul{self.reg_level}" if self.reg_level is not None else "") + (" fence" if self.fence else "")

    def options(self, interpreting: bool = False) -> dict:
        """Compile options beyond the constexprs: num_warps, num_stages, the register cap and ptxas's register usage
        level (neither for the interpreter)."""
        cap = {"maxnreg": self.maxnreg} if self.maxnreg and not interpreting else {}
        if self.reg_level is not None and not interpreting:
            cap["ptx_options"] = f"--register-usage-level={self.reg_level}"
        return {"num_warps": self.num_warps, "num_stages": 1, **cap}


# Candidates (sm_90 registers and KB in flight an SM: the census). Programs = ceil(N / 16 R): 512 at N 8192 and R 1,
# so R 1 fills 132 SMs from N ~ 4096 at 2-4 programs an SM; R 2 shares x between two rows a thread (fewer loads).
# What sets the bytes in flight at a shape is min(resident, programs / 132) x ring x an iteration's bytes: at N 8192
# and R 1 (3.9 programs an SM) ring 3 needs 4 resident (130 registers give 3: two waves), so it is capped at 128
# (H100, session 46: 8192^2 M = 1 17.1 us capped against 20.9 uncapped, 28672 x 8192 48.5 against 61.5).
STRIP_CONFIGS: list[StripConfig] = [  # M <= 8
    StripConfig(rows=1, kt=2, num_warps=4, ring=2),  # 82 registers, 5 an SM, 8 KB a program in flight
    StripConfig(rows=1, kt=2, num_warps=4, ring=3, maxnreg=128),  # 4 an SM, 12 KB (one wave at N 8192)
    StripConfig(rows=2, kt=2, num_warps=4, ring=2),  # 128, 4 an SM, 16 KB
    StripConfig(rows=1, kt=2, num_warps=8, ring=2),  # 82, 2 an SM, 16 KB
    StripConfig(rows=1, kt=2, num_warps=8, ring=3),  # 126, 2 an SM, 24 KB (N 4096: 1.9 programs an SM, one wave)
    StripConfig(rows=2, kt=2, num_warps=8, ring=2),  # 128, 2 an SM, 32 KB
    StripConfig(rows=4, kt=1, num_warps=4, ring=2),  # 124, 4 an SM, 16 KB
    StripConfig(rows=2, kt=2, num_warps=4, ring=3),  # 166, 3 an SM, 24 KB
    # x in the B order (x_perm_words; round 14c; 1.90 / 1.82 / 1.63 since round 14f): 2.09 / 2.01 / 1.72 instructions a
    # weight against 2.32 / 2.27 / 1.85; the first two are M 2-8 tuner candidates since session 49 (round 14g)
    StripConfig(rows=1, kt=2, num_warps=4, ring=2, xperm=True),  # 78, 6 an SM
    StripConfig(rows=1, kt=2, num_warps=4, ring=3, xperm=True),  # 117, 4 an SM
    StripConfig(rows=2, kt=2, num_warps=4, ring=2, xperm=True),  # 124, 4 an SM
    # eight warps a program, four programs an SM (31 warps an SM at N 8192 against ~15: round 14b's ncu found ~3.5
    # warps a scheduler, each stalled 8.5 cycles an instruction): 54 / 64 / 55 registers, spill-free
    StripConfig(rows=1, kt=2, num_warps=8, ring=1),  # 2.36 instructions a weight
    StripConfig(rows=1, kt=2, num_warps=8, ring=1, xperm=True, maxnreg=64),  # 2.05
    StripConfig(rows=1, kt=1, num_warps=8, ring=2, xperm=True),  # 2.72
    # the two M <= 8 picks with ptxas's register usage level 10 (round 14e: 292 / 431 loop instructions against
    # 297 / 436, the same registers): H100, session 49 (round 14g): within 0-2 % of their twins, sweep-only
    StripConfig(rows=1, kt=2, num_warps=4, ring=2, reg_level=10),
    StripConfig(rows=1, kt=2, num_warps=4, ring=3, maxnreg=128, reg_level=10),
    # the first slot's refill kept between the items (a never-taken store after it; round 14e: LDG.128 of the words
    # at 128-150 of 300 instead of 287-292): H100, session 49: no gain (8192^2 M = 1 17.0 against 17.1 us)
    StripConfig(rows=1, kt=2, num_warps=4, ring=2, fence=True),
    StripConfig(rows=1, kt=2, num_warps=4, ring=2, xperm=True, fence=True),
    # eight warps, x in the B order (80 registers, 3 an SM): the N 4096 shapes' 256 programs at ~16 warps an SM;
    # H100, session 49: the best strip config at M 1-8 on 14336 x 4096 (17.0 us), an M 2-8 tuner candidate
    StripConfig(rows=1, kt=2, num_warps=8, ring=2, xperm=True, fence=True),
    # round 14h's L2 bulk prefetch ahead of the ring (commit d249882 has it) was slower at every cell of the H100
    # sweep (session 50: 8192^2 M = 1, x handed over, 15.7 -> 17.4-19.4 us, the further ahead the slower): removed
]
STRIP_CONFIGS_16: list[StripConfig] = [  # 9 <= M <= 16: x and the second accumulator double
    StripConfig(rows=1, kt=2, num_warps=4, ring=2),
    StripConfig(rows=1, kt=1, num_warps=8, ring=2),
    StripConfig(rows=2, kt=1, num_warps=4, ring=2),
    StripConfig(rows=1, kt=2, num_warps=4, ring=2, xperm=True),  # 128 registers, 2.65 instructions a weight (3.23)
    StripConfig(rows=1, kt=2, num_warps=4, ring=2, xperm=True, reg_level=10),  # 128, 322 loop instructions (339)
    StripConfig(rows=1, kt=2, num_warps=4, ring=2, xperm=True, fence=True),  # refills at 160-172 of 339, not 285+
    StripConfig(rows=1, kt=2, num_warps=8, ring=2, xperm=True, fence=True),  # 128 registers, 2 an SM (N 4096)
    # r1 kt1 / r2 kt1 / r2 kt2 w4 ring2 xp (3.44 / 2.78 / 2.20 instructions a weight, 6 / 4 / 3 programs an SM)
    # were swept in session 47 and lost to this one in every cell (H100, round 14d): removed
]


def configs_for(m: int) -> list[StripConfig]:
    return STRIP_CONFIGS if m <= 8 else STRIP_CONFIGS_16


def check_args(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, cfg: StripConfig) -> None:
    """ValueError / TypeError naming the argument for anything the kernel does not take."""
    if not isinstance(cfg, StripConfig):
        raise TypeError(f"config must be a StripConfig, got {type(cfg).__name__}")
    check_operands(x, p, bias, cfg.kt, "the strip decode kernel")
    if cfg.rows not in (1, 2, 4):
        raise ValueError(f"config.rows={cfg.rows} must be 1, 2 or 4 (16-row fragment rows a program)")
    if cfg.kt not in (1, 2) or cfg.ring not in (1, 2, 3):
        raise ValueError(f"config kt={cfg.kt} must be 1 or 2 and ring={cfg.ring} 1..3")
    if cfg.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"config.num_warps={cfg.num_warps} must be a power of two 1..16 (the warps splitting K)")
    if cfg.maxnreg is not None and not (isinstance(cfg.maxnreg, int) and 24 <= cfg.maxnreg <= 255):
        raise ValueError(f"config.maxnreg={cfg.maxnreg!r} must be None or a register cap 24..255")
    if cfg.reg_level is not None and not (isinstance(cfg.reg_level, int) and 0 <= cfg.reg_level <= 10):
        raise ValueError(f"config.reg_level={cfg.reg_level!r} must be None or ptxas's register usage level 0..10")


def w4a16_strip(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None, *,
                config: StripConfig | None = None, xw: torch.Tensor | None = None,
                pdl: bool = True) -> torch.Tensor:
    """x (M <= 16, K) fp16/bf16 -> y (M, N) in x's dtype = x @ dequant(W) + bias. config: default the first
    candidate of M's bucket. xw: x already as the kernel reads it (x_perm_words(x, p) for an xperm config; a
    producer that writes x that way saves the gather), else made here. pdl: the kernel after a gather made here
    starts as its programmatic dependent (sm_90+; its weight loads overlap the gather's end), else plainly."""
    cfg = config or configs_for(x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 2 else 1)[0]
    check_args(x, p, bias, cfg)
    if xw is not None:
        check_xw(xw, x, p, cfg)
    if not isinstance(pdl, bool):
        raise TypeError(f"pdl must be a bool, got {pdl!r}")
    y = torch.empty((x.shape[0], p.out_features), dtype=x.dtype, device=x.device)
    if x.shape[0]:
        launch(x, p, bias, y, cfg, xw, pdl=pdl)
    return y


def check_xw(xw: torch.Tensor, x: torch.Tensor, p: PackedW4, cfg: StripConfig) -> None:
    """ValueError naming xw unless it is what the kernel would make of x: x_perm_words(x, p)'s shape for an xperm
    config, x_words(x, p)'s otherwise; int32, contiguous rows, on x's device (its values are the caller's)."""
    m, k = x.shape
    want = _xp_shape(m, k) if cfg.xperm else (m, k // 2)
    how = "x_perm_words(x, p)" if cfg.xperm else "x_words(x, p)"
    if not isinstance(xw, torch.Tensor) or xw.dtype != torch.int32 or tuple(xw.shape) != want:
        raise ValueError(f"xw must be {how}: int32 of shape {want}, got "
                         f"{getattr(xw, 'dtype', type(xw).__name__)} {tuple(getattr(xw, 'shape', ()))}")
    if xw.device != x.device or xw.stride(1) != 1:
        raise ValueError(f"xw must be on x's device {x.device} with contiguous rows, got {xw.device}, strides "
                         f"{xw.stride()}")


def _xp_shape(m: int, k: int) -> tuple[int, int]:
    """x_perm_words' shape for M tokens and K inputs: a row a block of 8 tokens, 256 words a 64-wide column."""
    return triton.cdiv(m, 8), triton.cdiv(k, 64) * 256


def x_perm_words(x2d: torch.Tensor, p: PackedW4, *, trigger: bool = False) -> torch.Tensor:
    """x (M, K) 16-bit -> (ceil(M / 8), ceil(K / 64) 256) int32 words in the B order (an xperm config's x): for each
    block of 8 tokens and 64-wide column, (2, 32, 2, 2) words [h, 4 g + t, ii, b] = B register b of 16-k chunk
    i = 2 h + ii of lane 4 g + t, i.e. the inputs 16 i + 2 t + b (low half) and 16 i + 2 t + b + 8 (high) of token
    g (the relabelled K order of the weights, w4a16_common.b_pairs). Act-order applied, tokens padded to 8 and K to
    64 with zeros. One launch (x_perm_kernel; the torch reference: x_perm_words_reference); trigger: it lets a
    programmatic dependent launched next start at once (launch's PDL path; sm_90+ only)."""
    m, k = x2d.shape
    out = torch.empty(_xp_shape(m, k), dtype=torch.int32, device=x2d.device)
    tb, cols = out.shape[0], out.shape[1] // 256
    xi = (x2d if x2d.stride(1) == 1 else x2d.contiguous()).view(torch.int16)  # bits, not values: no conversions
    perm = p.perm if p.perm is not None else out
    x_perm_kernel[(tb * cols,)](xi, perm, out, m, k, xi.stride(0), cols, HAS_PERM=p.perm is not None,
                                TRIGGER=trigger, num_warps=2)
    return out


def x_perm_words_reference(x2d: torch.Tensor, p: PackedW4) -> torch.Tensor:
    """x_perm_words in torch (a pad and a permute; the tests' reference)."""
    m, k = x2d.shape
    if p.perm is not None:
        x2d = x2d[:, p.perm.long()]
    tb, cols = triton.cdiv(m, 8), triton.cdiv(k, 64)
    xz = torch.nn.functional.pad(x2d, (0, cols * 64 - k, 0, tb * 8 - m))  # (8 tb, 64 cols)
    # (tb, g, col, h, ii, e, t, b) -> (tb, col, h, g, t, ii, b, e): input 16 (2 h + ii) + 8 e + 2 t + b of a column
    v = xz.reshape(tb, 8, cols, 2, 2, 2, 4, 2).permute(0, 2, 3, 1, 6, 4, 7, 5)
    return v.contiguous().view(torch.int32).reshape(tb, cols * 256)


def launch(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None, y: torch.Tensor, cfg: StripConfig,
           xw: torch.Tensor | None = None, pdl: bool = True):
    """One launch into y (M, N) (arguments as check_args takes them, M >= 1); returns what Triton's launch returns
    (on a GPU the compiled kernel: .n_regs). xw: x as the kernel reads it (x_words / x_perm_words), else made here.
    pdl: an xperm config's gather made here triggers at its start and the kernel launches as its programmatic
    dependent (PDL, where supported): the kernel's launch and first weight loads overlap the gather; it reads x only
    after griddepcontrol.wait. The gather itself launches plainly (after everything before it)."""
    m, k = x.shape
    n = p.out_features
    on = False
    if xw is None:
        on = cfg.xperm and pdl and _pdl.supported(x.device)
        xw = x_perm_words(x, p, trigger=on) if cfg.xperm else x_words(x, p)
    n_frag = triton.cdiv(n, 16)
    return w4a16_strip_kernel[(triton.cdiv(n_frag, cfg.rows),)](
        xw, p.qweight, p.sz, y, bias if bias is not None else y,
        m, n, k, xw.stride(0), y.stride(0), p.qweight.stride(0), p.sz.stride(0),
        G=p.group_size, HAS_BIAS=bias is not None, BF16=x.dtype == torch.bfloat16, R=cfg.rows, KT=cfg.kt,
        W=cfg.num_warps, BM=8 if m <= 8 else 16, RING=cfg.ring, EVEN=k % (64 * cfg.kt * cfg.num_warps) == 0,
        EVEN_N=n_frag % cfg.rows == 0, ASM=cfg.asm and not _interpreting(), XP=cfg.xperm, FENCE=cfg.fence,
        **({"PDL": True, "launch_pdl": True} if on else {}), **cfg.options(_interpreting()),
    )


# ---- sm_90 compiles and census (no GPU needed)

def compile_sm90(cfg: StripConfig, *, dtype: str = "bf16", bm: int = 8, group_size: int = 128):
    """Compile one config as a launch on an even Llama shape specializes it (K a multiple of 64 kt W, N of 16 R,
    pointers and strides 16-divisible, no bias): Triton's CompiledKernel (asm: ptx, cubin)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptrs = {"x_ptr": "*i32", "pk_ptr": "*i32", "sz_ptr": "*i32", "y_ptr": f"*{dtype}", "bias_ptr": f"*{dtype}"}
    ints = ("M", "N", "K", "stride_xm", "stride_ym", "stride_pn", "stride_sg")
    cx = dict(G=group_size, HAS_BIAS=False, BF16=dtype == "bf16", R=cfg.rows, KT=cfg.kt, W=cfg.num_warps, BM=bm,
              RING=cfg.ring, EVEN=True, EVEN_N=True, ASM=cfg.asm, XP=cfg.xperm, PDL=cfg.xperm,  # as launch runs it
              FENCE=cfg.fence)
    sig = {**ptrs, **{n: "i32" for n in ints}, **{n: "constexpr" for n in cx}}
    names = list(sig)
    aligned = set(ptrs) | {"N", "K", "stride_xm", "stride_ym", "stride_pn", "stride_sg"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in aligned}
    src = ASTSource(fn=w4a16_strip_kernel, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()},
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=cfg.options())


def compile_x_perm_sm90(has_perm: bool):
    """x_perm_kernel compiled for sm_90 as launch's PDL path runs it (trigger on; no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {"x_ptr": "*i16", "perm_ptr": "*i32", "out_ptr": "*i32", "M": "i32", "K": "i32", "stride_xm": "i32",
           "COLS": "i32", "HAS_PERM": "constexpr", "TRIGGER": "constexpr"}
    src = ASTSource(fn=x_perm_kernel, signature=sig, constexprs={(list(sig).index("HAS_PERM"),): has_perm,
                                                                 (list(sig).index("TRIGGER"),): True})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 2})


def census(cfg: StripConfig, **kw) -> dict:
    """Compile for sm_90 and count: registers, spills, local and shared memory, the hot loop's instruction mix an
    iteration of RING sub-items (LDG.128, other LDG, HMMA, shared-memory ops and barriers: none expected in the
    loop), its modelled loads in flight a thread and load waits, and early_ldg: the vector loads (refills) that
    ptxas issued before the iteration's last HMMA (round 14e)."""
    from flashscale.kernels.w4a16_ring_aot import loop_mix

    mix = loop_mix(compile_sm90(cfg, **kw))
    ops, rate, stats, n, body = mix["ops"], mix["rate"], mix["stats"], mix["n"], mix["body"]
    last_mma = max(i for i, o in enumerate(body) if o.startswith("HMMA"))
    early = sum(o.startswith("LDG") and o != "LDG.E" for o in body[:last_mma])  # vector refills issued mid-iteration
    weights = cfg.ring * cfg.rows * 16 * 64 * cfg.kt // 32  # a thread's weights an iteration
    return dict(config=asdict(cfg), label=cfg.label, bm=kw.get("bm", 8),
                **{n_: v for n_, v in stats.items() if n_ != "log"}, shared=mix["shared"],
                local=mix["local"], loop_instructions=sum(ops.values()),
                per_weight=sum(ops.values()) / weights, ldg128=n("LDG", suffix=".128"),
                ldg_other=n("LDG") - n("LDG", suffix=".128"), hmma=n("HMMA"), lop3=ops["LOP3.LUT"],
                prmt=ops["PRMT"], smem=n("LDS", "STS"), bar=n("BAR"), moves=n("MOV", "IMAD.MOV"),
                loads_in_flight=rate["loads_in_flight"], ldg_per_iter=rate["ldg_per_iter"],
                waits_per_iter=rate["waits_per_iter"], resident=cfg.resident(stats["registers"]), early_ldg=early,
                in_flight_kb=cfg.in_flight_kb(stats["registers"]))


if __name__ == "__main__":  # PYTHONPATH=src python -m flashscale.kernels.w4a16_strip (TRITON_INTERPRET unset)
    print("config (tokens) | regs spills local smem | resident/SM KB in flight/SM | loop instr instr/weight | "
          "LDG.128 other-LDG HMMA LOP3 PRMT LDS/STS BAR moves | modelled loads in flight, waits an iteration")
    bad = []
    for bm in (8, 16):
        for c in configs_for(bm):
            r = census(c, bm=bm)
            if r["spill_stores"] or r["spill_loads"] or r["stack"] or r["local"] or r["smem"] or r["bar"]:
                bad.append(f"{r['label']} M<={bm}")
            print(f"{c.label:28s} M<={bm:2d} | {r['registers']:3d} {r['spill_stores']}/{r['spill_loads']} "
                  f"{r['local']} {r['shared']:5d} | {r['resident']:2d} {r['in_flight_kb']:5.0f} | "
                  f"{r['loop_instructions']:5d} {r['per_weight']:.2f} | {r['ldg128']:3d} {r['ldg_other']:3d} "
                  f"{r['hmma']:3d} {r['lop3']:3d} {r['prmt']:3d} {r['smem']:3d} {r['bar']:2d} {r['moves']:3d} | "
                  f"{r['loads_in_flight']:.1f} of {r['ldg_per_iter']}, {r['waits_per_iter']} waits", flush=True)
    assert not bad, f"spills, local memory or shared memory / barriers in the loop: {bad}"
