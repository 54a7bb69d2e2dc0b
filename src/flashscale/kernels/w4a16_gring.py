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

Per program (stream-K as w4a16_ring: program p of P takes items [p U / P, (p + 1) U / P), tile-major; an item is
BN output rows x 64 KT inputs inside one group):
  * every thread issues cp.async copies of item g + STAGES - 1 (its own 16-byte fragment words, its rows' scale/zero
    words, the x words of its lane) into ring slot (g - 1) % STAGES, one commit group an item, then reads item g:
    STAGES - 1 items a program in flight in shared memory while the registers hold one;
  * one wait_group + one CTA barrier an item: after them every thread's copies of item g have landed and every
    thread is done with item g - 1, whose slot the new copies reuse (x words are copied by every warp: the barrier
    makes the duplicate writes harmless);
  * the math is w4a16_common's tensor-core decode, unchanged (its triton.jit helpers are called from here): per
    packed word 3 shifts + 4 LOP3 + one mma.sync m16n8k16, the zero point and the scale once per item and row;
  * split-K flush where programs share a tile: per-element tickets (each thread red.adds its elements into a zeroed
    fp32 tile, ATOMIC, or stores them to its contributor's slot, then takes each element's acq_rel ticket; the
    last arrival of an element reads the total, or sums the slots in contributor order: deterministic), writes y
    and zeroes the element's workspace and ticket. No shared memory, no barrier in the flush.
Layout L3 of every (NB, 32, 4) tensor: warps over fragment rows (R = NB / num_warps a thread), lane = the mma lane,
the 4 words of a 16-byte load in a thread's registers (the asm's pack of 4): BlockedLayout([R, 1, 4], [1, 32, 1],
[num_warps, 1, 1]); x and its sums are (1, 32, 4) in the same layout (broadcast over the rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from flashscale.kernels.w4a16 import _device_info, stream_k_grid, x_words
from flashscale.kernels.w4a16_common import b_pairs, mma_column, split_k_slices, split_k_workspace, x_sums
from flashscale.kernels.w4a16_gemv import _dec_range, _next_item
from flashscale.kernels.w4a16_pack import PackedW4
from flashscale.kernels.w4a16_ring import REGS_PER_SM, check_operands

try:  # Gluon is experimental: absent from older Tritons
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

    HAS_GLUON = True
except ImportError:  # pragma: no cover
    HAS_GLUON = False

SMEM_PER_SM = 228 * 1024


@dataclass(frozen=True, kw_only=True)
class GRingConfig:
    bn: int = 128  # output rows an item (NB = bn / 16 fragment rows, split over the warps)
    kt: int = 2  # 64-wide fragment columns an item (1 or 2)
    num_warps: int = 4
    stages: int = 4  # ring slots: stages - 1 items in flight while one is computed
    per_sm: int = 4  # programs an SM
    atomic: bool = True  # split-K: red.add + element tickets; False: slots summed in order (deterministic)

    @property
    def item_bytes(self) -> int:
        return self.bn * self.kt * 32

    def smem_bytes(self, tokens: int = 8) -> int:
        """A program's ring: per slot the packed words, the scale/zero words (4 a lane and row, duplicated as the
        C layout wants them), the x words (2 a chunk x 4 chunks x lanes, per column and token block)."""
        tb = 1 if tokens <= 8 else 2
        return self.stages * (self.item_bytes + self.bn // 16 * 512 + self.kt * tb * 2 * 512)

    def resident(self, regs: int) -> int:
        threads = 32 * self.num_warps
        by_regs = REGS_PER_SM // (-(-regs // 8) * 8 * threads)
        return max(1, min(by_regs, SMEM_PER_SM // (self.smem_bytes() + 1024), 2048 // threads, 32))

    def per_sm_options(self, regs: int | None = None) -> list[int]:
        fit = self.resident(regs) if regs else self.per_sm
        return sorted({min(self.per_sm, fit), *[p for p in (2, 3, 4, 5, 6, 8) if self.per_sm < p <= fit][-2:]})

    def in_flight_kb(self, per_sm: int) -> float:
        return per_sm * (self.stages - 1) * self.item_bytes / 1024

    @property
    def label(self) -> str:
        return (f"bn{self.bn} kt{self.kt} w{self.num_warps} st{self.stages} ({self.item_bytes // 1024} KB)"
                + (" atomic" if self.atomic else " slots"))


GRING_CONFIGS: list[GRingConfig] = [  # M <= 8; comment: KB of packed words in flight an SM (shared memory a program)
    GRingConfig(bn=128, kt=2, num_warps=4, stages=4, per_sm=4),  # 3 x 8 KB x 4 = 96 KB (56 KB)
    GRingConfig(bn=128, kt=2, num_warps=4, stages=4, per_sm=4, atomic=False),  # the same, deterministic
    GRingConfig(bn=128, kt=2, num_warps=4, stages=3, per_sm=5),  # 2 x 8 x 5 = 80 KB (42 KB)
    GRingConfig(bn=128, kt=2, num_warps=8, stages=6, per_sm=2),  # a fragment row a warp: 5 x 8 x 2 = 80 KB (84 KB)
    GRingConfig(bn=256, kt=2, num_warps=8, stages=4, per_sm=2),  # 3 x 16 x 2 = 96 KB (104 KB)
    GRingConfig(bn=64, kt=2, num_warps=4, stages=6, per_sm=4),  # 5 x 4 x 4 = 80 KB (48 KB)
]
GRING_CONFIGS_16: list[GRingConfig] = [  # 9 <= M <= 16 (x and the second accumulator: 102-122 registers)
    GRingConfig(bn=128, kt=2, num_warps=4, stages=4, per_sm=3),
    GRingConfig(bn=128, kt=2, num_warps=4, stages=4, per_sm=3, atomic=False),
    GRingConfig(bn=128, kt=2, num_warps=8, stages=4, per_sm=2),
]


def configs_for(m: int) -> list[GRingConfig]:
    return GRING_CONFIGS if m <= 8 else GRING_CONFIGS_16


if HAS_GLUON:

    @gluon.jit
    def _issue(w_s, sz_s, x_s, slot, pk_ptr, sz_ptr, x_ptr, tile, ks, ok, r3, nb3, lane3, j3, M, K, stride_xm,
               stride_pn, stride_sg, k_pad, n_frag, L3: gl.constexpr, NB: gl.constexpr, KT: gl.constexpr,
               G: gl.constexpr, TB: gl.constexpr, EVEN_K: gl.constexpr, EVEN_N: gl.constexpr):
        """cp.async copies of item (tile, ks) into ring slot `slot`, one copy a buffer (Triton's barrier analysis
        puts a CTA barrier between two copies into one buffer); ok False: every copy masked off."""
        k0 = ks * (64 * KT)
        kt3 = r3 // NB  # rows r of a slot's (KT NB, 32, 4) words: column kt = r // NB, fragment row r % NB
        fr = tile * NB + r3 % NB
        wp = pk_ptr + fr * stride_pn + (k0 // 64 + kt3) * 128 + lane3 * 4 + j3
        if EVEN_K and EVEN_N:
            cp.async_copy_global_to_shared(w_s.index(slot), wp, mask=ok)
        else:
            wm = (fr < n_frag) & (k0 + 64 * kt3 < k_pad) & (lane3 >= 0) & (j3 >= 0) & ok
            cp.async_copy_global_to_shared(w_s.index(slot), wp, mask=wm)
        # scale/zero words of rows g (c 0, 1) and g + 8 (c 2, 3): adjacent in PackedW4's sz (2 g, 2 g + 1)
        frs = tile * NB + nb3  # (NB, 1, 1)
        sp = sz_ptr + gl.minimum(k0 // G, K // G - 1) * stride_sg + frs * 16 + 2 * (lane3 // 4) + j3 // 2
        if EVEN_N:
            cp.async_copy_global_to_shared(sz_s.index(slot), sp, mask=ok)
        else:
            cp.async_copy_global_to_shared(sz_s.index(slot), sp, mask=(frs < n_frag) & (lane3 >= 0) & (j3 >= 0) & ok)
        # x words, row r = (kt TB + tb) 2 + q of the slot's (2 KT TB, 32, 4): lane 4 g + t, chunk i holds
        # (x[16 i + 2 t], x[.. + 1]) (+ 8 for the half q = 1) of token 8 tb + g (tokens >= M read M - 1: a B column
        # only reaches its own D column, which is never stored); K tails zero (padded codes dequantize to -z)
        xr = gl.arange(0, 2 * KT * TB, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))[:, None, None]
        q = xr % 2
        tb = (xr // 2) % TB
        kt = xr // (2 * TB)
        tok = gl.minimum(8 * tb + lane3 // 4, M - 1)
        kl = ks * (32 * KT) + 32 * kt + lane3 % 4 + 8 * j3 + 4 * q  # (2 KT TB, 32, 4)
        if EVEN_K:
            cp.async_copy_global_to_shared(x_s.index(slot), x_ptr + tok * stride_xm + kl, mask=ok)
        else:
            cp.async_copy_global_to_shared(x_s.index(slot), x_ptr + tok * stride_xm + kl, mask=(2 * kl < K) & ok)

    @gluon.jit
    def _read(w_s, sz_s, x_s, slot, L3: gl.constexpr, NB: gl.constexpr, KT: gl.constexpr, TB: gl.constexpr):
        """The item in `slot` into registers: scale/zero words (NB, 32, 4), the words of column 0 and 1 (NB, 32, 4;
        column 1 = column 0 when KT = 1) and the x rows (1, 32, 4) of column 0 / 1, token block 0 / 1, half 0 / 1."""
        ws = w_s.index(slot)
        xv = x_s.index(slot)
        szw = sz_s.index(slot).load(L3)
        w0 = ws.slice(0, NB, dim=0).load(L3)
        w1 = w0
        if KT == 2:
            w1 = ws.slice(NB, NB, dim=0).load(L3)
        x000 = xv.slice(0, 1, dim=0).load(L3)
        x001 = xv.slice(1, 1, dim=0).load(L3)
        x010 = x000
        x011 = x001
        if TB == 2:
            x010 = xv.slice(2, 1, dim=0).load(L3)
            x011 = xv.slice(3, 1, dim=0).load(L3)
        x100 = x000
        x101 = x001
        x110 = x010
        x111 = x011
        if KT == 2:
            x100 = xv.slice(2 * TB, 1, dim=0).load(L3)
            x101 = xv.slice(2 * TB + 1, 1, dim=0).load(L3)
            if TB == 2:
                x110 = xv.slice(6, 1, dim=0).load(L3)
                x111 = xv.slice(7, 1, dim=0).load(L3)
        return szw, w0, w1, x000, x001, x010, x011, x100, x101, x110, x111

    @gluon.jit
    def _item(acc, accb, szw, w0, w1, x000, x001, x010, x011, x100, x101, x110, x111, KT: gl.constexpr,
              TB: gl.constexpr, BF16: gl.constexpr):
        """acc (+ accb: tokens 8..15) += s 2^11 (D / D_UNIT - (OFF + z) sum(x)) of one item (_read's registers)."""
        s = (szw & -32).to(gl.float32, bitcast=True)  # s * 2^11
        zf = ((szw & 31) | 0x4B000000).to(gl.float32, bitcast=True)  # 2^23 + z, exact
        if BF16:
            zs = (zf - (8388608.0 - 128.0)) * s  # OFF_BF16
            sd = s
        else:
            zs = (zf - (8388608.0 - 64.0)) * s  # OFF_F16; the fp16 MMA sums are D_UNIT = 16x
            sd = s * (1.0 / 16.0)
        b0, b1 = b_pairs(x000, x001, True)
        bb0, bb1 = b_pairs(x010, x011, True)  # (= b0, b1 when TB = 1; unused there)
        d, db = mma_column(w0, b0, b1, bb0, bb1, None, None, BF16, TB == 2, True, True)
        xs = x_sums(b0, b1, None, BF16, True, True)
        xsb = xs
        if TB == 2:
            xsb = x_sums(bb0, bb1, None, BF16, True, True)
        if KT == 2:
            b0, b1 = b_pairs(x100, x101, True)
            bb0, bb1 = b_pairs(x110, x111, True)
            d, db = mma_column(w1, b0, b1, bb0, bb1, d, db, BF16, TB == 2, False, True)
            xs = x_sums(b0, b1, xs, BF16, False, True)
            if TB == 2:
                xsb = x_sums(bb0, bb1, xsb, BF16, False, True)
        acc = gl.fma(sd, d, acc) - zs * xs
        if TB == 2:
            accb = gl.fma(sd, db, accb) - zs * xsb
        return acc, accb

    @gluon.jit
    def _flush_block(acc, tile, pid, pf, nc, rows, toks, e_off, ws_ptr, cnt_ptr, y_ptr, bias_ptr, M, N, stride_ym,
                     SLOT: gl.constexpr, CM: gl.constexpr, HAS_BIAS: gl.constexpr, ATOMIC: gl.constexpr):
        """One token block's partial (NB, 32, 4): stored (sole contributor, nc == 1) or reduced element by element
        (module docstring)."""
        live = (toks < M) & (rows < N)
        if nc == 1:
            out = acc * (1.0 / 2048)
            if HAS_BIAS:
                out += gl.load(bias_ptr + rows, mask=live, other=0.0).to(gl.float32)
            gl.store(y_ptr + toks * stride_ym + rows, out.to(y_ptr.dtype.element_ty), mask=live)
        else:
            cp_ = cnt_ptr + (tile * SLOT).to(gl.int64) + e_off
            if ATOMIC:
                tp = ws_ptr + (tile * SLOT).to(gl.int64) + e_off
                gl.atomic_add(tp, acc, mask=live, sem="relaxed", scope="gpu")
            else:
                tp = ws_ptr + (tile * CM).to(gl.int64) * SLOT + e_off
                gl.store(tp + (pid - pf) * SLOT, acc, mask=live, cache_modifier=".cg")
            ticket = gl.atomic_add(cp_, e_off * 0 + 1, mask=live, sem="acq_rel", scope="gpu")
            last = live & (ticket == nc - 1)
            tot = gl.load(tp, mask=last, other=0.0, cache_modifier=".cg")
            if ATOMIC:
                gl.store(tp, gl.zeros_like(tot), mask=last)
            else:
                for c in gl.static_range(1, CM):  # a fixed left fold in contributor order; absent terms add 0
                    tot = tot + gl.load(tp + c * SLOT, mask=last & (c < nc), other=0.0, cache_modifier=".cg")
            gl.store(cp_, gl.zeros_like(ticket), mask=last)
            out = tot * (1.0 / 2048)
            if HAS_BIAS:
                out += gl.load(bias_ptr + rows, mask=last, other=0.0).to(gl.float32)
            gl.store(y_ptr + toks * stride_ym + rows, out.to(y_ptr.dtype.element_ty), mask=last)

    @gluon.jit(do_not_specialize=["M", "S", "U"])
    def w4a16_gring_kernel(
        x_ptr, pk_ptr, sz_ptr, y_ptr, bias_ptr, ws_ptr, cnt_ptr,
        M, N, K, stride_xm, stride_ym, stride_pn, stride_sg, S, U,
        G: gl.constexpr, HAS_BIAS: gl.constexpr, BF16: gl.constexpr, BN: gl.constexpr, KT: gl.constexpr,
        TB: gl.constexpr, STAGES: gl.constexpr, CM: gl.constexpr, ATOMIC: gl.constexpr, EVEN_K: gl.constexpr,
        EVEN_N: gl.constexpr, num_warps: gl.constexpr,
    ):
        """x_ptr: x as int32 words (pairs of 16-bit inputs); pk_ptr / sz_ptr: PackedW4 qweight / sz; S items a
        tile, U items; CM >= the contributors of any tile (the deterministic flush's slots a tile)."""
        NB: gl.constexpr = BN // 16
        SLOT: gl.constexpr = NB * 128 * TB
        L3: gl.constexpr = gl.BlockedLayout([NB // num_warps, 1, 4], [1, 32, 1], [num_warps, 1, 1], [2, 1, 0])
        SH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])  # a slot (rank 3), row-major
        w_s = gl.allocate_shared_memory(gl.int32, [STAGES, KT * NB, 32, 4], SH)
        sz_s = gl.allocate_shared_memory(gl.int32, [STAGES, NB, 32, 4], SH)
        x_s = gl.allocate_shared_memory(gl.int32, [STAGES, 2 * KT * TB, 32, 4], SH)
        nb3 = gl.arange(0, NB, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))[:, None, None]
        r3 = gl.arange(0, KT * NB, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))[:, None, None]
        lane3 = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))[None, :, None]
        j3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]
        pid, P, u0, u1, k_pad, n_frag = _dec_range(U, K, N)
        tile = u0 // S  # the item computed next
        ks = u0 - tile * S
        tile_p = tile  # the item copied next
        ks_p = ks
        for st in gl.static_range(STAGES - 1):
            _issue(w_s, sz_s, x_s, st, pk_ptr, sz_ptr, x_ptr, tile_p, ks_p, u0 + st < u1, r3, nb3, lane3, j3, M, K,
                   stride_xm, stride_pn, stride_sg, k_pad, n_frag, L3, NB, KT, G, TB, EVEN_K, EVEN_N)
            cp.commit_group()
            tile_p, ks_p = _next_item(tile_p, ks_p, S)
        acc = gl.zeros([NB, 32, 4], gl.float32, L3)
        accb = gl.zeros([NB, 32, 4], gl.float32, L3)
        rows0 = nb3 * 16 + lane3 // 4 + 8 * (j3 // 2)
        toks0 = 2 * (lane3 % 4) + j3 % 2
        e_off = nb3 * 128 + lane3 * 4 + j3
        for g in range(u0, u1):
            i = g - u0
            cp.wait_group(STAGES - 2)  # this thread's copies of item g have landed
            gl.thread_barrier()  # everyone's have, and everyone is done with item g - 1's slot
            szw, w0, w1, x000, x001, x010, x011, x100, x101, x110, x111 = _read(w_s, sz_s, x_s, i % STAGES, L3, NB, KT,
                                                                                TB)
            _issue(w_s, sz_s, x_s, (i + STAGES - 1) % STAGES, pk_ptr, sz_ptr, x_ptr, tile_p, ks_p,
                   g + STAGES - 1 < u1, r3, nb3, lane3, j3, M, K, stride_xm, stride_pn, stride_sg, k_pad, n_frag, L3,
                   NB, KT, G, TB, EVEN_K, EVEN_N)
            cp.commit_group()
            tile_p, ks_p = _next_item(tile_p, ks_p, S)
            acc, accb = _item(acc, accb, szw, w0, w1, x000, x001, x010, x011, x100, x101, x110, x111, KT, TB, BF16)
            if (ks == S - 1) | (g == u1 - 1):  # the end of this program's part of the tile
                pf = ((tile * S + 1) * P - 1) // U
                pl = ((tile * S + S) * P - 1) // U
                rows = tile * BN + rows0
                _flush_block(acc, tile, pid, pf, pl - pf + 1, rows, toks0, e_off, ws_ptr, cnt_ptr, y_ptr, bias_ptr,
                             M, N, stride_ym, SLOT, CM, HAS_BIAS, ATOMIC)
                if TB == 2:
                    _flush_block(accb, tile, pid, pf, pl - pf + 1, rows, toks0 + 8, e_off + NB * 128, ws_ptr,
                                 cnt_ptr, y_ptr, bias_ptr, M, N, stride_ym, SLOT, CM, HAS_BIAS, ATOMIC)
                acc = gl.zeros([NB, 32, 4], gl.float32, L3)
                accb = gl.zeros([NB, 32, 4], gl.float32, L3)
            tile, ks = _next_item(tile, ks, S)
        cp.wait_group(0)


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
