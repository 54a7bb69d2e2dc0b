"""GPTQ speed and memory on a Llama-3-8B-shaped model (random weights; issue 6's acceptance: one H200,
128 x 2048 calibration tokens, at most 5 minutes, peak GPU memory under 24 GB) ->
benchmarks/results/gptq-speed.json.

    python benchmarks/gptq_speed.py                       # full: 32 blocks, 4-bit g128
    python benchmarks/gptq_speed.py --layers 4            # a quick look (time scales with blocks)
    python benchmarks/gptq_speed.py --smoke --out /tmp/g  # CPU, tiny shape

The model is built on the meta device and materialized parameter by parameter in bf16 on the CPU (random
normal(0, 0.02) drawn on the GPU when there is one: fast), so host memory holds one bf16 copy (~16 GB).
quantize_model then runs layer by layer: each block visits the GPU, the calibration activations
(128 x 2048 x 4096 bf16 = 2 GiB, twice: inputs and outputs) stay there, the rest stays on the CPU.

Correctness first: GPTQ on one random linear with correlated inputs, on the benchmark device, must beat
RTN's output error by 1.3x, and the first block's codes must lie on the grid.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


@torch.no_grad()
def build_random_llama(cfg, *, dtype: torch.dtype, seed: int, init_device):
    from flashscale.models import Llama
    from flashscale.models.llama import RMSNorm, rope_inv_freq

    with torch.device("meta"):
        model = Llama(cfg)
    model.to(dtype).to_empty(device="cpu")  # dtype first: never a float32 copy of 8B parameters
    gen = torch.Generator(device=init_device).manual_seed(seed)
    for mod in model.modules():
        if isinstance(mod, RMSNorm):
            mod.weight.fill_(1.0)
        elif isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
            if isinstance(mod, torch.nn.Linear) and mod is model.lm_head and cfg.tie_word_embeddings:
                continue
            w = torch.empty(mod.weight.shape, device=init_device, dtype=dtype).normal_(0.0, cfg.initializer_range,
                                                                                       generator=gen)
            mod.weight.copy_(w.cpu())
            if getattr(mod, "bias", None) is not None:
                mod.bias.zero_()
    model.inv_freq = rope_inv_freq(cfg)  # float32, as the model keeps it
    return model.eval()


def correctness(device) -> None:
    from flashscale.quant.gptq import gptq_quantize
    from flashscale.quant.rtn import quantize_rtn

    g = torch.Generator().manual_seed(0)
    k = 512
    x = torch.randn(4096, k // 8, generator=g) @ torch.randn(k // 8, k, generator=g) / 8 + 0.1 * torch.randn(4096, k, generator=g)
    w = torch.randn(256, k, generator=g) * 0.02
    x, w = x.to(device), w.to(device)
    res = gptq_quantize(w, 2 * x.T @ x / x.shape[0], bits=4, group_size=128, sym=True)
    rtn = quantize_rtn(w, bits=4, group_size=128, sym=True)
    ratio = float((x @ (rtn.dequantize() - w).T).pow(2).mean() / (x @ (res.weight - w).T).pow(2).mean())
    if ratio < 1.3:
        sys.exit(f"correctness: GPTQ's output error is only {ratio:.2f}x lower than RTN's on {device}")
    print(f"correctness: GPTQ error {ratio:.2f}x lower than RTN on one linear ({device})", flush=True)


def main(argv=None) -> int:
    from flashscale.models import preset
    from flashscale.quant.api import quantize_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama3-8B")
    p.add_argument("--layers", type=int, default=None, help="blocks to build and quantize (default: all)")
    p.add_argument("--nsamples", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=2048)
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--act-order", action="store_true")
    p.add_argument("--batch-tokens", type=int, default=16384, help="tokens a block forward processes at once")
    p.add_argument("--device", default=None)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shape, 2 blocks, 4 x 64 tokens")
    args = p.parse_args(argv)
    if args.smoke:
        args.preset, args.nsamples, args.seqlen, args.group_size = "tiny", 4, 64, 32
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu"))
    overrides = {"intermediate_size": 192} if args.preset == "tiny" else {}
    if args.layers is not None:
        overrides["num_hidden_layers"] = args.layers
    cfg = preset(args.preset, **overrides)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    correctness(device)
    t0 = time.perf_counter()
    model = build_random_llama(cfg, dtype=dtype, seed=0, init_device=device)
    build_s = time.perf_counter() - t0
    print(f"built {args.preset} ({cfg.num_hidden_layers} blocks, {cfg.num_params() / 1e9:.2f} B params, {dtype}) "
          f"in {build_s:.1f} s", flush=True)
    tokens = torch.randint(0, cfg.vocab_size, (args.nsamples, args.seqlen), generator=torch.Generator().manual_seed(1))

    t0 = time.perf_counter()
    q = quantize_model(model, "gptq", bits=args.bits, group_size=args.group_size, act_order=args.act_order,
                       calib_tokens=tokens, device=device, batch_tokens=args.batch_tokens, progress=sys.stderr.isatty())
    wall = time.perf_counter() - t0
    first = q.records["layers.0.self_attn.q_proj"]
    if int(first.codes.max()) >= 2 ** args.bits or not bool(torch.isfinite(first.scales).all()):
        sys.exit("correctness: codes or scales of layers.0.self_attn.q_proj are off the grid")
    s = q.summary
    gib = 1 << 30
    blocks = s.block_seconds
    row = {"model": f"{args.preset} shape, random weights", "method": "gptq_act_order" if args.act_order else "gptq",
           "bits": args.bits, "group_size": args.group_size, "nsamples": args.nsamples, "seqlen": args.seqlen,
           "layers": cfg.num_hidden_layers, "dtype": str(dtype).removeprefix("torch."), "impl": "flashscale",
           "seconds": s.total_seconds, "wall_seconds": wall, "seconds_per_block": sum(blocks) / len(blocks),
           "max_block_seconds": max(blocks), "embed_and_setup_seconds": s.total_seconds - sum(blocks),
           "peak_gpu_gib": None if s.peak_gpu_bytes is None else s.peak_gpu_bytes / gib,
           "peak_gpu_gb": None if s.peak_gpu_bytes is None else s.peak_gpu_bytes / 1e9,
           "peak_host_gib": s.peak_host_bytes / gib, "build_seconds": build_s,
           "limit_seconds": 300, "limit_gpu_gb": 24}
    # projected to the full depth when fewer blocks ran (blocks of one model cost the same)
    full_layers = preset(args.preset).num_hidden_layers
    row["projected_seconds_full_depth"] = row["seconds_per_block"] * full_layers + row["embed_and_setup_seconds"]
    row["passed"] = bool(row["projected_seconds_full_depth"] <= 300 and (row["peak_gpu_gb"] or 0) < 24)
    import triton

    result = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "triton": triton.__version__, "date": datetime.date.today().isoformat(), "rows": [row]}
    args.out.mkdir(parents=True, exist_ok=True)
    name = "gptq-speed-smoke" if args.smoke else "gptq-speed"
    from flashscale.data.cache import atomic_write_text

    atomic_write_text(args.out / f"{name}.json", json.dumps(result, indent=1) + "\n")
    print(f"\n{'model':<34} {'blocks':>6} {'s/block':>8} {'total s':>8} {'full-depth s':>12} {'peak GPU GB':>11} "
          f"{'host GiB':>8}  passed")
    gpu = "-" if row["peak_gpu_gb"] is None else f"{row['peak_gpu_gb']:.1f}"
    print(f"{row['model']:<34} {row['layers']:>6} {row['seconds_per_block']:>8.2f} {row['seconds']:>8.1f} "
          f"{row['projected_seconds_full_depth']:>12.1f} {gpu:>11} {row['peak_host_gib']:>8.1f}  {row['passed']}")
    return 0 if math.isfinite(row["seconds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
