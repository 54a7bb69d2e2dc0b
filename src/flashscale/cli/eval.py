"""`flashscale eval MODEL`: perplexity of an HF model folder or a GGUF file on evaluation texts.

The protocol of the GPTQ/AWQ papers (flashscale.train.evaluate.perplexity): the text is tokenized
once with the model's own tokenizer and scored in non-overlapping windows. Default text: the held-out
bundled moby_dick, paragraphs joined with "\\n\\n".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="perplexity of a model on text",
                       description=__doc__.splitlines()[0],
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="an HF model folder (with tokenizer.json) or a .gguf file")
    p.add_argument("--perplexity", action="store_true",
                   help="report perplexity (the default, and for now the only metric)")
    p.add_argument("--text", action="append", metavar="FILE", default=None,
                   help="text to score (.txt/.jsonl, optionally .xz, or a folder); repeatable; "
                        "default: the bundled held-out moby_dick")
    p.add_argument("--window", type=int, default=None,
                   help="tokens a window (default: min(model context, 2048))")
    p.add_argument("--batch-size", type=int, default=8, help="windows a forward pass")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="the model's dtype for evaluation")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="score only the first N tokens of each text (quick checks)")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    p.set_defaults(func=run)


def _check_args(args) -> None:
    for name in ("window", "max_tokens"):
        v = getattr(args, name)
        if v is not None and v < 2:
            raise ValueError(f"--{name.replace('_', '-')}: takes an int >= 2, got {v}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size: takes an int >= 1, got {args.batch_size}")
    model = Path(args.model).expanduser()
    if not model.exists():
        raise FileNotFoundError(f"model {str(model)!r} does not exist (takes an HF model folder or a "
                                f".gguf file)")
    if not model.is_dir() and model.suffix.lower() != ".gguf":
        raise ValueError(f"model {str(model)!r}: takes an HF model folder or a .gguf file")
    if model.is_dir() and not (model / "tokenizer.json").is_file():
        raise FileNotFoundError(f"model folder {str(model)!r} has no tokenizer.json: eval tokenizes the "
                                f"text with the model's own tokenizer")
    for t in args.text or []:
        if not Path(t).expanduser().exists():
            raise FileNotFoundError(f"--text: file {t!r} does not exist")


def _device(name: str | None):
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device: takes a torch device such as cpu, cuda, cuda:1; got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA GPU is available here")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: takes cpu or cuda[:N], got {name!r}")
    return device


def load_model(path: Path, *, device, dtype: str):
    """(model, tokenizer) of an HF folder or a GGUF file, on device in dtype."""
    if path.is_dir():
        from flashscale.data.tokenizer import load_tokenizer
        from flashscale.models.checkpoint import load_hf

        return load_hf(path, device=device, dtype=dtype), load_tokenizer(path)
    from flashscale.models.gguf import load_gguf

    model, tok = load_gguf(path, dtype=dtype)
    return model.to(device), tok


def run(args) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from flashscale.data.corpus import EVAL_NAME, eval_text, read_text
    from flashscale.data.tokens import encode_text
    from flashscale.train.evaluate import perplexity

    _check_args(args)
    device = _device(args.device)
    path = Path(args.model).expanduser()
    texts = [(t, lambda t=t: read_text(t)) for t in args.text] if args.text else [(EVAL_NAME, eval_text)]

    console = Console(stderr=True)
    with console.status(f"loading {path.name}"):
        model, tok = load_model(path, device=device, dtype=args.dtype)
    context = model.config.max_position_embeddings
    window = args.window if args.window is not None else min(context, 2048)
    if window > context:
        raise ValueError(f"--window: takes an int in [2, {context}] (the model's context), got {window}")

    rows = []
    for label, read in texts:
        ids = torch.from_numpy(encode_text(tok, read()))  # (N,) int64, as tok.encode(text).ids
        if args.max_tokens is not None:
            ids = ids[: args.max_tokens]
        if ids.numel() < 2:
            raise ValueError(f"--text {label!r}: holds {ids.numel()} token(s); perplexity needs >= 2")
        if int(ids.max()) >= model.config.vocab_size:
            raise ValueError(f"model {str(path)!r}: its tokenizer gives id {int(ids.max())}, beyond the "
                             f"model's vocab_size {model.config.vocab_size}")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        res = perplexity(model, ids, window=window, batch_size=args.batch_size, device=device,
                         progress=console.is_terminal)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rows.append({"model": str(path), "text": label, "tokens": res["tokens"], "window": window,
                     "ppl": res["ppl"], "nll": res["nll"], "seconds": time.perf_counter() - t0,
                     "device": str(device), "dtype": args.dtype})

    table = Table(title="perplexity (non-overlapping windows)")
    for col in ("model", "text", "tokens", "window", "perplexity", "seconds"):
        table.add_column(col, justify="left" if col in ("model", "text") else "right",
                         overflow="fold" if col in ("model", "text") else "ellipsis")
    for r in rows:
        table.add_row(path.name, r["text"], f"{r['tokens']:,}", str(r["window"]), f"{r['ppl']:.3f}",
                      f"{r['seconds']:.1f}")
    Console().print(table)
    if args.json is not None:
        from flashscale.data.cache import atomic_write_text

        atomic_write_text(args.json, json.dumps(rows, indent=1) + "\n")
    return 0
