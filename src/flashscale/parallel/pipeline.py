"""Pipeline parallelism: the layer split, the schedules, and the executor that runs one.

Split. pp * v model chunks (v = virtual stages; chunk c lives on pipeline rank c % pp, Megatron's
interleaving), each a contiguous run of >= 1 layers. The automatic split minimizes the largest chunk's
cost, with the embedding counted on chunk 0 and the final norm + LM head on the last chunk. Cost is
parameters: it sets a stage's weight and optimizer memory and, for the matmuls of layers and head,
its FLOPs (2 per parameter per token); the first stage also holds the most in-flight activations in
1F1B (pp micro-batches), so counting the embedding against it is the right direction too.

Schedules (per rank, an ordered list of F(chunk, micro-batch) and B(chunk, micro-batch)):
  gpipe        all forwards, then all backwards           bubble (p-1)/(m+p-1), m activations live
  1f1b         p-r-1 warm-up forwards, then F/B alternate  same bubble, <= p activations live
  interleaved  1F1B over v chunks a rank (Narayanan et al. 2021, Megatron's order; m % p == 0)
                                                           bubble (p-1)/(v*m)
Execution. The per-rank orders are simulated once on a global clock (one action a tick, an action
starting only after its producer finished on an earlier tick), which gives every message a boundary
between two ticks at which both its sender and its receiver post it. At each boundary a rank posts all
of its sends and receives in one batch_isend_irecv: matching batches in the same order on both sides,
so the pattern is deadlock-free on NCCL as on gloo, whatever the schedule. The executor waits for a
received tensor only before the action that consumes it, and for its sends at the end: the boundaries
fix the order of the messages, not when the ranks compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from flashscale.models.config import LlamaConfig
from flashscale.parallel.mesh import ParallelMesh


# ------------------------------------------------------------------------------------------- split

def partition_layers(config: LlamaConfig, num_chunks: int) -> list[list[int]]:
    """Global layer indices of each of `num_chunks` chunks (contiguous, >= 1 layer each), minimizing the
    largest chunk cost (linear-partition dynamic program, O(chunks * layers^2))."""
    L = config.num_hidden_layers
    if not 1 <= num_chunks <= L:
        raise ValueError(f"{num_chunks} pipeline chunks for {L} layers: need 1 <= chunks <= layers")
    e, v = config.hidden_size, config.vocab_size
    layer = (config.num_params(embeddings=False) - e) / L
    embed, head = float(v * e), float(v * e + e)
    cost = [layer] * L
    prefix = [0.0]
    for c in cost:
        prefix.append(prefix[-1] + c)

    def chunk_cost(k: int, a: int, b: int) -> float:  # chunk k holds layers [a, b)
        return prefix[b] - prefix[a] + (embed if k == 0 else 0.0) + (head if k == num_chunks - 1 else 0.0)

    inf = float("inf")
    # best[k][b]: minimal max cost of chunks 0..k covering layers [0, b); cut[k][b]: start of chunk k
    best = [[inf] * (L + 1) for _ in range(num_chunks)]
    cut = [[0] * (L + 1) for _ in range(num_chunks)]
    for b in range(1, L + 1):
        best[0][b] = chunk_cost(0, 0, b)
    for k in range(1, num_chunks):
        for b in range(k + 1, L + 1):
            for a in range(k, b):  # chunk k = [a, b); earlier chunks cover [0, a) with >= 1 layer each
                val = max(best[k - 1][a], chunk_cost(k, a, b))
                if val < best[k][b] - 1e-9:
                    best[k][b], cut[k][b] = val, a
    bounds, b = [], L
    for k in range(num_chunks - 1, 0, -1):
        a = cut[k][b]
        bounds.append((a, b))
        b = a
    bounds.append((0, b))
    return [list(range(a, b)) for a, b in reversed(bounds)]


def explicit_partition(stage_layers: tuple[int, ...]) -> list[list[int]]:
    out, start = [], 0
    for n in stage_layers:
        out.append(list(range(start, start + n)))
        start += n
    return out


# --------------------------------------------------------------------------------------- schedules

@dataclass(frozen=True)
class Action:
    kind: str  # "F" or "B"
    chunk: int  # global chunk id
    mb: int  # micro-batch


def schedule_orders(schedule: str, pp: int, v: int, m: int) -> list[list[Action]]:
    """Every pipeline rank's ordered actions."""
    if schedule == "interleaved" and m % pp:
        raise ValueError(f"the interleaved schedule needs micro_batches divisible by pp: got {m} micro-batches, pp={pp}")
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"virtual_stages={v} needs schedule='interleaved', got {schedule!r}")
    orders = []
    for r in range(pp):
        if schedule == "gpipe":
            order = [Action("F", r, i) for i in range(m)] + [Action("B", r, i) for i in range(m)]
        elif schedule == "1f1b":
            warm = min(pp - r - 1, m)
            order = [Action("F", r, i) for i in range(warm)]
            for i in range(m - warm):
                order += [Action("F", r, warm + i), Action("B", r, i)]
            order += [Action("B", r, i) for i in range(m - warm, m)]
        elif schedule == "interleaved":
            total = m * v

            def mb(k):
                return (k // (pp * v)) * pp + k % pp

            def fwd(k):
                return Action("F", ((k % (pp * v)) // pp) * pp + r, mb(k))

            def bwd(k):
                return Action("B", (v - 1 - (k % (pp * v)) // pp) * pp + r, mb(k))

            warm = total if m == pp else min((pp - r - 1) * 2 + (v - 1) * pp, total)
            order = [fwd(k) for k in range(warm)]
            for i in range(total - warm):
                order += [fwd(warm + i), bwd(i)]
            order += [bwd(k) for k in range(total - warm, total)]
        else:
            raise ValueError(f"unknown pipeline schedule {schedule!r}")
        orders.append(order)
    return orders


@dataclass
class Step:
    """One thing a rank does: an action, or a communication boundary (sends and receives posted together)."""

    action: Action | None = None
    sends: list[tuple[tuple, int]] = field(default_factory=list)  # (message key, destination pp rank)
    recvs: list[tuple[tuple, int]] = field(default_factory=list)  # (message key, source pp rank)


def _deps(a: Action, num_chunks: int) -> list[Action]:
    if a.kind == "F":
        return [Action("F", a.chunk - 1, a.mb)] if a.chunk > 0 else []
    d = [Action("F", a.chunk, a.mb)]
    return d + ([Action("B", a.chunk + 1, a.mb)] if a.chunk < num_chunks - 1 else [])


def simulate(orders: list[list[Action]], num_chunks: int) -> dict[Action, int]:
    """The tick each action runs at on a global clock: one action a rank a tick, in the rank's order,
    once everything it consumes finished on an earlier tick. Raises if the orders deadlock."""
    pp = len(orders)
    done: dict[Action, int] = {}
    ptr = [0] * pp
    tick = 0
    while any(ptr[r] < len(orders[r]) for r in range(pp)):
        ran = [(r, orders[r][ptr[r]]) for r in range(pp) if ptr[r] < len(orders[r])
               and all(d in done and done[d] < tick for d in _deps(orders[r][ptr[r]], num_chunks))]
        if not ran:
            raise RuntimeError(f"pipeline schedule deadlocks at tick {tick} (a bug in the schedule orders)")
        for r, a in ran:
            done[a] = tick
            ptr[r] += 1
        tick += 1
    return done


def build_plan(orders: list[list[Action]], num_chunks: int) -> list[list[Step]]:
    """Each rank's steps: its actions in order, and after the tick of every action that produces a
    message for another rank, a boundary where the producer sends it and the consumer receives it.

    Messages: ("act", c, mb) is the input activation of chunk c, ("grad", c, mb) the gradient of chunk
    c's output. A message between chunks on the same rank (pp == 1) needs no communication."""
    pp = len(orders)
    ticks = simulate(orders, num_chunks)
    by_tick: dict[int, list[tuple[int, Action]]] = {}
    for r, order in enumerate(orders):
        for a in order:
            by_tick.setdefault(ticks[a], []).append((r, a))
    plan: list[list[Step]] = [[] for _ in range(pp)]
    for tick in sorted(by_tick):
        boundary = [Step() for _ in range(pp)]
        for r, a in by_tick[tick]:
            plan[r].append(Step(action=a))
            if a.kind == "F" and a.chunk < num_chunks - 1:
                key, dst = ("act", a.chunk + 1, a.mb), (a.chunk + 1) % pp
            elif a.kind == "B" and a.chunk > 0:
                key, dst = ("grad", a.chunk - 1, a.mb), (a.chunk - 1) % pp
            else:
                continue
            if dst != r:
                boundary[r].sends.append((key, dst))
                boundary[dst].recvs.append((key, r))
        for r in range(pp):
            if boundary[r].sends or boundary[r].recvs:
                plan[r].append(boundary[r])
    return plan


# ---------------------------------------------------------------------------------------- executor

class PipelineExecutor:
    """Runs one rank's plan. forward(local_chunk, mb, input) -> output; backward(local_chunk, mb,
    output_grad) -> input_grad (None on chunk 0). Tensors crossing ranks have the shape
    `activation_shape` and dtype `dtype` (hidden states and their gradients alike)."""

    def __init__(self, mesh: ParallelMesh, plan: list[Step], chunk_ids: list[int]):
        self.mesh, self.plan = mesh, plan
        self.local = {c: i for i, c in enumerate(chunk_ids)}

    def run(self, forward, backward, *, activation_shape, dtype, device) -> None:
        inbox: dict[tuple, torch.Tensor] = {}
        outbox: dict[tuple, torch.Tensor] = {}
        # A boundary's sends and receives are posted together (matching batches in the same order on
        # both sides: deadlock-free), but waited for lazily: a received tensor just before the action
        # that consumes it, the sends only at the end (or once complete). Waiting for the whole batch at
        # the boundary, as a first version did, chained the ranks tick by tick: with backward ~2x
        # forward, interleaved 1F1B idled 0.29 of its busy time against Megatron's 0.06 (2 stages, 8
        # micro-batches, 100/200 ms sleeps in benchmarks/pipeline_sim.py; now 0.07), worse than 1F1B.
        self._pending: dict[tuple, tuple[list, str]] = {}  # message key -> (its batch's works, what)
        self._sends: list[tuple[list, str, list]] = []  # (works, what, tensors kept alive until done)
        for step in self.plan:
            a = step.action
            if a is not None:
                c = self.local[a.chunk]
                if a.kind == "F":
                    key = ("act", a.chunk, a.mb)
                    self._await(key)
                    out = forward(c, a.mb, inbox.pop(key, None))
                    if out is not None:
                        self._deliver(("act", a.chunk + 1, a.mb), out, inbox, outbox)
                else:
                    key = ("grad", a.chunk, a.mb)
                    self._await(key)
                    g = backward(c, a.mb, inbox.pop(key, None))
                    if g is not None:
                        self._deliver(("grad", a.chunk - 1, a.mb), g, inbox, outbox)
                self._prune_sends()
                continue
            self._exchange(step, inbox, outbox, activation_shape, dtype, device)
        for works, what, _ in self._sends:
            for w in works:
                self.mesh.pp._guard(what, w.wait)
        self._sends = []
        if inbox or outbox or self._pending:
            raise RuntimeError(f"pipeline ended with undelivered messages "
                               f"{sorted(inbox) + sorted(outbox) + sorted(self._pending)}")

    def _await(self, key) -> None:
        if key in self._pending:
            works, what = self._pending.pop(key)
            for w in works:
                self.mesh.pp._guard(what, w.wait)  # NCCL: the compute stream waits; gloo: the host

    def _prune_sends(self) -> None:
        self._sends = [s for s in self._sends if not all(w.is_completed() for w in s[0])]

    def _deliver(self, key, tensor, inbox, outbox) -> None:
        if key[1] in self.local:  # the next/previous chunk is on this rank (pp == 1 interleaving)
            inbox[key] = tensor
        else:
            outbox[key] = tensor.detach().contiguous()

    def _exchange(self, step: Step, inbox, outbox, shape, dtype, device) -> None:
        pp = self.mesh.pp
        ops, received, sent = [], [], []
        for key, dst in step.sends:
            t = outbox.pop(key)
            sent.append(t)
            ops.append(dist.P2POp(dist.isend, t, self.mesh.stage_global_rank(dst), group=pp.group))
        for key, src in step.recvs:
            buf = torch.empty(shape, dtype=dtype, device=device)
            ops.append(dist.P2POp(dist.irecv, buf, self.mesh.stage_global_rank(src), group=pp.group))
            received.append((key, buf))
        what = "pipeline send/recv " + ", ".join(f"{k[0]}(chunk {k[1]}, mb {k[2]})"
                                                 for k, _ in step.sends + step.recvs)
        works = pp._guard(what, lambda: dist.batch_isend_irecv(ops))
        for key, buf in received:
            inbox[key] = buf
            self._pending[key] = (works, what)
        if sent:
            self._sends.append((works, what, sent))
