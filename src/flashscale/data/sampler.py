"""Deterministic, resumable, rank-sharded sampling of training windows from a token array.

An epoch is one pass over non-overlapping windows: window j covers tokens [o + j*S, o + j*S + S]
(S + 1 tokens: inputs and the shifted targets share S of them), where the offset o in [0, S) is drawn
anew each epoch so that, across epochs, every token position gets to sit at every place in a window.
The windows are visited in a seeded random order; every step takes the next `batch_size * world_size`
of them and rank r takes its own contiguous `batch_size` slice, so ranks never share a window. The
tail that does not fill a global batch is dropped (it comes back, shifted, in later epochs).

The state is (epoch, position): position counts the windows of this epoch already taken by all ranks.
The epoch's offset and order are a pure function of (seed, epoch), so a sampler that loads a saved
state yields exactly the batches the original would have yielded next, with no data stored.
Position counts windows, not steps, so a run may resume with another batch size or world size.
"""

from __future__ import annotations

import numpy as np
import torch


def _check_int(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: takes an int, got {type(value).__name__} {value!r}")
    if value < lo:
        raise ValueError(f"{name}: takes an int >= {lo}, got {value}")
    return int(value)


class BatchSampler:
    """next_batch(tokens) -> (x, y) int64 (batch_size, seq_len) for this rank; y is x shifted by one."""

    def __init__(self, num_tokens: int, *, seq_len: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        self.num_tokens = _check_int("num_tokens", num_tokens, 2)
        self.seq_len = _check_int("seq_len", seq_len, 1)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.seed = _check_int("seed", seed, 0)
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank: takes an int in [0, world_size={self.world_size}), got {rank}")
        # The fewest windows an epoch can have (offset S-1); it must fill one global batch.
        need = self.global_batch * self.seq_len + self.seq_len
        if self.min_windows < self.global_batch:
            raise ValueError(f"num_tokens: {num_tokens} tokens make {self.min_windows} windows of "
                             f"seq_len={seq_len}; one global batch (batch_size {batch_size} x world_size "
                             f"{world_size}) needs >= {need} tokens")
        self.epoch = 0
        self.position = 0
        self._cache: tuple[int, int, np.ndarray] | None = None  # (epoch, offset, order)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def min_windows(self) -> int:
        return (self.num_tokens - 1 - (self.seq_len - 1)) // self.seq_len

    def _epoch_plan(self, epoch: int) -> tuple[int, np.ndarray]:
        """(offset, window order) of an epoch: a function of (seed, epoch) only."""
        if self._cache is None or self._cache[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(self.seq_len))
            n = (self.num_tokens - 1 - offset) // self.seq_len  # windows of S+1 tokens that fit
            self._cache = (epoch, offset, rng.permutation(n))
        return self._cache[1], self._cache[2]

    def next_starts(self) -> np.ndarray:
        """This rank's window starts for the next step (batch_size,) int64, and advance the state."""
        offset, order = self._epoch_plan(self.epoch)
        if self.position + self.global_batch > len(order):  # the tail cannot fill a batch: next epoch
            self.epoch, self.position = self.epoch + 1, 0
            offset, order = self._epoch_plan(self.epoch)
        lo = self.position + self.rank * self.batch_size
        windows = order[lo: lo + self.batch_size]
        self.position += self.global_batch
        return offset + windows.astype(np.int64) * self.seq_len

    def next_batch(self, tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens: the 1-D array (np memmap / ndarray / torch tensor) this sampler was built for.
        Returns x, y: LongTensors (batch_size, seq_len) on the CPU."""
        if len(tokens) != self.num_tokens or getattr(tokens, "ndim", 1) != 1:
            raise ValueError(f"tokens: takes the 1-D array of num_tokens={self.num_tokens} tokens this "
                             f"sampler was built for, got shape {tuple(tokens.shape)}")
        starts = self.next_starts()
        idx = starts[:, None] + np.arange(self.seq_len + 1)  # (B, S+1)
        if isinstance(tokens, torch.Tensor):
            win = tokens[torch.from_numpy(idx)].long()
        else:
            win = torch.from_numpy(np.asarray(tokens[idx]).astype(np.int64))  # gather from the memmap
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()

    @property
    def steps_per_epoch(self) -> int:
        """Steps in the current epoch (epochs differ by at most one, through their offsets)."""
        return len(self._epoch_plan(self.epoch)[1]) // self.global_batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "num_tokens": self.num_tokens, "seq_len": self.seq_len}

    def load_state_dict(self, state: dict) -> None:
        """Resume from state_dict(); the data (num_tokens), seq_len and seed must be the same."""
        if not isinstance(state, dict):
            raise TypeError(f"state: takes a dict from state_dict(), got {type(state).__name__}")
        missing = {"epoch", "position", "seed", "num_tokens", "seq_len"} - state.keys()
        if missing:
            raise ValueError(f"state: missing keys {sorted(missing)}")
        for key in ("seed", "num_tokens", "seq_len"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(f"state: was saved with {key}={state[key]}, this sampler has "
                                 f"{key}={getattr(self, key)}; resume with the same data and settings")
        epoch = _check_int("state['epoch']", state["epoch"], 0)
        position = _check_int("state['position']", state["position"], 0)
        self.epoch, self.position = epoch, position
