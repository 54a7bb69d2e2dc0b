"""Tile scheduling of the FA3-style forward: the tile -> (batch, head, query block) maps and the order programs
take tiles in (head groups heaviest first, the persistent snake, the dynamic scheduler's shared-memory hand-off),
and the varlen compact tile list over cu_seqlens_q. The Gluon helpers (the ping-pong partitions' and the FP8
forward's) beside their pure-Python twins (head_group, tile_order, program_tiles, varlen_*), which the launchers and
the CPU tests use; kernels/attention_fa3.py re-exports the public names."""

from __future__ import annotations

# The bf16 FA3 family's probe of Gluon (coop, pingpong, kernels import HAS_GLUON from here).
try:  # Gluon is experimental: absent from older Tritons, and its API moves between releases
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    HAS_GLUON = hasattr(gl, "warp_specialize")
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False


# ---- varlen bookkeeping (pure Python; the kernel's _varlen_find / _tile_info_varlen do the same on the GPU) ----

def varlen_block_bound(total_q: int, n_seq: int, max_seqlen_q: int, block_m: int) -> int:
    """An upper bound on the query blocks of a packed batch, sum_b cdiv(len_q_b, block_m), from what the host
    knows without reading cu_seqlens_q (no device sync): sum_b floor(len_b / block_m) <= total_q // block_m plus
    at most one partial block a sequence; and at most cdiv(max_seqlen_q, block_m) a sequence. Exact when every
    sequence has max_seqlen_q tokens. The one-tile-a-program grid is H times this."""
    return min(total_q // block_m + n_seq, n_seq * -(-max_seqlen_q // block_m))


def varlen_schedule(cu_seqlens_q, n_heads: int, block_m: int) -> list[tuple[int, int, int]]:
    """(sequence, head, query block) of tile t = 0, 1, ... as the kernel orders them: sequence by sequence,
    each one's query blocks last first (the most keys under a causal mask), all heads of a block together
    (t % n_heads is the head). Empty sequences have no tile. For tests and tools."""
    cu = [int(x) for x in cu_seqlens_q]
    tiles = []
    for b in range(len(cu) - 1):
        for blk in reversed(range(-(-(cu[b + 1] - cu[b]) // block_m))):
            tiles += [(b, h, blk) for h in range(n_heads)]
    return tiles


def varlen_find(i: int, cu_seqlens_q, block_m: int, chunk: int = 128) -> tuple[int, int, int, int]:
    """What the kernel's _varlen_find computes for compact query block i (tile // H), step by step as it does
    (a prefix sum over `chunk` sequences at a time, 32 per warp): (sequence b, its query block, first token,
    length); b = number of sequences when i is past the last block. For the unit test of that arithmetic."""
    cu = [int(x) for x in cu_seqlens_q]
    n_seq = len(cu) - 1
    base, c0 = 0, 0
    while c0 < n_seq:
        offs = [o for o in range(c0, c0 + chunk)]
        lo = [cu[o] if o < n_seq else 0 for o in offs]
        hi = [cu[o + 1] if o < n_seq else 0 for o in offs]
        nb = [(h - l + block_m - 1) // block_m for l, h in zip(lo, hi)]
        end = [base + sum(nb[:j + 1]) for j in range(chunk)]
        hit = [j for j in range(chunk) if end[j] - nb[j] <= i < end[j]]
        assert len(hit) <= 1
        if hit:
            j = hit[0]
            return offs[j], end[j] - 1 - i, lo[j], hi[j] - lo[j]
        base = max(e for e, o in zip(end, offs) if o < n_seq)
        c0 += chunk
    return n_seq, 0, 0, 0

def head_group(bh: int, n_m: int, n_sms: int, grouped: bool = True) -> int:
    """(batch, head)s a group of the ping-pong tile order (_tile_info): enough that a group's bh x n_m tiles
    fill the SMs once (ceil(n_sms / n_m), at most bh), so the tiles running at once share few heads' K/V
    and each head's K/V is read from HBM about once. grouped=False: bh (one group: heaviest tile first over
    all heads, the order before 2026-12-03)."""
    if bh < 1 or n_m < 1 or n_sms < 1:
        raise ValueError(f"head_group: bh, n_m, n_sms must be >= 1, got {bh}, {n_m}, {n_sms}")
    return max(1, min(bh, -(-n_sms // n_m))) if grouped else bh


def program_tiles(n_tiles: int, programs: int) -> list[list[int]]:
    """The tiles each persistent program runs, in order (_program_tiles / _snake_tile in Python): rounds of
    `programs` tiles, left to right in even rounds and right to left in odd ones."""
    out = [[] for _ in range(programs)]
    for t in range(n_tiles):
        k, j = divmod(t, programs)
        out[j if k % 2 == 0 else programs - 1 - j].append(t)
    return out


def tile_order(bh: int, n_m: int, hg: int) -> list[tuple[int, int]]:
    """The kernel's tile -> ((batch, head) index, query block) map for tiles 0 .. bh * n_m - 1, in Python
    (_tile_info does the same on the GPU; tests check it is a permutation, heaviest first within a group)."""
    out = []
    for t in range(bh * n_m):
        g, r = divmod(t, hg * n_m)
        n = min(hg, bh - g * hg)
        out.append((g * hg + r % n, n_m - 1 - r // n))
    return out


if HAS_GLUON:
    from flashscale.kernels.attention_fa3_coop import _max_combine, _sum_combine

    @gluon.jit
    def _grouped_tile(tile, n_m, BH, HG):
        """Tile t -> ((batch, head) index, query block) in head groups of HG, heaviest first within a group
        (tile_order is this in Python)."""
        tg = HG * n_m  # tiles of a full group
        g = tile // tg
        r = tile - g * tg
        hg = gl.minimum(HG, BH - g * HG)  # heads of this group (the last one may have fewer)
        return g * HG + r % hg, n_m - 1 - r // hg

    @gluon.jit
    def _tile_info(tile, n_m, BH, HG, H, GROUP, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   CAUSAL: gl.constexpr):
        """Tile t -> (b, h, K/V head, first query row, key blocks to visit). The (batch, head)s are taken HG
        at a time (head_group: about one wave of tiles a group, so the group's K/V is read from HBM once and
        from L2 by its other query tiles); within a group heaviest first: the last query tiles (the most keys
        under a causal mask) of its heads, then the next ones. HG = BH: one group, heaviest first globally."""
        bh, m_blk = _grouped_tile(tile, n_m, BH, HG)
        m0 = m_blk * BLOCK_M
        h = bh % H
        if CAUSAL:  # keys [0, hi) are visible to some row of the tile
            hi = gl.maximum(gl.minimum(seqlen_k, m0 + BLOCK_M + seqlen_k - seqlen_q), 0)
        else:
            hi = seqlen_k
        return bh // H, h, h // GROUP, m0, (hi + BLOCK_N - 1) // BLOCK_N

    @gluon.jit
    def _program_tiles(p, n_tiles, P):
        """Tiles of program p of P in the snake order of _snake_tile: R = n_tiles // P full rounds, and one of
        the rem = n_tiles % P tiles of the last round when the round's slot of p (p, or P - 1 - p in an odd
        round) is below rem. One-tile-a-program grids (P = n_tiles) give 1."""
        rounds = n_tiles // P
        rem = n_tiles - rounds * P
        slot = p + (rounds % 2) * (P - 1 - 2 * p)
        return rounds + (slot < rem).to(gl.int32)

    @gluon.jit
    def _snake_tile(k, p, P):
        """Program p's k-th tile: round k of P tiles, taken left to right in even rounds and right to left in
        odd ones, so the programs that drew a round's heaviest tiles draw the next round's lightest (the tile
        list runs heaviest first within a head group: round-robin would hand program 0 the heaviest causal
        tile of every round)."""
        return k * P + p + (k % 2) * (P - 1 - 2 * p)

    @gluon.jit
    def _pass_next_tile(next_smem, next_ready, next_free, k, tile, lay: gl.constexpr):
        """Dynamic scheduler, producer side: the tile after the program's k-th into slot k % 2 of next_smem,
        once every consumer has read what slot held two tiles before (next_free, count = consumers)."""
        slot = k % 2
        mbarrier.wait(next_free.index(slot), ((k // 2) & 1) ^ 1)  # a fresh barrier passes at once
        next_smem.index(slot).store(gl.full([1], tile, gl.int32, layout=lay))
        mbarrier.arrive(next_ready.index(slot), count=1)  # (Triton puts the warp's barrier before it)

    @gluon.jit
    def _take_next_tile(next_smem, next_ready, next_free, k, lay: gl.constexpr):
        """Dynamic scheduler, consumer side: the tile after the program's k-th, from the producer."""
        slot = k % 2
        mbarrier.wait(next_ready.index(slot), (k // 2) & 1)
        tile = gl.max(next_smem.index(slot).load(lay), 0)
        mbarrier.arrive(next_free.index(slot), count=1)
        return tile

    # ---- varlen (packed q (Tq, H, D), k/v (Tk, Hkv, D), int32 cu_seqlens): the compact tile list -----------
    # Sequence b has nb_b = cdiv(len_q_b, BLOCK_M) query blocks; they take the compact block numbers
    # [S_b, S_b + nb_b), S_b = nb_0 + ... + nb_{b-1}, last block first (heaviest under causal, as the dense
    # order). Tile t = (compact block t // H, head t % H). varlen_schedule() is this in Python (tested).

    @gluon.jit
    def _varlen_find(i, CU_Q, n_seq, BLOCK_M: gl.constexpr, WARPS: gl.constexpr):
        """Compact query block i -> (sequence b, its query block (last first), first token, length); b = n_seq
        when i is past the last block. A prefix sum of the block counts over 32 * WARPS sequences at a time
        (one a thread), from sequence 0, until the chunk that holds i (FA3's varlen scheduler does the same
        a warp at a time)."""
        CHUNK: gl.constexpr = 32 * WARPS
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        zero = i * 0
        base = zero  # blocks of the sequences before the chunk
        b = zero + n_seq
        m_blk = zero
        start = zero
        length = zero
        c0 = zero
        while c0 < n_seq:
            offs = c0 + gl.arange(0, CHUNK, layout=lay)
            inb = offs < n_seq
            lo = gl.load(CU_Q + offs, mask=inb, other=0)
            hi = gl.load(CU_Q + offs + 1, mask=inb, other=0)
            nb = (hi - lo + (BLOCK_M - 1)) // BLOCK_M  # 0 past n_seq and for empty sequences
            end = base + gl.associative_scan(nb, 0, _sum_combine)  # S_b + nb_b
            hit = (i < end) & (i >= end - nb)  # at most one lane (an empty sequence never hits)
            hb = gl.reduce(gl.where(hit, offs, -1), 0, _max_combine)
            if hb >= 0:
                b = hb
                m_blk = gl.reduce(gl.where(hit, end - 1 - i, 0), 0, _sum_combine)  # nb_b - 1 - (i - S_b)
                start = gl.reduce(gl.where(hit, lo, 0), 0, _sum_combine)
                length = gl.reduce(gl.where(hit, hi - lo, 0), 0, _sum_combine)
                c0 = zero + n_seq
            else:
                base = gl.reduce(gl.where(inb, end, 0), 0, _max_combine)
                c0 = c0 + CHUNK
        return b, m_blk, start, length

    @gluon.jit
    def _varlen_total(CU_Q, n_seq, BLOCK_M: gl.constexpr, WARPS: gl.constexpr):
        """Query blocks of all sequences, sum of cdiv(len_q_b, BLOCK_M) (the persistent grid's tile count / H)."""
        CHUNK: gl.constexpr = 32 * WARPS
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        total = n_seq * 0
        for c0 in range(0, n_seq, CHUNK):
            offs = c0 + gl.arange(0, CHUNK, layout=lay)
            inb = offs < n_seq
            lo = gl.load(CU_Q + offs, mask=inb, other=0)
            hi = gl.load(CU_Q + offs + 1, mask=inb, other=0)
            total += gl.reduce((hi - lo + (BLOCK_M - 1)) // BLOCK_M, 0, _sum_combine)
        return total

    @gluon.jit
    def _tile_info_varlen(tile, CU_Q, CU_K, n_seq, H, GROUP, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          CAUSAL: gl.constexpr, WARPS: gl.constexpr):
        """Tile t -> (valid, b, h, K/V head, first query row in the sequence, key blocks to visit, q start, len_q,
        k start, len_k): _tile_info with each sequence's own lengths (causal aligned bottom-right per sequence)."""
        h = tile % H
        b, m_blk, q_start, len_q = _varlen_find(tile // H, CU_Q, n_seq, BLOCK_M, WARPS)
        bk = gl.minimum(b, n_seq - 1)  # a tile past the end (b = n_seq) reads a valid entry; it does nothing
        k_start = gl.load(CU_K + bk)
        len_k = gl.load(CU_K + bk + 1) - k_start
        m0 = m_blk * BLOCK_M
        if CAUSAL:  # keys [0, hi) are visible to some row of the tile
            hi = gl.maximum(gl.minimum(len_k, m0 + BLOCK_M + len_k - len_q), 0)
        else:
            hi = len_k
        return b < n_seq, b, h, h // GROUP, m0, (hi + BLOCK_N - 1) // BLOCK_N, q_start, len_q, k_start, len_k
