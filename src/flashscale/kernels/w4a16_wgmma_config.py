"""The W4A16 wgmma GEMM's configuration and plans, pure Python (no Triton): WgmmaConfig, the shared-memory limits and
smem_bytes, the candidate tables (CANDIDATES, TWINS, candidates), config_error, launch_options and the env knobs it and
the fix-up read (MAXNREG_OVERRIDE, FIXUP_FENCE), and the launch plans (stream_k_plan, auto_split, plan_split,
_grid_flags). Apart from the Gluon code so that the tuner, the tests and the benchmarks can plan and check configs
without compiling anything; kernels/w4a16_wgmma.py launches (and re-exports these names).

The two diagnosis knobs live here only (w4a16_wgmma does not re-export them: a copy there would reach nothing):
MAXNREG_OVERRIDE is read by launch_options at every call, so set `w4a16_wgmma_config.MAXNREG_OVERRIDE`;
FIXUP_FENCE is read once, into w4a16_wgmma_epilogue's gl.constexpr _FENCE at its import: set its environment variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

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


def _szr(cfg: WgmmaConfig, g: int) -> int:
    return cfg.bk // g if g < cfg.bk else 1


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
