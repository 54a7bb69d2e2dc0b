"""Reference training run on one GPU: the 125M preset on the shared corpus, in at most 5 minutes wall
including tokenization; validation perplexity on the held-out moby_dick, tokens/s and MFU.

    python benchmarks/train_reference.py                      # H200: ../shared/data/corpus, 300 s budget
    python benchmarks/train_reference.py --save /tmp/ref125M  # also keep the model (HF folder + tokenizer)
    python benchmarks/train_reference.py --steps 900          # a fixed step count: the exact same run again
    python benchmarks/train_reference.py --smoke              # CPU check of the whole path, seconds

Protocol. Training files: every *.txt.xz of --corpus-dir but moby_dick; a byte-level BPE of 32768
tokens trained on them (the first 20 M characters, spread over the files); windows of 1024 tokens,
32 a step. bf16 weights with fp32 master weights and AdamW states (SingleDeviceEngine), warmup + cosine
LR, deterministic kernels, seed 0. Evaluation: moby_dick, paragraphs joined with "\\n\\n", tokenized
once, non-overlapping windows of 1024 tokens, each scored on its own (the GPTQ/AWQ protocol,
flashscale.train.evaluate.perplexity), beside the add-one unigram baseline fit on the training tokens.
MFU: (6N + 12·L·h·s) FLOPs a token (N with the output projection, not the input embedding) x tokens/s
over the dense bf16 peak (989 TFLOP/s on H100/H200), tokens/s over the training steps only.

Steps. The budget is wall-clock from the start of this script. With --steps unset, after tokenization
the script times three steps of a throwaway model (the same shapes, so the same kernels; cuda-synced)
and picks the steps that fit what is left of the budget, less a reserve for evaluation and saving.
The choice is printed and stored in the JSON: rerun with --steps N to repeat the identical run (the
run itself is deterministic: seeded, deterministic kernels, fixed data order).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path

from plotting import gpu_tag

T_START = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent
RESERVE_S = 25.0  # evaluation of moby_dick (~0.3 M tokens), saving, process exit


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", type=Path, default=ROOT.parent / "shared" / "data" / "corpus",
                   help="folder of *.txt.xz files (moby_dick is held out)")
    p.add_argument("--time-budget", type=float, default=300.0, help="seconds of wall time for the whole script")
    p.add_argument("--steps", type=int, default=None, help="fixed step count (default: fit the budget)")
    p.add_argument("--config", default="125M", help="training config (bundled name or TOML path)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (pays back on long runs only)")
    p.add_argument("--save", type=Path, default=None, help="write the trained model here (HF folder + tokenizer)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder for the JSON")
    p.add_argument("--cache-dir", type=Path, default=None, help="tokenizer/token cache (default: flashscale's)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU check: the bundled corpus, the tiny preset, a few steps "
                        "(writes train-reference-smoke.json)")
    p.add_argument("overrides", nargs="*", help="extra config overrides, e.g. --train.lr 6e-4 (after --)")
    return p.parse_args(argv)


def config_for(args):
    from flashscale.train.config import load_config

    ov = ["--log.every", "25", "--log.eval_every", "0", "--checkpoint.every", "0", "--log.tensorboard", "false"]
    if args.smoke:
        ov = ["--model.preset", "tiny", "--data.files", "bundled", "--data.val_files", "bundled-eval",
              "--data.vocab_size", "1024",
              "--data.tokenizer_max_chars", "1000000", "--data.seq_len", "128", "--train.batch_size", "8",
              "--train.micro_batches", "2", "--train.device", "cpu", "--train.dtype", "float32",
              "--train.warmup_steps", "2", "--train.lr", "3e-3", "--log.eval_batches", "2"] + ov
    else:
        files = sorted(str(f) for f in args.corpus_dir.glob("*.txt.xz") if not f.name.startswith("moby_dick"))
        if not files:
            raise SystemExit(f"--corpus-dir {args.corpus_dir}: no *.txt.xz training files")
        moby = args.corpus_dir / "moby_dick.txt.xz"
        val = json.dumps([str(moby)]) if moby.is_file() else "bundled-eval"  # the bundled copy is the same text
        # All of the training files train; the trainer's validation windows come from the held-out text.
        ov += ["--data.files", json.dumps(files), "--data.val_files", val,
               "--train.device", "cuda", "--train.dtype", "bfloat16"]
    if args.cache_dir is not None:
        ov += ["--data.cache_dir", str(args.cache_dir)]
    if args.compile:
        ov += ["--train.compile", "true"]
    return load_config(args.config, ov + list(args.overrides))


def eval_ids(args, tokenizer):
    import torch

    from flashscale.data.corpus import eval_text, read_text
    from flashscale.data.tokens import encode_text

    moby = args.corpus_dir / "moby_dick.txt.xz"
    text = read_text(moby) if (moby.is_file() and not args.smoke) else eval_text()  # the bundled copy is the same text
    ids = torch.from_numpy(encode_text(tokenizer, text, add_special_tokens=False))  # (N,) int64
    return ids[:16384] if args.smoke else ids


def time_steps(config, device, model_config, n: int = 3) -> float:
    """Seconds a step of this run, from n timed steps of a throwaway model after two warm-up steps."""
    import torch

    from flashscale.models.llama import Llama
    from flashscale.train.engine import OptimConfig, SingleDeviceEngine

    t = config.train
    model = Llama(model_config).init_weights(seed=t.seed)
    model.activation_checkpointing = t.activation_checkpointing
    engine = SingleDeviceEngine(model, OptimConfig(), device=device, dtype=t.dtype, compile=t.compile)
    x = torch.randint(0, model_config.vocab_size, (t.batch_size, config.data.seq_len),
                      generator=torch.Generator().manual_seed(0))  # (B, S)
    step = lambda: engine.train_step(x, x, lr=t.lr, micro_batches=t.micro_batches, max_grad_norm=t.max_grad_norm)
    for _ in range(2):
        float(step()["loss"])
    t0 = time.perf_counter()
    for _ in range(n):
        out = step()
    float(out["loss"])  # waits for the device
    per_step = (time.perf_counter() - t0) / n
    del step, out, engine, model  # free the throwaway's memory before the real run allocates its own
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return per_step


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from flashscale.models.checkpoint import save_hf
    from flashscale.train.evaluate import perplexity, unigram_perplexity
    from flashscale.train.setup import configure_cpu, prepare, set_deterministic
    from flashscale.train.trainer import Trainer

    config = config_for(args)
    if config.train.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run with --smoke for the CPU check")
    if config.train.device == "cuda":
        set_deterministic(torch.device("cuda"))  # before the first CUDA matmul (cuBLAS workspace)
        # bf16 run: the attention reference's float32 matmuls (until the kernel lands) may use TF32.
        torch.backends.cuda.matmul.allow_tf32 = True
    configure_cpu()
    if args.smoke:
        # Tiny shapes: one intra-op thread. On a shared machine an OpenMP team whose other thread is
        # descheduled spins at every op's barrier (measured 60x slower steps of the tiny preset).
        torch.set_num_threads(1)

    t0 = time.perf_counter()
    device, data, model_config = prepare(config)  # tokenizer + token file (cached by content hash)
    t_data = time.perf_counter() - t0
    print(f"data: {len(data.files)} files, {len(data.train):,} training tokens, vocab {data.vocab_size}; "
          f"{t_data:.1f} s (tokenizer + tokens)", flush=True)
    print(f"model: {config.model.preset}, {model_config.num_params() / 1e6:.1f}M parameters, "
          f"{model_config.flops_per_token(config.data.seq_len) / 1e6:.0f} MFLOP a token", flush=True)

    if args.steps is not None:
        steps, how = args.steps, "fixed (--steps)"
    elif args.smoke:
        steps, how = 20, "smoke"
    else:
        per_step = time_steps(config, device, model_config)
        left = args.time_budget - (time.perf_counter() - T_START) - RESERVE_S
        steps = max(10, int(left / per_step))
        how = f"fitted: {per_step * 1e3:.0f} ms a step, {left:.0f} s left of the {args.time_budget:.0f} s budget"
    print(f"steps: {steps} ({how})", flush=True)
    config.train = dataclasses.replace(config.train, steps=steps,
                                       warmup_steps=min(config.train.warmup_steps, max(1, steps // 10)))

    trainer = Trainer(config, out_dir=None, progress=False)
    result = trainer.fit()
    model = trainer.model

    ids = eval_ids(args, data.tokenizer)
    ev = perplexity(model, ids, window=config.data.seq_len, batch_size=8, device=device)
    unigram = unigram_perplexity(data.train, ids, data.vocab_size)
    if args.save is not None:
        save_hf(model, args.save, tokenizer=data.tokenizer)
    wall = time.perf_counter() - T_START

    gpu = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu"
    row = {"impl": "flashscale SingleDeviceEngine" + (" +compile" if config.train.compile else ""),
           "model": config.model.preset, "params": model_config.num_params(), "steps": result.steps,
           "tokens": result.tokens, "seconds": round(result.seconds, 2),
           "tokens_per_s": round(result.tokens_per_s, 1),
           "mfu": None if result.mfu is None else round(result.mfu, 4),
           "val_ppl_moby_dick": round(ev["ppl"], 3), "unigram_ppl": round(unigram, 3),
           "eval_tokens": ev["tokens"], "final_train_loss": result.loss, "dtype": config.train.dtype,
           "seq_len": config.data.seq_len, "batch_size": config.train.batch_size, "lr": config.train.lr,
           "vocab_size": data.vocab_size, "train_tokens_available": len(data.train),
           "data_seconds": round(t_data, 1), "wall_seconds": round(wall, 1), "steps_how": how}
    doc = {"gpu": gpu, "torch": torch.__version__, "triton": _triton_version(),
           "date": dt.date.today().isoformat(), "python": sys.version.split()[0], "rows": [row]}
    args.out.mkdir(parents=True, exist_ok=True)
    name = "train-reference-smoke.json" if args.smoke else f"train-reference-{gpu_tag(gpu)}.json"
    from flashscale.data.cache import atomic_write_text

    atomic_write_text(args.out / name, json.dumps(doc, indent=1) + "\n")

    print(f"\n{'model':<8} {'params':>8} {'steps':>6} {'tokens':>12} {'s':>7} {'tok/s':>10} {'MFU':>7} "
          f"{'ppl moby':>9} {'unigram':>8} {'wall s':>7}")
    mfu_s = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
    print(f"{row['model']:<8} {row['params'] / 1e6:>7.1f}M {row['steps']:>6} {row['tokens']:>12,} "
          f"{row['seconds']:>7.1f} {row['tokens_per_s']:>10,.0f} {mfu_s:>7} {row['val_ppl_moby_dick']:>9.2f} "
          f"{row['unigram_ppl']:>8.1f} {wall:>7.1f}")
    print(f"wrote {args.out / name}" + (f"; model saved to {args.save}" if args.save else ""))
    return 0


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
