"""Data parallelism with ZeRO stages 0-3 (Rajbhandari et al. 2020) over the mesh's dp axis.

Parameters are grouped into units (a transformer block, the embedding, the norm + head). A unit's
parameters are views into one flat buffer of N elements (padded to a multiple of dp); its gradients
into another. Per rank and unit, with s = N / dp and this rank's shard [dp_rank * s, (dp_rank + 1) * s):

    stage  compute params (dtype)       grads (grad dtype)                  fp32 master + Adam m, v
    0      N, persistent                N, all-reduced                      N (every rank steps it all)
    1      N, persistent                N, all-reduced                      s
    2      N, persistent                s from its reduce-scatter to the    s
                                        optimizer step (N during backward)
    3      none (N gathered per use,    as 2                                s
           cast from the master shard)

At the optimizer step that is the ZeRO paper's 16Ψ, 4Ψ+12Ψ/N_d, 2Ψ+14Ψ/N_d, 16Ψ/N_d with 2-byte
params and grads (ZeRO-3's 2-byte parameter shard is the fp32 master's cast, made per gather: as FSDP2
keeps fp32 shards only). Between steps ZeRO-2 and 3 hold no gradients (FSDP's set_to_none): ZeRO-3
holds 12Ψ/N_d, as FSDP2 does, and 4Ψ/N_d of gradient shards appear during the backward while its
activations are being freed.

Reduction overlaps backward: a hook on every parameter counts its unit's accumulated gradients; when a
unit's last one lands on the step's last micro-batch, its all-reduce (0, 1) or reduce-scatter (2, 3)
starts asynchronously while the backward continues into earlier layers (a unit is a bucket). Earlier
micro-batches only accumulate locally: no communication (no_sync). ZeRO-3 gathers a unit just before
its forward (prefetching the next one), frees it after, and gathers it again when its backward starts
(a hook on the unit's output gradient); the autograd graph keeps views of the flat buffer, whose
storage is released and re-allocated underneath them (FSDP's technique).

Gradients that are partial sums over another axis (sequence-parallel norms over tp, replicated kv
heads over kv, the tied embedding's two copies over embed) are summed there after the dp reduction; the
global norm counts every element once: this rank's dp shard of the parameters its tensor-parallel
ShardSpec marks as owned.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from flashscale.parallel.mesh import ParallelMesh
from flashscale.parallel.tensor import ShardSpec


def _free(t: torch.Tensor) -> None:
    if t.untyped_storage().size():
        t.untyped_storage().resize_(0)


def _alloc(t: torch.Tensor, zero: bool = False) -> None:
    if not t.untyped_storage().size():
        t.untyped_storage().resize_(t.numel() * t.element_size())
        if zero:
            t.zero_()


def _intersect(ranges: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    for a, b in ranges:
        a, b = max(a, lo), min(b, hi)
        if a < b:
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
    return out


class Entry:
    __slots__ = ("name", "param", "spec", "offset", "numel", "shape", "decay", "uses")

    def __init__(self, name, param, spec, offset, decay, uses):
        self.name, self.param, self.spec, self.offset, self.decay = name, param, spec, offset, decay
        self.numel, self.shape = param.numel(), tuple(param.shape)
        self.uses = uses  # backward calls that accumulate into it per micro-batch


class FlatUnit:
    """One unit's flat parameter, gradient, master and optimizer-range bookkeeping on this rank."""

    def __init__(self, key: str, named: list[tuple[str, nn.Parameter]], specs: dict[str, ShardSpec],
                 mesh: ParallelMesh, zero: int, dtype: torch.dtype, grad_dtype: torch.dtype,
                 uses: dict[str, int] | None = None):
        self.key, self.zero = key, zero
        seen, uniq = set(), []
        for n, p in named:
            if id(p) not in seen:  # a tied parameter used twice in one unit is stored once
                seen.add(id(p))
                uniq.append((n, p))
        # Matrices and embeddings first (AdamW decays them), then norms and biases: the optimizer's
        # pieces are then two contiguous ranges (train.engine.param_groups' rule: dim >= 2 decays).
        uniq.sort(key=lambda np_: np_[1].dim() < 2)
        self.entries, off = [], 0
        for n, p in uniq:
            self.entries.append(Entry(n, p, specs[n], off, p.dim() >= 2, (uses or {}).get(n, 1)))
            off += p.numel()
        self.numel = off
        dp = mesh.dp_size
        self.padded = -(-off // dp) * dp
        self.shard = self.padded // dp
        self.shard_lo = mesh.dp_rank * self.shard
        self.decay_end = sum(e.numel for e in self.entries if e.decay)
        self.dtype, self.device, self.grad_dtype = dtype, self.entries[0].param.device, grad_dtype
        # The parameters arrive in float32: their exact values become the masters (no rounding to bf16
        # at initialization, as the single-device engine), the compute copy is cast from them.
        full32 = torch.zeros(self.padded, dtype=torch.float32, device=self.device)
        with torch.no_grad():
            for e in self.entries:
                full32[e.offset:e.offset + e.numel].copy_(e.param.detach().reshape(-1))
        self.flat_param = full32 if dtype == torch.float32 else full32.to(dtype)
        for e in self.entries:
            e.param.data = self.flat_param[e.offset:e.offset + e.numel].view(e.shape)
        # The ranges this rank's optimizer updates, and the slices of it counted in the global norm.
        self.opt_lo, self.opt_hi = (0, self.padded) if zero == 0 else (self.shard_lo, self.shard_lo + self.shard)
        # The fp32 master of the optimizer range (a copy even for fp32 compute: one code path).
        self.master = full32[self.opt_lo:self.opt_hi].clone()
        del full32  # (when fp32 it is flat_param itself, which ZeRO-3 frees below)
        owned = [(e.offset, e.offset + e.numel) for e in self.entries if e.spec.owner]
        self.norm_ranges = _intersect(owned, self.shard_lo, self.shard_lo + self.shard)
        self.sync_ranges: dict[str, list[tuple[int, int]]] = {}
        for e in self.entries:
            if e.spec.grad_sync is not None:
                r = _intersect([(e.offset, e.offset + e.numel)], self.opt_lo, self.opt_hi)
                self.sync_ranges.setdefault(e.spec.grad_sync, []).extend(r)
        # Gradients: autograd accumulates straight into views of flat_grad when the dtypes agree;
        # otherwise (bf16 params, fp32 grads) a hook adds each fresh grad in (Megatron's main_grad).
        self.flat_grad = torch.zeros(self.padded, dtype=grad_dtype, device=self.device)
        self.grad_views = [self.flat_grad[e.offset:e.offset + e.numel].view(e.shape) for e in self.entries]
        self.direct = grad_dtype == self.dtype
        if self.direct:
            for e, g in zip(self.entries, self.grad_views):
                e.param.grad = g
        self.grad_shard = None
        if zero >= 2:  # allocated by the reduce-scatter that fills it, freed after the optimizer step
            self.grad_shard = torch.empty(self.shard, dtype=grad_dtype, device=self.device)
            _free(self.grad_shard)
            _free(self.flat_grad)
        if zero == 3:  # the master shard is the only persistent copy; each gather casts from it
            _free(self.flat_param)
        cut = min(max(self.decay_end, self.opt_lo), self.opt_hi)
        self.pieces: list[tuple[int, int, bool, nn.Parameter]] = []  # (lo, hi) in unit coordinates
        for lo, hi, decay in ((self.opt_lo, cut, True), (cut, self.opt_hi, False)):
            if lo < hi:
                self.pieces.append((lo, hi, decay, nn.Parameter(self.master[lo - self.opt_lo:hi - self.opt_lo])))
        # state
        self.gathered = zero < 3
        self.pending_gather = None
        self.in_backward = False
        self.needs_params_in_backward = key != "embed"  # an embedding's backward reads ids, not weights
        self.accumulated = 0
        self.accumulations = sum(e.uses for e in self.entries)  # per micro-batch
        self.passes = 0

    def grad_source(self) -> tuple[torch.Tensor, int]:
        """The reduced gradients this rank's optimizer reads, and the unit coordinate of element 0."""
        return (self.flat_grad, 0) if self.zero < 2 else (self.grad_shard, self.shard_lo)


class ZeroData:
    """Units, hooks, reductions, global norm and the sharded AdamW of one rank (module docstring)."""

    def __init__(self, units: list[FlatUnit], mesh: ParallelMesh, *, zero: int, optim_config,
                 forward_order: list[list[str]], prefetch: bool = True, alias: dict[str, str] | None = None):
        self.units = {u.key: u for u in units}
        self.alias = dict(alias or {})  # hook key -> unit key (the tied embedding lives in the head's unit)
        self.mesh, self.zero, self.prefetch = mesh, zero, prefetch
        # Prefetch order by hook key (a position in the forward: "embed", "layers.<i>", "head"), within
        # a chunk (the next chunk runs after a p2p exchange).
        self.next_key, self.prev_key = {}, {}
        for keys in forward_order:
            for a, b in zip(keys, keys[1:]):
                self.next_key[a], self.prev_key[b] = b, a
        self.expected_passes = 1
        self.in_flight: list[tuple[FlatUnit, object]] = []
        # The hooks hold this object and its units only weakly: a parameter's hook lives in autograd's
        # C++ side, invisible to the garbage collector, so a strong reference back to the units (which
        # hold the parameter) would keep a dropped engine's buffers alive for the life of the process.
        me = weakref.ref(self)

        def on_grad(p, key, i):
            zd = me()
            if zd is not None:
                zd._on_grad(zd.units[key], i, p)

        for u in units:
            for i, e in enumerate(u.entries):
                e.param.register_post_accumulate_grad_hook(lambda p, key=u.key, i=i: on_grad(p, key, i))
        decay = [p for u in units for lo, hi, d, p in u.pieces if d]
        no_decay = [p for u in units for lo, hi, d, p in u.pieces if not d]
        fused = mesh.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": optim_config.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=0.0, betas=tuple(optim_config.betas), eps=optim_config.eps, fused=fused,
            foreach=None if fused else True)

    # ------------------------------------------------------------------------------- forward hooks
    def unit(self, key: str) -> FlatUnit:
        return self.units[self.alias.get(key, key)]

    def pre_forward(self, key: str) -> None:
        if self.zero == 3:
            u = self.unit(key)
            self._acquire(u)
            nxt = self.next_key.get(key)
            if self.prefetch and nxt is not None and not u.in_backward:
                self._prefetch(self.unit(nxt))

    def post_forward(self, key: str, out: torch.Tensor) -> torch.Tensor:
        u = self.unit(key)
        if self.zero >= 2 and torch.is_grad_enabled() and out.requires_grad:
            out.register_hook(lambda g, key=key: self._pre_backward(key))
        if self.zero == 3 and not u.in_backward:
            self._release(u)
        return out

    # ------------------------------------------------------------------------------ ZeRO-3 gathers
    def _gather_source(self, own: torch.Tensor) -> torch.Tensor:
        """The all-gather input for this rank's chunk `own` of the output: NCCL gathers in place, gloo
        needs a separate tensor."""
        return own if self.mesh.dp.size == 1 or self.mesh.backend == "nccl" else own.clone()

    def _prefetch(self, u: FlatUnit) -> None:
        if not u.gathered and u.pending_gather is None:
            _alloc(u.flat_param)
            own = u.flat_param[u.shard_lo:u.shard_lo + u.shard]
            with torch.no_grad():
                own.copy_(u.master)  # the cast to the compute dtype
            u.pending_gather = self.mesh.dp.all_gather_into(u.flat_param, self._gather_source(own), async_op=True,
                                                            what=f"ZeRO-3 prefetch of {u.key}")

    def _acquire(self, u: FlatUnit) -> None:
        if u.gathered:
            return
        if u.pending_gather is None:
            self._prefetch(u)
        u.pending_gather.wait()
        u.pending_gather, u.gathered = None, True

    def _release(self, u: FlatUnit) -> None:
        if u.pending_gather is not None:
            u.pending_gather.wait()
            u.pending_gather = None
        _free(u.flat_param)
        u.gathered = False

    # ------------------------------------------------------------------------------ backward hooks
    def _pre_backward(self, key: str) -> None:
        u = self.unit(key)
        _alloc(u.flat_grad, zero=True)
        if self.zero == 3 and u.needs_params_in_backward:
            self._acquire(u)
            u.in_backward = True
            prev = self.prev_key.get(key)
            if self.prefetch and prev is not None and self.unit(prev).needs_params_in_backward:
                self._prefetch(self.unit(prev))

    def _on_grad(self, u: FlatUnit, i: int, p: nn.Parameter) -> None:
        if not u.direct:
            u.grad_views[i].add_(p.grad)
            p.grad = None
        u.accumulated += 1
        if u.accumulated < u.accumulations:
            return
        u.accumulated = 0
        u.passes += 1
        if u.passes == self.expected_passes:
            self._reduce(u)
        if self.zero == 3:
            u.in_backward = False
            self._release(u)

    def _reduce(self, u: FlatUnit) -> None:
        dp = self.mesh.dp
        if self.zero < 2:
            self.in_flight.append((u, dp.all_reduce(u.flat_grad, async_op=True, what=f"all-reduce of {u.key} grads")))
            return
        _alloc(u.grad_shard)  # every element is written
        work = dp.reduce_scatter_into(u.grad_shard, u.flat_grad, async_op=True,
                                      what=f"reduce-scatter of {u.key} grads")
        self.in_flight.append((u, work))
        while len(self.in_flight) > 2:  # bound the full-size gradient buffers alive at once
            self._complete(*self.in_flight.pop(0))

    def _complete(self, u: FlatUnit, work) -> None:
        work.wait()
        if self.zero >= 2:
            _free(u.flat_grad)

    # ---------------------------------------------------------------------------------------- step
    def begin_step(self, passes: int) -> None:
        self.expected_passes = passes
        for u in self.units.values():
            u.passes = u.accumulated = 0
            if self.zero < 2:
                u.flat_grad.zero_()
            if u.direct:  # someone's zero_grad(set_to_none) must not detach .grad from the flat buffer
                for e, g in zip(u.entries, u.grad_views):
                    if e.param.grad is not g:
                        e.param.grad = g

    def finish_backward(self) -> None:
        """Waits for every reduction, then sums the partial gradients over tp / kv / embed."""
        while self.in_flight:
            self._complete(*self.in_flight.pop(0))
        missing = [u.key for u in self.units.values() if u.passes != self.expected_passes]
        if missing:
            raise RuntimeError(f"units {missing} got gradients in fewer than {self.expected_passes} backward "
                               f"passes this step (a parameter the loss does not depend on?)")
        for axis_name in ("tp", "kv", "embed"):
            axis = self.mesh.axes[axis_name]
            segs = []
            for u in self.units.values():
                src, base = u.grad_source()
                segs += [src[a - base:b - base] for a, b in u.sync_ranges.get(axis_name, [])]
            if axis.size == 1 or not segs:
                continue
            flat = torch.cat(segs)
            axis.all_reduce(flat, what=f"sum of partial gradients over {axis_name}")
            off = 0
            for s in segs:
                s.copy_(flat[off:off + s.numel()])
                off += s.numel()

    def local_grad_sq(self) -> torch.Tensor:
        """Sum of squares of the gradient elements this rank owns (float32 scalar)."""
        total = torch.zeros((), dtype=torch.float32, device=self.mesh.device)
        for u in self.units.values():
            src, base = u.grad_source()
            for a, b in u.norm_ranges:
                total += torch.linalg.vector_norm(src[a - base:b - base], dtype=torch.float32).square()
        return total

    def step(self, lr: float, clip_coef: torch.Tensor | None) -> None:
        for u in self.units.values():
            src, base = u.grad_source()
            for lo, hi, _, p in u.pieces:
                g = src[lo - base:hi - base].to(torch.float32)  # a view when fp32: scaled in place
                if clip_coef is not None:
                    g.mul_(clip_coef)
                p.grad = g
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        for u in self.units.values():
            for *_, p in u.pieces:
                p.grad = None
            if u.grad_shard is not None:
                _free(u.grad_shard)
        self.masters_to_params()

    def masters_to_params(self) -> None:
        """Rounds the fp32 masters into the compute parameters (all-gathering the shards for 1, 2)."""
        pending = []
        dp = self.mesh.dp
        with torch.no_grad():
            for u in self.units.values():
                if self.zero == 3:
                    self._release(u)  # a gathered or prefetched copy holds the old values; the next
                    continue  # gather casts the updated master
                own = u.flat_param[u.opt_lo:u.opt_hi]
                own.copy_(u.master)  # the cast happens in the copy
                if self.zero > 0:
                    pending.append(dp.all_gather_into(u.flat_param, self._gather_source(own),
                                                      async_op=True, what=f"all-gather of {u.key} params"))
        for w in pending:
            w.wait()

    # -------------------------------------------------------------------------------------- memory
    def memory_bytes(self) -> dict[str, int]:
        """Bytes held now (between steps) by parameters, gradients and optimizer (fp32 masters and
        AdamW's two moments; AdamW's per-tensor step counters, a few bytes, are left out)."""
        def nbytes(t):
            return t.untyped_storage().nbytes() if t is not None else 0

        params = grads = optim = 0
        for u in self.units.values():
            params += nbytes(u.flat_param)
            grads += nbytes(u.flat_grad) + nbytes(u.grad_shard)
            optim += nbytes(u.master)
            for *_, p in u.pieces:
                st = self.optimizer.state.get(p, {})
                optim += sum(nbytes(st[k]) for k in ("exp_avg", "exp_avg_sq") if k in st)
        return {"params": params, "grads": grads, "optimizer": optim}
