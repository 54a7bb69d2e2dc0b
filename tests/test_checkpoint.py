"""HF checkpoints: ours -> transformers and transformers -> ours with equal logits, shards, atomic
writes, and a one-line error for every kind of broken checkpoint."""

import json
import math
import os
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from flashscale.errors import UserError
from flashscale.models import Llama, preset
from flashscale.models.checkpoint import load_config, load_hf, parse_dtype, parse_size, save_hf

transformers = pytest.importorskip("transformers")


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def _tiny(tie, **kw):
    return Llama(preset("tiny", tie_word_embeddings=tie, **kw)).init_weights(seed=3).eval()


@pytest.fixture
def ids():
    return torch.randint(0, 512, (2, 23), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("tie", [False, True])
def test_ours_to_transformers(tmp_path, ids, tie):
    ours = _tiny(tie, attention_bias=tie)  # GQA (4 heads, 2 kv heads); biases in one case
    save_hf(ours, tmp_path / "ck")
    names = set(load_file(tmp_path / "ck" / "model.safetensors"))
    assert ("lm_head.weight" in names) != tie  # HF convention: a tied head is not stored
    assert "model.layers.1.self_attn.k_proj.weight" in names
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ck", dtype=torch.float32).eval()
    with torch.no_grad():
        assert _rel(ours(ids), hf(ids).logits) <= 1e-5


@pytest.mark.parametrize("tie", [False, True])
def test_transformers_to_ours(tmp_path, ids, tie):
    cfg = preset("tiny", tie_word_embeddings=tie)
    torch.manual_seed(5)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg.to_hf_dict())).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf")
    assert ours.config == cfg
    assert (ours.lm_head.weight is ours.embed_tokens.weight) == tie
    assert ours.inv_freq.dtype == torch.float32
    with torch.no_grad():
        assert _rel(ours(ids), hf(ids).logits) <= 1e-5


def test_sharded_round_trip_and_dtype(tmp_path, ids):
    ours = _tiny(False)
    save_hf(ours, tmp_path / "sh", max_shard_size="60KB")
    files = sorted(p.name for p in (tmp_path / "sh").iterdir())
    shards = [f for f in files if f.startswith("model-")]
    assert len(shards) > 2 and f"-of-{len(shards):05d}.safetensors" in shards[0]
    index = json.loads((tmp_path / "sh" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in ours.parameters())
    back = load_hf(tmp_path / "sh")
    for (n, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), n
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "sh", dtype=torch.float32).eval()
    with torch.no_grad():
        assert _rel(back(ids), hf(ids).logits) <= 1e-5

    save_hf(ours, tmp_path / "bf", dtype="bfloat16")
    assert json.loads((tmp_path / "bf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    as_stored = load_hf(tmp_path / "bf")
    assert as_stored.embed_tokens.weight.dtype == torch.bfloat16
    assert as_stored.inv_freq.dtype == torch.float32  # RoPE frequencies stay float32
    up = load_hf(tmp_path / "bf", dtype=torch.float32)
    assert torch.equal(up.layers[0].mlp.up_proj.weight, ours.layers[0].mlp.up_proj.weight.bfloat16().float())


def test_save_with_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2, "hi": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    save_hf(_tiny(True), tmp_path / "t", tokenizer=tok,
            extra_json={"tokenizer_config.json": {"chat_template": "x"}})
    assert Tokenizer.from_file(str(tmp_path / "t" / "tokenizer.json")).encode("hi").ids == [3]
    tc = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
    assert tc["bos_token"] == "<s>" and tc["eos_token"] == "</s>" and tc["chat_template"] == "x"
    gen = json.loads((tmp_path / "t" / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 1, "eos_token_id": 2}


def test_atomic_replace(tmp_path):
    target = tmp_path / "ck"
    save_hf(_tiny(False), target, max_shard_size="60KB")
    assert (target / "model.safetensors.index.json").exists()
    save_hf(_tiny(True), target)  # replaces the whole directory: no stale shards or index
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "generation_config.json",
                                                        "model.safetensors"]
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    with pytest.raises(TypeError, match="tokenizer must be"):  # fails after the weights were written
        save_hf(_tiny(False), target, tokenizer=42)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temporary directory left


def test_refuses_to_replace_a_foreign_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="non-empty directory without config.json"):
        save_hf(_tiny(False), tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_nan_is_loaded_not_rejected(tmp_path):
    m = _tiny(False)
    with torch.no_grad():
        m.norm.weight[0] = float("nan")
    save_hf(m, tmp_path / "n")
    assert math.isnan(load_hf(tmp_path / "n").norm.weight[0].item())


# ----------------------------------------------------------------------------------- error paths

@pytest.fixture
def ck(tmp_path):
    save_hf(_tiny(False), tmp_path / "ck")
    return tmp_path / "ck"


def _one_line(excinfo):
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_missing_directory_and_files(tmp_path, ck):
    with pytest.raises(FileNotFoundError, match="does not exist") as e:
        load_hf(tmp_path / "nope")
    assert "nope" in _one_line(e)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        load_hf(tmp_path / "file")
    (ck / "model.safetensors").rename(tmp_path / "weights")
    with pytest.raises(FileNotFoundError, match="expected model.safetensors or model.safetensors.index.json"):
        load_hf(ck)
    (ck / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json not found"):
        load_hf(ck)


def test_bad_config_json(ck):
    (ck / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="config.json is not valid JSON"):
        load_config(ck)
    (ck / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UserError, match="model_type='bert' is not a Llama"):
        load_config(ck)


def test_bad_safetensors_header(ck):
    path = ck / "model.safetensors"
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    data[8:8 + n] = b"{" + b"x" * (n - 1)  # same length, not JSON
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="model.safetensors: bad safetensors header") as e:
        load_hf(ck)
    _one_line(e)
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(UserError, match=r"bad safetensors header \(header length"):
        load_hf(ck)
    path.write_bytes(b"abc")
    with pytest.raises(UserError, match="not a safetensors file"):
        load_hf(ck)


def test_truncated_file(ck):
    path = ck / "model.safetensors"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(UserError, match=rf"model.safetensors is truncated: .* describes {size} bytes, "
                                        rf"the file holds {size - 1000}") as e:
        load_hf(ck)
    _one_line(e)


def test_shape_disagrees_with_config(ck):
    cfg = json.loads((ck / "config.json").read_text())
    cfg["intermediate_size"] = 200
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=r"tensor model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight has shape "
                                        r"\[\d+, \d+\] but config\.json implies \[\d+, \d+\]") as e:
        load_hf(ck)
    assert "176" in _one_line(e) and "200" in str(e.value)


def test_missing_and_unexpected_tensors(ck):
    path = ck / "model.safetensors"
    sd = load_file(path)
    del sd["model.layers.1.mlp.up_proj.weight"]
    sd["model.layers.7.extra.weight"] = torch.zeros(2)
    save_file(sd, str(path))
    with pytest.raises(UserError, match=r"missing tensors model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf(ck)
    sd["model.layers.1.mlp.up_proj.weight"] = torch.zeros(176, 64)
    save_file(sd, str(path))
    with pytest.raises(UserError, match=r"unexpected tensors model\.layers\.7\.extra\.weight"):
        load_hf(ck)


def test_index_names_a_missing_shard(tmp_path):
    save_hf(_tiny(False), tmp_path / "sh", max_shard_size="60KB")
    second = sorted((tmp_path / "sh").glob("model-00002-of-*.safetensors"))[0]
    second.unlink()
    with pytest.raises(FileNotFoundError, match=rf"{second.name} \(listed in model\.safetensors\.index\.json"):
        load_hf(tmp_path / "sh")


def test_argument_validation(tmp_path):
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2MiB") == 2 << 20 and parse_size(10) == 10
    for bad in ("lots", 0, -1, "0MB"):
        with pytest.raises(ValueError, match="max_shard_size"):
            parse_size(bad)
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype(None) is None
    with pytest.raises(ValueError, match="dtype='int8' is not supported"):
        parse_dtype("int8")
    with pytest.raises(TypeError, match="model must be a flashscale Llama"):
        save_hf(torch.nn.Linear(2, 2), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_loads_lazily_tensor_by_tensor(ck, monkeypatch):
    """No full state dict in memory: tensors are read one at a time through safe_open."""
    import flashscale.models.checkpoint as ckpt

    reads = []

    class Spy:
        def __init__(self, *a, **k):
            self.f = safe_open(*a, **k)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def get_tensor(self, name):
            reads.append(name)
            return self.f.get_tensor(name)

        def get_slice(self, name):
            return self.f.get_slice(name)

    monkeypatch.setattr(ckpt, "safe_open", Spy)
    load_hf(ck)
    assert len(reads) == len(set(reads)) == len(load_file(ck / "model.safetensors"))
    assert os.path.exists(ck)
