"""Shared by the parallel tests and their worker processes: the tiny models, the data, the single-process
reference run, the launcher (N processes with a file rendezvous, always reaped), comparisons.

Layout dicts: ParallelConfig fields plus "model" (a key of MODELS), and for training jobs optionally
"max_grad_norm". Every process of a launch runs every job in order, so one launch amortizes the
process start-up over many layouts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from flashscale.models.config import LlamaConfig

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_parallel_worker.py"

# Odd vocabulary (61: not divisible by tp = 2 or 4), 5 layers (pp = 2 splits unevenly, interleaving with
# 2 virtual stages gives 4 chunks over 5 layers), GQA with 2 kv heads (split at tp = 2), or MQA with 1
# kv head (replicated at tp = 2), tied embeddings (the head copy on the last stage when pp = 2) and MLP
# biases (row-parallel bias). No attention biases in training runs: the k_proj bias gets an analytically
# zero gradient (softmax ignores a per-query constant), so AdamW turns its rounding noise into full-size
# updates in any implementation; the layer tests check its (noise-level) gradient instead.
MODELS = {
    "gqa": dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
    "mqa_tied": dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                     num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
                     tie_word_embeddings=True, mlp_bias=True),
    "biased": dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
                   tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
    # vocab and every unit's size divisible by 2 and 4: no padding, so bytes follow the formula exactly
    "even": dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
    # document masking (attention within documents cut at eos 3, positions restarting): batches() makes every
    # fourth token or so an eos for this one, so rows hold several documents, some of length 1
    "gqa_docs": dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, eos_token_id=3),
}
DOC_MODELS = {"gqa_docs"}  # built with model.document_masking = True
SEED = 1
BATCH, SEQ, STEPS = 8, 8, 20


def model_config(name: str) -> LlamaConfig:
    return LlamaConfig(**MODELS[name])


def batches(cfg: LlamaConfig, steps: int, *, batch: int = BATCH, seq: int = SEQ, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # Next-token data with structure (a noisy shift) so the loss moves, not pure noise.
    out = []
    for _ in range(steps):
        x = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g)
        x[:, 1:] = torch.where(torch.rand(batch, seq, generator=g) < 0.5, (x[:, :-1] + 1) % cfg.vocab_size, x[:, 1:])
        if cfg.eos_token_id is not None:
            x = torch.where(torch.rand(x.shape, generator=g) < 0.25, torch.full_like(x, cfg.eos_token_id), x)
        out.append((x[:, :-1].contiguous(), x[:, 1:].contiguous()))
    return out


def lr_at(step: int, steps: int = STEPS) -> float:
    # AdamW divides each gradient by its own running RMS, so an element whose gradient is ~0 moves by
    # ~lr in a direction set by rounding noise: weight differences between two correct runs grow with
    # lr (measured 2026-11: 9e-6 relative at 2e-3 after 20 steps, 5e-6 at 1e-3). A usual peak of 1e-3.
    return 1e-3 * (1.0 - 0.5 * step / steps)


def reference_run(model_name: str, steps: int, *, max_grad_norm: float | None, start_state=None):
    """The single-process run: the trainer's SingleDeviceEngine on the whole global batch at once.
    Returns (losses, grad_norms, {name: final fp32 tensor})."""
    from flashscale.models.llama import Llama
    from flashscale.train.engine import OptimConfig, SingleDeviceEngine

    cfg = model_config(model_name)
    model = Llama(cfg).init_weights(SEED)
    model.document_masking = model_name in DOC_MODELS
    eng = SingleDeviceEngine(model, OptimConfig(), dtype="float32")
    losses, norms = [], []
    for step, (x, y) in enumerate(batches(cfg, steps)):
        out = eng.train_step(x, y, lr=lr_at(step, steps), micro_batches=1, max_grad_norm=max_grad_norm)
        losses.append(float(out["loss"]))
        norms.append(float(out["grad_norm"]))
    return losses, norms, {n: p.detach().clone() for n, p in eng.model.named_parameters()}


def launch(world: int, jobs: list[dict], *, timeout: float = 300.0, tmp: str | None = None) -> list:
    """Runs `jobs` in `world` worker processes; returns each rank's result list. Processes are killed
    on timeout or on the first failure; their output is shown on failure."""
    root = Path(tmp or tempfile.mkdtemp(prefix="fs-par-"))
    root.mkdir(parents=True, exist_ok=True)
    spec = root / "jobs.json"
    spec.write_text(json.dumps(jobs))
    store = root / "rendezvous"
    store.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs, logs = [], []
    for r in range(world):
        log = open(root / f"log-{r}.txt", "w")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(spec), str(r), str(world), str(store),
                                       str(root)], stdout=log, stderr=subprocess.STDOUT, env=env))
    deadline = time.monotonic() + timeout
    failed = None
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                failed = f"timed out after {timeout:.0f}s"
                break
            bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if bad:
                time.sleep(2.0)  # let the others report their side of the failure
                failed = f"rank {bad[0]} exited with {procs[bad[0]].returncode}"
                break
            time.sleep(0.05)
        if failed is None:
            bad = [r for r, p in enumerate(procs) if p.returncode != 0]
            if bad:
                failed = f"rank {bad[0]} exited with {procs[bad[0]].returncode}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        for log in logs:
            log.close()
    if failed:
        tails = "\n".join(f"--- rank {r} ---\n" + (root / f"log-{r}.txt").read_text()[-3000:] for r in range(world))
        raise AssertionError(f"parallel launch of {world} processes failed: {failed}\n{tails}")
    return [torch.load(root / f"result-{r}.pt", weights_only=False) for r in range(world)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], cwd: Path, *, env: dict | None = None, timeout: float = 600) -> str:
    """`torchrun --nproc-per-node 2` (c10d rendezvous on a free local port) with args; its output. On a timeout the
    whole session (torchrun and the workers it started) is killed; a non-zero exit fails with the output's tail."""
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # torchrun and the workers it started (their own session)
        out, _ = proc.communicate()
        raise AssertionError(f"torchrun timed out:\n{out[-4000:]}") from None
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{out[-4000:]}"
    return out


def assemble_weights(rank_results: list[dict]) -> dict[str, torch.Tensor]:
    from flashscale.parallel.checkpoint import assemble_all

    pieces = [pc for res in rank_results for pc in zip(res["records"], res["tensors"])]
    return {name: t for (name, kind), t in assemble_all(pieces).items() if kind == "master"}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def compare_run(label: str, losses, norms, weights, ref, tol: float = 1e-5) -> None:
    r_losses, r_norms, r_weights = ref
    assert len(losses) == len(r_losses), label
    for i, (a, b) in enumerate(zip(losses, r_losses)):
        assert abs(a - b) <= tol * abs(b), f"{label}: step {i + 1} loss {a!r} vs single-process {b!r}"
    for i, (a, b) in enumerate(zip(norms, r_norms)):
        assert abs(a - b) <= tol * abs(b), f"{label}: step {i + 1} grad norm {a!r} vs single-process {b!r}"
    if weights is not None:
        assert set(weights) == set(r_weights), f"{label}: tensors {sorted(set(weights) ^ set(r_weights))}"
        for n, w in weights.items():
            e = rel(w, r_weights[n])
            assert e <= tol, f"{label}: final {n} differs by {e:.2e} (relative norm) from the single-process run"
