"""Hopper W4A16 GEMM in Gluon (an autotune candidate of w4a16_matmul from M = 2): y (M, N) = x (M, K) @ W (K, N).

Swap AB as w4a16_gemm.py: each consumer warpgroup computes acc^T (64 features, BM tokens) = W^T (64, BK) @
x^T (BK, BM) with RS-wgmma (m64nBMk16: A, the dequantized weights, from registers; B, x^T, from shared memory).
  * producer, 1 warp (setmaxnreg PRODUCER_REGS): TMA copies of one K step into a STAGES-slot ring: the packed
    words of the tile (qweight viewed (N_pad/16, K_pad/64, 128) int32, box (BN/16, BK/64, 128): BN*BK/2 bytes,
    unswizzled), x (box (BM, BK) bf16/fp16, 128-byte swizzle, rows >= M and columns >= K zero-filled) and the
    scale/zero words (sz (NG, N_pad), box (SZR, BN), SZR = BK / G groups a step for G = 64, else 1); one
    ready mbarrier a slot (expect-tx of all three), one empty mbarrier (count CONSUMERS).
  * consumers, CONSUMERS warpgroups (setmaxnreg CONSUMER_REGS; consumer 0 is the default partition), each
    owning 64 of the tile's BN = 64 * CONSUMERS features (or one consumer owning 128: `features=128`, two wgmma row
    blocks sharing each x tile, so x's L2 -> SM bytes a feature halve): LDS.128 of its fragments (one 16-byte vector a
    thread IS a 16x16 A fragment of four K steps, PackedW4), dequantization in registers, then with one
    consumer (unrolled by two, A buffers alternating by position: no register moves; _mainloop_wait1)
        dequantize A_j (slot j, wgmma j-1 in flight)  ->  issue wgmma j  ->  wait(1): j-1 retired  ->  release j-1
    and with two (12 warps: 168 registers at launch, 240 by setmaxnreg; wait(1) makes ptxas serialize the wgmma
    there, C7512; _mainloop_wait0)
        issue wgmma(A_j, x_j)  ->  dequantize A_{j+1} (slot j+1)  ->  wait for slot j+2  ->  wait(0)  ->  release j
    so the unpack of a step runs on the CUDA cores while the tensor cores work on another one (two A buffers
    live, each untouched until its wgmma retires). Epilogue in 16..64-token chunks (HAS_SPLIT: split-K path).
  * scale and zero are applied to A before the MMA, exactly (w4a16_common's fp32 magic-number unpack: one
    shift per two nibbles, one LOP3 and one FFMA a weight, one cvt per pair; w = (q - z) * s rounded once to
    16 bits, as the reference does); with h2=True (opt-in until timed) the packed 16-bit unpack of w4a16_h2.py: the
    same values, two weights an instruction, 9 instead of 15 ALU-pipe instructions a packed word. The alternative
    (decode kernel: MMA on OFF + q, s and z*sum(x) per group after) needs one accumulator drain per group: BM/2
    fp32 per thread times two FMAs every 128 K plus group sums of x and a wait per group that breaks the wgmma
    overlap: more work than the dequant at BM >= 64.
  * split-K (grid axis 1) for grids that cannot fill the SMs (M = 64 on N <= 8192): each split writes its fp32
    partial to its own workspace slice, one acq_rel ticket a (tile, consumer), the last split sums the slices
    in split order (deterministic) and writes y, as w4a16_common's slice scheme.
  * tile order over (n, m) grouped by GROUP n-tiles (their weights stay in L2 across the token tiles).
  * pingpong (two consumers): FA3's tensor-core turns, consumer c issues its wgmma of a step after the other one's
    (mbarriers turn[0..1]), so one warpgroup's unpack runs under the other's MMA instead of both at once.
  * persistent (two consumers, no split): grid = min(tiles, SMs), program p takes tiles p, p + grid, ...; the ring's
    steps and turns run on across tiles (counters base + j), so the producer loads tile t+1 while the consumers
    store tile t (the fill and the epilogue of a tile no longer leave the tensor cores idle).
  * stream_k (persistent): where the last wave would leave >= 10 % of the SMs idle (stream_k_plan), the grid is
    the SMs; the whole waves (or all but one) go tile by tile, and the K steps of the remaining tiles form one run
    cut into equal pieces, one a program (Stream-K's hybrid; with several token tiles, each partial-wave tile in
    S aligned K pieces). A tile split between programs: each writes its fp32 partial to its own block, and the last
    to take the tile's ticket sums the blocks in program order.
act-order (perm): x is gathered once on the host (x[:, perm], one copy of M*K*2 bytes) since TMA cannot gather.
Shapes: x (M, K), qweight (N_pad/16, K_pad/64, 32, 4) int32, sz (NG, N_pad) int32, y (M, N).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, replace

import torch

from flashscale.kernels import w4a16_h2 as h2
from flashscale.kernels.w4a16_common import MAGIC_ONE
from flashscale.kernels.w4a16_pack import FRAG_K, PackedW4

try:  # Gluon is experimental: absent from older Tritons
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = hasattr(gl, "warp_specialize")
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False

SMEM_LIMIT = 232_448  # H100/H200: the most shared memory one block may take
SMEM_PER_SM = 233_472  # H100/H200: an SM's shared memory (228 KB), 1 KB of it reserved a resident block
# diagnosis knob (session 41): every consumer thread fences (fence.acq_rel.gpu) around the fix-up's ticket
FIXUP_FENCE = os.environ.get("FLASHSCALE_W4A16_FIXUP_FENCE", "0") == "1"
CTA_MAXNREG = {2: 128, 3: 80, 4: 64}  # launch registers a thread for ctas blocks of 8 warps an SM (64 K registers)
# diagnosis knob (session 42): launch registers a thread for every config (0: CTA_MAXNREG's), to tell the register
# cap from two resident blocks in the ctas = 2 fix-up failures (benchmarks/w4a16_fixup_repeat.py)
MAXNREG_OVERRIDE = int(os.environ.get("FLASHSCALE_W4A16_MAXNREG", "0"))


@dataclass(frozen=True, kw_only=True)
class WgmmaConfig:
    bm: int = 128  # tokens a tile: the wgmma N (16..256, a power of two)
    consumers: int = 2  # consumer warpgroups, `features` output features each (BN = features * consumers)
    bk: int = 128  # input features a K step (64 or 128: the packed box's inner dims)
    stages: int = 4  # slots of the shared-memory ring
    split_k: int = 0  # K splits (grid axis 1); 0: as many as fill the SMs at small grids (auto_split)
    group: int = 8  # n-tiles that share a sweep over the token tiles (L2 reuse)
    producer_regs: int = 24
    consumer_regs: int = 240
    pingpong: bool = False  # two consumers: tensor-core turns (consumer c issues its wgmma of step j after c - 1)
    persistent: bool = False  # one CTA an SM looping over tiles: the ring runs on into the next tile's K steps
    stream_k: bool = False  # persistent: the last, partly filled wave's tiles split along K over all programs
    features: int = 64  # output features a consumer: 64, or 128 (one consumer, two wgmma row blocks sharing x)
    ctas: int = 1  # resident blocks an SM (one consumer): 2 / 3 / 4 launch at 128 / 80 / 64 registers a thread, the
    # consumer raised to 232 / 136 / 104 by setmaxnreg (the producer gives its own back), each block at most 1 / ctas
    # of the SM's shared memory
    h2: bool = False  # the packed 16-bit unpack (w4a16_h2.py: half the ALU-pipe work a weight, the same values)
    vec_y: bool = False  # y by 16-byte stores after a layout conversion (_store_y_vec), where N % 8 == 0

    @property
    def bn(self) -> int:
        return self.features * self.consumers

    def label(self) -> str:
        return (f"bm{self.bm}-bn{self.bn}-bk{self.bk}-s{self.stages}" + (f"-k{self.split_k}" if self.split_k else "")
                + ("-pp" if self.pingpong else "") + ("-persist" if self.persistent else "")
                + ("-sk" if self.stream_k else "") + (f"-f{self.features}" if self.features != 64 else "")
                + (f"-x{self.ctas}" if self.ctas != 1 else "")
                + ("-h2" if self.h2 else "") + ("-vy" if self.vec_y else ""))


def smem_bytes(cfg: WgmmaConfig, group_size: int = 128) -> int:
    """One block's ring: per slot packed words (BN*BK/2), x (BM*BK*2), scale/zero words (SZR*BN*4); + barriers;
    + vec_y's layout conversion scratch (a warp's 16 x 16 16-bit tile through stmatrix: 1888 B a consumer, sm_90)."""
    szr = cfg.bk // group_size if group_size < cfg.bk else 1
    return (cfg.stages * (cfg.bn * cfg.bk // 2 + cfg.bm * cfg.bk * 2 + szr * cfg.bn * 4 + 16) + 64
            + 2048 * cfg.consumers * cfg.vec_y)


# Candidates per M bucket (benchmarks/w4a16.py times each and keeps the best a cell; the first is the default).
# SMEM (G = 128): bm64 bn128 s6 147 KB; bm64 bn64 s8 162 KB; bm128 bn64 s4 145 KB; bm128 bn128 s4 162 KB;
# bm256 bn64 s3 205 KB; bm256 bn64 bk64 s6 206 KB; bm256 bn128 bk64 s6 219 KB; bm256 bn128 bk128 s3 218 KB.
# M > 256 leads with bm256 x bn128 (two consumers sharing each x tile): benchmarks/w4a16_gemm_probe.py on the H200
# (2026-12-02) put it at 0.90-1.01x cuBLAS at M 1024 / 4096 where the best bn64 tile was 0.78-0.89x, and its
# persistent bk128 form with turns first (the probe's best in all six cells, 0.87-1.00x), with a stream-K tail
# where the last wave leaves SMs idle (stream_k_plan; it is the plain persistent kernel elsewhere).
_BIG = [WgmmaConfig(bm=128, consumers=1, stages=4), WgmmaConfig(bm=128, consumers=2, stages=4)]
_LARGE = ([WgmmaConfig(bm=256, consumers=2, stages=3, pingpong=True, persistent=True, stream_k=True),
           WgmmaConfig(bm=256, consumers=2, bk=64, stages=6),
           WgmmaConfig(bm=64, consumers=2, stages=6), WgmmaConfig(bm=64, consumers=2, stages=6, group=16),
           WgmmaConfig(bm=64, consumers=2, stages=4)] + _BIG
          + [WgmmaConfig(bm=256, consumers=1, stages=3), WgmmaConfig(bm=256, consumers=1, bk=64, stages=6)])
# M <= 256: few tiles (32-224 at N 4096-28672), so a wave is partly filled or not even one; split-K covered that for
# bm <= 64 only (its epilogue spills at bm >= 128), the stream-K tail (spill-free at bm 32-256) covers every tile.
CANDIDATES: dict[int, list[WgmmaConfig]] = {
    # M 2..16 (one 16-token tile): the probe's g-dec rows (H200, session 29, docs/w4a16_decode.md "Round 8") had
    # bm16 x bn64 (auto split: 1 at N 8192, 2 at N 4096) at 23.3 / 9.98 us for 8192^2 / 4096^2 at M = 16 against
    # the tuned decode kernels' 24.7 / 10.9, and the persistent stream-K bn128 within 1 % of it; the tuner times both
    # beside the decode kernels (at M = 1 they lost: 23.2 against 18.8 us)
    16: [WgmmaConfig(bm=16, consumers=1, stages=8), WgmmaConfig(bm=16, consumers=2, stages=6, persistent=True,
                                                                 stream_k=True),
         # two blocks an SM (session 38, w4a16-gemm-probe-dec-h200.json): M = 16 8192^2 19.7 us against 23.3
         WgmmaConfig(bm=16, consumers=1, stages=8, ctas=2)],
    64: [WgmmaConfig(bm=64, consumers=2, stages=6), WgmmaConfig(bm=64, consumers=1, stages=8),
         WgmmaConfig(bm=32, consumers=2, stages=8), WgmmaConfig(bm=64, consumers=2, stages=6, persistent=True,
                                                                stream_k=True),
         # session 38 (w4a16-gemm-probe-h2-m64-h200.json): two one-consumer blocks an SM, 4096 x 14336 23.8 us against
         # 27.3; and one consumer of 128 features in two blocks, 8192 x 28672 82.7 us against 89.7
         WgmmaConfig(bm=64, consumers=1, stages=3, ctas=2),
         WgmmaConfig(bm=64, consumers=1, features=128, bk=64, stages=8, ctas=2)],
    256: [WgmmaConfig(bm=64, consumers=2, stages=6), WgmmaConfig(bm=64, consumers=1, stages=8)] + _BIG
         + [WgmmaConfig(bm=128, consumers=2, stages=4, persistent=True, stream_k=True), _LARGE[0]],
    2048: _LARGE,
    1 << 30: _LARGE,  # M > 2048 (w4a16._GEMM_CANDIDATES' buckets: tuned apart from 257..2048)
}
# Only spill-free configs (sm_90 census, docs/w4a16_gemm.md). Two consumers (12 warps: 168 registers at launch, 240
# by setmaxnreg) keep the wait(0) loop (wait(1) serializes the wgmma there); one consumer (255) runs the unrolled
# wait(1) loop.
# bm >= 128 spills only in the split-K epilogue (36-260 B), so auto split is off for those tiles.


# Opt-in variants timed beside each config (FLASHSCALE_W4A16_WGMMA=h2 / vy, the probe's --extra h2 / vy): name -> the
# WgmmaConfig flag it sets
TWINS = {"h2": "h2", "vy": "vec_y"}


def twin(cfg: WgmmaConfig, name: str) -> WgmmaConfig:
    """cfg with TWINS[name] set."""
    return replace(cfg, **{TWINS[name]: True})


def candidates(m: int) -> list[WgmmaConfig]:
    return list(next(v for b, v in CANDIDATES.items() if m <= b))


def all_candidates() -> list[WgmmaConfig]:
    out = []
    for v in CANDIDATES.values():
        out += [c for c in v if c not in out]
    return out


def config_error(cfg: WgmmaConfig, group_size: int = 128, k: int | None = None) -> str | None:
    """Why cfg cannot compile / fit, or None."""
    if cfg.bm not in (16, 32, 64, 128, 256):
        return f"bm={cfg.bm}: a power of two in 16..256 (the wgmma N)"
    if cfg.consumers not in (1, 2):
        return f"consumers={cfg.consumers}: 1 or 2 warpgroups"
    if cfg.bk not in (64, 128):
        return f"bk={cfg.bk}: 64 or 128"
    if cfg.features not in (64, 128):
        return f"features={cfg.features}: 64 or 128 a consumer"
    room = {1: 160, 2: 128}.get(cfg.ctas, 0)  # bm + bk that f128 fits in the consumer's 255 / 232 registers
    if cfg.features == 128 and (cfg.consumers != 1 or cfg.bm + cfg.bk > room):
        return (f"features=128 takes consumers=1 and bm + bk <= {room} at ctas={cfg.ctas} (got consumers="
                f"{cfg.consumers}, bm={cfg.bm}, bk={cfg.bk}): its accumulator (bm) and two A tiles (bk) registers a "
                f"thread; past that ptxas serializes the wgmma (bm64 x bk128 at one block an SM, bm16 x bk128 at two)")
    if cfg.stages < 2:
        return "stages >= 2"
    if cfg.persistent and (cfg.split_k > 1 or cfg.consumers != 2):
        return ("persistent takes two consumers and split_k 0 or 1 (one consumer at 255 registers spills in the tile "
                "loop; split tiles are reduced by tickets a program)")
    if cfg.stream_k and not cfg.persistent:
        return "stream_k takes persistent=True (the stream-K tail is walked by the persistent programs)"
    if cfg.pingpong and cfg.consumers != 2:
        return "pingpong takes consumers=2 (the turns alternate between two warpgroups)"
    g = group_size
    if not (g == k or g % cfg.bk == 0 or (g == 64 and cfg.bk == 128)):
        return f"group_size={g}: a multiple of bk={cfg.bk}, 64, or one group a row (K)"
    if smem_bytes(cfg, g) > SMEM_LIMIT:
        return f"{smem_bytes(cfg, g)} B of shared memory > {SMEM_LIMIT}"
    if cfg.ctas not in (1, 2, 3, 4):
        return f"ctas={cfg.ctas}: 1, 2, 3 or 4 blocks an SM"
    if cfg.ctas > 1 and cfg.split_k > 1:
        return (f"ctas={cfg.ctas} takes split_k 0 or 1: the split-K fix-up (tickets) of two blocks an SM gave wrong "
                "sums and left tickets behind on an H100 (docs/w4a16_gemm.md, session 42)")
    if cfg.ctas > 1 and cfg.consumers != 1:
        return f"ctas={cfg.ctas} takes consumers=1 (two blocks of 12 warps would get 85 registers a thread)"
    if cfg.ctas >= 3 and (cfg.bm != 16 or (cfg.ctas == 4 and cfg.bk != 64)):
        return (f"ctas={cfg.ctas} takes bm=16{' and bk=64' if cfg.ctas == 4 else ''} (got bm={cfg.bm}, bk={cfg.bk}): "
                f"at {2 * CTA_MAXNREG[cfg.ctas] - 24} registers a consumer only that tile keeps its wgmma pipelined")
    if cfg.ctas > 1 and smem_bytes(cfg, g) > SMEM_PER_SM // cfg.ctas - 1024:
        return (f"ctas={cfg.ctas}: {smem_bytes(cfg, g)} B of shared memory a block > {SMEM_PER_SM // cfg.ctas - 1024} "
                f"(1 / {cfg.ctas} of an SM)")
    return None




def launch_options(cfg: WgmmaConfig) -> dict:
    """Compile options beyond num_warps: ctas blocks an SM cap the launch registers (CTA_MAXNREG: 8 warps x 128 x 2
    = the SM's 64 K); setmaxnreg then gives the consumer 232 / 136 / 104 and the producer 24 (sm_90 census)."""
    if MAXNREG_OVERRIDE:
        return {"maxnreg": MAXNREG_OVERRIDE}
    return {"maxnreg": CTA_MAXNREG[cfg.ctas]} if cfg.ctas in CTA_MAXNREG else {}


if HAS_GLUON:

    @gluon.jit
    def _coords(t, num_n, num_m, GROUP: gl.constexpr):
        """Tile t -> (pid_n, pid_m): GROUP n-tiles sweep the token tiles together (their weights stay in L2)."""
        width = GROUP * num_m
        first_n = (t // width) * GROUP
        gsz = gl.minimum(num_n - first_n, GROUP)
        return first_n + (t % width) % gsz, (t % width) // gsz

    @gluon.jit
    def _produce(w_desc, x_desc, sz_desc, w_smem, x_smem, sz_smem, ready, empty, t, base, it0, n_it, num_n, num_m,
                 G: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                 GROUP: gl.constexpr):
        """Tile t's K steps it0 .. it0 + n_it - 1 into ring steps base .. base + n_it - 1."""
        nbytes: gl.constexpr = w_desc.block_type.nbytes + x_desc.block_type.nbytes + sz_desc.block_type.nbytes
        pid_n, pid_m = _coords(t, num_n, num_m, GROUP)
        for j in range(n_it):
            g = base + j
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)  # a fresh slot passes at once
            mbarrier.expect(ready.index(s), nbytes)
            k0 = (it0 + j) * BK
            tma.async_copy_global_to_shared(w_desc, [pid_n * (BN // 16), k0 // 64, 0], ready.index(s),
                                            w_smem.index(s))
            tma.async_copy_global_to_shared(x_desc, [pid_m * BM, k0], ready.index(s), x_smem.index(s))
            tma.async_copy_global_to_shared(sz_desc, [k0 // G, pid_n * BN], ready.index(s), sz_smem.index(s))

    @gluon.jit
    def _sk_run(tile0, tiles, DP, SKQ, n_it):
        """Program tile0's stream-K run: steps [s0, s1) of the K steps of tiles DP .. tiles - 1 taken in order, and
        the stream-K tiles r_lo .. r_hi - 1 it touches (none where s0 >= s1)."""
        s0 = tile0 * SKQ
        s1 = gl.minimum(s0 + SKQ, (tiles - DP) * n_it)
        r_lo = s0 // n_it
        r_hi = r_lo
        if s0 < s1:
            r_hi = (s1 - 1) // n_it + 1
        return s0, s1, r_lo, r_hi

    @gluon.jit
    def _sk_segment(r, s0, s1, n_it):
        """The K steps [k0, k1) of stream-K tile r in the run [s0, s1)."""
        return gl.maximum(s0 - r * n_it, 0), gl.minimum(s1 - r * n_it, n_it)

    @gluon.jit
    def _producer(w_desc, x_desc, sz_desc, w_smem, x_smem, sz_smem, ready, empty, tile0, tiles, tstride, num_n, num_m,
                  it0, n_it, DP, SKQ, G: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  STAGES: gl.constexpr, GROUP: gl.constexpr, STREAM_K: gl.constexpr):
        base = 0  # ring steps of the earlier tiles (persistent: the ring runs on from tile to tile)
        for t in range(tile0, DP, tstride):  # DP = tiles but with stream-K
            _produce(w_desc, x_desc, sz_desc, w_smem, x_smem, sz_smem, ready, empty, t, base, it0, n_it, num_n, num_m,
                     G, BM, BN, BK, STAGES, GROUP)
            base += n_it
        if STREAM_K:  # the same segments as _consumer_sk's
            s0, s1, r_lo, r_hi = _sk_run(tile0, tiles, DP, SKQ, n_it)
            for r in range(r_lo, r_hi):
                k0, k1 = _sk_segment(r, s0, s1, n_it)
                _produce(w_desc, x_desc, sz_desc, w_smem, x_smem, sz_smem, ready, empty, DP + r, base, k0, k1 - k0,
                         num_n, num_m, G, BM, BN, BK, STAGES, GROUP)
                base += k1 - k0

    # module globals a kernel reads must be constexpr
    _H2_B0, _H2_B1, _H2_B2, _H2_B3 = (gl.constexpr(h2.pair_asm(m, "bf16")) for m in range(4))
    _H2_F0, _H2_F1, _H2_F2, _H2_F3 = (gl.constexpr(h2.pair_asm(m, "fp16")) for m in range(4))
    _H2_CON_B = gl.constexpr(h2.constraints("bf16"))
    _H2_CON_F = gl.constexpr(h2.constraints("fp16"))

    @gluon.jit
    def _nib(s, MAGIC, LOW: gl.constexpr):
        """int32 -> float32 1 + q/2^11 (q at bits 12..15, LOW) or 1 + q/2^7 (bits 16..19): one LOP3."""
        if LOW:
            return ((s & 0xF000) | MAGIC).to(gl.float32, bitcast=True)
        else:
            return ((s & 0xF0000) | MAGIC).to(gl.float32, bitcast=True)

    @gluon.jit
    def _pair(lo, hi, DT: gl.constexpr):
        """Two fp32 weights (k0 = 0, 1) -> one packed pair (cvt.rn.bf16x2.f32 / f16x2)."""
        return gl.join(lo, hi).to(DT)

    @gluon.jit
    def _consts(sz):
        """sz words (float32 bits of s*2^11 | zero) -> S_12, C_12, S_16, C_16 (w4a16_common.group_consts)."""
        s12 = (sz & -32).to(gl.float32, bitcast=True)
        c12 = (sz & 31).to(gl.float32) * s12 * (1.0 / 2048.0) + s12
        return s12, c12, s12 * 0.0625, s12 * -0.9375 + c12

    @gluon.jit
    def _load_slot(w_slot, sz_slot, c: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr, num_warps: gl.constexpr,
                   NBF: gl.constexpr):
        """Slot -> consumer c's packed words and scale/zero words in registers (LDS.128 / LDS.64), NBF fragments of
        16 features (4: 64 features; 8: 128, warp w holding fragments w and w + 4, the wgmma's row blocks).
        words (NBF, KT, 8, 4, 4) = (fragment row nb, column kt, g, t, step i); nibble j = 4 k3 + 2 n3 + k0
        of word (nb, kt, g, t, i) is W^T[16 nb + 8 n3 + g, 64 kt + 16 i + 8 k3 + 2 t + k0]."""
        KT: gl.constexpr = BK // 64
        ld: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])
        p = w_slot.slice(c * NBF, NBF, dim=0).load(ld)  # (NBF, KT, 128): one LDS.128 a thread a fragment
        l5: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 4], [1, 1, 8, 4, 1], [num_warps, 1, 1, 1, 1], [4, 3, 2, 1, 0])
        p = gl.convert_layout(gl.reshape(p, [NBF, KT, 8, 4, 4]), l5)  # the same registers, named (nb, kt, g, t, i)
        # scale/zero words of the 16 NBF rows: column 16 nb + 2 g + n3 (rows 8 n3 + g), SZR groups a step
        sl: gl.constexpr = gl.BlockedLayout([1, 1, 1, 2], [1, 1, 8, 4], [1, num_warps, 1, 1], [3, 2, 1, 0])
        szw = sz_slot.reshape([SZR, sz_slot.shape[1] // 16, 8, 2]).slice(c * NBF, NBF, dim=1).load(sl)
        return p, szw

    @gluon.jit
    def _unpack(p, szw, MAGIC, H2: gl.constexpr, DT: gl.constexpr, a_layout: gl.constexpr, BK: gl.constexpr,
                num_warps: gl.constexpr):
        """Registers only: words + scale/zero words -> this consumer's A tile (16 NBF, BK) in the wgmma operand
        layout."""
        l5: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 4], [1, 1, 8, 4, 1], [num_warps, 1, 1, 1, 1], [4, 3, 2, 1, 0])
        sza, szb = gl.split(szw)  # (SZR, 4, 8): rows n3 = 0 / 1
        l3: gl.constexpr = gl.SliceLayout(3, gl.SliceLayout(4, l5))  # (nb, kt, g), broadcast over t and i
        sza = gl.expand_dims(gl.expand_dims(gl.convert_layout(gl.permute(sza, [1, 0, 2]), l3), 3), 4)
        szb = gl.expand_dims(gl.expand_dims(gl.convert_layout(gl.permute(szb, [1, 0, 2]), l3), 3), 4)
        pu = p.to(gl.uint32, bitcast=True)
        if H2:  # packed 16-bit pairs (w4a16_h2.py): 1 SHF, then PRMT, LOP3 and 2-3 packed FMA-pipe ops a pair
            return _unpack_h2(p, pu, sza, szb, DT, a_layout, BK)
        s12a, c12a, s16a, c16a = _consts(sza)
        s12b, c12b, s16b, c16b = _consts(szb)
        r16 = ((pu << 16) | (pu >> 16)).to(gl.int32, bitcast=True)
        l8 = p << 8
        r8 = (pu >> 8).to(gl.int32, bitcast=True)
        # fp32 pairs (k0 = 0, 1) joined first, then one cvt.rn.bf16x2 a pair: each packed register is already an
        # A-fragment register (no PRMT), so keeping the 16-bit values alive keeps the wgmma's operand registers
        w0 = _pair(_nib(r16, MAGIC, False) * s16a - c16a, _nib(l8, MAGIC, True) * s12a - c12a, DT)  # nibbles 0, 1
        w1 = _pair(_nib(l8, MAGIC, False) * s16b - c16b, _nib(p, MAGIC, True) * s12b - c12b, DT)  # 2, 3
        w2 = _pair(_nib(p, MAGIC, False) * s16a - c16a, _nib(r8, MAGIC, True) * s12a - c12a, DT)  # 4, 5
        w3 = _pair(_nib(r8, MAGIC, False) * s16b - c16b, _nib(r16, MAGIC, True) * s12b - c12b, DT)  # 6, 7
        e = gl.join(gl.join(w0, w1), gl.join(w2, w3))  # (nb, kt, g, t, i, k0, n3, k3) -> reorder below
        e = gl.permute(e, [0, 6, 2, 1, 4, 7, 3, 5])  # (nb, n3, g, kt, i, k3, t, k0)
        return gl.convert_layout(gl.reshape(e, [p.shape[0] * 16, BK]), a_layout)  # registers only: A's layout

    @gluon.jit
    def _dup16(v):
        """16-bit floats -> int32 words holding the value in both halves (an h2 pair operand)."""
        return (v.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF) * 0x10001

    @gluon.jit
    def _h2_consts(sz, like, BF16: gl.constexpr):
        """sz words (float32 bits of s*2^11 | zero) -> the h2 asm's C = BIAS + z, then S_LO, S_HI (bf16: s split
        in two bf16, the low part exact) or S, S (fp16), each as both halves of an int32, broadcast like `like`."""
        s = (sz & -32).to(gl.float32, bitcast=True) * (1.0 / 2048.0)  # s exactly (a float16 value)
        z = (sz & 31).to(gl.float32)
        if BF16:
            hi = s.to(gl.bfloat16)
            c, lo, hi = _dup16((z + 128.0).to(gl.bfloat16)), _dup16((s - hi.to(gl.float32)).to(gl.bfloat16)), _dup16(hi)
        else:
            c, lo = _dup16((z + 1024.0).to(gl.float16)), _dup16(s.to(gl.float16))
            hi = lo
        c, lo, hi = gl.broadcast(c, like)[0], gl.broadcast(lo, like)[0], gl.broadcast(hi, like)[0]
        return gl.join(c, c), gl.join(lo, lo), gl.join(hi, hi)

    @gluon.jit
    def _h2_pair(pp, shp, c, lo, hi, ASM: gl.constexpr, CON: gl.constexpr, BF16: gl.constexpr):
        if BF16:
            return gl.inline_asm_elementwise(ASM, CON, [pp, shp, c, lo, hi], dtype=gl.bfloat16, is_pure=True, pack=2)
        else:
            return gl.inline_asm_elementwise(ASM, CON, [pp, shp, c, lo], dtype=gl.float16, is_pure=True, pack=2)

    @gluon.jit
    def _unpack_h2(p, pu, sza, szb, DT: gl.constexpr, a_layout: gl.constexpr, BK: gl.constexpr):
        """_unpack with w4a16_h2's packed 16-bit arithmetic: pair m of a word (nibbles 2m, 2m + 1 = k0 0, 1) is
        one asm call with pack=2 on int32 operands whose two elements are equal (the word, word >> 4, C, S_LO,
        S_HI of its row), giving the packed A-fragment register directly: the same values as the fp32 path."""
        BF16: gl.constexpr = DT == gl.bfloat16
        sh = (pu >> 4).to(gl.int32, bitcast=True)
        pp = gl.join(p, p)
        shp = gl.join(sh, sh)
        ca, la, ha = _h2_consts(sza, p, BF16)
        cb, lb, hb = _h2_consts(szb, p, BF16)
        if BF16:
            w0 = _h2_pair(pp, shp, ca, la, ha, _H2_B0, _H2_CON_B, BF16)  # nibbles 0, 1 (row n3 = 0)
            w1 = _h2_pair(pp, shp, cb, lb, hb, _H2_B1, _H2_CON_B, BF16)  # 2, 3 (n3 = 1)
            w2 = _h2_pair(pp, shp, ca, la, ha, _H2_B2, _H2_CON_B, BF16)  # 4, 5
            w3 = _h2_pair(pp, shp, cb, lb, hb, _H2_B3, _H2_CON_B, BF16)  # 6, 7
        else:
            w0 = _h2_pair(pp, shp, ca, la, ha, _H2_F0, _H2_CON_F, BF16)
            w1 = _h2_pair(pp, shp, cb, lb, hb, _H2_F1, _H2_CON_F, BF16)
            w2 = _h2_pair(pp, shp, ca, la, ha, _H2_F2, _H2_CON_F, BF16)
            w3 = _h2_pair(pp, shp, cb, lb, hb, _H2_F3, _H2_CON_F, BF16)
        e = gl.join(gl.join(w0, w1), gl.join(w2, w3))  # as _unpack's
        e = gl.permute(e, [0, 6, 2, 1, 4, 7, 3, 5])
        return gl.convert_layout(gl.reshape(e, [p.shape[0] * 16, BK]), a_layout)

    @gluon.jit
    def _step(a_prev, acc, w_smem, x_smem, sz_smem, ready, empty, j, MAGIC, H2: gl.constexpr, C: gl.constexpr,
              a_l: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr, STAGES: gl.constexpr):
        """K step j >= 1, wgmma j-1 (A = a_prev) in flight: slot j's words to registers -> unpack A_j (ALU work under
        wgmma j-1) -> issue wgmma j async (queued behind j-1: the tensor cores never wait for the unpack) ->
        wait(1): wgmma j-1 retired, a_prev's registers free -> release slot j-1. The issue reads A_j, so ptxas
        cannot sink the unpack below it (with wait(0) between issue and the next step's unpack it sank the
        unpack of the first half of an unrolled pair below the wait: 48 % overlap)."""
        s = j % STAGES
        mbarrier.wait(ready.index(s), (j // STAGES) & 1)
        p, szw = _load_slot(w_smem.index(s), sz_smem.index(s), C, BK, SZR, 4, w_smem.shape[1])  # one consumer
        a = _unpack(p, szw, MAGIC, H2, x_smem.dtype, a_l, BK, 4)
        acc = warpgroup_mma(a, x_smem.index(s).permute((1, 0)), acc, is_async=True)
        acc, a_prev = warpgroup_mma_wait(1, deps=(acc, a_prev))
        mbarrier.arrive(empty.index((j - 1) % STAGES), count=1)
        return acc, a

    @gluon.jit
    def _mainloop_wait0(a, acc, w_smem, x_smem, sz_smem, ready, empty, turn, base, n_it, MAGIC, H2: gl.constexpr,
                        C: gl.constexpr, a_l: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr, STAGES: gl.constexpr,
                        PINGPONG: gl.constexpr):
        """The first loop (two consumer warpgroups): issue wgmma(A_j, x_j) -> unpack A_{j+1} -> wait for slot j+2 ->
        wait(0) -> release j. A_{j+1} is a dependency of the wait too (no sinking the unpack below it in the PTX),
        and A_j stays live until wgmma j retires; the loop-carried a = a_next costs 12-58 register moves a step.
        The mbarrier wait for slot j+2 (the next step's load, predicated off past the last step) is a try-wait
        loop, a basic-block boundary between the unpack and the wgmma wait: without it ptxas hoisted
        WARPGROUP.DEPBAR right after the HGMMAs at bm256 (the unpack ran after its own wgmma retired, 15 of 96
        dequant ops overlapped), as it does with the PV wait in the attention kernels (`late_pv_wait`).
        PINGPONG (FA3's inter-warpgroup schedule, kernels/attention_fa3.py's turns): consumer C issues its wgmma of
        step j only after the other consumer issued its own of step j - 1 (C = 0) / j (C = 1), and passes the
        turn right after issuing, so the tensor cores take the two warpgroups' wgmmas in alternation and one's
        unpack runs under the other's MMA instead of both unpacking at once (the two share every x slot, so
        without turns they run in lockstep). turn[c] has count 1; consumer c's j-th wait has parity (j & 1) ^ FIRST
        (FIRST = 1 for consumer 0, whose turn 0 passes on the fresh barrier). Both take n_it turns: no skew."""
        FIRST: gl.constexpr = 1 if C == 0 else 0
        # base: ring steps (and turns) of this program's earlier tiles; slot and phase of step j are base + j's
        mbarrier.wait(ready.index((base + 1) % STAGES), ((base + 1) // STAGES) & 1, pred=n_it > 1)
        for j in range(n_it - 1):
            s = (base + j) % STAGES
            s1 = (base + j + 1) % STAGES
            p, szw = _load_slot(w_smem.index(s1), sz_smem.index(s1), C, BK, SZR, 4, w_smem.shape[1] // 2)  # slot j+1
            if PINGPONG:
                mbarrier.wait(turn.index(C), ((base + j) & 1) ^ FIRST)
            tok = warpgroup_mma(a, x_smem.index(s).permute((1, 0)), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - C))
            a_next = _unpack(p, szw, MAGIC, H2, x_smem.dtype, a_l, BK, 4)  # only ALU work under wgmma j
            mbarrier.wait(ready.index((base + j + 2) % STAGES), ((base + j + 2) // STAGES) & 1, pred=j + 2 < n_it)
            acc, a, a_next = warpgroup_mma_wait(0, deps=(tok, a, a_next))
            mbarrier.arrive(empty.index(s), count=1)
            a = a_next
        s = (base + n_it - 1) % STAGES
        if PINGPONG:
            mbarrier.wait(turn.index(C), ((base + n_it - 1) & 1) ^ FIRST)
        tok = warpgroup_mma(a, x_smem.index(s).permute((1, 0)), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - C))
        acc, a = warpgroup_mma_wait(0, deps=(tok, a))
        mbarrier.arrive(empty.index(s), count=1)
        return acc

    @gluon.jit
    def _mainloop_wait1(a0, acc, w_smem, x_smem, sz_smem, ready, empty, base, n_it, MAGIC, H2: gl.constexpr,
                        C: gl.constexpr, a_l: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr, STAGES: gl.constexpr):
        """Steps 0..n_it-1 (A_0 = a0 unpacked) with _step (ring steps base + j); returns the retired accumulator."""
        acc = warpgroup_mma(a0, x_smem.index(base % STAGES).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(1, deps=(acc, ))  # a no-op (one group in flight): the loop carries a tensor
        # unrolled by two: steps 2i+1 and 2i+2 use the A buffers alternately, so A_j is unpacked into the registers
        # that wgmma j-2 freed (no a = a_next copies: ptxas moved 21-58 registers a step for the loop-carried A)
        for i in range((n_it - 1) // 2):
            acc, a1 = _step(a0, acc, w_smem, x_smem, sz_smem, ready, empty, base + 2 * i + 1, MAGIC, H2, C, a_l, BK,
                            SZR, STAGES)
            acc, a0 = _step(a1, acc, w_smem, x_smem, sz_smem, ready, empty, base + 2 * i + 2, MAGIC, H2, C, a_l, BK,
                            SZR, STAGES)
        if (n_it - 1) % 2 == 1:  # an odd count of steps after the first
            acc, a1 = _step(a0, acc, w_smem, x_smem, sz_smem, ready, empty, base + n_it - 1, MAGIC, H2, C, a_l, BK, SZR,
                            STAGES)
            acc, a1 = warpgroup_mma_wait(0, deps=(acc, a1))
        else:
            acc, a0 = warpgroup_mma_wait(0, deps=(acc, a0))
        mbarrier.arrive(empty.index((base + n_it - 1) % STAGES), count=1)
        return acc

    @gluon.jit
    def _halves(t):
        """(R, W) -> columns [0, W/2) and [W/2, W): the top column bit of the wgmma layout is a register bit."""
        return gl.split(gl.permute(gl.reshape(t, [t.shape[0], 2, t.shape[1] // 2]), [0, 2, 1]))

    @gluon.jit
    def _epi_store(v, col0, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C: gl.constexpr,
                   HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, MODE: gl.constexpr):
        """One column chunk (F = BN / CONSUMERS features, W tokens) of the accumulator, its offsets computed for it
        alone (the 64-bit pointers of the whole tile would not fit beside acc at BM >= 128). MODE 0: to y; 1: to this
        split's workspace slice; 2: the last split sums the slices in split order (v unused) and writes y; stream-K,
        ws_ptr at a (BN features, BM tokens) fp32 block of the tile: 3: to that block; 4: sums SPLIT_K consecutive
        blocks in order (v unused) and writes y."""
        W: gl.constexpr = v.shape[1]
        F: gl.constexpr = v.shape[0]
        l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, W, 16])
        offs_n = pid_n * BN + C * F + gl.arange(0, F, layout=gl.SliceLayout(1, l))
        offs_m = pid_m * BM + col0 + gl.arange(0, W, layout=gl.SliceLayout(0, l))
        mask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims(offs_m < M, 0)
        off = gl.expand_dims(offs_m * N, 0) + gl.expand_dims(offs_n, 1)  # M * N < 2^31 (unsupported())
        if MODE >= 3:  # the block's own offsets: tokens contiguous (a thread's column pairs: 8-byte accesses)
            loc = (gl.expand_dims((C * F + gl.arange(0, F, layout=gl.SliceLayout(1, l))) * BM, 1)
                   + gl.expand_dims(col0 + gl.arange(0, W, layout=gl.SliceLayout(0, l)), 0))
        if MODE == 2:
            acc = gl.load(ws_ptr + off, mask=mask, other=0.0, cache_modifier=".cg")
            for sp in range(1, SPLIT_K):
                acc += gl.load(ws_ptr + sp * M.to(gl.int64) * N + off, mask=mask, other=0.0, cache_modifier=".cg")
        elif MODE == 4:
            acc = gl.load(ws_ptr + loc, cache_modifier=".cg")
            for sp in range(1, SPLIT_K):
                acc += gl.load(ws_ptr + sp * (BM * BN) + loc, cache_modifier=".cg")
        else:
            acc = gl.convert_layout(v, l)  # the same registers (the chunk of the wgmma layout is this layout)
        if MODE == 1:
            gl.store(ws_ptr + gl.program_id(1).to(gl.int64) * M * N + off, acc, mask=mask)
        elif MODE == 3:
            gl.store(ws_ptr + loc, acc)
        else:
            if HAS_BIAS:
                acc += gl.expand_dims(gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32), 1)
            if VEC_Y:
                _store_y_vec(acc.to(y_ptr.dtype.element_ty), y_ptr, pid_n * BN + C * F, pid_m * BM + col0, M, N)
            else:
                gl.store(y_ptr + off, acc.to(y_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _store_y_vec(v, y_ptr, n0, m0, M, N):
        """v (F features, W tokens; 16-bit) -> y[m0 + j, n0 + i] with 16-byte stores: a layout conversion (through a
        few KB of shared memory: stmatrix, then 128-bit loads) gives each thread 8 consecutive features of one token,
        so a warp writes whole 32-byte sectors of y's rows. In the accumulator's layout a thread holds 2 tokens of a
        feature (rows of y N apart): 2-byte stores, half of each sector. Needs N % 8 == 0 (VEC_Y); the mask is on the
        tokens alone except in the last feature tile, where it goes back to element stores."""
        F: gl.constexpr = v.shape[0]
        W: gl.constexpr = v.shape[1]
        vl: gl.constexpr = gl.BlockedLayout(size_per_thread=[8, 1], threads_per_warp=[2, 16], warps_per_cta=[4, 1],
                                            order=[0, 1])
        yv = gl.convert_layout(v, vl)
        offs_n = n0 + gl.arange(0, F, layout=gl.SliceLayout(1, vl))
        offs_m = m0 + gl.arange(0, W, layout=gl.SliceLayout(0, vl))
        ptr = (y_ptr + gl.expand_dims(gl.multiple_of(offs_m * N, 8), 0)
               + gl.expand_dims(gl.max_contiguous(gl.multiple_of(offs_n, 8), 8), 1))
        if n0 + F <= N:  # a whole feature tile: only the token mask (constant along a thread's 8 features)
            gl.store(ptr, yv, mask=gl.expand_dims(offs_m < M, 0) & gl.expand_dims(offs_n >= 0, 1))
        else:
            gl.store(ptr, yv, mask=gl.expand_dims(offs_m < M, 0) & gl.expand_dims(offs_n < N, 1))

    @gluon.jit
    def _epilogue(acc, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C: gl.constexpr,
                  HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, CHUNKS: gl.constexpr,
                  MODE: gl.constexpr):
        """acc (BN / CONSUMERS features, BM tokens) -> y[m, n] (MODE, _epi_store) in CHUNKS (1, 2 or 4) column chunks."""
        if CHUNKS == 1:
            _epi_store(acc, 0, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS, VEC_Y, BM,
                       BN, MODE)
        else:
            h0, h1 = _halves(acc)
            if CHUNKS == 2:
                _epi_store(h0, 0, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS, VEC_Y,
                           BM, BN, MODE)
                _epi_store(h1, BM // 2, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS,
                           VEC_Y, BM, BN, MODE)
            else:
                q0, q1 = _halves(h0)
                _epi_store(q0, 0, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS, VEC_Y,
                           BM, BN, MODE)
                _epi_store(q1, BM // 4, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS,
                           VEC_Y, BM, BN, MODE)
                q2, q3 = _halves(h1)
                _epi_store(q2, BM // 2, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS,
                           VEC_Y, BM, BN, MODE)
                _epi_store(q3, 3 * BM // 4, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C,
                           HAS_BIAS, VEC_Y, BM, BN, MODE)

    _FENCE = gl.constexpr(FIXUP_FENCE)

    @gluon.jit
    def _fence_gpu():
        """fence.acq_rel.gpu in every thread of a warpgroup (one element a thread)."""
        l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[4], order=[0])
        gl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r,r", [gl.arange(0, 128, layout=l)],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _fixup(acc, y_ptr, bias_ptr, part_ptr, sum_ptr, cnt_ptr, t, pid_n, pid_m, M, N, COUNT, C: gl.constexpr,
               HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, CHUNKS: gl.constexpr,
               CONSUMERS: gl.constexpr, PART: gl.constexpr, SUM: gl.constexpr):
        """Tile t split among COUNT programs (split-K: PART 1 / SUM 2; stream-K: 3 / 4, _epi_store's modes): this
        one's fp32 partial to part_ptr, then one acq_rel ticket a (tile, consumer); the last to take it sums the
        COUNT partials from sum_ptr in order (the same bits whatever the arrival order), writes y and puts the
        ticket back to zero."""
        _epilogue(acc, y_ptr, bias_ptr, part_ptr, cnt_ptr, pid_n, pid_m, M, N, COUNT, C, HAS_BIAS, VEC_Y, BM, BN,
                  CHUNKS, PART)
        if _FENCE:
            _fence_gpu()
        gl.thread_barrier()
        tkt = t * CONSUMERS + C
        if gl.atomic_add(cnt_ptr + tkt, 1, sem="acq_rel", scope="gpu") == COUNT - 1:
            if _FENCE:
                _fence_gpu()
            _epilogue(acc, y_ptr, bias_ptr, sum_ptr, cnt_ptr, pid_n, pid_m, M, N, COUNT, C, HAS_BIAS, VEC_Y, BM, BN,
                      CHUNKS, SUM)
            gl.atomic_xchg(cnt_ptr + tkt, 0, sem="relaxed", scope="gpu")

    @gluon.jit
    def _tile_acc(w_smem, x_smem, sz_smem, ready, empty, turn, base, n_it, MAGIC, H2: gl.constexpr, C: gl.constexpr,
                  BM: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                  PINGPONG: gl.constexpr):
        """The accumulator (BN / CONSUMERS features, BM tokens) of the K steps at ring steps base .. base + n_it - 1."""
        NBF: gl.constexpr = w_smem.shape[1] // CONSUMERS  # 16-feature fragments a consumer
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
        acc = gl.zeros([16 * NBF, BM], gl.float32, acc_l)
        mbarrier.wait(ready.index(base % STAGES), (base // STAGES) & 1)
        p, szw = _load_slot(w_smem.index(base % STAGES), sz_smem.index(base % STAGES), C, BK, SZR, 4, NBF)
        a0 = _unpack(p, szw, MAGIC, H2, x_smem.dtype, a_l, BK, 4)
        if CONSUMERS == 2:  # 12 warps (168 registers at launch, 240 by setmaxnreg): wait(1) serializes the wgmma there
            acc = _mainloop_wait0(a0, acc, w_smem, x_smem, sz_smem, ready, empty, turn, base, n_it, MAGIC, H2, C, a_l,
                                  BK, SZR, STAGES, PINGPONG)
        else:
            acc = _mainloop_wait1(a0, acc, w_smem, x_smem, sz_smem, ready, empty, base, n_it, MAGIC, H2, C, a_l, BK,
                                  SZR, STAGES)
        return acc

    @gluon.jit
    def _consumer_tile(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, t, base, num_n,
                       num_m, n_it, M, N, MAGIC, H2: gl.constexpr, SPLIT_K, C: gl.constexpr, HAS_BIAS: gl.constexpr,
                       VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, SZR: gl.constexpr,
                       STAGES: gl.constexpr, CONSUMERS: gl.constexpr, HAS_SPLIT: gl.constexpr, PINGPONG: gl.constexpr,
                       GROUP: gl.constexpr):
        """Tile t, its K steps at ring steps base .. base + n_it - 1: main loop, then the epilogue."""
        CHUNKS: gl.constexpr = 4 if BM >= 128 else (2 if BM == 64 else 1)  # 16..64 tokens a chunk
        pid_n, pid_m = _coords(t, num_n, num_m, GROUP)
        acc = _tile_acc(w_smem, x_smem, sz_smem, ready, empty, turn, base, n_it, MAGIC, H2, C, BM, BK, SZR, STAGES,
                        CONSUMERS, PINGPONG)
        if HAS_SPLIT:  # never persistent (config_error); slices, the last split sums them in split order
            _fixup(acc, y_ptr, bias_ptr, ws_ptr, ws_ptr, cnt_ptr, t, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS, VEC_Y,
                   BM, BN, CHUNKS, CONSUMERS, 1, 2)
        else:
            _epilogue(acc, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, SPLIT_K, C, HAS_BIAS, VEC_Y, BM, BN,
                      CHUNKS, 0)

    @gluon.jit
    def _consumer_sk(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, tile0, tiles, num_n,
                     num_m, n_it, M, N, MAGIC, H2: gl.constexpr, base, DP, SKQ, MAXC, C: gl.constexpr,
                     HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                     BK: gl.constexpr, SZR: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                     PINGPONG: gl.constexpr, GROUP: gl.constexpr):
        """Stream-K tail: the K steps of tiles DP .. tiles - 1 in one run, program p taking run steps [p SKQ, (p + 1)
        SKQ): one segment a tile it touches. A tile done by one program is stored; a shared one is written by each
        of its contributors to its own fp32 block (tile r's blocks r MAXC + idx, idx = program - the tile's first),
        and the last to take the (tile, consumer) ticket sums the blocks in idx order (the same bits every call)."""
        CHUNKS: gl.constexpr = 4 if BM >= 128 else (2 if BM == 64 else 1)
        s0, s1, r_lo, r_hi = _sk_run(tile0, tiles, DP, SKQ, n_it)
        for r in range(r_lo, r_hi):
            k0, k1 = _sk_segment(r, s0, s1, n_it)
            acc = _tile_acc(w_smem, x_smem, sz_smem, ready, empty, turn, base, k1 - k0, MAGIC, H2, C, BM, BK, SZR,
                            STAGES, CONSUMERS, PINGPONG)
            base += k1 - k0
            t = DP + r
            pid_n, pid_m = _coords(t, num_n, num_m, GROUP)
            first = (r * n_it) // SKQ
            count = ((r + 1) * n_it - 1) // SKQ - first + 1
            if count == 1:
                _epilogue(acc, y_ptr, bias_ptr, ws_ptr, cnt_ptr, pid_n, pid_m, M, N, 1, C, HAS_BIAS, VEC_Y, BM, BN,
                          CHUNKS, 0)
            else:
                blk = ws_ptr + (r * MAXC).to(gl.int64) * (BM * BN)
                _fixup(acc, y_ptr, bias_ptr, blk + (tile0 - first) * (BM * BN), blk, cnt_ptr, t, pid_n, pid_m, M,
                       N, count, C, HAS_BIAS, VEC_Y, BM, BN, CHUNKS, CONSUMERS, 3, 4)

    @gluon.jit
    def _consumer(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, tile0, tiles, tstride,
                  num_n, num_m, it0, n_it, M, N, MAGIC, H2: gl.constexpr, SPLIT_K, DP, SKQ, MAXC, C: gl.constexpr,
                  HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  SZR: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, HAS_SPLIT: gl.constexpr,
                  PINGPONG: gl.constexpr, GROUP: gl.constexpr, PERSISTENT: gl.constexpr, STREAM_K: gl.constexpr):
        if PERSISTENT:  # tiles tile0, tile0 + tstride, ... < DP: the ring's steps (and turns) run on from tile to tile
            base = 0
            for t in range(tile0, DP, tstride):
                _consumer_tile(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, t, base,
                               num_n, num_m, n_it, M, N, MAGIC, H2, SPLIT_K, C, HAS_BIAS, VEC_Y, BM, BN, BK, SZR,
                               STAGES, CONSUMERS, HAS_SPLIT, PINGPONG, GROUP)
                base += n_it
            if STREAM_K:
                _consumer_sk(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, tile0,
                             tiles, num_n, num_m, n_it, M, N, MAGIC, H2, base, DP, SKQ, MAXC, C, HAS_BIAS, VEC_Y, BM,
                             BN, BK, SZR, STAGES, CONSUMERS, PINGPONG, GROUP)
        else:  # one tile a program (no loop: a tile loop around the body made bm256-bn64-bk128 spill 12 B)
            _consumer_tile(w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr, cnt_ptr, tile0, 0,
                           num_n, num_m, n_it, M, N, MAGIC, H2, SPLIT_K, C, HAS_BIAS, VEC_Y, BM, BN, BK, SZR, STAGES,
                           CONSUMERS, HAS_SPLIT, PINGPONG, GROUP)

    @gluon.jit(do_not_specialize=["M", "N", "K", "SPLIT_K", "DP", "SKQ", "MAXC"])
    def w4a16_wgmma_kernel(w_desc, x_desc, sz_desc, y_ptr, bias_ptr, ws_ptr, cnt_ptr, M, N, K, MAGIC, SPLIT_K, DP, SKQ,
                           MAXC, G: gl.constexpr, HAS_BIAS: gl.constexpr, VEC_Y: gl.constexpr, BM: gl.constexpr,
                           BK: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, GROUP: gl.constexpr,
                           PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, HAS_SPLIT: gl.constexpr,
                           PINGPONG: gl.constexpr, PERSISTENT: gl.constexpr, STREAM_K: gl.constexpr,
                           H2: gl.constexpr):
        BN: gl.constexpr = w_desc.block_type.shape[0] * 16  # 64 or 128 features a consumer
        SZR: gl.constexpr = sz_desc.block_type.shape[0]
        num_n = (N + BN - 1) // BN
        num_m = (M + BM - 1) // BM
        tiles = num_n * num_m
        tile0 = gl.program_id(0)
        if PERSISTENT:  # tiles tile0, tile0 + grid, ... < DP (the grid is min(tiles, SMs), or SMs with stream-K)
            tstride = gl.num_programs(0)
        else:  # one tile a program
            tstride = tiles
        n_iter = (K + BK - 1) // BK
        it0 = gl.program_id(1) * n_iter // SPLIT_K
        n_it = (gl.program_id(1) + 1) * n_iter // SPLIT_K - it0  # >= 1: the host keeps SPLIT_K <= n_iter

        w_smem = gl.allocate_shared_memory(gl.int32, [STAGES] + w_desc.block_type.shape, w_desc.layout)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
        sz_smem = gl.allocate_shared_memory(gl.int32, [STAGES] + sz_desc.block_type.shape, sz_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=CONSUMERS)
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        if CONSUMERS == 2:
            gl.warp_specialize([ (_consumer, (w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr,
                               cnt_ptr, tile0, tiles, tstride, num_n, num_m, it0, n_it, M, N, MAGIC, H2, SPLIT_K, DP,
                               SKQ, MAXC, 0, HAS_BIAS, VEC_Y, BM, BN, BK, SZR, STAGES, CONSUMERS, HAS_SPLIT, PINGPONG,
                               GROUP, PERSISTENT, STREAM_K)), (_consumer, (w_smem, x_smem, sz_smem, ready, empty, turn,
                               y_ptr, bias_ptr, ws_ptr, cnt_ptr, tile0, tiles, tstride, num_n, num_m, it0, n_it, M, N,
                               MAGIC, H2, SPLIT_K, DP, SKQ, MAXC, 1, HAS_BIAS, VEC_Y, BM, BN, BK, SZR, STAGES,
                               CONSUMERS, HAS_SPLIT, PINGPONG, GROUP, PERSISTENT, STREAM_K)), (_producer, (w_desc,
                               x_desc, sz_desc, w_smem, x_smem, sz_smem, ready, empty, tile0, tiles, tstride, num_n,
                               num_m, it0, n_it, DP, SKQ, G, BM, BN, BK, STAGES, GROUP, STREAM_K)), ], [4, 1],
                               [CONSUMER_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([ (_consumer, (w_smem, x_smem, sz_smem, ready, empty, turn, y_ptr, bias_ptr, ws_ptr,
                               cnt_ptr, tile0, tiles, tstride, num_n, num_m, it0, n_it, M, N, MAGIC, H2, SPLIT_K, DP,
                               SKQ, MAXC, 0, HAS_BIAS, VEC_Y, BM, BN, BK, SZR, STAGES, CONSUMERS, HAS_SPLIT, PINGPONG,
                               GROUP, PERSISTENT, STREAM_K)), (_producer, (w_desc, x_desc, sz_desc, w_smem, x_smem,
                               sz_smem, ready, empty, tile0, tiles, tstride, num_n, num_m, it0, n_it, DP, SKQ, G, BM,
                               BN, BK, STAGES, GROUP, STREAM_K)), ], [1], [PRODUCER_REGS])


# ---- host side

def _gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]


@functools.lru_cache(maxsize=None)  # get_default_for alone took 14 us a call (host time of every launch)
def _layouts(cfg: WgmmaConfig, dtype: torch.dtype):
    w_l = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
    sz_l = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    x_l = gl.NVMMASharedLayout.get_default_for([cfg.bm, cfg.bk], _gl_dtype(dtype))
    return w_l, x_l, sz_l


def _szr(cfg: WgmmaConfig, g: int) -> int:
    return cfg.bk // g if g < cfg.bk else 1


def unsupported(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None,
                config: WgmmaConfig | None = None) -> str | None:
    """Why w4a16_wgmma cannot run these inputs, or None."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        return "x must be a 2-D (M, K) tensor"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"x has dtype {x.dtype}; the wgmma kernel takes bfloat16 or float16"
    if not isinstance(p, PackedW4):
        return f"p must be a PackedW4, got {type(p).__name__}"
    if x.shape[1] != p.in_features:
        return f"x has K={x.shape[1]} columns but p has in_features={p.in_features}"
    if p.in_features % 8:
        return f"in_features K={p.in_features} must be a multiple of 8 (16-byte TMA row stride of x)"
    g, k = p.group_size, p.in_features
    if g != k and g % 64:
        return f"group_size={g}: the wgmma kernel takes multiples of 64 or one group a row (w4a16_matmul takes more)"
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (p.out_features, )):
        return f"bias must be a ({p.out_features},) tensor"
    if config is not None:
        bad = config_error(config, g, k)
        if bad is not None:
            return f"config {config}: {bad}"
    if not HAS_GLUON:
        return "needs triton.experimental.gluon with warp_specialize (Triton >= 3.6)"
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] != 9:
        return f"x is on {x.device}: the wgmma kernel needs a Hopper GPU (sm_90)"
    if p.qweight.device != x.device:
        return f"p is on {p.qweight.device} but x on {x.device}"
    return None


def supported(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None,
              config: WgmmaConfig | None = None) -> bool:
    return unsupported(x, p, bias, config) is None


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _grid_flags(cfg: WgmmaConfig, split: int) -> tuple[bool, bool]:
    """(PERSISTENT, stream-K compiled in) of a launch of cfg that splits K `split` ways: a split launch runs its
    one-tile-a-program form (config_error keeps split_k off persistent configs; an auto split only reaches bm <= 64)."""
    persistent = cfg.persistent and split == 1
    return persistent, persistent and cfg.stream_k


SK_MIN_STEPS = 4  # a stream-K segment's fewest K steps (shorter ones are mostly ring fill and fix-up)


def stream_k_plan(tiles: int, k_steps: int, programs: int, m_tiles: int) -> tuple[int, int, int]:
    """(DP, SKQ, MAXC) of a stream-K launch on `programs` persistent programs, or (tiles, 0, 0) where it does not
    pay. Tiles 0 .. DP - 1 go whole, round robin (DP a multiple of programs); the K steps of the other tiles form
    one run that program p walks at [p SKQ, (p + 1) SKQ); MAXC bounds the contributors of a tile (its fp32 fix-up
    blocks). Only where the last wave leaves >= 10 % of the programs idle, and in one of two forms:
    * one token tile (m_tiles == 1: no two tiles share a weight block, x is <= 256 rows): Stream-K's "DP + one to
      two tiles" hybrid (Osama et al., 2023): the last, partly filled wave plus one full wave cut into equal runs
      (a tile has at most two contributors). M 256 x N 28672: 224 tiles = 1.7 waves run as 1.7.
    * several token tiles: the tiles of the partial wave each cut into S equal K pieces (S * tiles <= programs),
      so the programs of one piece index run at the same K offsets. Tiles that share x rows or a weight block then
      read them at the same time, as in the whole waves (the GROUP order keeps them in L2); free-running runs did
      not, and measured 5-15 % slower than no stream-K at M 1024-4096 (H200, session 21). K 4096 x N 14336 at
      M 1024: 448 tiles = 3 waves + 52 tiles, each in two halves: 3.5 waves instead of 4.
    The fix-up workspace is (tiles - DP) * MAXC blocks of BM x BN fp32: at most ~4 blocks a program (68 MB at
    bm256 x bn128 on 132 SMs), kept and reused by _workspace."""
    waves = -(-tiles // programs)
    if (waves * programs - tiles) * 10 < programs:
        return tiles, 0, 0
    if m_tiles == 1:
        dp = max(tiles // programs - 1, 0) * programs
        q = max(-(-(tiles - dp) * k_steps // programs), min(k_steps, SK_MIN_STEPS))
    else:
        dp = tiles // programs * programs
        pieces = min(programs // (tiles - dp), k_steps // SK_MIN_STEPS)
        if pieces < 2:
            return tiles, 0, 0
        q = -(-k_steps // pieces)
    if dp // programs * k_steps + q >= waves * k_steps:
        return tiles, 0, 0
    return dp, q, (k_steps - 1) // q + 2


def auto_split(tiles: int, k_steps: int, num_sms: int) -> int:
    """Splits so that a small grid fills about one wave; each split keeps >= 4 K steps (the ring's prologue)."""
    if tiles >= num_sms * 3 // 4:
        return 1
    return max(1, min(num_sms // tiles, k_steps // 4, 8))


def plan_split(cfg: WgmmaConfig, tiles: int, k_steps: int, num_sms: int) -> int:
    """K splits of a launch: cfg.split_k, else auto_split over the SMs for token tiles <= 64 in one block an SM (the
    split epilogue of bm >= 128 spills; ctas > 1 with a split gave wrong sums: docs/w4a16_gemm.md) and 1 otherwise;
    never more than the K steps."""
    split = cfg.split_k or (auto_split(tiles, k_steps, num_sms) if cfg.bm <= 64 and cfg.ctas == 1 else 1)
    return max(1, min(split, k_steps))


_WS: dict[torch.device, list] = {}


def _workspace(device: torch.device, floats: int, tickets: int):
    """(fp32 partials, int32 tickets) of at least floats / tickets, one pair a device, grown as needed. Calls on one
    device must not overlap in time (one stream). Growing inside CUDA-graph capture fails (the new tickets' zeros
    would exist only when the graph replays, not for the eager calls after it): run each shape once before."""
    buf = _WS.get(device)
    if buf is None:  # (not setdefault: its default would allocate two empty tensors on every call)
        buf = _WS[device] = [torch.empty(0, device=device), torch.zeros(0, dtype=torch.int32, device=device)]
    if (buf[0].numel() < floats or buf[1].numel() < tickets) and device.type == "cuda" \
            and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"the W4A16 wgmma workspace must grow to {floats} floats / {tickets} tickets inside "
                           "CUDA-graph capture; run each shape once before capturing")
    if buf[0].numel() < floats:
        buf[0] = torch.empty(floats, device=device)
    if buf[1].numel() < tickets:  # tickets are left at zero by the kernel
        buf[1] = torch.zeros(tickets, dtype=torch.int32, device=device)
    return buf[0], buf[1]


def _weight_descs(p: PackedW4, cfg: WgmmaConfig, w_l, sz_l):
    """The TMA descriptors of the packed words and the scale/zero words, kept on p (host time: ~8 us each to
    build and validate), rebuilt when p's tensors are replaced."""
    cache = p.__dict__.setdefault("_wgmma_descs", {})
    key = (cfg.bn, cfg.bk, _szr(cfg, p.group_size))
    now = (p.qweight.data_ptr(), p.sz.data_ptr(), p.qweight.shape, p.sz.shape)
    hit = cache.get(key)
    if hit is None or hit[0] != now:  # one entry a tile shape: a replaced tensor's descriptors are dropped
        nb_all, kt_all = p.qweight.shape[:2]
        w3 = p.qweight.view(nb_all, kt_all, 128)
        ng, n_pad = p.sz.shape
        hit = cache[key] = (now, (
            TensorDescriptor(w3, [nb_all, kt_all, 128], [kt_all * 128, 128, 1], [cfg.bn // 16, cfg.bk // 64, 128], w_l),
            TensorDescriptor(p.sz, [ng, n_pad], [n_pad, 1], [_szr(cfg, p.group_size), cfg.bn], sz_l)))
    return hit[1]


def w4a16_wgmma(x: torch.Tensor, p: PackedW4, bias: torch.Tensor | None = None,
                config: WgmmaConfig | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) bf16/fp16 -> y (M, N) = x @ W + bias in x's dtype (semantics of w4a16_matmul). config: the
    first candidate of M's bucket by default. out: a contiguous (M, N) tensor of x's dtype to write y into
    (w4a16_matmul's). Raises ValueError naming the argument it cannot take."""
    why = unsupported(x, p, bias, config)
    if why is not None:
        raise ValueError(f"w4a16_wgmma: {why}")
    m, k = x.shape
    n = p.out_features
    if out is not None and (out.shape != (m, n) or out.dtype != x.dtype or not out.is_contiguous()
                            or out.device != x.device):
        raise ValueError(f"w4a16_wgmma: out must be a contiguous ({m}, {n}) {x.dtype} tensor on {x.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if m == 0 or n == 0:  # (n == 0: no tile; auto_split would divide by zero tiles)
        return y
    if k == 0:  # no K step: n_it = 0 and the consumers would wait forever on ring slot 0, which nobody fills
        return y.zero_() if bias is None else y.copy_(bias.to(x.dtype).expand(m, n))
    cfg = config or candidates(m)[0]
    bad = config_error(cfg, p.group_size, k)
    if bad is not None:
        raise ValueError(f"w4a16_wgmma: config {cfg}: {bad}")
    if p.perm is not None:
        x = x[:, p.perm.long()]  # act-order: one gather (TMA cannot gather on sm_90)
    if x.stride(1) != 1 or (x.stride(0) * 2) % 16 or x.data_ptr() % 16:
        x = x.contiguous()
        if x.data_ptr() % 16:
            x = x.clone()
    if bias is not None:
        bias = bias.to(x.dtype).contiguous()
    w_l, x_l, sz_l = _layouts(cfg, x.dtype)
    w_desc, sz_desc = _weight_descs(p, cfg, w_l, sz_l)
    x_desc = TensorDescriptor(x, [m, k], [x.stride(0), 1], [cfg.bm, cfg.bk], x_l)
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
    k_steps = triton.cdiv(triton.cdiv(k, FRAG_K) * FRAG_K, cfg.bk)
    sms = _num_sms(x.device.index or 0)
    split = plan_split(cfg, tiles, k_steps, sms)
    persistent, stream_k = _grid_flags(cfg, split)
    dp, skq, maxc = stream_k_plan(tiles, k_steps, sms, triton.cdiv(m, cfg.bm)) if stream_k else (tiles, 0, 0)
    floats = split * m * n if split > 1 else (tiles - dp) * maxc * cfg.bm * cfg.bn if skq else 1
    ws, cnt = _workspace(x.device, floats, tiles * cfg.consumers)
    grid0 = (sms if skq else min(tiles, sms)) if persistent else tiles
    w4a16_wgmma_kernel[(grid0, split)](
        w_desc, x_desc, sz_desc, y, bias if bias is not None else y, ws, cnt, m, n, k, MAGIC_ONE, split, dp, skq, maxc,
        G=p.group_size, HAS_BIAS=bias is not None, BM=cfg.bm, BK=cfg.bk, STAGES=cfg.stages,
        CONSUMERS=cfg.consumers, GROUP=cfg.group, PRODUCER_REGS=cfg.producer_regs, CONSUMER_REGS=cfg.consumer_regs,
        HAS_SPLIT=split > 1, PINGPONG=cfg.pingpong, PERSISTENT=persistent, STREAM_K=skq > 0, H2=cfg.h2,
        VEC_Y=cfg.vec_y and n % 8 == 0 and y.data_ptr() % 16 == 0, num_warps=4, **launch_options(cfg))
    return y


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


if __name__ == "__main__":
    _main()
