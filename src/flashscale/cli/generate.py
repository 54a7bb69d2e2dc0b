"""`flashscale generate MODEL --prompt "..."`: continue a prompt with an HF model directory or a GGUF file.

Greedy with --temperature 0, else sampling (temperature, top-k, top-p), reproducible with --seed.
The text goes to stdout; the timing to stderr.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

DTYPES = ("float32", "float16", "bfloat16")


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt", description=__doc__.splitlines()[0])
    p.add_argument("model", metavar="MODEL",
                   help="an HF model directory (config.json, *.safetensors, tokenizer.json) or a .gguf file")
    p.add_argument("--prompt", default="", help="the text to continue (empty: start from the BOS token)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens (default: all)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="model dtype (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="decode through one CUDA graph replay a token (flashscale.infer.decode.StaticDecoder; on a "
                        "GPU: far fewer launches from Python; the CPU runs the same decoder eagerly)")
    p.set_defaults(func=run)


def _eos_ids(path: Path, config) -> list[int]:
    """EOS ids: generation_config.json's (an id or a list) when present, else config.json's."""
    gen = path / "generation_config.json"
    if path.is_dir() and gen.is_file():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise ValueError(f"{gen} is not a valid JSON object ({e})") from None
        if eos is not None:
            return [eos] if isinstance(eos, int) else list(eos)
    return [] if config.eos_token_id is None else [config.eos_token_id]


def _load(path: Path, device, dtype: str):
    from flashscale.data.tokenizer import load_tokenizer
    from flashscale.errors import UserError
    from flashscale.models.checkpoint import load_hf
    from flashscale.models.gguf import is_gguf, load_gguf

    if not path.exists():
        raise FileNotFoundError(f"model {path} does not exist (expected an HF model directory or a .gguf file)")
    if path.is_dir():
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path} has no tokenizer.json: generate needs the model's tokenizer")
        return load_hf(path, device=device, dtype=dtype), load_tokenizer(path)
    if not is_gguf(path):
        raise UserError(f"{path} is not a GGUF file (no GGUF magic) nor an HF model directory")
    model, tokenizer = load_gguf(path, dtype=dtype)
    return model.to(device), tokenizer


def run(args) -> int:
    import torch

    from flashscale.infer.generate import generate

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens: takes an int >= 1, got {args.max_new_tokens}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: CUDA is not available on this machine")
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    path = Path(args.model).expanduser()
    model, tokenizer = _load(path, device, dtype)
    config = model.config

    ids = tokenizer.encode(args.prompt).ids
    if not ids:
        if config.bos_token_id is None:
            raise ValueError("--prompt is empty and the model has no BOS token to start from; give a prompt")
        ids = [config.bos_token_id]
    if max(ids) >= config.vocab_size:
        raise ValueError(f"{path}: the tokenizer gives id {max(ids)}, beyond the model's vocab_size "
                         f"{config.vocab_size}")
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)  # (1, S0)
    t0 = time.perf_counter()
    out = generate(model, input_ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, eos_token_id=_eos_ids(path, config) or None,
                   seed=args.seed, cuda_graph=args.cuda_graph)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    new = out[0, len(ids):].tolist()
    print(args.prompt + tokenizer.decode(new, skip_special_tokens=True))
    print(f"{len(new)} tokens in {seconds:.2f} s ({len(new) / seconds:.1f} tokens/s, {device}, {dtype})",
          file=sys.stderr)
    return 0
