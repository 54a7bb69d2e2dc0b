"""What the parallel wrapper costs at world size 1: tokens/s of ParallelEngine against the trainer's
SingleDeviceEngine on the same model, batch and precision (bf16 weights, fp32 masters and gradients,
fused AdamW), one GPU, no process group (every collective returns early at axis size 1).

    python benchmarks/parallel_overhead.py                 # H200: 125M and 1B presets
    python benchmarks/parallel_overhead.py --smoke         # CPU: the whole path on a tiny model, seconds

Protocol. 1. Correctness first: in float32 on a small model, both engines train 3 steps from the same
weights on the same batches; losses must agree to 1e-5 relative (the parallel engine's own tests check
every layout against the single process on CPU). 2. Timing: per preset, each engine is built from the
same initialized weights, warmed up (3 steps), then timed over rounds of N steps (cuda-synchronized
wall clock; a step includes forward, backward, clipping, AdamW and the master-to-bf16 copy); rounds
alternate between the engines so clock or thermal drift hits both alike; the median round counts.
tokens/s = batch x seq_len x N / round seconds. Overhead = 1 - parallel / single, each stage against
the single engine's rounds interleaved with its own (acceptance: <= 2% for the default, ZeRO-1).
Extra rows: the other ZeRO stages at world size 1 (ZeRO-2/3 add a copy of the gradients into the
shard and, for 3, of the parameters into the gathered buffer; at dp = 1 they buy nothing).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from plotting import gpu_tag

ROOT = Path(__file__).resolve().parent.parent
PRESETS = {  # preset: (seq_len, batch, micro_batches)
    "125M": (1024, 32, 1),
    "1B": (2048, 8, 1),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="+", default=list(PRESETS), help="model presets to time")
    p.add_argument("--steps", type=int, default=10, help="steps a round")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per engine (alternating)")
    p.add_argument("--zero", nargs="+", type=int, default=[1, 0, 2, 3], help="ZeRO stages (first = headline)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder for JSON and plot")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, float32: checks the script runs")
    return p.parse_args(argv)


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(kind, cfg, weights, device, dtype, zero=1):
    import torch

    from flashscale.models.llama import Llama
    from flashscale.parallel.config import ParallelConfig
    from flashscale.parallel.engine import ParallelEngine
    from flashscale.parallel.mesh import ParallelMesh
    from flashscale.train.engine import OptimConfig, SingleDeviceEngine

    model = Llama(cfg)
    model.load_state_dict(weights)  # a tied model's state dict names the shared tensor twice: fine
    if kind == "single":
        return SingleDeviceEngine(model, OptimConfig(), device=device, dtype=dtype)
    pc = ParallelConfig(zero=zero)
    return ParallelEngine(cfg, pc, OptimConfig(), model=model, mesh=ParallelMesh(pc, cfg, device=device),
                          dtype=dtype)


def batches(cfg, n, batch, seq, device, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device),
             torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)) for _ in range(n)]


def check_correctness(device) -> dict:
    """float32, a small model: 3 steps of each engine from the same weights agree to 1e-5."""
    import torch

    from flashscale.models.config import preset
    from flashscale.models.llama import Llama

    cfg = preset("tiny", num_hidden_layers=4)
    weights = Llama(cfg).init_weights(0).state_dict()
    data = batches(cfg, 3, 8, 64, device)
    losses = {}
    for kind in ("single", "parallel"):
        eng = build(kind, cfg, weights, device, "float32")
        losses[kind] = [float(eng.train_step(x, y, lr=1e-3, micro_batches=2, max_grad_norm=1.0)["loss"])
                        for x, y in data]
        del eng
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses["parallel"], losses["single"]))
    if not worst <= 1e-5:
        raise SystemExit(f"correctness check failed: losses {losses} differ by {worst:.2e} relative")
    _free(device)
    return {"losses": losses, "max_rel_diff": worst}


def _free(device):
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _rounds(engines, data, args, mb, device) -> dict:
    """Alternating timed rounds over the engines given (built and warmed up by the caller)."""
    times = {k: [] for k in engines}
    for _ in range(args.rounds):
        for k, eng in engines.items():
            _sync(device)
            t0 = time.perf_counter()
            for i in range(args.steps):
                eng.train_step(*data[i % len(data)], lr=1e-4, micro_batches=mb, max_grad_norm=1.0)
            _sync(device)
            times[k].append(time.perf_counter() - t0)
    return times


def time_preset(name, args, device, dtype) -> list[dict]:
    """The single engine and the headline ZeRO stage alternate round by round (both alive: a 1B pair
    needs ~45 GB); each other stage then alternates with the single engine on its own."""
    from flashscale.models.config import preset
    from flashscale.models.llama import Llama

    seq, batch, mb = PRESETS.get(name, (128, 4, 2))
    if args.smoke:
        seq, batch, mb = 64, 4, 2
    cfg = preset(name)
    weights = Llama(cfg).init_weights(0).state_dict()
    data = batches(cfg, 4, batch, seq, device)
    tokens = batch * seq * args.steps

    def warm(kind, zero):
        eng = build(kind, cfg, weights, device, dtype, zero or 1)
        for i in range(3):
            eng.train_step(*data[i % len(data)], lr=1e-4, micro_batches=mb, max_grad_norm=1.0)
        _sync(device)
        return eng

    single = warm("single", None)
    rows = []
    for zero in args.zero:
        par = warm("parallel", zero)
        times = _rounds({"single": single, "parallel": par}, data, args, mb, device)
        base = tokens / statistics.median(times["single"])
        tps = tokens / statistics.median(times["parallel"])
        if not rows:
            rows.append({"preset": name, "engine": "single", "zero": None, "seq_len": seq, "batch": batch,
                         "micro_batches": mb, "tokens_per_s": base, "round_seconds": times["single"],
                         "overhead": None})
        rows.append({"preset": name, "engine": "parallel", "zero": zero, "seq_len": seq, "batch": batch,
                     "micro_batches": mb, "tokens_per_s": tps, "round_seconds": times["parallel"],
                     "single_tokens_per_s_same_rounds": base, "overhead": 1.0 - tps / base})
        del par
        _free(device)
    del single
    _free(device)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.smoke:
        raise SystemExit("no CUDA GPU: run with --smoke for the CPU check")
    dtype = "float32" if args.smoke else "bfloat16"
    presets = ["tiny"] if args.smoke else args.presets
    if args.smoke:
        args.steps, args.rounds = 2, 2
    check = check_correctness(device)
    rows = []
    for name in presets:
        rows += time_preset(name, args, device, dtype)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    tag = "smoke" if args.smoke else gpu_tag(gpu)
    result = {"benchmark": "parallel_overhead", "date": dt.datetime.now(dt.timezone.utc).isoformat(),
              "device": gpu, "torch": torch.__version__, "python": sys.version.split()[0], "dtype": dtype,
              "correctness": check, "rows": rows,
              "headline": {r["preset"]: r["overhead"] for r in rows if r["engine"] == "parallel"
                           and r["zero"] == args.zero[0]}}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"parallel-overhead-{tag}.json"
    from flashscale.data.cache import atomic_write_text

    atomic_write_text(path, json.dumps(result, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        labels = [f"{r['preset']}\n{r['engine']}" + ("" if r["zero"] is None else f" z{r['zero']}") for r in rows]
        ax.bar(range(len(rows)), [r["tokens_per_s"] for r in rows], color=["#888" if r["engine"] == "single"
                                                                             else "#3a7" for r in rows])
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set_ylabel("tokens/s")
        ax.set_title(f"ParallelEngine at world size 1 vs SingleDeviceEngine ({gpu}, {dtype})", fontsize=9)
        fig.tight_layout()
        fig.savefig(path.with_suffix(".png"), dpi=120)
    except ImportError:
        pass
    print(f"correctness: 3 float32 steps, losses agree to {check['max_rel_diff']:.1e} relative")
    print(f"{'preset':8s} {'engine':9s} {'zero':>4s} {'tokens/s':>12s} {'overhead':>9s}")
    for r in rows:
        ov = "-" if r["overhead"] is None else f"{100 * r['overhead']:+.2f}%"
        print(f"{r['preset']:8s} {r['engine']:9s} {str(r['zero'] if r['zero'] is not None else '-'):>4s} "
              f"{r['tokens_per_s']:12,.0f} {ov:>9s}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
