"""`flashscale train` and `flashscale demo` from the command line: user errors are one line and exit 2;
a tiny training run writes a loadable HF model; `demo --quick` runs end to end on the CPU."""

import json
import os
import subprocess
import sys

import pytest

from flashscale.cli import main


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    # One tokenizer + token file for the session's training tests (test_trainer, test_cli_train_demo,
    # their subprocesses): same settings, same content-hashed cache entries.
    path = tmp_path_factory.getbasetemp() / "train-cache"
    path.mkdir(exist_ok=True)
    return path


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["--model.preset", "huge"], "model.preset='huge' is not a preset; choose one of: tiny, demo, 125M"),
    (["--train.steps", "ten"], "config key train.steps = 'ten': expected int"),
    (["--train.betas", "0.9"], "config key train.betas = '0.9': expected list of 2 float"),
    (["--train.stepz", "3"], "unknown config key train.stepz; valid keys of [train]: steps, time_budget, batch_size"),
    (["--data.files", "/no/such/corpus.txt"], "data.files: corpus path '/no/such/corpus.txt' does not exist"),
    (["--data.tokenizer", "/no/such/tokenizer.json"], "tokenizer path '/no/such/tokenizer.json' does not exist"),
    (["--data.val_files", "/no/such/dir/"], "data.val_files: corpus path '/no/such/dir/' does not exist"),
    (["--data.val_files", "bundled"], "data.val_files shares files with data.files"),
])
def test_train_user_errors_are_one_line(capsys, tmp_path, cache, argv, message):
    code, out, err = run_cli(capsys, "train", "tiny", "--out", str(tmp_path), "--data.cache_dir", str(cache), *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashscale train: error: ") and message in lines[0], err
    assert "Traceback" not in err


def test_train_unknown_config_file(capsys):
    code, _, err = run_cli(capsys, "train", "no_such_config")
    assert code == 2 and "config 'no_such_config' is neither a TOML file nor a bundled config; bundled:" in err


def test_train_tiny_writes_loadable_model(capsys, tmp_path, cache):
    from flashscale.data.tokenizer import load_tokenizer
    from flashscale.models.checkpoint import load_hf

    out = tmp_path / "run"
    code, stdout, err = run_cli(capsys, "train", "tiny", "--out", str(out), "--no-progress",
                                "--data.cache_dir", str(cache), "--data.vocab_size", "1024",
                                "--data.tokenizer_max_chars", "1000000", "--train.steps", "6",
                                "--log.every", "3", "--log.tensorboard", "false", "--checkpoint.every", "3")
    assert code == 0, err
    assert "flashscale train: summary" in stdout and "validation loss / perplexity" in stdout
    model = load_hf(out / "final")
    assert model.config.vocab_size == load_tokenizer(out / "final").get_vocab_size() == 1024
    assert json.loads((out / "config.json").read_text())["train"]["steps"] == 6
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000003", "step-00000006"]
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [3, 6]


def test_demo_quick_end_to_end(tmp_path, cache):
    env = {**os.environ, "FLASHSCALE_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "flashscale", "demo", "--quick", "--device", "cpu",
                           "--out", str(tmp_path / "demo")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "unigram baseline" in out and "demo model (float32)" in out
    for prompt in ("It is a truth universally acknowledged", "The ship sailed", "And the LORD said"):
        assert prompt in out
    assert (tmp_path / "demo" / "model" / "model.safetensors").is_file()
    assert (tmp_path / "demo" / "model" / "tokenizer.json").is_file()
    # the 4-bit rows, each a finite perplexity, and the GPTQ checkpoint loads back
    ppl = {}
    for line in out.splitlines():
        if "│" in line and "perplexity" not in line:
            cells = [c.strip() for c in line.split("│") if c.strip()]
            if len(cells) == 2:
                ppl[cells[0]] = float(cells[1])
    assert any(k.startswith("demo model, RTN 4-bit") for k in ppl), ppl
    gptq = [v for k, v in ppl.items() if k.startswith("demo model, GPTQ 4-bit")]
    assert gptq and all(0 < v < float("inf") for v in ppl.values()), ppl
    from flashscale.quant.io import load_quantized, read_quantization_config

    qdir = tmp_path / "demo" / "model-gptq-4bit"
    assert read_quantization_config(qdir)["bits"] == 4
    load_quantized(qdir)


def test_demo_rejects_bad_steps(capsys):
    code, _, err = run_cli(capsys, "demo", "--steps", "0")
    assert code == 2 and "--steps: takes an int >= 1, got 0" in err

