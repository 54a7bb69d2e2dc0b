"""HF Llama checkpoints: save ours so transformers' LlamaForCausalLM loads them, load theirs into ours.

Layout (what `save_pretrained` writes): config.json, generation_config.json, model.safetensors or
model-0000i-of-0000n.safetensors + model.safetensors.index.json, and optionally tokenizer.json +
tokenizer_config.json. Tensor names are ours with a "model." prefix, except lm_head.weight, which is not
stored when the embeddings are tied (HF's convention; restored by tying on load).

Writes are atomic: everything goes into a temporary directory beside the target, is fsynced, and only
then renamed over the target, so a crash leaves either the old checkpoint or the new one, never a mix.
Loads are lazy (safetensors safe_open, one tensor at a time into a model built on the meta device), so
peak memory stays about one model.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from flashscale.errors import UserError
from flashscale.models.config import LlamaConfig
from flashscale.models.llama import Llama, rope_inv_freq

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# safetensors header dtype codes -> bytes per element, to check a header against the file size.
_ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


def parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """None, a torch floating dtype, or one of 'float32', 'float16', 'bfloat16' -> torch.dtype or None."""
    if dtype is None or isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in _DTYPES:
        return _DTYPES[dtype.removeprefix("torch.")]
    raise ValueError(f"dtype={dtype!r} is not supported; use one of {', '.join(_DTYPES)}")


def parse_size(size: int | str) -> int:
    """Bytes from an int or a string like '5GB', '500MB', '2GiB' (HF's decimal GB, binary GiB)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(size), flags=re.IGNORECASE)
    if isinstance(size, str) and m:
        unit = (m.group(2) or "B").upper()
        base = 1024 if "I" in unit else 1000
        power = "BKMGT".index(unit[0])
        n = int(float(m.group(1)) * base ** power)
        if n > 0:
            return n
    raise ValueError(f"max_shard_size={size!r} must be a positive int of bytes or a size like '5GB'")


# ----------------------------------------------------------------------------------------- writing

@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[Path]:
    """Yields an empty temporary directory beside `target`; on success it replaces `target` whole.

    An existing target is moved aside only after the new directory is complete and fsynced, and
    removed after the rename; on an exception the temporary directory is deleted and target untouched.
    (A crash between the two renames leaves the old checkpoint in .NAME.old-*/x beside the target.)
    """
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"{target} exists and is not a directory; cannot write a checkpoint there")
    if target.is_dir() and any(target.iterdir()) and not (target / CONFIG_FILE).is_file():
        # Replacing the whole directory would delete files that are not ours.
        raise ValueError(f"{target} is a non-empty directory without {CONFIG_FILE}; refusing to replace it "
                         "with a checkpoint (choose a new or empty directory)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        for f in tmp.iterdir():
            _fsync_path(f)
        _fsync_path(tmp)
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.rename(target, old / "x")
        os.rename(tmp, target)
        _fsync_path(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def hf_name(name: str) -> str:
    """Our parameter name -> HF's (a "model." prefix, except the output head)."""
    return name if name == "lm_head.weight" else f"model.{name}"


def _hf_tensors(model: Llama) -> dict[str, torch.Tensor]:
    """HF name -> our tensor (no copy); the tied lm_head is left out, as HF does."""
    return {hf_name(k): v for k, v in model.state_dict().items()
            if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}


def hf_state_dict(model: Llama, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Our state dict under HF names (CPU, contiguous, in `dtype` if given); tied lm_head left out."""
    out = {}
    for name, t in _hf_tensors(model).items():
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[name] = t.to("cpu").contiguous()
    return out


def _shards(sd: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Greedy split in state-dict order; a tensor larger than max_bytes gets a shard of its own."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in sd.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    return shards


def write_hf_files(model: Llama, directory: Path, *, dtype: torch.dtype | None = None, tokenizer=None,
                   max_shard_size: int | str = "5GB",
                   extra_json: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Writes the checkpoint files into an existing directory (not atomic: see save_hf)."""
    config: LlamaConfig = model.config
    sd = hf_state_dict(model, dtype)
    stored = next(iter(sd.values())).dtype
    hf_config = config.to_hf_dict()
    hf_config["torch_dtype"] = str(stored).removeprefix("torch.")
    _write_json(directory / CONFIG_FILE, hf_config)
    gen = {k: getattr(config, k) for k in ("bos_token_id", "eos_token_id") if getattr(config, k) is not None}
    _write_json(directory / "generation_config.json", gen)
    shards = _shards(sd, parse_size(max_shard_size))
    if len(shards) == 1:
        save_file(shards[0], str(directory / SINGLE_FILE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(directory / fname), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, fname))
        total = sum(t.numel() * t.element_size() for t in sd.values())
        _write_json(directory / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    if tokenizer is not None:
        _write_tokenizer(tokenizer, directory, config, (extra_json or {}).get("tokenizer_config.json", {}))
    for fname, obj in (extra_json or {}).items():
        if fname != "tokenizer_config.json":
            _write_json(directory / fname, dict(obj))


def _write_tokenizer(tokenizer, directory: Path, config: LlamaConfig, overrides: Mapping[str, Any]) -> None:
    from tokenizers import Tokenizer

    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = Tokenizer.from_file(str(tokenizer))
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a tokenizers.Tokenizer or a tokenizer.json path, got "
                        f"{type(tokenizer).__name__}")
    tokenizer.save(str(directory / TOKENIZER_FILE))
    # tokenizer_config.json tells transformers' AutoTokenizer to take tokenizer.json as it is (not to
    # rebuild a Llama/SentencePiece tokenizer from it) and which tokens are bos/eos.
    tc: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                          "model_max_length": config.max_position_embeddings}
    for key in ("bos", "eos"):
        tid = getattr(config, f"{key}_token_id")
        if tid is not None and tokenizer.id_to_token(tid) is not None:
            tc[f"{key}_token"] = tokenizer.id_to_token(tid)
    tc.update(overrides)
    _write_json(directory / "tokenizer_config.json", tc)


def save_hf(model: Llama, directory: str | os.PathLike, *, dtype: torch.dtype | str | None = None,
            tokenizer=None, max_shard_size: int | str = "5GB",
            extra_json: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    """Saves `model` as an HF Llama directory, atomically (temp dir beside it, fsync, rename).

    dtype: the stored dtype (None: the model's). tokenizer: a tokenizers.Tokenizer or a tokenizer.json
    path, written as tokenizer.json + tokenizer_config.json. Shards above max_shard_size (HF's '5GB').
    extra_json: more JSON files by name (a "tokenizer_config.json" entry updates the default one).
    """
    if not isinstance(model, Llama):
        raise TypeError(f"model must be a flashscale Llama, got {type(model).__name__}")
    dtype = parse_dtype(dtype)
    max_shard_size = parse_size(max_shard_size)
    with atomic_directory(directory) as tmp:
        write_hf_files(model, tmp, dtype=dtype, tokenizer=tokenizer, max_shard_size=max_shard_size,
                       extra_json=extra_json)
    return Path(directory)


# ----------------------------------------------------------------------------------------- loading

def _check_dir(directory: str | os.PathLike) -> Path:
    d = Path(directory)
    if not d.exists():
        raise FileNotFoundError(f"checkpoint directory {d} does not exist")
    if not d.is_dir():
        raise NotADirectoryError(f"checkpoint {d} is not a directory (expected an HF model directory "
                                 f"with {CONFIG_FILE} and *.safetensors)")
    return d


def load_config(directory: str | os.PathLike) -> LlamaConfig:
    """The LlamaConfig of an HF model directory's config.json."""
    path = _check_dir(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: an HF model directory needs a {CONFIG_FILE}")
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise UserError(f"{path} must hold a JSON object, got {type(d).__name__}")
    try:
        return LlamaConfig.from_hf_dict(d)
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The header of a .safetensors file, checked against the file's size (clear errors for a corrupt
    header or a truncated file, before safetensors' own less specific ones)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise UserError(f"{path} is not a safetensors file: {size} bytes, too short for a header")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100 << 20):
            raise UserError(f"{path}: bad safetensors header (header length {n} bytes, file holds {size})")
        raw = f.read(n)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, stop = info["data_offsets"]
            itemsize = _ST_ITEMSIZE.get(info["dtype"])
            if not 0 <= begin <= stop or itemsize and stop - begin != itemsize * _numel(info["shape"]):
                raise ValueError(f"tensor {name}: offsets do not match dtype {info['dtype']} x shape {info['shape']}")
            end = max(end, stop)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: bad safetensors header ({e})") from None
    if 8 + n + end > size:
        raise UserError(f"{path} is truncated: its header describes {8 + n + end} bytes, the file holds {size}")
    return header


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _weight_files(d: Path) -> dict[str, Path]:
    """HF tensor name -> the .safetensors file that holds it (single file or sharded via the index)."""
    index = d / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise UserError(f"{index}: expected a JSON object with a 'weight_map' ({e})") from None
        files = {}
        for name, fname in weight_map.items():
            path = d / fname
            if not path.is_file():
                raise FileNotFoundError(f"{path} (listed in {INDEX_FILE} for {name}) not found")
            files[name] = path
        return files
    single = d / SINGLE_FILE
    if not single.is_file():
        raise FileNotFoundError(f"no weights in {d}: expected {SINGLE_FILE} or {INDEX_FILE} with its shards")
    return dict.fromkeys((k for k in read_safetensors_header(single) if k != "__metadata__"), single)


def _few(names, n: int = 5) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def load_hf(directory: str | os.PathLike, *, device: str | torch.device = "cpu",
            dtype: torch.dtype | str | None = None) -> Llama:
    """Loads an HF Llama directory into our Llama (eval mode), one tensor at a time.

    dtype: the model's floating dtype (None: as stored). NaN/inf values are loaded as they are.
    """
    d = _check_dir(directory)
    config = load_config(d)
    dtype = parse_dtype(dtype)
    files = _weight_files(d)
    headers = {p: read_safetensors_header(p) for p in set(files.values())}
    for name, path in files.items():
        if name not in headers[path]:
            raise UserError(f"{path} does not hold {name}, which {INDEX_FILE} places there")

    # Shapes from config.json, checked against the files before anything is read.
    with torch.device("meta"):
        model = Llama(config)
    expected = {k: tuple(v.shape) for k, v in _hf_tensors(model).items()}
    missing = set(expected) - set(files)
    unexpected = set(files) - set(expected)
    if config.tie_word_embeddings:
        unexpected.discard("lm_head.weight")  # some exporters store the tied copy too
    # Older HF conversions stored the (recomputable) RoPE frequencies per layer.
    unexpected = {n for n in unexpected if not n.endswith("rotary_emb.inv_freq")}
    where = d / (INDEX_FILE if (d / INDEX_FILE).is_file() else SINGLE_FILE)
    if missing:
        raise UserError(f"{where}: missing tensors {_few(missing)} (config.json describes {len(expected)})")
    if unexpected:
        raise UserError(f"{where}: unexpected tensors {_few(unexpected)} (not in a Llama with this config.json)")
    for name, shape in expected.items():
        got = tuple(headers[files[name]][name]["shape"])
        if got != shape:
            raise UserError(f"{files[name]}: tensor {name} has shape {list(got)} but config.json implies "
                            f"{list(shape)}")

    if dtype is None:
        first = next(iter(expected))
        with safe_open(str(files[first]), framework="pt") as f:
            dtype = f.get_slice(first).get_dtype()
        dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}.get(dtype, torch.float32)
    model = model.to(dtype).to_empty(device=device)
    params = dict(model.named_parameters(remove_duplicate=False))
    ours = {hf_name(k): k for k in params}
    by_file: dict[Path, list[str]] = {}
    for name in expected:
        by_file.setdefault(files[name], []).append(name)
    with torch.no_grad():
        for path, names in by_file.items():
            try:
                with safe_open(str(path), framework="pt") as f:
                    for name in names:
                        params[ours[name]].copy_(f.get_tensor(name))
            except Exception as e:  # safetensors' own errors (SafetensorError) carry no file name
                if isinstance(e, (UserError, MemoryError)):
                    raise
                raise UserError(f"{path}: cannot read tensors ({e})") from None
        if config.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        # RoPE frequencies are not stored; keep them float32 whatever the weights' dtype.
        model.inv_freq = rope_inv_freq(config).to(device)
    return model.eval()
