"""W4A16 autotuner: the process's tuned table, the timing of a candidate config and the choice among them.

_TUNED (one dict a process: w4a16.py re-exports this same object) maps a call's key (_tune_key) to its config and
split; tuned_configs() / load_tuned_configs() move it to and from JSON, pin_config() and ring_add_choices() let a
caller that times a whole decode step choose for it. _time runs a candidate in CUDA graphs over weight copies that pass
the L2; _tune times the candidates of a key once and keeps the fastest (w4a16.py's module docstring). Apart from the
dispatcher because this is the tuner's state and knobs (_AUTOTUNE, WARM_MS, RETIME_*, TUNE_*, _time, _split_options,
_interpreting): tests and benchmarks that replace one must do it on this module, whose code reads them.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, replace

import torch
import triton.testing
from triton.runtime.errors import OutOfResources

from flashscale.kernels.w4a16_configs import (DecodeConfig, _config_class, _device_info, _interpreting, _is_ring,
                                              _is_strip, _is_wgmma, _ring_configs)
from flashscale.kernels.w4a16_pack import PackedW4


_TUNED: dict[tuple, dict] = {}  # key -> config fields + "split_k"
_AUTOTUNE = True


def set_autotune(enabled: bool) -> None:
    """Off: every key takes its bucket's first candidate untimed (one compile a bucket: tests)."""
    global _AUTOTUNE
    _AUTOTUNE = bool(enabled)


def _tune_key(kernel: str, bucket: int, x2d: torch.Tensor, p: PackedW4) -> tuple:
    """_tune's cache key of a call: kernel family, M bucket, the weight's shape, group and act-order, x's dtype, GPU."""
    return (kernel, bucket, p.out_features, p.in_features, p.group_size, str(x2d.dtype).removeprefix("torch."),
            "perm" if p.perm is not None else "noperm", _device_info(x2d.device)[0])


def _split_options(default: int, slices: bool = False, k_steps: int = 0, decode: bool = False) -> list[int]:
    """Split factors the autotuner times around the heuristic (a runtime argument: no recompiles);
    for the decode kernel, programs per SM: the default (16 warps an SM) and 8, 12, 24 warps' worth."""
    if decode:
        return sorted({max(1, default * w // 16) for w in (8, 12, 16, 24)})
    if slices:
        up = min(2 * default, max(1, k_steps // 2)) if k_steps else default
        return sorted({up, default, max(1, default // 2)}, reverse=True)
    return sorted({default, max(1, default // 2), max(1, default // 4)}, reverse=True)


def tuned_configs() -> dict[str, dict]:
    """The autotune table of this process (JSON-able): "kernel|M bucket|N|K|G|dtype|act|device" -> config."""
    return {"|".join(map(str, k)): dict(v) for k, v in _TUNED.items()}


def load_tuned_configs(table: dict[str, dict]) -> None:
    """Install a table from tuned_configs() (e.g. saved by a benchmark run) so no key is re-timed."""
    for k, v in table.items():
        kind, bucket, n, kk, g, dtype, act, dev = k.split("|")
        _TUNED[(kind, int(bucket), int(n), int(kk), int(g), dtype, act, dev)] = dict(v)


def ring_add_choices() -> dict[tuple, list]:
    """The accumulating ring GEMV's tuned keys of this process (w4a16_addmm_'s: one per shape and prologue kind)
    -> their candidate configs, the tuned one first: what a caller that times a whole decode step may pin
    (pin_config) in its place (not uneven shares, RingConfig.late: slower in the step, docs round 12)."""
    out = {}
    for key, fields in _TUNED.items():
        if str(key[0]).startswith("ring-add"):
            cur = dict(fields)
            split = cur.pop("split_k")
            tuned = _config_class(cur)(**cur)
            out[key] = [(tuned, split)] + [(c, c.per_sm) for c in _ring_configs() if c != tuned]
    return out


def pin_config(key: tuple, cfg, split: int) -> None:
    """Make `key`'s tuned choice (cfg, split): later calls of that key run it untimed."""
    _TUNED[key] = dict(asdict(cfg), split_k=split)


RETIME_TOP = 3  # _tune times the fastest few trials again, RETIME_ROUNDS times each, interleaved
RETIME_ROUNDS = 3
WARM_MS = 50.0  # before those rounds, the leader runs this long: the clocks settle at their loaded level


TUNE_L2_PASSES = 2  # the tuner's weight copies together pass this many times the L2 (HBM-cold weights)
TUNE_MAX_COPIES = 32


def _weight_ring(p: PackedW4) -> list[PackedW4]:
    """p and copies of its packed weights and scales that together pass TUNE_L2_PASSES x the L2, for the tuner to
    cycle through: each launch then reads its weights from HBM, as in a decode step (a model's next linear is
    never in L2)."""
    nbytes = p.qweight.numel() * 4 + p.sz.numel() * 4
    l2 = getattr(torch.cuda.get_device_properties(p.device), "L2_cache_size", 0) or 60 << 20
    n = max(1, min(TUNE_MAX_COPIES, -(-TUNE_L2_PASSES * l2 // max(nbytes, 1))))
    return [p] + [replace(p, qweight=p.qweight.clone(), sz=p.sz.clone()) for _ in range(n - 1)]


TUNE_REPLAY_MS = 10.0  # a timed graph replay's length: long enough for the clocks to settle at their loaded level
TUNE_MAX_LAUNCHES = 1024


def _time(launch, c, s, ring=(), *, replay_ms: float | None = None, sync: bool = False,
          side_stream: bool = False) -> float:
    """ms a launch of (c, s): a CUDA graph of launches back to back, launch(c, s, w) over the weights w of ring in
    turn (launch(c, s) when ring is empty), about TUNE_REPLAY_MS of work a replay; one replay to warm, then the median
    of 5 replays queued back to back (events between them, one synchronize at the end: no idle gaps). Eager timing
    (do_bench) of a 5-20 us kernel measures the host's launch path as much as the kernel, and one weight stays
    in L2 at 4096x4096: the H200 once kept a 15 us config over an 8.5 us one that way (results/w4a16-h200.json,
    2026-12-02). Short replays with a synchronize between them (1 ms, until session 21) ran as bursts at boost
    clocks: at M 1024 they timed bm256 x bn64 as fast as the persistent bm256 x bn128 config (192-195 us both),
    where 60 ms of steady replays put them at 212-217 and 203 us (docs/w4a16_gemm.md, session 21). Falls back to
    do_bench where a graph cannot be captured. replay_ms (default TUNE_REPLAY_MS), sync (a synchronize after each
    replay) and side_stream (replays on a new stream) are do_bench_cudagraph's ways, for
    benchmarks/w4a16_tune_timing.py to compare one at a time."""
    calls = [functools.partial(launch, c, s, w) for w in ring] or [functools.partial(launch, c, s)]
    with torch.cuda.stream(torch.cuda.Stream() if side_stream else torch.cuda.current_stream()):
        return _time_graph(calls, TUNE_REPLAY_MS if replay_ms is None else replay_ms, sync)


def _time_graph(calls: list, replay_ms: float, sync: bool) -> float:
    try:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        calls[0]()
        end.record()
        end.synchronize()
        n = max(len(calls), min(TUNE_MAX_LAUNCHES, int(replay_ms / max(start.elapsed_time(end), 1e-3))))
        n = -(-n // len(calls)) * len(calls)
        for call in calls[1:]:  # each copy's first launch (allocation, descriptors) outside the capture
            call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(n):
                calls[i % len(calls)]()
        graph.replay()
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(10)]
        for i in range(5):
            marks[2 * i].record()
            graph.replay()
            marks[2 * i + 1].record()
            if sync:
                marks[2 * i + 1].synchronize()
        marks[-1].synchronize()
        return sorted(marks[2 * i].elapsed_time(marks[2 * i + 1]) / n for i in range(5))[2]
    except RuntimeError:
        torch.cuda.synchronize()
        return triton.testing.do_bench(calls[0], warmup=5, rep=25, return_mode="median")


def _tune(key: tuple, cands: list, split_of, launch, steps_of=lambda c: 0, ring=tuple) -> tuple[object, int]:
    """Fastest (config, split) for `key`, timed once per process over the candidates and a few split
    factors around the heuristic, the RETIME_TOP fastest timed again in RETIME_ROUNDS interleaved rounds and the
    best median kept;
    the first candidate with the heuristic split when timing is off or impossible (interpreter, CUDA-graph
    capture). launch(c, s[, w]) runs a trial (on weight w); ring() gives the weights _time cycles through, built
    only when a key is timed."""
    hit = _TUNED.get(key)
    if hit is not None:
        fields = dict(hit)
        split = fields.pop("split_k")
        return _config_class(fields)(**fields), split
    if not _AUTOTUNE or _interpreting() or torch.cuda.is_current_stream_capturing():
        return cands[0], split_of(cands[0])
    trials = [(c, s) for c in cands for s in ([split_of(c)] if _is_wgmma(c) or _is_ring(c) or _is_strip(c) else  # own
                                               _split_options(split_of(c), getattr(c, "slices", False), steps_of(c),
                                                              isinstance(c, DecodeConfig)))]
    if len(trials) == 1:
        return trials[0]
    weights = ring()
    timed = []
    for c, s in trials:
        try:
            launch(c, s)  # compile (and size the split-K buffers) outside the timing
            timed.append((_time(launch, c, s, weights), len(timed), (c, s)))
        except OutOfResources:
            continue  # this config does not fit the device (shared memory, registers)
    if not timed:
        raise RuntimeError(f"no W4A16 config runs on this device for {key}")
    # The leaders again, after every candidate has run once, so one unlucky timing cannot decide alone (added when
    # eager timing had kept a config 1.5x slower than another run's choice; see _time): first WARM_MS of the leader,
    # then RETIME_ROUNDS interleaved rounds (A B C, B C A, ...), each leader's median deciding. The first round runs
    # on a GPU that was idle and still boosts: on the H200 the M = 4096 candidates timed 5-10 % faster there than
    # later, and one more timing each in a row flipped a 4 % steady-state order (benchmarks/w4a16_tune_timing.py,
    # session 21: the persistent bm256 x bn128 config lost to the one-tile bk64 config in 11 of 12 cells it leads at
    # steady state); interleaved rounds on warm clocks spread such drift over every leader alike.
    leaders = [cs for _, _, cs in sorted(timed)[:RETIME_TOP]]
    if len(leaders) > 1:
        t_end = time.perf_counter() + WARM_MS * 1e-3
        while time.perf_counter() < t_end:
            _time(launch, *leaders[0], weights)
        seen = {i: [] for i in range(len(leaders))}
        for r in range(RETIME_ROUNDS):
            for i in [(r + j) % len(leaders) for j in range(len(leaders))]:
                seen[i].append(_time(launch, *leaders[i], weights))
        best = leaders[min(seen, key=lambda i: (sorted(seen[i])[len(seen[i]) // 2], i))]
    else:
        best = leaders[0]
    _TUNED[key] = dict(asdict(best[0]), split_k=best[1])
    return best
