"""Load balance of the FA3 forward's persistent schedules under a causal mask, in a cost model (no GPU).

The persistent grid (FA3Config.persistent) assigns tiles statically: program p of P takes, in the tile list's
order (attention_fa3.tile_order: head groups, heaviest first within a group), the snake order of
attention_fa3.program_tiles, or round-robin before it. A one-tile-a-program grid is balanced by the hardware,
which hands the next tile to whichever SM frees first ("dynamic" below: greedy in list order). Cost of a tile:
its key blocks (ceil(min(S, (m + 1) * block_m) / block_n) under the causal mask) plus `--overhead` blocks of
prologue/epilogue. Printed: the busiest program's load over the mean (1.0 = perfect), per schedule.

    python benchmarks/persistent_balance.py            # the grid's causal cells at the defaults' tiles

Reading (2026-12-03): at d128 16k the snake over head groups of 256 tiles (132 programs) is 1.69x the mean: the
groups are not a whole number of snake round pairs, so the programs at the round ends draw heavy tiles round
after round. That is the measured 407 TFLOP/s against 582 for one tile a program (0.70x). Dynamic assignment
(an atomic tile counter, FA3's scheduler) stays within 1-8 % everywhere.
"""

from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from flashscale.kernels.attention_fa3 import head_group, program_tiles, tile_order  # noqa: E402

TOKENS, HIDDEN = 16384, 2048


def imbalance(seqlen: int, bh: int, block_m: int, block_n: int, programs: int, overhead: float,
              grouped: bool = True) -> dict[str, float]:
    """Busiest program's load / mean load for the snake, round-robin and dynamic schedules."""
    n_m = -(-seqlen // block_m)
    order = tile_order(bh, n_m, head_group(bh, n_m, programs, grouped))
    cost = [-(-min(seqlen, (m + 1) * block_m) // block_n) + overhead for _, m in order]
    mean = sum(cost) / programs
    snake = max(sum(cost[t] for t in ts) for ts in program_tiles(len(cost), programs))
    robin = max(sum(cost[t::programs]) for t in range(programs))
    free = [0.0] * programs
    for c in cost:
        heapq.heappush(free, heapq.heappop(free) + c)
    return {"snake": snake / mean, "round_robin": robin / mean, "dynamic": max(free) / mean}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=132, help="SMs (persistent programs)")
    ap.add_argument("--overhead", type=float, default=1.5, help="a tile's fixed cost, in key blocks")
    args = ap.parse_args(argv)
    if args.programs < 1 or args.overhead < 0:
        raise SystemExit("--programs must be >= 1 and --overhead >= 0")
    print(f"{'hdim':>4} {'seqlen':>6} {'tile':>8} {'order':>7}   snake  round_robin  dynamic")
    for hdim, block_m in ((64, 128), (64, 192), (128, 128), (256, 128)):
        block_n = 64 if hdim == 256 else 128
        for seqlen in (1024, 2048, 4096, 8192, 16384):
            bh = (TOKENS // seqlen) * (HIDDEN // hdim)
            for grouped in (True, False):
                r = imbalance(seqlen, bh, block_m, block_n, args.programs, args.overhead, grouped)
                print(f"{hdim:>4} {seqlen:>6} {block_m:>4}x{block_n:<3} {'grouped' if grouped else 'flat':>7}   "
                      f"{r['snake']:.3f}  {r['round_robin']:>11.3f}  {r['dynamic']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
