"""`flashscale demo`: the whole life of a small model on the bundled corpus, in minutes on a CPU.

1. train a byte-level BPE tokenizer (4096 tokens) on the bundled training texts (austen + scofield);
2. train the "demo" preset (configs/demo.toml) on them: on the CPU for a wall-clock budget (the step
   schedule is fitted to this machine's measured speed as it trains, unless --steps is given), on a
   GPU in bf16 with more steps and a larger batch;
3. score the held-out moby_dick (GPTQ/AWQ protocol: non-overlapping windows) beside the unigram baseline;
4. quantize it to 4 bits (groups of 32: the MLP's 352 inputs rule out 64 and 128) with RTN and with
   GPTQ (calibrated on 128 windows of the training text) and score both on the same tokens;
5. generate three short samples with the 4-bit GPTQ model.
The trained model is saved as an HF folder (OUT/model: config.json, model.safetensors, tokenizer.json)
and the 4-bit one in the GPTQ checkpoint format (OUT/model-gptq-4bit); `flashscale eval` and
`flashscale generate` take either.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

CPU_BUDGET_S = 210.0  # training seconds on the CPU; tokenizer, tokens, quantization and evaluation come on top
QUANT_BITS, CALIB_WINDOWS = 4, 128
EVAL_BUDGET_S = 90.0  # on a CPU too slow to score all of moby_dick in this time, a prefix is scored (and said so)
MAX_STEPS = 8000  # bound under the CPU time budget (3.7 passes over the corpus), beyond what 2 cores reach
QUICK_EVAL_TOKENS = 8192  # --quick scores only this prefix of moby_dick
PROMPTS = ("It is a truth universally acknowledged", "The ship sailed", "And the LORD said")


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="train, evaluate and sample a small model on the bundled corpus",
                       description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to train (default: cuda if available, else cpu)")
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps (default: as many as fit %d s of training on the CPU; 1500 on a GPU)"
                        % CPU_BUDGET_S)
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
        # bf16 weights with fp32 masters; a GPU wants larger batches: 1500 steps of 16 x 256 tokens are
        # 6.1M tokens, ~6 passes over the corpus, which a 1.3M-parameter model takes without overfitting much.
        ov += ["--train.dtype", "bfloat16", "--train.batch_size", "16", "--train.lr", "2e-3",
               "--train.warmup_steps", "60", "--train.steps", "1500", "--log.every", "100"]
    if args.quick:
        ov += ["--model.preset", "tiny", "--data.vocab_size", "1024", "--data.tokenizer_max_chars", "1000000",
               "--data.seq_len", "64",
               "--train.steps", "12", "--train.batch_size", "8", "--train.lr", "3e-3",
               "--train.warmup_steps", "2", "--log.every", "4", "--log.eval_batches", "2"]
    if args.steps is not None:
        ov += ["--train.steps", str(args.steps)]
    return ov


def time_cpu_step(config, device, model_config) -> tuple[float, int]:
    """(seconds a step, intra-op threads): timed on a throwaway copy of the run (same shapes, so the
    same kernels) after a warm-up step, with all cores and with one; the faster count is kept. One
    wins on a busy machine: an OpenMP team whose other thread is descheduled stalls every op at its
    barrier (measured 16x slower steps with 2 threads on 2 loaded cores, 2026-11)."""
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

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            out = engine.train_step(x, x, lr=t.lr, micro_batches=t.micro_batches, max_grad_norm=t.max_grad_norm)
            float(out["loss"])  # waits for the step
        return (time.perf_counter() - t0) / n

    timed(1)  # warm-up: first-call allocations
    cores = torch.get_num_threads()
    per_step = {cores: timed(2)}
    if cores > 1:
        torch.set_num_threads(1)
        per_step[1] = timed(2)
    threads = min(per_step, key=per_step.get)
    torch.set_num_threads(threads)
    return per_step[threads], threads


def _quantize(model, data, seq_len: int, device, seed: int):
    """(GPTQ's QuantizedModel, [(table label, QuantizedModel)] for RTN and GPTQ), each on its own copy
    of the trained model (quantize_model works in place)."""
    import copy

    from flashscale.data.corpus import train_text
    from flashscale.quant.api import quantize_model
    from flashscale.quant.calibrate import calibration_tokens

    calib = calibration_tokens(data.tokenizer, text=train_text(),  # moby_dick stays held out
                               nsamples=CALIB_WINDOWS, seqlen=seq_len, seed=seed)
    # the largest usual group size dividing every linear's inputs (demo: 32, for the MLP's 352), else rows
    ins = {model.config.hidden_size, model.config.intermediate_size, model.config.q_dim}
    group = next((gs for gs in (128, 64, 32) if all(n % gs == 0 for n in ins)), -1)
    kw = dict(bits=QUANT_BITS, group_size=group, device=device)
    rtn = quantize_model(copy.deepcopy(model).float().eval(), "rtn", **kw)
    gptq = quantize_model(copy.deepcopy(model).float().eval(), "gptq", calib_tokens=calib, **kw)
    g = f"{QUANT_BITS}-bit, " + (f"groups of {group}" if group > 0 else "one group a row")
    return gptq, [(f"demo model, RTN {g}", rtn),
                  (f"demo model, GPTQ {g} ({gptq.summary.total_seconds:.0f} s)", gptq)]


def run(args) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from flashscale.data.corpus import eval_text
    from flashscale.data.tokens import encode_text
    from flashscale.models.checkpoint import save_hf
    from flashscale.quant.io import save_quantized
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
    if device.type == "cpu":
        per_step, threads = time_cpu_step(config, device, model_config)
        msg = f"measured {per_step:.2f} s a training step with {threads} thread(s)"
        if args.steps is None and not args.quick:
            # The machine's speed can change under us (other jobs): the trainer re-fits the schedule to
            # the time left at every step instead of trusting this one measurement.
            config.train = dataclasses.replace(config.train, steps=MAX_STEPS, time_budget=CPU_BUDGET_S)
            msg += (f"; training for {CPU_BUDGET_S:.0f} s (~{CPU_BUDGET_S / per_step:.0f} steps at this speed; "
                    f"--steps N for a fixed, reproducible count)")
        console.print(msg)

    trainer = Trainer(config, out_dir=args.out / "train")
    result = trainer.fit()
    model = trainer.model
    console.print(f"trained {result.steps} steps, {result.tokens:,} tokens in {result.seconds:.0f} s "
                  f"({result.tokens_per_s:,.0f} tokens/s); validation loss {result.val_loss:.3f} "
                  f"(perplexity {result.val_ppl:.1f}) on {len(trainer.val_set)} batches of moby_dick windows")
    save_hf(model, args.out / "model", tokenizer=data.tokenizer)

    # -- held-out evaluation: moby_dick, GPTQ/AWQ protocol (windows of the training length) ----------
    t0 = time.perf_counter()
    ids = torch.from_numpy(encode_text(data.tokenizer, eval_text(), add_special_tokens=False))  # (N,)
    total = len(ids)
    if args.quick:
        ids = ids[:QUICK_EVAL_TOKENS]
    elif device.type == "cpu":
        # A forward pass costs about a third of a training step's forward + backward.
        affordable = int(EVAL_BUDGET_S * 3 * result.tokens_per_s) if result.tokens_per_s > 0 else total
        if affordable < total:
            ids = ids[:max(affordable, 16 * config.data.seq_len)]
    ev = perplexity(model, ids, window=config.data.seq_len, batch_size=16, device=device)
    unigram = unigram_perplexity(data.train, ids, data.vocab_size)
    part = ("all" if len(ids) == total
            else f"the first {len(ids):,} of {total:,} (all would take over {EVAL_BUDGET_S:.0f} s here)")
    table = Table(title=f"moby_dick (held out): {part} tokens, {ev['tokens']:,} scored in windows of "
                        f"{config.data.seq_len}")
    table.add_column("model")
    table.add_column("perplexity", justify="right")
    table.add_row("unigram baseline (add-one, fit on the training tokens)", f"{unigram:.1f}")
    table.add_row(f"demo model ({config.train.dtype})", f"{ev['ppl']:.1f}")
    t_eval = time.perf_counter() - t0

    # -- 4-bit quantization: RTN and GPTQ, each scored on the same ids -------------------------------
    t0 = time.perf_counter()
    qmodel, qrows = _quantize(model, data, config.data.seq_len, device, args.seed)
    for label, q in qrows:
        table.add_row(label, f"{perplexity(q.model, ids, window=config.data.seq_len, batch_size=16, device=device)['ppl']:.1f}")
    save_quantized(qmodel, args.out / "model-gptq-4bit", tokenizer=data.tokenizer, overwrite=True)
    console.print(table)
    ratio = unigram / ev["ppl"]
    verdict = f"{ratio:.1f}x below" if ratio >= 1 else f"{1 / ratio:.1f}x above"
    console.print(f"perplexity {ev['ppl']:.1f}: {verdict} the unigram baseline's {unigram:.1f} "
                  f"({t_eval:.0f} s to evaluate; quantizing and scoring the 4-bit models {time.perf_counter() - t0:.0f} s)")
    model = qmodel.model

    # -- samples --------------------------------------------------------------------------------------
    from flashscale.infer.generate import generate

    console.rule(f"samples of the {QUANT_BITS}-bit GPTQ model (top-k 40, temperature 0.8)")
    for i, prompt in enumerate(PROMPTS):
        x = torch.tensor([data.tokenizer.encode(prompt).ids], dtype=torch.long)  # (1, S0)
        out = generate(model, x, max_new_tokens=16 if args.quick else 48, temperature=0.8, top_k=40,
                       eos_token_id=data.eos_id, seed=args.seed + i)
        text = data.tokenizer.decode(out[0].tolist())
        console.print(f"[bold]{prompt}[/bold]{text[len(prompt):] if text.startswith(prompt) else ' | ' + text}",
                      soft_wrap=True)
    console.rule()
    console.print(f"model saved to {args.out / 'model'}, its {QUANT_BITS}-bit version to "
                  f"{args.out / 'model-gptq-4bit'} (flashscale eval / generate take them); "
                  f"training log in {args.out / 'train'}; total {time.perf_counter() - t_start:.0f} s")
    return 0
