"""Do the W4A16 wgmma GEMM's split-K / stream-K fix-ups give the same bits call after call? (session 40)

Repeats the cases that mismatched in test_vec_y_is_bitwise_the_element_store when the GPU file ran as 8 pytest
processes on an H100: each config called 30 times, plain and with vec_y, every output compared with the first call
and with float64. Run one process (`python benchmarks/w4a16_fixup_repeat.py 0`) and several at once (the same with
worker ids 0..7 in the background) to see whether concurrency matters. Prints one line a case; needs a Hopper GPU.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from test_w4a16_wgmma_gpu import _err, _oracle, _weight  # noqa: E402

from flashscale.kernels import w4a16_wgmma as wg  # noqa: E402

C = wg.WgmmaConfig
CASES = [(C(bm=16, consumers=1, stages=8, ctas=2, split_k=2), torch.float16, 1088, 2048, 300),
         (C(bm=256, consumers=2, stages=3, pingpong=True, persistent=True, stream_k=True), torch.float16, 4160, 2100,
          300),
         (C(bm=256, consumers=2, stages=3, pingpong=True, persistent=True, stream_k=True), torch.float16, 4160, 2048,
          300),
         (C(bm=64, consumers=2, stages=6, split_k=2), torch.bfloat16, 1088, 2048, 300)]


def main(worker: int = 0, reps: int = 30) -> None:
    for cfg, dtype, k, n, m in CASES:
        p = _weight(k, n, 64, seed=k + n)
        torch.manual_seed(worker)
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype)
        orc = _oracle(x, p, bias)
        first = wg.w4a16_wgmma(x, p, bias, config=cfg)
        bad = []
        for rep in range(reps):
            for c in (cfg, dataclasses.replace(cfg, vec_y=True)):
                y = wg.w4a16_wgmma(x, p, bias, config=c)
                if not torch.equal(y, first):
                    bad.append((rep, c.vec_y, int((y != first).sum()), round(_err(y, orc), 6)))
        print(f"w{worker} {cfg.label()} {str(dtype)[6:]} k{k} n{n} m{m}: first call rel. err {_err(first, orc):.2e}; "
              f"{len(bad)} of {2 * reps} differ from it {bad[:6]}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
