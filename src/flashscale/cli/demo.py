"""`flashscale demo`: the whole life of a small model on the bundled corpus, in minutes on a CPU.

1. train a byte-level BPE tokenizer (4096 tokens) on the bundled training texts (austen + scofield);
2. train the "demo" preset (configs/demo.toml) on them: on the CPU for a wall-clock budget (the step
   count is fitted to the measured speed of this machine unless --steps is given), on a GPU in bf16
   with more steps and a larger batch;
3. score the held-out moby_dick (GPTQ/AWQ protocol: non-overlapping windows) beside the unigram baseline;
4. [quantization goes here: another issue adds 4-bit quantization and perplexity before/after];
5. generate three short samples.
The trained model is saved as an HF folder (OUT/model: config.json, model.safetensors, tokenizer.json),
usable with `flashscale eval` and `flashscale generate`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

CPU_BUDGET_S = 180.0  # training seconds on the CPU; tokenizer, tokens and evaluation come on top
QUICK_EVAL_TOKENS = 8192  # --quick scores only this prefix of moby_dick
PROMPTS = ("It is a truth universally acknowledged", "The ship sailed", "And the LORD said")


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="train, evaluate and sample a small model on the bundled corpus",
                       description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to train (default: cuda if available, else cpu)")
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps (default: fitted to a %d s budget on the CPU; 1500 on a GPU)" % CPU_BUDGET_S)
    p.add_argument("--out", type=Path, default=Path("flashscale-demo"),
                   help="output folder: model/ (HF layout), train/ (log.jsonl, tensorboard) (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, the data order and the samples")
    p.add_argument("--quick", action="store_true",
                   help="the smallest setting (tiny model, a few steps, a slice of the evaluation text): "
                        "checks the pipeline end to end in seconds; its numbers mean nothing")
    p.set_defaults(func=run)


def _overrides(args, device: str) -> list[str]:
    ov = ["--train.device", device, "--train.seed", str(args.seed)]
    if device == "cuda":
        # bf16 weights with fp32 masters; 16x the CPU's tokens: ~12 epochs of the corpus at most,
        # which this 2.4M-parameter model does not overfit much.
        ov += ["--train.dtype", "bfloat16", "--train.batch_size", "32", "--train.lr", "3e-3",
               "--train.warmup_steps", "50", "--train.steps", "1500", "--log.every", "100"]
    if args.quick:
        ov += ["--model.preset", "tiny", "--data.vocab_size", "1024", "--data.seq_len", "64",
               "--train.steps", "12", "--train.batch_size", "8", "--train.lr", "3e-3",
               "--train.warmup_steps", "2", "--log.every", "4", "--log.eval_batches", "2"]
    if args.steps is not None:
        ov += ["--train.steps", str(args.steps)]
    return ov


def fit_steps(config, device, model_config, budget_s: float, console) -> int:
    """Steps that fit `budget_s` seconds, from two timed steps of a throwaway copy of the run (same
    shapes, so the same kernels) after one warm-up step."""
    import torch

    from flashscale.models.llama import Llama
    from flashscale.train.engine import OptimConfig, SingleDeviceEngine
    from flashscale.train.setup import configure_cpu

    configure_cpu()
    t = config.train
    model = Llama(model_config).init_weights(seed=t.seed)
    engine = SingleDeviceEngine(model, OptimConfig(), device=device, dtype=t.dtype)
    gen = torch.Generator().manual_seed(t.seed)
    x = torch.randint(0, model_config.vocab_size, (t.batch_size, config.data.seq_len), generator=gen)  # (B, S)
    engine.train_step(x, x, lr=t.lr, micro_batches=t.micro_batches, max_grad_norm=t.max_grad_norm)
    t0 = time.perf_counter()
    for _ in range(2):
        float(engine.train_step(x, x, lr=t.lr, micro_batches=t.micro_batches, max_grad_norm=t.max_grad_norm)["loss"])
    per_step = (time.perf_counter() - t0) / 2
    steps = max(50, int(budget_s / per_step))
    console.print(f"measured {per_step:.2f} s a step here: {steps} steps fit the {budget_s:.0f} s training budget "
                  f"(--steps N to choose)")
    return steps


def run(args) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from flashscale.data.corpus import eval_text
    from flashscale.data.tokens import encode_text
    from flashscale.models.checkpoint import save_hf
    from flashscale.train.config import load_config
    from flashscale.train.evaluate import perplexity, unigram_perplexity
    from flashscale.train.setup import prepare, resolve_device
    from flashscale.train.trainer import Trainer

    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps: takes an int >= 1, got {args.steps}")
    console = Console()
    t_start = time.perf_counter()
    device = resolve_device(args.device)
    config = load_config("demo", _overrides(args, device.type))

    console.rule("[bold]flashscale demo")
    console.print(f"device {device}, dtype {config.train.dtype}; corpus: bundled austen + scofield "
                  f"(moby_dick held out)")
    t0 = time.perf_counter()
    _, data, model_config = prepare(config)  # tokenizer + token file, cached for the trainer's own call
    console.print(f"tokenizer: byte-level BPE, {data.vocab_size} tokens; {len(data.train):,} training and "
                  f"{len(data.val):,} validation tokens ({time.perf_counter() - t0:.1f} s, cached for reruns)")
    console.print(f"model: preset {config.model.preset!r}, {model_config.num_params() / 1e6:.2f}M parameters, "
                  f"{model_config.num_hidden_layers} layers, hidden {model_config.hidden_size}, "
                  f"{model_config.num_attention_heads}/{model_config.num_key_value_heads} heads")
    if device.type == "cpu" and args.steps is None and not args.quick:
        steps = fit_steps(config, device, model_config, CPU_BUDGET_S, console)
        config.train = dataclasses.replace(config.train, steps=steps)

    trainer = Trainer(config, out_dir=args.out / "train")
    result = trainer.fit()
    model = trainer.model
    console.print(f"trained {result.steps} steps, {result.tokens:,} tokens in {result.seconds:.0f} s "
                  f"({result.tokens_per_s:,.0f} tokens/s); validation (scofield) loss {result.val_loss:.3f}, "
                  f"perplexity {result.val_ppl:.1f}")
    save_hf(model, args.out / "model", tokenizer=data.tokenizer)

    # -- held-out evaluation: moby_dick, GPTQ/AWQ protocol (windows of the training length) ----------
    t0 = time.perf_counter()
    ids = torch.from_numpy(encode_text(data.tokenizer, eval_text(), add_special_tokens=False))  # (N,)
    if args.quick:
        ids = ids[:QUICK_EVAL_TOKENS]
    ev = perplexity(model, ids, window=config.data.seq_len, batch_size=16, device=device)
    unigram = unigram_perplexity(data.train, ids, data.vocab_size)
    table = Table(title=f"moby_dick (held out): {ev['tokens']:,} tokens, windows of {config.data.seq_len}")
    table.add_column("model")
    table.add_column("perplexity", justify="right")
    table.add_row("unigram baseline (add-one, fit on the training tokens)", f"{unigram:.1f}")
    table.add_row(f"demo model ({config.train.dtype})", f"{ev['ppl']:.1f}")
    # -- QUANTIZATION (added by the quantization issue): quantize `model` to 4 bits here and add a
    #    row "demo model, 4-bit" with its perplexity on the same `ids`, next to the float one. ----------
    console.print(table)
    console.print(f"perplexity {ev['ppl']:.1f} vs unigram {unigram:.1f}: {unigram / ev['ppl']:.1f}x lower "
                  f"({time.perf_counter() - t0:.0f} s to evaluate)")

    # -- samples --------------------------------------------------------------------------------------
    from flashscale.infer.generate import generate

    console.rule("samples (top-k 40, temperature 0.8)")
    for i, prompt in enumerate(PROMPTS):
        x = torch.tensor([data.tokenizer.encode(prompt).ids], dtype=torch.long)  # (1, S0)
        out = generate(model, x, max_new_tokens=16 if args.quick else 48, temperature=0.8, top_k=40,
                       eos_token_id=data.eos_id, seed=args.seed + i)
        text = data.tokenizer.decode(out[0].tolist())
        console.print(f"[bold]{prompt}[/bold]{text[len(prompt):] if text.startswith(prompt) else ' | ' + text}",
                      soft_wrap=True)
    console.rule()
    console.print(f"model saved to {args.out / 'model'} (flashscale eval / generate take it); "
                  f"training log in {args.out / 'train'}; total {time.perf_counter() - t_start:.0f} s")
    return 0
