"""Pieces shared by the W4A16 kernels: nibble -> float without a conversion instruction, the group
constants, the split-K epilogues (per-element atomics, or per-split slices with one ticket per tile),
and their workspaces.

Nibble to float ("magic number"): OR-ing a nibble into the mantissa of 1.0f gives 1 + q * 2^(p-23) for
a nibble at bits p..p+3, with no int->float conversion (I2F runs at a quarter of the FMA rate). Two
windows are used, p = 12 and p = 16, so one shift brings two nibbles of a word into place (raw word:
nibbles 3, 4; << 8: 1, 2; >> 8: 5, 6; rotate 16: 7, 0) and each nibble then costs one LOP3
((s & mask) | magic, with magic in a register so ptxas fuses the two: it passes as a kernel argument).
Then w = (q - z) * s is one FMA: f * S_p - C_p with S_12 = s * 2^11, C_12 = S_12 + z*s,
S_16 = s * 2^7, C_16 = S_16 + z*s. Every one of these is exact in float32 (s has 11 significant bits,
z <= 16: S_p, C_p and f * S_p fit in 24 bits), so w is exactly (q - z) * s before the single rounding to
the 16-bit MMA operand, as the reference computes it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAGIC_ONE = 0x3F800000  # float32 1.0: the exponent the nibbles are OR-ed under


@triton.jit
def nibble_float(s, MAGIC, LOW: tl.constexpr):
    """int32 s -> float32 1 + q/2^11 (q at bits 12..15, LOW) or 1 + q/2^7 (q at bits 16..19)."""
    if LOW:
        return ((s & 0xF000) | MAGIC).to(tl.float32, bitcast=True)
    else:
        return ((s & 0xF0000) | MAGIC).to(tl.float32, bitcast=True)


@triton.jit
def word_shifts(p):
    """int32 words -> (rot16, <<8, >>8) views: each brings two more nibbles into the windows."""
    pu = p.to(tl.uint32, bitcast=True)
    r16 = ((pu << 16) | (pu >> 16)).to(tl.int32, bitcast=True)  # one SHF.L.W (funnel shift)
    l8 = p << 8
    r8 = (pu >> 8).to(tl.int32, bitcast=True)
    return r16, l8, r8


@triton.jit
def group_consts(sz):
    """sz words (float32 bits of s*2^11 | zero) -> S_12, C_12, S_16, C_16 (module docstring)."""
    s12 = (sz & -32).to(tl.float32, bitcast=True)
    zs = (sz & 31).to(tl.float32) * s12  # z * s * 2^11, exact
    c12 = zs * (1.0 / 2048.0) + s12
    s16 = s12 * 0.0625
    c16 = s12 * -0.9375 + c12
    return s12, c12, s16, c16


@triton.jit
def store_or_reduce(acc, y_ptrs, ws_off, mask, bias, ws_ptr, cnt_ptr, SPLIT_K, HAS_BIAS: tl.constexpr):
    """Write an fp32 tile (+ bias) to y, or, under split-K, add it into the fp32 workspace: the split
    that arrives last for an element (its own per-element ticket) writes y and puts workspace and
    ticket back to zero, so one launch does it all and the next call finds a clean workspace."""
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc = acc + bias
        tl.store(y_ptrs, acc.to(y_ptrs.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(ws_ptr + ws_off, acc, mask=mask, sem="relaxed")
        # acq_rel: our add is visible before the ticket; the last one sees every earlier add
        ticket = tl.atomic_add(cnt_ptr + ws_off, tl.full(acc.shape, 1, tl.int32), mask=mask, sem="acq_rel")
        last = mask & (ticket == SPLIT_K - 1)
        tot = tl.load(ws_ptr + ws_off, mask=last, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            tot = tot + bias
        tl.store(y_ptrs, tot.to(y_ptrs.dtype.element_ty), mask=last)
        tl.store(ws_ptr + ws_off, tl.zeros(acc.shape, tl.float32), mask=last)
        tl.store(cnt_ptr + ws_off, tl.zeros(acc.shape, tl.int32), mask=last)


@triton.jit
def write_partial(acc, ws_ptr, ws_off, mask, SLICE):
    """Split-K by slices, step 1: this split's fp32 partial tile goes to its own workspace slice
    (pid_k * SLICE + offset) with plain coalesced stores: no per-element atomics."""
    tl.store(ws_ptr + tl.program_id(1).to(tl.int64) * SLICE + ws_off, acc, mask=mask)


@triton.jit
def last_split(cnt_ptr, tile, SPLIT_K):
    """Split-K by slices, step 2: one ticket per output tile (one atomic a program, not one an element).
    The barrier orders every thread's partial stores before the release of the one thread that takes
    the ticket; the split that draws SPLIT_K - 1 sums the slices and puts the ticket back to 0."""
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    return ticket == SPLIT_K - 1


@triton.jit
def sum_partials(ws_ptr, ws_off, mask, SLICE, SPLIT_K):
    """Split-K by slices, step 3 (last split only): the slices summed in split order (deterministic,
    whatever order the splits finished in), read through L2 (.cg: the L1 may hold a stale line)."""
    tot = tl.load(ws_ptr + ws_off, mask=mask, other=0.0, cache_modifier=".cg")
    for s in range(1, SPLIT_K):
        tot += tl.load(ws_ptr + s * SLICE + ws_off, mask=mask, other=0.0, cache_modifier=".cg")
    return tot


@triton.jit
def reset_ticket(cnt_ptr, tile):
    tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


_WORKSPACE: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
_SLICES: dict[torch.device, torch.Tensor] = {}


def split_k_slices(device: torch.device, numel: int) -> torch.Tensor:
    """fp32 buffer of >= numel for split-K by slices (splits x M x N partials). Every split overwrites
    its slice before the last one reads it, so the contents never need clearing; tickets live in
    split_k_workspace's int32 buffer (left at zero like the per-element ones)."""
    device = torch.device(device)
    buf = _SLICES.get(device)
    if buf is None or buf.numel() < numel:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the W4A16 split-K slice buffer must grow to {numel} elements inside CUDA-graph "
                               "capture; run each shape once before capturing")
        buf = torch.empty(max(numel, 1 << 16), dtype=torch.float32, device=device)
        _SLICES[device] = buf
    return buf


def split_k_workspace(device: torch.device, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 partial sums, int32 tickets), zero, at least `numel` long, one pair per device.

    The kernels leave both at zero after every call. Calls on one device must not overlap in time
    (one stream), and the first call of a size should happen outside CUDA-graph capture.
    """
    device = torch.device(device)
    ws = _WORKSPACE.get(device)
    if ws is None or ws[0].numel() < numel:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # zeros made inside a capture are not zero until the graph replays: fail loudly instead
            raise RuntimeError(f"the W4A16 split-K workspace must grow to {numel} elements inside CUDA-graph "
                               "capture; run each shape once before capturing")
        size = max(numel, 1 << 16)
        ws = (torch.zeros(size, dtype=torch.float32, device=device), torch.zeros(size, dtype=torch.int32, device=device))
        _WORKSPACE[device] = ws
    return ws
