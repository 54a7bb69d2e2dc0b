"""The trainer on the bundled corpus: the loss goes down; a run SIGKILLed at any moment (between
checkpoints, or inside a checkpoint write) resumes to exactly the uninterrupted run's per-step losses
and weights; a killed save never leaves a checkpoint that looks complete."""

import json
import math
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from flashscale.train import checkpoint as ckpt
from flashscale.train.config import load_config
from flashscale.train.logger import read_jsonl
from flashscale.train.schedule import lr_at
from flashscale.train.trainer import Trainer

STEPS, EVERY = 12, 4  # checkpoints at steps 4, 8, 12
THREADS = 1  # every run of a comparison must use the same count (it changes the CPU kernels' summation order)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # One intra-op thread: these models are tiny, and on a shared 2-core machine an OpenMP team of 2
    # whose second thread is descheduled stalls every op at its barrier (measured 16x slower steps).
    before = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    # One tokenizer + token file for the session's training tests (test_trainer, test_cli_train_demo,
    # their subprocesses): same settings, same content-hashed cache entries.
    path = tmp_path_factory.getbasetemp() / "train-cache"
    path.mkdir(exist_ok=True)
    return path


def overrides(cache, **extra):
    base = {"data.cache_dir": str(cache), "data.vocab_size": "1024", "data.tokenizer_max_chars": "1000000",
            "data.seq_len": "32", "train.batch_size": "4", "train.steps": str(STEPS), "train.lr": "3e-3",
            "train.warmup_steps": "2", "train.device": "cpu", "log.every": "1", "log.tensorboard": "false",
            "log.eval_batches": "2", "checkpoint.every": str(EVERY), "checkpoint.keep": "2"}
    base.update(extra)
    return [t for k, v in base.items() for t in (f"--{k}", v)]


def losses_in_log(out_dir):
    return [r["loss"] for r in read_jsonl(out_dir / "log.jsonl") if "loss" in r]


def master_weights(trainer):
    return {k: v.clone() for k, v in trainer.engine.state_dict()["model"].items()}


@pytest.fixture(scope="module")
def reference(cache, tmp_path_factory):
    """The uninterrupted run: (per-step losses, final weights, out dir)."""
    out = tmp_path_factory.mktemp("ref")
    tr = Trainer(load_config("tiny", overrides(cache)), out_dir=out, progress=False, quiet=False)
    result = tr.fit()
    assert result.steps == STEPS and len(result.losses) == STEPS
    assert losses_in_log(out) == result.losses
    return result.losses, master_weights(tr), out


CHILD = textwrap.dedent("""
    import os, signal, sys, json
    import torch
    torch.set_num_threads(%d)
    from flashscale.train.config import load_config
    from flashscale.train.trainer import Trainer
    from flashscale.train import checkpoint as ckpt
    overrides, out, kill_at_step, kill_in_save = json.loads(sys.argv[1])
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    if kill_in_save:  # everything of this checkpoint written and fsynced, not yet renamed
        fsync_tree = ckpt._fsync_tree
        def fsync_then_die(path):
            fsync_tree(path)
            if path.name == ".tmp-" + ckpt.step_dir_name(kill_in_save):
                die()
        ckpt._fsync_tree = fsync_then_die
    on_step = (lambda step, rec: die() if step == kill_at_step else None) if kill_at_step else None
    Trainer(load_config("tiny", overrides), out_dir=out, progress=False, quiet=True, on_step=on_step).fit()
""" % THREADS)


def run_killed_child(tmp_path, overrides_, out, *, kill_at_step=0, kill_in_save=0):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.run([sys.executable, str(script), json.dumps([overrides_, str(out), kill_at_step, kill_in_save])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def test_loss_decreases_on_bundled_corpus(cache, tmp_path):
    ov = overrides(cache, **{"train.steps": "40", "data.seq_len": "64", "train.batch_size": "8",
                             "checkpoint.every": "0", "log.every": "10", "log.tensorboard": "true",
                             "log.eval_every": "20"})
    tr = Trainer(load_config("tiny", ov), out_dir=tmp_path, progress=False)
    result = tr.fit()
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    vocab = tr.model_config.vocab_size
    assert result.losses[0] == pytest.approx(math.log(vocab), abs=0.3)  # a fresh model guesses uniformly
    assert last < first - 0.8, result.losses
    assert result.val_loss < math.log(vocab) - 0.5 and result.val_ppl == pytest.approx(math.exp(result.val_loss))
    log = read_jsonl(tmp_path / "log.jsonl")
    train_recs = [r for r in log if "loss" in r]
    assert [r["step"] for r in train_recs] == [10, 20, 30, 40]
    assert [r["step"] for r in log if "val_loss" in r] == [20, 40]
    for r in train_recs:
        assert r["mfu"] is None and r["tokens_per_s"] > 0 and r["peak_mem"] > 0  # CPU: no MFU
        assert r["lr"] == pytest.approx(lr_at(r["step"] - 1, lr=3e-3, min_lr=3e-4, warmup_steps=2, total_steps=40))
    assert any((tmp_path / "tensorboard").iterdir())
    assert json.loads((tmp_path / "config.json").read_text())["train"]["steps"] == 40


def test_sigkill_between_checkpoints_resumes_exactly(cache, reference, tmp_path):
    ref_losses, ref_weights, _ = reference
    out = tmp_path / "run"
    ov = overrides(cache)
    run_killed_child(tmp_path, ov, out, kill_at_step=10)  # dies after step 10: step 8 is the newest checkpoint
    assert [p.name for p in ckpt.list_checkpoints(out / "checkpoints")] == ["step-00000004", "step-00000008"]
    assert losses_in_log(out) == ref_losses[:9]  # steps 1..9 were logged before the kill

    tr = Trainer(load_config("tiny", ov), out_dir=out, progress=False)
    result = tr.fit(resume="auto")
    assert result.steps_run == STEPS - 8
    assert result.losses == ref_losses[8:]  # bitwise: float32 on the CPU
    assert losses_in_log(out) == ref_losses  # the log was rewound to step 8, then continued
    weights = master_weights(tr)
    assert all(torch.equal(weights[k], ref_weights[k]) for k in ref_weights)
    assert [p.name for p in ckpt.list_checkpoints(out / "checkpoints")] == ["step-00000008", "step-00000012"]


def test_sigkill_inside_checkpoint_write_leaves_no_complete_checkpoint(cache, reference, tmp_path):
    ref_losses, ref_weights, _ = reference
    out = tmp_path / "run"
    ov = overrides(cache)
    run_killed_child(tmp_path, ov, out, kill_in_save=8)
    ckdir = out / "checkpoints"
    leftover = ckdir / ".tmp-step-00000008"
    assert leftover.is_dir() and (leftover / ckpt.TRAINER_FILE).is_file()  # fully written, never renamed
    assert ckpt.latest_checkpoint(ckdir).name == "step-00000004"  # ... so it does not count
    with pytest.raises(FileNotFoundError, match="not a complete training checkpoint"):
        ckpt.resolve_resume(leftover, ckdir)

    tr = Trainer(load_config("tiny", ov), out_dir=out, progress=False)
    result = tr.fit(resume="auto")
    assert not leftover.exists()
    assert result.losses == ref_losses[4:]
    assert losses_in_log(out) == ref_losses
    weights = master_weights(tr)
    assert all(torch.equal(weights[k], ref_weights[k]) for k in ref_weights)


def test_resume_explicit_path_and_finished_run(cache, reference, tmp_path):
    ref_losses, _, ref_out = reference
    step8 = ref_out / "checkpoints" / "step-00000008"
    state = ckpt.read_trainer_state(step8)
    assert state["step"] == 8 and state["sampler"]["position"] > 0
    # a fresh output folder resumed from another run's checkpoint continues that run exactly
    tr = Trainer(load_config("tiny", overrides(cache)), out_dir=tmp_path / "fork", progress=False, quiet=True)
    assert tr.fit(resume=step8).losses == ref_losses[8:]
    # resuming a finished run trains nothing
    tr = Trainer(load_config("tiny", overrides(cache)), out_dir=ref_out, progress=False, quiet=True)
    assert tr.fit(resume="auto").steps_run == 0
    with pytest.raises(FileNotFoundError, match="not a complete training checkpoint"):
        Trainer(load_config("tiny", overrides(cache)), out_dir=tmp_path / "x", quiet=True).fit(resume=tmp_path / "none")


def test_failed_save_leaves_nothing(tmp_path):
    def broken_engine_save(directory):
        (directory / "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path, 3, save_engine=broken_engine_save, trainer_state={})
    assert list(tmp_path.iterdir()) == []
    # pruning keeps the newest K, oldest removed first
    for step in (1, 2, 3):
        ckpt.save_checkpoint(tmp_path, step, save_engine=lambda d: None, trainer_state={"x": step}, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    assert ckpt.read_trainer_state(tmp_path / "step-00000003") == {"step": 3, "x": 3}


def test_schedule_warmup_then_cosine():
    kw = dict(lr=1.0, min_lr=0.1, warmup_steps=4, total_steps=20)
    assert [lr_at(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(19, **kw) == pytest.approx(0.1)
    values = [lr_at(s, **kw) for s in range(4, 20)]
    assert all(a > b for a, b in zip(values, values[1:]))  # strictly decreasing after warmup
    assert lr_at(11.5, **kw) == pytest.approx(0.55)  # halfway through the decay: the mean of lr and min_lr


def test_bf16_engine_keeps_fp32_masters():
    """bf16 weights, fp32 masters: an update far below bf16's resolution still accumulates in the
    masters (a bf16-only AdamW would drop it), and the weights are the masters rounded."""
    from flashscale.models.config import preset
    from flashscale.models.llama import Llama
    from flashscale.train.engine import OptimConfig, SingleDeviceEngine

    model = Llama(preset("tiny", vocab_size=64)).init_weights(seed=0)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    eng = SingleDeviceEngine(model, OptimConfig(weight_decay=0.0), device="cpu", dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters()) and model.inv_freq.dtype == torch.float32
    assert all(torch.equal(m, init[n]) for n, m in zip(eng.names, eng.masters))  # exact fp32 start
    x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        out = eng.train_step(x, x.roll(-1, 1), lr=1e-5, micro_batches=2, max_grad_norm=1.0)
    assert out["loss"].dtype == torch.float32 and math.isfinite(float(out["grad_norm"]))
    moved = [(m - init[n]).abs().max().item() for n, m in zip(eng.names, eng.masters)]
    assert all(0 < d < 1e-4 for d in moved)  # Adam moves each weight by ~lr a step
    for n, p in model.named_parameters():
        master = eng.masters[eng.names.index(n)]
        assert torch.equal(p, master.to(torch.bfloat16))


def test_time_budget_fits_the_schedule_and_stops(cache, tmp_path):
    ov = overrides(cache, **{"train.steps": "100000", "train.time_budget": "2.0", "checkpoint.every": "0",
                             "log.every": "1000"})
    result = Trainer(load_config("tiny", ov), out_dir=tmp_path, progress=False, quiet=True).fit()
    assert 3 <= result.steps < 100000 and result.seconds >= 2.0
    last = [r for r in read_jsonl(tmp_path / "log.jsonl") if "loss" in r][-1]
    assert last["step"] == result.steps  # the last step is logged
    assert last["lr"] <= 3e-4 + 0.25 * (3e-3 - 3e-4)  # the cosine was re-fitted to end with the budget


def test_document_masking_trains_on_the_corpus_documents(cache, tmp_path):
    """train.document_masking: the model cuts attention at the corpus's end-of-document tokens (a row across a
    boundary gives other logits than without the mask), and the loss falls as without it."""
    ov = overrides(cache, **{"train.steps": "30", "data.seq_len": "256", "train.batch_size": "4",
                             "checkpoint.every": "0", "log.every": "10", "train.document_masking": "true"})
    tr = Trainer(load_config("tiny", ov), out_dir=tmp_path, progress=False, quiet=True)
    tr.setup()
    train = torch.from_numpy(tr.data.train[:].astype("int64"))
    at = int(torch.nonzero(train == tr.data.eos_id)[0])  # a row across the first document boundary
    model, x = tr.engine.model, train[max(0, at - 128):][:256][None]
    assert model.document_masking and (x == tr.data.eos_id).any()
    with torch.no_grad():
        masked = model(x)
        model.document_masking = False
        plain = model(x)
        model.document_masking = True
    assert not torch.allclose(masked, plain, atol=1e-4)
    result = tr.fit()
    assert sum(result.losses[-5:]) / 5 < sum(result.losses[:5]) / 5 - 0.5, result.losses
