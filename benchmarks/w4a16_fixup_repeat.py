"""Do the W4A16 wgmma GEMM's split-K / stream-K fix-ups give the same bits call after call? (sessions 40-41)

Repeats the cases that mismatched in the vec_y GPU test when it ran as 8 pytest processes on an H100 (session 40),
and neighbours that isolate one change each (ctas, dtype, N % 8, split or stream-K): each case called `reps` times,
plain and with vec_y, every output compared with the first call and with float64, the tickets checked back at zero
after every call. A line a call as it happens (a hang shows where), then the tiles (token tile, feature tile) that
differ. `python benchmarks/w4a16_fixup_repeat.py CASE [WORKER] [REPS]`; `list` prints the cases. Needs a Hopper GPU.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from test_w4a16_wgmma_gpu import _err, _oracle, _weight  # noqa: E402

from flashscale.kernels import w4a16_wgmma as wg  # noqa: E402
# MAXNREG_OVERRIDE lives in w4a16_wgmma_config, where launch_options reads it at every call
from flashscale.kernels import w4a16_wgmma_config as wgc  # noqa: E402

C = wg.WgmmaConfig
_LEAD = C(bm=256, consumers=2, stages=3, pingpong=True, persistent=True, stream_k=True)
_F16, _B16 = torch.float16, torch.bfloat16
CASES = [(C(bm=16, consumers=1, stages=8, ctas=2, split_k=2), _F16, 1088, 2048, 300),  # 0: wrong (s40-42), refused now
         (C(bm=16, consumers=1, stages=8, ctas=2, split_k=2), _B16, 1088, 2048, 300),  # 1: bf16 (case 9: 0, allowed)
         (C(bm=16, consumers=1, stages=8, split_k=2), _F16, 1088, 2048, 300),  # 2: one block an SM
         (_LEAD, _F16, 4160, 2100, 300),  # 3: mismatched (s40), vec_y off at launch (N % 8 = 4)
         (_LEAD, _F16, 4160, 2048, 300),  # 4: N % 8 = 0
         (_LEAD, _B16, 4160, 2100, 300),  # 5: bf16
         (C(bm=64, consumers=2, stages=6, split_k=2), _B16, 1088, 2048, 300),  # 6: two consumers, split
         # session 42 (fix41 on an H100: 0-2 and 6 as above, only ctas = 2 wrong, tickets left over): what in ctas = 2
         (C(bm=16, consumers=1, stages=8, ctas=2, split_k=1), _F16, 1088, 2048, 300),  # 7: no fix-up
         (C(bm=16, consumers=1, stages=16, split_k=2), _F16, 1088, 2048, 300, 128),  # 8: ctas=2's registers, one block
         (C(bm=16, consumers=1, stages=8, split_k=2), _F16, 1088, 2048, 300, 128)]  # 9: the same at two blocks an SM


def _tiles(diff: torch.Tensor, bm: int, bn: int) -> list:
    idx = diff.nonzero()
    if idx.numel() == 0:
        return []
    t = torch.stack([idx[:, 0] // bm, idx[:, 1] // bn], 1)
    keys, counts = t.unique(dim=0, return_counts=True)
    return [(*k.tolist(), int(c)) for k, c in zip(keys[:8], counts[:8])]


def _tickets(dev: torch.device) -> int:
    """The fix-up tickets left after the last call (the kernel puts every one back to zero)."""
    torch.cuda.synchronize()
    return int(wg._workspace(dev, 1, 1)[1].abs().sum())


def main(case: int, worker: int = 0, reps: int = 10) -> None:
    cfg, dtype, k, n, m = CASES[case][:5]
    wgc.MAXNREG_OVERRIDE = (CASES[case][5:] or (0,))[0]  # launch registers a thread (a diagnosis knob), 0: the config's
    dev = torch.device("cuda", torch.cuda.current_device())
    p = _weight(k, n, 64, seed=k + n)
    torch.manual_seed(worker)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    orc = _oracle(x, p, bias)
    tag = (f"case {case} w{worker} {cfg.label()} {str(dtype)[6:]} k{k} n{n} m{m}"
           + (f" maxnreg {wgc.MAXNREG_OVERRIDE}" if wgc.MAXNREG_OVERRIDE else ""))
    t0 = time.perf_counter()
    first = wg.w4a16_wgmma(x, p, bias, config=cfg)
    tickets = _tickets(dev)
    print(f"{tag}: first call {time.perf_counter() - t0:.1f} s, rel. err {_err(first, orc):.2e}, tickets {tickets}, "
          f"bad tiles vs float64 {_tiles((first.double() - orc).abs() > 0.05 * orc.abs().max(), cfg.bm, cfg.bn)}",
          flush=True)
    bad = 0
    for rep in range(reps):
        for c in (cfg, dataclasses.replace(cfg, vec_y=True)):
            t0 = time.perf_counter()
            y = wg.w4a16_wgmma(x, p, bias, config=c)
            tickets = _tickets(dev)
            if not torch.equal(y, first) or tickets:
                bad += 1
                print(f"  rep {rep} vec_y={c.vec_y}: {int((y != first).sum())} differ, rel. err {_err(y, orc):.2e}, "
                      f"tickets {tickets}, tiles {_tiles(y != first, cfg.bm, cfg.bn)}, "
                      f"{time.perf_counter() - t0:.2f} s", flush=True)
    print(f"{tag}: {bad} of {2 * reps} calls differ from the first", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["list"]:
        for i, case in enumerate(CASES):
            print(i, case[0].label(), case[1:])  # a sixth field: the launch registers (MAXNREG_OVERRIDE)
    else:
        main(*(int(a) for a in sys.argv[1:4]))
