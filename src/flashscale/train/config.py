"""The training run's typed configuration: TOML files (src/flashscale/configs/*.toml or any path) plus
command-line overrides (`--train.steps 200`), checked against the dataclasses below.

Every value is checked against its field's annotation (bool/int/float/str/Literal/list/tuple/dict,
Optional); an unknown section or key is rejected with the list of valid ones; a wrong type is a
one-line ValueError naming the key, the value and the expected type. Defaults are written once, here.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from flashscale.models.config import PRESETS, LlamaConfig, preset
from flashscale.parallel.config import ParallelConfig
from flashscale.train.typed import Mismatch, coerce, parse_text, type_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclass(kw_only=True)
class ModelSection:
    """A preset (flashscale.models.config.PRESETS) and overrides of its LlamaConfig fields (None: keep
    the preset's). vocab_size None: the tokenizer's vocabulary size."""

    preset: str = "tiny"
    vocab_size: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int | None = None
    rms_norm_eps: float | None = None
    rope_theta: float | None = None
    rope_scaling: dict | None = None
    tie_word_embeddings: bool | None = None
    attention_bias: bool | None = None
    mlp_bias: bool | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    initializer_range: float | None = None

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"model.preset={self.preset!r} is not a preset; choose one of: {', '.join(PRESETS)}")

    def overrides(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "preset" and getattr(self, f.name) is not None}

    def build(self, **extra: Any) -> LlamaConfig:
        """The LlamaConfig: the preset, then `extra` (e.g. the tokenizer's vocab size), then this
        section's explicit overrides, which win."""
        return preset(self.preset, **{**extra, **self.overrides()})


@dataclass(kw_only=True)
class DataSection:
    # Each entry: "bundled" (the bundled training texts: austen + scofield), a file (.txt, .xz, .jsonl
    # with a "text" field), a directory (its *.txt, *.txt.xz, *.jsonl) or a glob pattern.
    files: list[str] = field(default_factory=lambda: ["bundled"])
    # Validation documents kept apart from `files` (same entry kinds; "bundled-eval" is the bundled
    # held-out moby_dick). Empty: the tail of `files` is split off instead (val_fraction).
    val_files: list[str] = field(default_factory=list)
    # "train": train a byte-level BPE tokenizer of `vocab_size` on `files` (cached); else a path to a
    # tokenizer.json, a model directory holding one, or a .gguf file.
    tokenizer: str = "train"
    vocab_size: int = 4096
    # Cap on the characters the tokenizer trains on (spread over the files): BPE merges settle on a
    # few MB, and training time grows with the text. None: all of it.
    tokenizer_max_chars: int | None = 20_000_000
    seq_len: int = 256
    val_fraction: float = 0.05  # without val_files: the tail of the token stream, cut on a document boundary
    cache_dir: str | None = None  # None: $XDG_CACHE_HOME/flashscale (or ~/.cache/flashscale)

    def __post_init__(self) -> None:
        if not self.files:
            raise ValueError("data.files is empty; give at least one file, directory, glob or 'bundled'")
        _positive(self, "data", "vocab_size", "seq_len")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={self.val_fraction!r}: expected a float in (0, 1)")


@dataclass(kw_only=True)
class TrainSection:
    steps: int = 100
    # Seconds of training (validation and checkpoints excluded), or None. With a budget, train.steps is
    # an upper bound and the cosine's length is re-estimated every step from the measured step time, so
    # the decay ends when the budget does; the run is then not reproducible step for step (its log
    # records the steps it took: rerun with that train.steps and no budget to repeat it exactly).
    time_budget: float | None = None
    batch_size: int = 16  # global batch, in sequences of data.seq_len tokens
    micro_batches: int = 1  # gradient accumulation: batch_size is split into this many micro-batches
    lr: float = 1e-3
    min_lr: float = 1e-4  # end of the cosine decay
    warmup_steps: int = 10
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0  # None: no clipping (the norm is still reported)
    seed: int = 0
    # "bfloat16": bf16 weights and activations with fp32 master weights and AdamW states (see engine.py)
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    activation_checkpointing: Literal["none", "full", "attention"] = "none"
    # attention within documents (a sequence is cut after each eos token, RoPE positions restart at 0 in each:
    # Megatron's reset_attention_mask + reset_position_ids), through the varlen attention kernels
    document_masking: bool = False
    compile: bool = False  # torch.compile the model's forward
    # torch.use_deterministic_algorithms + fixed cuBLAS workspace: a rerun gives the same losses
    deterministic: bool = True

    def __post_init__(self) -> None:
        _positive(self, "train", "steps", "batch_size", "micro_batches")
        if self.batch_size % self.micro_batches:
            raise ValueError(f"train.batch_size={self.batch_size} is not divisible by "
                             f"train.micro_batches={self.micro_batches}")
        if not self.lr > 0 or not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"train.lr={self.lr!r}, train.min_lr={self.min_lr!r}: expected 0 <= min_lr <= lr, lr > 0")
        if self.time_budget is not None and not self.time_budget > 0:
            raise ValueError(f"train.time_budget={self.time_budget!r}: expected seconds > 0, or none")
        if self.seed < 0:
            raise ValueError(f"train.seed={self.seed!r}: expected an int >= 0")
        if self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps={self.warmup_steps!r}: expected an int >= 0")
        if self.weight_decay < 0:
            raise ValueError(f"train.weight_decay={self.weight_decay!r}: expected a float >= 0")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"train.betas={list(self.betas)!r}: expected two floats in [0, 1)")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"train.max_grad_norm={self.max_grad_norm!r}: expected a float > 0, or none")


@dataclass(kw_only=True)
class LogSection:
    every: int = 10  # console / JSONL / TensorBoard every this many steps
    eval_every: int = 0  # validation loss every this many steps (0: only at the end)
    eval_batches: int = 8  # fixed validation set: the first eval_batches x batch_size windows
    jsonl: bool = True  # OUT/log.jsonl
    tensorboard: bool = True  # OUT/tensorboard (skipped with a note if tensorboard is not installed)

    def __post_init__(self) -> None:
        _positive(self, "log", "every", "eval_batches")
        if self.eval_every < 0:
            raise ValueError(f"log.eval_every={self.eval_every!r}: expected an int >= 0")


@dataclass(kw_only=True)
class CheckpointSection:
    dir: str | None = None  # None: OUT/checkpoints
    every: int = 0  # a checkpoint every this many steps (0: only at the end)
    keep: int = 2  # the newest `keep` checkpoints are kept

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"checkpoint.every={self.every!r}: expected an int >= 0")
        _positive(self, "checkpoint", "keep")


@dataclass(kw_only=True)
class Config:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    log: LogSection = field(default_factory=LogSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    # the (pp, dp, tp) layout, ZeRO stage, pipeline schedule (flashscale.parallel; used under torchrun
    # or when any key is set)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples as lists); `config_from_dict` reads it back."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


def _positive(obj: Any, section: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ValueError(f"{section}.{name}={value!r}: expected a positive int")


# --------------------------------------------------------------------------------------------- loading

def sections() -> dict[str, type]:
    """Section name -> its dataclass."""
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config)}


def keys(section: str) -> dict[str, Any]:
    """Key name -> type annotation of one section."""
    cls = sections()[section]
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _check_key(section: str, key: str, where: str) -> Any:
    secs = sections()
    if section not in secs:
        raise ValueError(f"{where}: unknown config section [{section}]; valid sections: {', '.join(secs)}")
    ks = keys(section)
    if key not in ks:
        raise ValueError(f"{where}: unknown config key {section}.{key}; valid keys of [{section}]: {', '.join(ks)}")
    return ks[key]


def parse_overrides(overrides: list[str]) -> dict[str, dict[str, Any]]:
    """["--train.steps", "200", "--model.preset=tiny", "--train.compile"] -> {section: {key: value}}.

    A bool key given without a value means true; "none" sets an optional key to None."""
    out: dict[str, dict[str, Any]] = {}
    i = 0
    while i < len(overrides):
        tok = overrides[i]
        if not tok.startswith("--") or "." not in tok:
            raise ValueError(f"config override {tok!r}: expected --section.key VALUE (e.g. --train.steps 200)")
        name, eq, text = tok[2:].partition("=")
        section, _, key = name.partition(".")
        tp = _check_key(section, key, f"override --{name}")
        if not eq:
            nxt = overrides[i + 1] if i + 1 < len(overrides) else None
            if nxt is None or nxt.startswith("--"):
                if tp is not bool:
                    raise ValueError(f"config override --{name} has no value; expected {type_name(tp)}")
                text = "true"
            else:
                text = nxt
                i += 1
        i += 1
        try:
            value = parse_text(text, tp)
        except Mismatch:
            raise ValueError(f"config key {section}.{key} = {text!r}: expected {type_name(tp)}") from None
        out.setdefault(section, {})[key] = value
    return out


def config_from_dict(d: dict[str, Any], *, where: str = "config") -> Config:
    """A Config from {section: {key: value}} (a parsed TOML file, or `Config.to_dict()`)."""
    if not isinstance(d, dict):
        raise TypeError(f"{where}: expected a table of sections, got {type(d).__name__}")
    built = {}
    for section, body in d.items():
        if section not in sections():
            _check_key(section, "", where)
        if not isinstance(body, dict):
            raise ValueError(f"{where}: [{section}] must be a table of keys, got {body!r}")
        values = {}
        for key, value in body.items():
            tp = _check_key(section, key, where)
            try:
                values[key] = coerce(value, tp)
            except Mismatch:
                raise ValueError(f"{where}: config key {section}.{key} = {value!r}: expected {type_name(tp)}") from None
        built[section] = sections()[section](**values)
    return Config(**built)


def available_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def resolve_config_path(path_or_name: str | Path) -> Path:
    """A path to a TOML file, or the name of one of the bundled configs (tiny, demo, 125M, ...)."""
    p = Path(path_or_name).expanduser()
    if p.is_file():
        return p
    named = CONFIG_DIR / f"{path_or_name}.toml"
    if "/" not in str(path_or_name) and named.is_file():
        return named
    raise FileNotFoundError(f"config {str(path_or_name)!r} is neither a TOML file nor a bundled config; "
                            f"bundled: {', '.join(available_configs())}")


def load_config(path_or_name: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """The Config of a TOML file (or bundled config name; None: the defaults) with `overrides`
    (["--train.steps", "200", ...]) applied on top. Overrides are checked first, so a typo in one
    is reported even when the file is fine."""
    parsed = parse_overrides(list(overrides or []))
    raw: dict[str, Any] = {}
    where = "config"
    if path_or_name is not None:
        path = resolve_config_path(path_or_name)
        where = str(path)
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML: {e}") from None
    for section, values in parsed.items():
        body = raw.setdefault(section, {})
        if not isinstance(body, dict):
            raise ValueError(f"{where}: [{section}] must be a table of keys, got {body!r}")
        body.update(values)
    return config_from_dict(raw, where=where)


def diff(a: Config, b: Config) -> list[str]:
    """The "section.key" names whose values differ between two configs."""
    da, db = a.to_dict(), b.to_dict()
    return [f"{s}.{k}" for s in da for k in da[s] if da[s][k] != db[s][k]]
