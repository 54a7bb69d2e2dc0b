"""The training config: TOML files, command-line overrides parsed by the field's type, unknown keys and
wrong types rejected in one line that names the key, the value and what it takes."""

import dataclasses

import pytest

from flashscale.models.config import LlamaConfig
from flashscale.train.config import (Config, ModelSection, available_configs, config_from_dict, diff, load_config,
                                     parse_overrides)


def test_bundled_configs_load_and_build():
    assert {"tiny", "demo", "125M"} <= set(available_configs())
    for name in ("tiny", "demo", "125M"):
        c = load_config(name)
        assert c.model.preset == name
        cfg = c.model.build(vocab_size=c.data.vocab_size)
        assert cfg.max_position_embeddings >= c.data.seq_len
        assert c.train.batch_size % c.train.micro_batches == 0
    assert load_config("125M").train.dtype == "bfloat16"


def test_overrides_parse_by_field_type():
    c = load_config("tiny", ["--train.steps", "7", "--train.lr=2e-3", "--train.betas", "0.8,0.99",
                             "--train.compile", "--log.tensorboard", "false", "--train.max_grad_norm", "none",
                             "--data.files", "[\"a.txt\", \"b/\"]", "--model.hidden_size", "96",
                             "--model.rope_scaling", '{"rope_type": "llama3", "factor": 8.0}',
                             "--train.dtype", "bfloat16", "--model.tie_word_embeddings", "yes",
                             "--data.cache_dir", "/tmp/x"])
    assert c.train.steps == 7 and isinstance(c.train.steps, int)
    assert c.train.lr == 2e-3 and isinstance(c.train.lr, float)
    assert c.train.betas == (0.8, 0.99)
    assert c.train.compile is True and c.log.tensorboard is False
    assert c.train.max_grad_norm is None
    assert c.data.files == ["a.txt", "b/"]
    assert c.model.hidden_size == 96 and c.model.rope_scaling == {"rope_type": "llama3", "factor": 8.0}
    assert c.model.tie_word_embeddings is True and c.train.dtype == "bfloat16"
    assert c.data.cache_dir == "/tmp/x"
    # file values stay where not overridden
    assert c.data.seq_len == load_config("tiny").data.seq_len
    assert c.model.build(vocab_size=300).hidden_size == 96
    # an int given to a float key is a float; later overrides of the same key win
    assert parse_overrides(["--train.lr", "1", "--train.lr", "3"]) == {"train": {"lr": 3.0}}


@pytest.mark.parametrize("overrides, match", [
    (["--train.stepz", "5"], r"unknown config key train\.stepz; valid keys of \[train\]: steps, time_budget, "),
    (["--trian.steps", "5"], r"unknown config section \[trian\]; valid sections: model, data, train, log, checkpoint"),
    (["--train.steps", "abc"], r"config key train\.steps = 'abc': expected int$"),
    (["--train.steps", "2.5"], r"train\.steps = '2\.5': expected int"),
    (["--train.lr", "fast"], r"train\.lr = 'fast': expected float"),
    (["--train.compile", "maybe"], r"train\.compile = 'maybe': expected bool"),
    (["--train.dtype", "fp16"], r"train\.dtype = 'fp16': expected one of 'float32', 'bfloat16'"),
    (["--train.betas", "0.9"], r"train\.betas = '0\.9': expected list of 2 float"),
    (["--model.hidden_size", "big"], r"model\.hidden_size = 'big': expected int or none"),
    (["--train.steps"], r"--train\.steps has no value; expected int"),
    (["steps=5"], r"expected --section\.key VALUE"),
    (["--model.preset", "huge"], r"model\.preset='huge' is not a preset; choose one of: tiny, demo"),
    (["--train.batch_size", "10", "--train.micro_batches", "3"], r"batch_size=10 is not divisible by"),
    (["--train.steps", "0"], r"train\.steps=0: expected a positive int"),
    (["--train.seed", "-3"], r"train\.seed=-3: expected an int >= 0"),
    (["--data.val_fraction", "1.5"], r"data\.val_fraction=1\.5: expected a float in \(0, 1\)"),
])
def test_bad_overrides_are_one_line_errors(overrides, match):
    with pytest.raises(ValueError, match=match) as e:
        load_config("tiny", overrides)
    assert "\n" not in str(e.value)


def test_toml_file_errors(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[train]\nsteps = "many"\n')
    with pytest.raises(ValueError, match=r"run\.toml: config key train\.steps = 'many': expected int"):
        load_config(f)
    f.write_text('[train]\nstepz = 3\n')
    with pytest.raises(ValueError, match=r"unknown config key train\.stepz; valid keys of \[train\]"):
        load_config(f)
    f.write_text('[optimizer]\nlr = 3\n')
    with pytest.raises(ValueError, match=r"unknown config section \[optimizer\]; valid sections: model"):
        load_config(f)
    f.write_text('[train]\nlr = true\n')  # TOML booleans are not numbers
    with pytest.raises(ValueError, match=r"train\.lr = True: expected float"):
        load_config(f)
    f.write_text('[train\nsteps = 3\n')
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(f)
    with pytest.raises(FileNotFoundError, match=r"'nope' is neither a TOML file nor a bundled config; bundled: .*tiny"):
        load_config("nope")
    # a typo in an override is reported before the file is even read
    with pytest.raises(ValueError, match="unknown config key"):
        load_config("nope", ["--train.x", "1"])


def test_file_overrides_and_round_trip(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[model]\npreset = "demo"\nnum_hidden_layers = 2\n[train]\nsteps = 3\nbetas = [0.5, 0.6]\n')
    c = load_config(f, ["--train.steps", "4"])
    assert c.train.steps == 4 and c.train.betas == (0.5, 0.6) and c.model.num_hidden_layers == 2
    back = config_from_dict(c.to_dict())
    assert back == c and diff(back, c) == []
    assert diff(c, Config()) == ["model.preset", "model.num_hidden_layers", "train.steps", "train.betas"]


def test_model_section_covers_every_llama_field():
    """Every LlamaConfig field can be overridden: the section must not fall behind the model config."""
    llama = {f.name for f in dataclasses.fields(LlamaConfig)}
    section = {f.name for f in dataclasses.fields(ModelSection)} - {"preset"}
    assert llama == section
