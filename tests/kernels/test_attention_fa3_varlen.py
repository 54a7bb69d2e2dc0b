"""The varlen FA3 forward's tile bookkeeping, on the CPU, against brute-force enumeration: the tile order
(varlen_schedule), the in-kernel search that maps a tile to its sequence and block, step by step as the
kernel runs it (varlen_find, chunks of 32 sequences a warp), and the host-side bound that sizes the grid
(varlen_block_bound). The kernel itself runs in tests/kernels/test_attention_fa3_gpu.py (-k varlen)."""

from __future__ import annotations

import itertools
import random

import pytest

fa3 = pytest.importorskip("flashscale.kernels.attention_fa3")

LENGTHS = [
    [0],
    [1],
    [128],
    [129],
    [0, 0, 0],
    [0, 1, 300, 77, 1000, 128, 5],
    [513, 0, 1, 2048, 31],
    [1] * 70,  # more sequences than a 1-warp chunk (32) and than 64
    [5, 0, 200, 0, 0, 1, 256, 255, 257] * 9,
]


def _cu(lens):
    return [0, *itertools.accumulate(lens)]


def _brute(lens, n_heads, block_m):
    """Every (sequence, head, query block) that holds at least one query row."""
    return {(b, h, blk) for b, n in enumerate(lens) for h in range(n_heads) for blk in range(n)
            if blk * block_m < n}


@pytest.mark.parametrize("block_m", [64, 128, 192, 256])
@pytest.mark.parametrize("lens", LENGTHS, ids=lambda lens: f"{len(lens)}seq_{sum(lens)}tok")
def test_schedule_covers_every_tile_once(lens, block_m):
    H = 3
    tiles = fa3.varlen_schedule(_cu(lens), H, block_m)
    assert len(tiles) == len(set(tiles)) and set(tiles) == _brute(lens, H, block_m)
    for t, (b, h, blk) in enumerate(tiles):
        assert h == t % H and tiles[t - h] == (b, 0, blk)  # all heads of a block together
    # sequence by sequence, each one's last (heaviest under causal) block first
    seq_blocks = [(b, blk) for b, h, blk in tiles if h == 0]
    assert seq_blocks == sorted(seq_blocks, key=lambda x: (x[0], -x[1]))


@pytest.mark.parametrize("chunk", [1, 2, 3, 32, 128])
@pytest.mark.parametrize("block_m", [64, 128, 192])
@pytest.mark.parametrize("lens", LENGTHS, ids=lambda lens: f"{len(lens)}seq_{sum(lens)}tok")
def test_kernel_search_matches_the_schedule(lens, block_m, chunk):
    # _varlen_find as the kernel runs it (prefix sums over `chunk` sequences, stopping at the chunk that holds
    # the block), for every tile of the schedule and for tiles past the end (the grid's bound): those find
    # no sequence (b = number of sequences) and the kernel skips them.
    H = 2
    cu = _cu(lens)
    tiles = fa3.varlen_schedule(cu, H, block_m)
    bound = fa3.varlen_block_bound(cu[-1], len(lens), max(lens), block_m)
    for t in range(H * bound + 2 * H):
        b, blk, start, length = fa3.varlen_find(t // H, cu, block_m, chunk)
        if t < len(tiles):
            assert (b, t % H, blk) == tiles[t]
            assert (start, length) == (cu[b], lens[b])
            assert 0 <= blk * block_m < length
        else:
            assert b == len(lens)


@pytest.mark.parametrize("block_m", [64, 128, 192])
def test_grid_bound(block_m):
    # The one-tile-a-program grid must hold every tile: the bound never undercounts; equal lengths: exact.
    rng = random.Random(0)
    cases = LENGTHS + [[rng.choice([0, 1, 63, 64, 65, 127, 128, 129, 1000, rng.randrange(4096)])
                        for _ in range(rng.randrange(1, 40))] for _ in range(300)]
    for lens in cases:
        exact = sum(-(-n // block_m) for n in lens)
        bound = fa3.varlen_block_bound(sum(lens), len(lens), max(lens), block_m)
        assert exact <= bound <= exact + len(lens), (lens, exact, bound)
    for n in (1, 64, 100, 128, 1000):
        lens = [n] * 7
        assert fa3.varlen_block_bound(sum(lens), 7, n, block_m) == 7 * -(-n // block_m)
    # offsets that start above 0 / end below the packed length (the kernel attends only [cu[0], cu[-1]))
    assert fa3.varlen_block_bound(1000, 1, 300, 128) == 3


def test_varlen_config_and_cpu_refusals():
    import torch

    assert "ping-pong" in fa3.config_error(128, fa3.FA3Config(pingpong=False), varlen=True)
    assert fa3.config_error(128, fa3.FA3Config(pingpong=False)) is None
    for d, cfg in fa3.DEFAULT_CONFIGS.items():
        assert fa3.config_error(d, cfg, varlen=True) is None
    q = torch.randn(10, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(12, 2, 64, dtype=torch.bfloat16)
    assert "Hopper" in fa3.unsupported(q, k, k, varlen=True)  # the layout is fine: the device is missing
    assert "packed layout" in fa3.unsupported(q[None], k[None], k[None], varlen=True)
    assert "dense layout" in fa3.unsupported(q, k, k)
    assert "do not fit" in fa3.unsupported(q, k[..., :32], k[..., :32], varlen=True)  # head_dim 32 vs 64
    assert "do not fit" in fa3.unsupported(torch.randn(10, 3, 64, dtype=torch.bfloat16), k, k, varlen=True)
