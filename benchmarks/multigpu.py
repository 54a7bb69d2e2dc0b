"""Multi-GPU validation of flashscale.parallel with NCCL: parity, scaling, memory, pipeline bubble.

    torchrun --standalone --nproc-per-node 1 benchmarks/multigpu.py --tmp /tmp/mg      # 1-GPU rows
    torchrun --standalone --nproc-per-node 2 benchmarks/multigpu.py --tmp /tmp/mg      # 2-GPU rows
    python benchmarks/multigpu.py --merge /tmp/mg --kind nvidia-h200-x2                 # JSON + plot
    torchrun --standalone --nproc-per-node 2 benchmarks/multigpu.py --smoke --tmp /tmp/s  # CPU, gloo

Each launch (world size W) runs the parts below and rank 0 writes TMP/part-W.json; --merge collects
them into benchmarks/results/multigpu-<kind>.json (+ .png), flat rows with an `impl` field.

1. parity  (W > 1) A 4-layer 125M-shaped Llama, 50 bf16 steps on a fixed synthetic token stream (a
   random bigram chain, so the loss falls) under every (pp, dp, tp) factorization of W and the variants
   of each axis (ZeRO 0-3; sequence parallelism; GPipe, 1F1B, interleaved), against the same run on one
   GPU (every rank runs the single-GPU reference on its own GPU), AdamW at lr 3e-4. bf16 tolerance from
   the noise floor: the single-GPU run with 2 micro-batches instead of 1 (same math, other summation
   order) differs from it by `floor` (largest per-step relative loss difference); a layout passes at
   <= min(max(4 floor, 1e-2), 5e-2). Then 5 float32 steps (TF32 off) of every layout: <= 1e-5.
2. scaling (all W) The 1B preset, seq 2048, 8 sequences per GPU (weak scaling: global batch 8 W), each
   layout of W GPUs (dp with ZeRO 0-3, tp with sequence parallelism, pp 1F1B) and torch's FSDP2
   (fully_shard per block and root, bf16 params, fp32 reductions, fused AdamW, the same clipping and
   micro-batches): 3 warm-up steps, median of 3 rounds of 5 steps; tokens/s/GPU, MFU (PaLM FLOPs, bf16
   dense peak), peak memory (max allocated).
3. memory  The dp rows of 2. also record the model-state bytes held between steps (memory allocated
   after a step) against the ZeRO formula for Psi parameters over N_d = dp ranks (zero_formula: bf16
   parameters 2 Psi, none at ZeRO-3; fp32 gradients 4 Psi, none at ZeRO >= 2; fp32 masters + AdamW
   moments 12 Psi, ZeRO >= 1: / N_d). predicted_peak = formula states + the activation bytes measured
   at ZeRO-0 on the same per-GPU batch (peak - states there: ZeRO does not change activations) + the
   gradient shards of ZeRO >= 2 (see predict_memory).
4. bubble  (W > 1) pp = W, the 1B preset with a 32k vocabulary (16 layers, split evenly: the head
   costs ~1/4 layer), micro-batches of 4 x 2048 (at 1 x 2048 the host's kernel launches set the
   pace), m in {4, 8, 16}, GPipe / 1F1B / interleaved (v = 2). The pipeline
   section of a step is timed on the host between two barriers (total); every forward and backward
   action on the GPU with CUDA events (busy), on the busiest rank (the formulas assume equal stages;
   the lighter ranks' extra idle is the stage imbalance, reported apart). GPipe and 1F1B: bubble =
   idle / total against (p-1)/(m+p-1); interleaved: idle / busy against Megatron's (p-1)/(v m).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from flashscale.models.config import LlamaConfig, preset  # noqa: E402
from flashscale.models.llama import Llama  # noqa: E402
from flashscale.parallel import engine as pengine  # noqa: E402
from flashscale.parallel.config import ParallelConfig  # noqa: E402
from flashscale.parallel.engine import ParallelEngine  # noqa: E402
from flashscale.parallel.mesh import ParallelMesh  # noqa: E402
from flashscale.train.engine import OptimConfig  # noqa: E402
from flashscale.train.metrics import mfu, peak_flops  # noqa: E402

GB = 1e9
# the fields of a results row the issue names (flat records, one table over every part)
ROW_FIELDS = ("impl", "model", "gpus", "layout", "tokens_per_s_per_gpu", "mfu", "peak_mem_gb", "predicted_peak_gb",
              "max_loss_rel_diff", "bubble_measured", "bubble_formula")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tmp", type=Path, default=Path("/tmp/flashscale-multigpu"), help="folder for part files")
    p.add_argument("--parts", nargs="+", default=["parity", "scaling", "bubble"],
                   choices=["parity", "scaling", "scaling8b", "bubble", "profile"], help="what to run (memory rides on scaling; profile: where a pipeline step's time goes, printed)")
    p.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                   help="parity and scaling: only the layouts whose name contains one of these (e.g. zero3 fsdp2)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes (CPU with gloo, or a quick GPU check)")
    p.add_argument("--merge", type=Path, help="collect the part files of this folder into the results JSON")
    p.add_argument("--kind", default=None, help="with --merge: the machine kind, names the results file")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="with --merge: output folder")
    p.add_argument("--note", default=None, help="with --merge: a note stored in the results (how the runs were made)")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------ helpers
class Ctx:
    def __init__(self, smoke: bool, only: list[str] | None = None):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", self.local) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.smoke = smoke
        self.only = only  # layout-name filters (--only)
        if self.world > 1 and not dist.is_initialized():
            kw = {"device_id": self.device} if self.cuda else {}
            dist.init_process_group("nccl" if self.cuda else "gloo", timeout=dt.timedelta(seconds=900), **kw)

    def wants(self, layout: str) -> bool:
        """Whether --only lets this layout run."""
        return not self.only or any(o in layout for o in self.only)

    def log(self, *a):
        if self.rank == 0:
            print(*a, flush=True)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def barrier(self):
        if self.world > 1:
            dist.barrier()

    def free(self, eng=None):
        mesh = getattr(eng, "mesh", None)
        if mesh is not None:
            mesh.destroy()  # this layout's subgroups (NCCL communicators hold GPU memory)
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)


def factorizations(w: int) -> list[tuple[int, int, int]]:
    """Every (pp, dp, tp) with pp * dp * tp = w."""
    return [(p, d, w // (p * d)) for p in range(1, w + 1) if w % p == 0
            for d in range(1, w // p + 1) if (w // p) % d == 0]


def layout_name(pc: ParallelConfig, pp: int, dp: int, tp: int) -> str:
    s = f"dp{dp}-tp{tp}-pp{pp}-zero{pc.zero}"
    if pp > 1:
        s += f"-{pc.schedule}" + (f"v{pc.virtual_stages}" if pc.virtual_stages > 1 else "")
    if pc.sequence_parallel and tp > 1:
        s += "-sp"
    return s


def layouts(w: int, num_layers: int) -> list[tuple[ParallelConfig, tuple[int, int, int]]]:
    """The layouts of w ranks to compare: every factorization at the defaults, plus each axis' variants."""
    out = []
    for pp, dp, tp in factorizations(w):
        base = dict(pp=pp, tp=tp, dp=dp)
        zeros = [0, 1, 2, 3] if dp > 1 else [1]
        for z in zeros:
            out.append(ParallelConfig(zero=z, **base))
        if tp > 1:
            out.append(ParallelConfig(zero=1, sequence_parallel=True, **base))
        if pp > 1:
            out.append(ParallelConfig(zero=1, schedule="gpipe", **base))
            if 2 * pp <= num_layers:
                out.append(ParallelConfig(zero=1, schedule="interleaved", virtual_stages=2, **base))
    return [(pc, (pc.pp, pc.dp, pc.tp)) for pc in out]


def bigram_stream(vocab: int, n_batches: int, batch: int, seq: int, seed: int = 0):
    """(x, y) batches from a fixed random bigram chain (next = table[prev] 85% of the time, else
    uniform): learnable, so the loss falls over 50 steps and the runs compare on a moving target."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, vocab, (vocab,), generator=g)
    out = []
    for _ in range(n_batches):
        t = torch.empty(batch, seq + 1, dtype=torch.long)
        t[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for i in range(1, seq + 1):
            keep = torch.rand(batch, generator=g) < 0.85
            t[:, i] = torch.where(keep, table[t[:, i - 1]], torch.randint(0, vocab, (batch,), generator=g))
        out.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))
    return out


def dp_slice(x: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor:
    n = x.shape[0] // dp
    return x[dp_rank * n:(dp_rank + 1) * n]


def fresh(cfg: LlamaConfig, weights: dict | None) -> Llama:
    """The model with `weights`, or (None) initialized from seed 0: the same weights in every build."""
    if weights is None:  # built and drawn on this rank's GPU: the same seed gives every rank the same weights
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            return Llama(cfg).init_weights(0)
    m = Llama(cfg)
    m.load_state_dict(weights)
    return m


def build(ctx: Ctx, cfg, weights, pc: ParallelConfig | None, dtype: str) -> ParallelEngine:
    """pc None: the single-GPU engine (world size 1 mesh, no process group) on this rank's GPU."""
    if pc is None:
        pc1 = ParallelConfig(zero=1)
        mesh = ParallelMesh(pc1, cfg, device=ctx.device)
        return ParallelEngine(cfg, pc1, OptimConfig(), model=fresh(cfg, weights), mesh=mesh, dtype=dtype)
    mesh = ParallelMesh(pc, cfg, rank=ctx.rank, world_size=ctx.world, device=ctx.device)
    return ParallelEngine(cfg, pc, OptimConfig(), model=fresh(cfg, weights), mesh=mesh, dtype=dtype)


def train(ctx, eng, data, m, lr=3e-4, dp=(0, 1)) -> list[float]:
    losses = []
    for x, y in data:
        out = eng.train_step(dp_slice(x, *dp), dp_slice(y, *dp), lr=lr, micro_batches=m, max_grad_norm=1.0)
        losses.append(float(out["loss"]))
    return losses


def rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


# ------------------------------------------------------------------------------------------- parity
def part_parity(ctx: Ctx) -> list[dict]:
    if ctx.world == 1:
        return []
    # 8 heads and 8 layers: every factorization of up to 8 GPUs is a valid layout
    cfg = (preset("125M", num_hidden_layers=8, vocab_size=4096, hidden_size=512, intermediate_size=1536,
                  num_attention_heads=8, num_key_value_heads=8) if not ctx.smoke else preset("tiny", num_hidden_layers=4))
    seq, batch, steps = (256, 16, 50) if not ctx.smoke else (32, 8, 6)
    weights = Llama(cfg).init_weights(0).state_dict()
    data = bigram_stream(cfg.vocab_size, steps, batch, seq)
    dtype = "bfloat16" if ctx.cuda else "float32"
    rows = []
    single = train(ctx, build(ctx, cfg, weights, None, dtype), data, 1)
    ctx.free()
    single2 = train(ctx, build(ctx, cfg, weights, None, dtype), data, 2)
    ctx.free()
    floor = rel(single2, single)
    tol = min(max(4 * floor, 1e-2), 5e-2) if dtype == "bfloat16" else 1e-5
    ctx.log(f"parity: single-GPU {dtype} loss {single[0]:.4f} -> {single[-1]:.4f} over {steps} steps; "
            f"noise floor (2 vs 1 micro-batches) {floor:.2e}; tolerance {tol:.2e}")
    rows.append(dict(impl="single", part="parity", model="parity-8L-512", gpus=1, layout="single", dtype=dtype,
                     steps=steps, loss_first=single[0], loss_last=single[-1], noise_floor=floor))
    # float32 reference (TF32 off) for the 5-step check
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    single32 = train(ctx, build(ctx, cfg, weights, None, "float32"), data[:5], 1)
    ctx.free()
    for pc, (pp, dp, tp) in layouts(ctx.world, cfg.num_hidden_layers):
        name = layout_name(pc, pp, dp, tp)
        if not ctx.wants(name):
            continue
        m = 2 * pp if pp > 1 else 1
        dpr = (int(ctx.rank // tp) % dp, dp)
        eng = build(ctx, cfg, weights, pc, dtype)
        losses = train(ctx, eng, data, m, dp=dpr)
        ctx.free(eng)
        eng = build(ctx, cfg, weights, pc, "float32")
        l32 = train(ctx, eng, data[:5], m, dp=dpr)
        ctx.free(eng)
        del eng
        d, d32 = rel(losses, single), rel(l32, single32)
        d10 = abs(sum(losses[-10:]) - sum(single[-10:])) / abs(sum(single[-10:]))
        ok = d <= tol and d32 <= 1e-5
        ctx.log(f"  {name:34s} {dtype} max rel diff {d:.2e} (last-10 mean {d10:.1e})  float32 {d32:.2e}  "
                f"{'ok' if ok else 'FAIL'}")
        rows.append(dict(impl="flashscale", part="parity", model="parity-8L-512", gpus=ctx.world, layout=name,
                         dtype=dtype, steps=steps, loss_first=losses[0], loss_last=losses[-1],
                         max_loss_rel_diff=d, last10_loss_rel_diff=d10, tolerance=tol, max_loss_rel_diff_fp32=d32, fp32_steps=5,
                         tolerance_fp32=1e-5, passed=ok))
    torch.backends.cuda.matmul.allow_tf32 = True
    return rows


# ------------------------------------------------------------------------------------ scaling, memory
def zero_formula(psi: int, zero: int, nd: int, grad_bytes: int = 4, lazy: bool = True) -> float:
    """Model-state bytes a rank holds between steps (parallel.data's table): bf16 compute parameters
    2 Psi (ZeRO-3: none, each gather casts the master shard), fp32 gradients 4 Psi (ZeRO >= 2: none,
    the shards live from the reduce-scatter to the optimizer step), fp32 masters + AdamW moments 12 Psi
    (ZeRO >= 1: / N_d). lazy=False: the layout before 2026-11-29 (the paper's accounting: ZeRO-3 kept a
    2 Psi / N_d compute shard, ZeRO >= 2 its 4 Psi / N_d gradient shard), for rows measured then."""
    if lazy:
        p = 2 * psi if zero < 3 else 0.0
        g = grad_bytes * psi if zero < 2 else 0.0
    else:
        p = 2 * psi / (nd if zero >= 3 else 1)
        g = grad_bytes * psi / (nd if zero >= 2 else 1)
    o = 12 * psi / (nd if zero >= 1 else 1)
    return p + g + o


def predict_memory(rows: list[dict]) -> None:
    """Fills predicted_state_gb (the ZeRO formula) and predicted_peak_gb of the data-parallel scaling
    rows: formula states + the activations measured at ZeRO-0 (its peak minus its states, same per-GPU
    batch) + for ZeRO >= 2 the gradient shards (4 Psi / N_d, allocated during the backward) + with
    several micro-batches the full fp32 gradient (4 Psi): earlier micro-batches accumulate locally and
    the reduce-scatter runs on the last (no_sync, as FSDP's), so every unit's full gradient is alive in
    that backward before its shard is kept. Rows without formula="v2" were measured with the layout
    before 2026-11-29 and are predicted with it."""
    act = {(r["model"], r["gpus"]): (r["peak_mem_gb"] - r["state_mem_gb"]) for r in rows
           if r.get("part") == "scaling" and r.get("zero") == 0 and r.get("params")}
    for r in rows:
        if r.get("part") != "scaling" or not r.get("params"):
            continue
        psi, z, nd, lazy = r["params"], r["zero"], r["dp"], r.get("formula") == "v2"
        r["predicted_state_gb"] = zero_formula(psi, z, nd, lazy=lazy) / GB
        # weak scaling: the same per-GPU batch at every W; a model without a ZeRO-0 row (8B: its states
        # do not fit) gets the formula's states only
        a = act.get((r["model"], r["gpus"]),
                    next((v for (mo, _), v in act.items() if mo == r["model"]), None))
        if a is not None:
            accum = 4 * psi / GB if z >= 2 and r["micro_batches"] > 1 else 0.0
            shards = 4 * psi / nd / GB if z >= 2 and lazy else 0.0
            r["predicted_peak_gb"] = r["predicted_state_gb"] + a + accum + shards


def fsdp2_engine(ctx, cfg, weights):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = fresh(cfg, weights).to(ctx.device)
    mesh = init_device_mesh(ctx.device.type, (ctx.world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if ctx.cuda else None, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    oc = OptimConfig()
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=oc.betas, eps=oc.eps,
                                weight_decay=oc.weight_decay, fused=ctx.cuda)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=oc.betas, eps=oc.eps, weight_decay=oc.weight_decay)

    class Step:
        def train_step(self, x, y, *, lr, micro_batches, max_grad_norm):
            for g in opt.param_groups:
                g["lr"] = lr
            total = 0.0
            xs, ys = x.to(ctx.device).chunk(micro_batches), y.to(ctx.device).chunk(micro_batches)
            for i, (xm, ym) in enumerate(zip(xs, ys)):
                model.set_requires_gradient_sync(i == micro_batches - 1)
                with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=ctx.cuda):
                    logits = model(xm)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), ym.reshape(-1)) / micro_batches
                loss.backward()
                total = total + loss.detach()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return {"loss": total}

    return Step()


def timed(ctx, eng, data, m, dpr, steps=5, rounds=3, warm=3) -> tuple[float, float]:
    for i in range(warm):
        x, y = data[i % len(data)]
        eng.train_step(dp_slice(x, *dpr), dp_slice(y, *dpr), lr=1e-4, micro_batches=m, max_grad_norm=1.0)
    times = []
    for _ in range(rounds):
        ctx.sync()
        ctx.barrier()
        t0 = time.perf_counter()
        for i in range(steps):
            x, y = data[i % len(data)]
            eng.train_step(dp_slice(x, *dpr), dp_slice(y, *dpr), lr=1e-4, micro_batches=m, max_grad_norm=1.0)
        ctx.sync()
        ctx.barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), steps


def max_over_ranks(ctx, v: float) -> float:
    if ctx.world == 1:
        return v
    t = torch.tensor([v], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def scaling_configs(name: str, W: int) -> list[tuple[str, ParallelConfig | None, tuple[int, int, int]]]:
    """What part_scaling compares at W GPUs. 1B: one GPU alone, then dp with ZeRO 0-3, tp with sequence
    parallelism, pp 1F1B. 8B (llama3-8B, 18 bytes of model state a parameter = 145 GB: not on one
    H200): ZeRO-3 and tp with sequence parallelism, from 2 GPUs. Both beside FSDP2."""
    out: list[tuple[str, ParallelConfig | None, tuple[int, int, int]]] = []
    if name == "llama3-8B":
        if W > 1:
            out += [("flashscale", ParallelConfig(zero=3), (1, W, 1)),
                    ("flashscale", ParallelConfig(tp=W, zero=1, sequence_parallel=True), (1, 1, W)),
                    ("fsdp2", None, (1, W, 1))]
        return out
    if W == 1:  # the baseline of weak scaling (ZeRO stages at dp = 1 differ only in copies)
        out.append(("single", None, (1, 1, 1)))
    for z in ((0, 1, 2, 3) if W > 1 else ()):
        out.append(("flashscale", ParallelConfig(zero=z), (1, W, 1)))
    if W > 1:
        out.append(("flashscale", ParallelConfig(tp=W, zero=1, sequence_parallel=True), (1, 1, W)))
        out.append(("flashscale", ParallelConfig(pp=W, zero=1), (W, 1, 1)))
    out.append(("fsdp2", None, (1, W, 1)))
    return out


def part_scaling(ctx: Ctx, name: str = "1B") -> list[dict]:
    W = ctx.world
    big = name == "llama3-8B"
    configs = scaling_configs(name, W)
    cfg = preset(name) if not ctx.smoke else preset("tiny", num_hidden_layers=4)
    if ctx.smoke:
        name = "tiny-as-8B" if big else "tiny"
    # sequences per GPU, and per micro-batch (dp/tp; pp uses 2 for 8 micro-batches). 8B: 2 x 2048 in one
    # micro-batch per GPU (~13 GB of activations a sequence; ZeRO-3 at 2 GPUs holds 72 GB of states)
    seq, per_gpu, mbs = (2048, 2, 2) if big else (2048, 8, 4)
    if ctx.smoke:
        seq, per_gpu, mbs = 32, 4, 2
    if not configs:
        ctx.log(f"scaling {name}: nothing at {W} GPU (model states do not fit one GPU)")
        return []
    # the 8B model is built per layout from the seed (a shared fp32 state dict would hold 32 GB more
    # host memory per rank); the same seed gives every layout the same weights
    weights = None if big else Llama(cfg).init_weights(0).state_dict()
    g = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, cfg.vocab_size, (per_gpu * W, seq), generator=g),
             torch.randint(0, cfg.vocab_size, (per_gpu * W, seq), generator=g)) for _ in range(2)]
    dtype = "bfloat16" if ctx.cuda else "float32"
    peak = peak_flops(ctx.device)
    fpt = cfg.flops_per_token(seq)
    rows = []
    for impl, pc, (pp, dp, tp) in configs:
        layout = f"fsdp2-dp{W}" if impl == "fsdp2" else "single" if pc is None else layout_name(pc, pp, dp, tp)
        if not ctx.wants(layout):
            continue
        ctx.free()
        t_build = time.perf_counter()
        eng = fsdp2_engine(ctx, cfg, weights) if impl == "fsdp2" else build(ctx, cfg, weights, pc, dtype)
        t_build = time.perf_counter() - t_build
        m = 1 if big else (per_gpu * W // dp) // (2 if pp > 1 else mbs)
        dpr = ((ctx.rank // tp) % dp, dp)
        sec, steps = timed(ctx, eng, data, m, dpr)
        tps = per_gpu * W * seq * steps / sec / W
        ctx.sync()
        peak_mem = max_over_ranks(ctx, torch.cuda.max_memory_allocated(ctx.device) if ctx.cuda else 0)
        gc.collect()
        state = max_over_ranks(ctx, torch.cuda.memory_allocated(ctx.device) if ctx.cuda else 0)
        row = dict(impl=impl, part="scaling", model=name, gpus=W, layout=layout, seq_len=seq,
                   global_batch=per_gpu * W, micro_batches=m, tokens_per_s_per_gpu=tps,
                   mfu=mfu(fpt, tps, peak), peak_mem_gb=peak_mem / GB, state_mem_gb=state / GB,
                   predicted_state_gb=None, predicted_peak_gb=None, max_loss_rel_diff=None,
                   bubble_measured=None, bubble_formula=None)
        if impl != "fsdp2" and pp == 1 and tp == 1:
            row.update(zero=pc.zero if pc is not None else 1, dp=dp, params=cfg.num_params(), formula="v2")
        rows.append(row)
        predict_memory(rows)
        mf = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
        pred = "" if row["predicted_state_gb"] is None else f" (formula {row['predicted_state_gb']:.2f})"
        ctx.log(f"scaling {name} {W} GPU {layout:28s} {tps:10,.0f} tok/s/GPU  MFU {mf:>6s}  peak "
                f"{peak_mem / GB:6.2f} GB  states {state / GB:6.2f} GB{pred}  (built in {t_build:.0f} s)")
        ctx.free(eng)
        del eng
    return rows


# ------------------------------------------------------------------------------------------- bubble
def bubble_stats(per: list[tuple[float, float]], sched: str, p: int, v: int, m: int):
    """per: each pipeline rank's (total, busy) seconds. The formulas assume stages of equal cost; ours
    differ a little (the last also runs the head and the loss), and the lighter ranks then idle for
    that imbalance on top of the schedule's bubble. The bubble is the bottleneck (busiest) rank's idle
    time; the imbalance, 1 - min busy / max busy, is reported beside it."""
    total, busy = max(per, key=lambda tb: tb[1])
    imbalance = 1 - min(b for _, b in per) / busy
    if sched == "interleaved":
        return (total - busy) / busy, (p - 1) / (v * m), "idle/busy of the busiest rank", imbalance
    return (total - busy) / total, (p - 1) / (m + p - 1), "idle/total of the busiest rank", imbalance


class TimedExecutor(pengine.PipelineExecutor):
    """The engine's executor with the forward/backward actions timed by CUDA events and the whole
    pipeline section timed on the host between barriers."""
    record: list = []

    def run(self, forward, backward, **kw):
        events = []

        def wrap(fn):
            def inner(*a):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                out = fn(*a)
                e.record()
                events.append((s, e))
                return out
            return inner

        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        super().run(wrap(forward), wrap(backward), **kw)
        torch.cuda.synchronize()
        dist.barrier()
        total = time.perf_counter() - t0
        busy = sum(s.elapsed_time(e) for s, e in events) / 1e3
        TimedExecutor.record.append((total, busy))


def part_bubble(ctx: Ctx) -> list[dict]:
    W = ctx.world
    if W == 1 or not ctx.cuda:
        return []
    L = 16 if not ctx.smoke else 4
    cfg = preset("1B", vocab_size=32000) if not ctx.smoke else preset("tiny", num_hidden_layers=L)
    seq = 2048 if not ctx.smoke else 64
    # 4 sequences a micro-batch: at 1 x 2048 a stage's ~8000 kernels a step average ~20 us each, as
    # short as their launch from Python, so the host, not the schedule, set the idle time (profiled)
    mb_size = 4 if not ctx.smoke else 1
    weights = Llama(cfg).init_weights(0).state_dict()
    pengine.PipelineExecutor = TimedExecutor
    rows = []
    try:
        for sched, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
            chunks = W * v
            # even split: the head and loss (a 32k x 2048 matmul) cost ~1/4 of a layer (measured: GPipe
            # m = 16 on 2 GPUs, 15 layers split 8/7+head: 46.5 ms a layer, 12 ms the head)
            split = [L // chunks] * chunks
            pc = ParallelConfig(pp=W, zero=1, schedule=sched, virtual_stages=v, stage_layers=split)
            eng = build(ctx, cfg, weights, pc, "bfloat16")
            for m in (4, 8, 16):
                if sched == "interleaved" and m % W:
                    continue
                g = torch.Generator().manual_seed(m)
                x = torch.randint(0, cfg.vocab_size, (m * mb_size, seq), generator=g)
                y = torch.randint(0, cfg.vocab_size, (m * mb_size, seq), generator=g)
                TimedExecutor.record.clear()
                for _ in range(5):
                    eng.train_step(x, y, lr=1e-4, micro_batches=m, max_grad_norm=1.0)
                rec = TimedExecutor.record[2:]  # 2 warm-up steps
                total = statistics.median(r[0] for r in rec)
                busy = statistics.median(r[1] for r in rec)
                bt = torch.tensor([total, busy], dtype=torch.float64, device=ctx.device)
                allv = [torch.zeros_like(bt) for _ in range(W)]
                dist.all_gather(allv, bt)
                per = [(float(a[0]), float(a[1])) for a in allv]
                meas, formula, definition, imbalance = bubble_stats(per, sched, W, v, m)
                layout = layout_name(pc, W, 1, 1)
                rows.append(dict(impl="flashscale", part="bubble", model="1B-32kvocab", gpus=W, layout=layout,
                                 schedule=sched, virtual_stages=v, micro_batches=m, micro_batch_size=mb_size,
                                 seq_len=seq, stage_layers=split,
                                 bubble_measured=meas, bubble_formula=formula, bubble_definition=definition,
                                 stage_imbalance=imbalance,
                                 per_rank_busy_s=[b for _, b in per], per_rank_total_s=[t for t, _ in per]))
                ctx.log(f"bubble {layout:28s} m={m:2d}  measured {meas:.3f}  formula {formula:.3f}  ({definition}; "
                        f"busy per rank {', '.join(f'{b * 1e3:.0f}' for _, b in per)} ms of {per[0][0] * 1e3:.0f})")
            ctx.free(eng)
            del eng
    finally:
        pengine.PipelineExecutor = TimedExecutor.__mro__[1]
    return rows


def part_profile(ctx: Ctx) -> list[dict]:
    """pp = W, GPipe against 1F1B at m = 8 (the bubble part's model): each rank's CUDA kernel time by
    kind (NCCL vs compute) and the busiest kernels, from torch.profiler over 2 steps. Prints only."""
    if ctx.world == 1 or not ctx.cuda:
        return []
    from torch.profiler import ProfilerActivity, profile

    W, L, seq, m = ctx.world, 16, 2048, 8
    cfg = preset("1B", vocab_size=32000)
    weights = Llama(cfg).init_weights(0).state_dict()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (m, seq), generator=g)
    y = torch.randint(0, cfg.vocab_size, (m, seq), generator=g)
    for sched in ("gpipe", "1f1b"):
        split = [L // W + (1 if i < L % W else 0) for i in range(W)]
        pc = ParallelConfig(pp=W, zero=1, schedule=sched, stage_layers=split)
        eng = build(ctx, cfg, weights, pc, "bfloat16")
        for _ in range(3):
            eng.train_step(x, y, lr=1e-4, micro_batches=m, max_grad_norm=1.0)
        ctx.sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                eng.train_step(x, y, lr=1e-4, micro_batches=m, max_grad_norm=1.0)
            ctx.sync()
        kern = {}
        for e in prof.key_averages():
            t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if t:
                kern[e.key] = kern.get(e.key, 0) + t
        nccl = sum(t for k, t in kern.items() if "nccl" in k.lower())
        comp = sum(t for k, t in kern.items() if "nccl" not in k.lower())
        top = sorted(kern.items(), key=lambda kv: -kv[1])[:12]
        lines = [f"profile {sched} m={m} rank {ctx.rank}: kernel time per step compute {comp / 2e3:.1f} ms, "
                 f"nccl {nccl / 2e3:.1f} ms"] + [f"    {t / 2e3:8.2f} ms  {k[:100]}" for k, t in top]
        out = [None] * W
        dist.all_gather_object(out, "\n".join(lines))
        ctx.log("\n".join(out))
        if ctx.rank == 0:
            import gzip
            import shutil

            trace = Path(os.environ.get("OUT", "/tmp")) / f"trace-{sched}-rank0.json"
            prof.export_chrome_trace(str(trace))
            with open(trace, "rb") as f, gzip.open(f"{trace}.gz", "wb") as gz:
                shutil.copyfileobj(f, gz)
            trace.unlink()
        ctx.free(eng)
        del eng
    return []


PARTS = {"parity": part_parity, "scaling": part_scaling, "scaling8b": lambda ctx: part_scaling(ctx, "llama3-8B"),
         "bubble": part_bubble, "profile": part_profile}


# -------------------------------------------------------------------------------------------- merge
def merge(args) -> int:
    import platform

    rows, meta = [], {}
    for f in sorted(args.merge.glob("part-*.json")):
        d = json.loads(f.read_text())
        rows += d["rows"]
        meta = d
    predict_memory(rows)  # again over all files: a 1-GPU row takes the activations measured at ZeRO-0 on N
    if not rows:
        raise SystemExit(f"no part-*.json files in {args.merge}")
    for r in rows:  # every row carries the fields (None where a part does not measure one): one flat table
        for key in ROW_FIELDS:
            r.setdefault(key, None)
    kind = args.kind or meta.get("kind", "unknown")
    result = {"benchmark": "multigpu", "kind": kind, "gpu": meta.get("gpu"), "torch": meta.get("torch"),
              "triton": meta.get("triton"), "date": meta.get("date"),
              "python": platform.python_version(), "nccl": meta.get("nccl"), "rows": rows}
    if args.note:
        result["note"] = args.note
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"multigpu-{kind}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    try:
        plot(rows, path.with_suffix(".png"), kind)
    except ImportError:
        pass
    print(f"wrote {path} ({len(rows)} rows)")
    return 0


def plot(rows, path, kind):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    sc = [r for r in rows if r["part"] == "scaling"]
    labels = [f"{r['gpus']}G {r['model']} {r['layout']}" for r in sc]
    a1.barh(range(len(sc)), [r["tokens_per_s_per_gpu"] for r in sc],
            color=["#888" if r["impl"] == "single" else "#d62" if r["impl"] == "fsdp2" else "#3a7" for r in sc])
    a1.set_yticks(range(len(sc)), labels, fontsize=7)
    a1.set_xlabel("tokens/s per GPU (seq 2048; 1B: 8 seqs/GPU, 8B: 2)")
    a1.invert_yaxis()
    bu = [r for r in rows if r["part"] == "bubble"]
    for sched, mk in (("gpipe", "o"), ("1f1b", "s"), ("interleaved", "^")):
        pts = [r for r in bu if r["schedule"] == sched]
        if pts:
            a2.plot([r["micro_batches"] for r in pts], [r["bubble_measured"] for r in pts], mk + "-", label=f"{sched} measured")
            a2.plot([r["micro_batches"] for r in pts], [r["bubble_formula"] for r in pts], mk + "--", alpha=0.5,
                    label=f"{sched} formula")
    a2.set_xlabel("micro-batches m")
    a2.set_ylabel("bubble fraction")
    a2.legend(fontsize=7)
    fig.suptitle(f"flashscale multi-GPU ({kind})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_part(args, ctx, rows) -> None:
    import triton

    args.tmp.mkdir(parents=True, exist_ok=True)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if ctx.cuda else None
    d = {"gpu": torch.cuda.get_device_name(ctx.device) if ctx.cuda else "cpu", "torch": torch.__version__,
         "triton": triton.__version__, "parts": args.parts, "date": dt.datetime.now(dt.timezone.utc).isoformat(),
         "world": ctx.world, "nccl": nccl, "rows": rows}
    path = args.tmp / f"part-{ctx.world}-{'-'.join(args.parts)}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(d, indent=1))
    tmp.replace(path)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        return merge(args)
    ctx = Ctx(args.smoke, args.only)
    rows = []
    t0 = time.time()
    for part in args.parts:
        try:
            rows += PARTS[part](ctx)
        except Exception:  # noqa: BLE001 -- a part failing on every rank: log it, keep the other parts
            import traceback

            print(f"rank {ctx.rank}: part {part} failed:\n{traceback.format_exc()}", flush=True)
            ctx.free()
        ctx.log(f"[{part} done at {time.time() - t0:.0f} s]")
        if ctx.rank == 0:  # after every part: a run cut short keeps what it measured
            write_part(args, ctx, rows)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
