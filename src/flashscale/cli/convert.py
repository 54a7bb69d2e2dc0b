"""`flashscale convert SOURCE OUT_DIR`: a GGUF file or an HF model directory -> an HF Llama directory.

GGUF: tensors dequantized (float32 by default, exact), names mapped, llama.cpp's RoPE row permutation
undone, tokenizer rebuilt from the metadata (tokenizer.json + tokenizer_config.json). HF directory:
re-saved, e.g. in another dtype or shard size, with its tokenizer and generation files carried over.
The output is written atomically (a temporary directory renamed into place).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DTYPES = ("float32", "float16", "bfloat16")
# Small JSON files of an HF directory carried over as they are (tokenizer.json is re-serialized).
_CARRIED = ("tokenizer_config.json", "generation_config.json", "special_tokens_map.json")


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a GGUF file or an HF directory to an HF Llama directory",
                       description=__doc__.splitlines()[0])
    p.add_argument("source", metavar="SOURCE", help="a .gguf file or an HF model directory")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the HF directory to write (replaced if it is one)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="stored dtype (default: float32 for GGUF, as stored for an HF directory)")
    p.add_argument("--max-shard-size", default="5GB",
                   help="split the weights into shards of at most this (default: %(default)s)")
    p.set_defaults(func=run)


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(obj).__name__}")
    return obj


def convert_hf(source: Path, out_dir: Path, *, dtype: str | None, max_shard_size: str) -> Path:
    """HF directory -> HF directory. Everything is read before writing, so out_dir may be source."""
    from tokenizers import Tokenizer

    from flashscale.models.checkpoint import load_hf, save_hf

    model = load_hf(source)
    tokenizer = None
    if (source / "tokenizer.json").is_file():
        try:
            tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise ValueError(f"{source / 'tokenizer.json'} is not a valid tokenizer.json ({e})") from None
    else:
        print(f"note: {source} has no tokenizer.json; {out_dir} will have none either", file=sys.stderr)
    extra = {name: _read_json(source / name) for name in _CARRIED if (source / name).is_file()}
    if tokenizer is None:
        extra.pop("tokenizer_config.json", None)
    return save_hf(model, out_dir, dtype=dtype, tokenizer=tokenizer, max_shard_size=max_shard_size,
                   extra_json=extra)


def run(args) -> int:
    from flashscale.errors import UserError
    from flashscale.models.checkpoint import load_config, parse_size
    from flashscale.models.gguf import convert_gguf, is_gguf

    source, out_dir = Path(args.source).expanduser(), Path(args.out_dir).expanduser()
    parse_size(args.max_shard_size)  # a bad size fails before the (slow) load
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist (expected a .gguf file or an HF model directory)")
    if source.is_dir():
        if not (source / "config.json").is_file():
            raise FileNotFoundError(f"{source} is a directory without config.json: not an HF model directory")
        convert_hf(source, out_dir, dtype=args.dtype, max_shard_size=args.max_shard_size)
    elif is_gguf(source):
        convert_gguf(source, out_dir, dtype=args.dtype, max_shard_size=args.max_shard_size)
    else:
        raise UserError(f"{source} is not a GGUF file (no GGUF magic) nor an HF model directory")
    config = load_config(out_dir)
    files = sorted(p.name for p in out_dir.iterdir())
    print(f"wrote {out_dir}: {config.num_params() / 1e6:.1f}M parameters, {config.num_hidden_layers} layers, "
          f"vocab {config.vocab_size}; files: {', '.join(files)}")
    return 0
