"""`flashscale quantize MODEL OUT_DIR`: RTN, GPTQ or AWQ post-training quantization to a GPTQ/AWQ folder.

MODEL is an HF model folder or a GGUF file; the perplexity on the held-out text is reported before and
after (of the written checkpoint, read back).

The run is resumable: per-block results go to a work directory beside OUT_DIR (.OUT_DIR.work); run the
same command again after a crash and it continues at the first unfinished block. OUT_DIR appears only
once complete (written to a temporary directory and renamed).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from flashscale.errors import UserError

DTYPES = ("auto", "float32", "bfloat16", "float16")


def add_parser(sub) -> None:
    p = sub.add_parser("quantize", help="RTN / GPTQ / AWQ post-training quantization",
                       description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="an HF model folder (with tokenizer.json) or a .gguf file")
    p.add_argument("out", metavar="OUT_DIR", help="the quantized model folder to write")
    p.add_argument("--method", choices=("gptq", "awq", "rtn"), default="gptq", help="the algorithm")
    p.add_argument("--bits", type=int, default=4, help="2, 3, 4 or 8")
    p.add_argument("--group-size", type=int, default=128, help="columns sharing a scale; -1: one per row")
    p.add_argument("--act-order", action="store_true", help="GPTQ: columns by descending Hessian diagonal")
    p.add_argument("--static-groups", action="store_true", help="GPTQ: fit group grids before act-order")
    sym = p.add_mutually_exclusive_group()
    sym.add_argument("--sym", dest="sym", action="store_true", default=argparse.SUPPRESS,
                     help="symmetric grid (the default for gptq/rtn)")
    sym.add_argument("--asym", dest="sym", action="store_false", default=argparse.SUPPRESS,
                     help="asymmetric grid (the default for awq)")
    p.add_argument("--format", choices=("gptq", "gptq_v2", "awq"), default=None,
                   help="checkpoint layout (default: awq for --method awq at 4 bits, else gptq)")
    p.add_argument("--calib", default=None, metavar="FILE",
                   help="calibration text (.txt/.jsonl, optionally .xz, or a folder); default: the bundled "
                        "training corpus (never the held-out moby_dick)")
    p.add_argument("--nsamples", type=int, default=128, help="calibration windows")
    p.add_argument("--seqlen", type=int, default=None, help="tokens a window (default: min(2048, model context))")
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration windows")
    p.add_argument("--damp", type=float, default=0.01, help="GPTQ dampening, a fraction of mean(diag H)")
    p.add_argument("--sink-weight", type=float, default=1.0,
                   help="GPTQ: weight of each calibration window's first token (an attention sink) in the "
                        "Hessians; 1 is the paper's uniform weighting")
    p.add_argument("--device", default=None, help="where blocks are processed (default: cuda if available)")
    p.add_argument("--dtype", choices=DTYPES, default="auto", help="compute dtype (auto: bfloat16 on cuda, else float32)")
    p.add_argument("--work-dir", default=None, help="per-block resume state (default: .OUT_DIR.work beside OUT_DIR)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR (once the new one is complete)")
    p.add_argument("--no-eval", action="store_true", help="skip perplexity before/after")
    p.add_argument("--eval-max-tokens", type=int, default=None, metavar="N", help="score only the first N eval tokens")
    p.add_argument("--eval-batch-size", type=int, default=8, help="windows a forward pass in evaluation")
    p.set_defaults(func=run, sym=None)


def _check_args(args):
    """Everything checkable before a model is loaded; returns the QuantizeConfig."""
    from flashscale.quant.api import QuantizeConfig

    for name in ("nsamples", "seqlen", "eval_max_tokens", "eval_batch_size"):
        v = getattr(args, name)
        if v is not None and v < (2 if name in ("seqlen", "eval_max_tokens") else 1):
            raise ValueError(f"--{name.replace('_', '-')}: takes a positive int, got {v}")
    fmt = args.format or ("awq" if args.method == "awq" and args.bits == 4 else "gptq")
    cfg = QuantizeConfig(method=args.method, bits=args.bits, group_size=args.group_size, sym=args.sym,
                         act_order=args.act_order, static_groups=args.static_groups, damp_percent=args.damp,
                         sink_weight=args.sink_weight, checkpoint_format=fmt)
    model = Path(args.model).expanduser()
    if not model.exists():
        raise FileNotFoundError(f"model {str(model)!r} does not exist (takes an HF model folder or a .gguf file)")
    if not model.is_dir() and model.suffix.lower() != ".gguf":
        raise ValueError(f"model {str(model)!r}: takes an HF model folder or a .gguf file")
    if model.is_dir() and not (model / "tokenizer.json").is_file() and not (args.method == "rtn" and args.no_eval):
        raise FileNotFoundError(f"model folder {str(model)!r} has no tokenizer.json (needed for calibration/eval)")
    out = Path(args.out).expanduser()
    if out.exists() and not args.overwrite:
        raise UserError(f"output folder {str(out)!r} exists; pass --overwrite to replace it")
    if out.resolve() == model.resolve():
        raise ValueError("OUT_DIR must differ from MODEL")
    if args.calib is not None and not Path(args.calib).expanduser().exists():
        raise FileNotFoundError(f"--calib: {args.calib!r} does not exist")
    return cfg


def _load(path: Path, dtype):
    if path.is_dir():
        from flashscale.data.tokenizer import load_tokenizer
        from flashscale.models.checkpoint import load_hf

        tok = load_tokenizer(path) if (path / "tokenizer.json").is_file() else None
        return load_hf(path, dtype=dtype), tok
    from flashscale.models.gguf import load_gguf

    return load_gguf(path, dtype=dtype)


def _calib_text(calib: str | None) -> tuple[str, str]:
    from flashscale.data.corpus import read_text, train_files, train_text

    if calib is not None:
        return read_text(Path(calib).expanduser()), calib
    names = ", ".join(p.name.split(".")[0] for p in train_files())
    return train_text(), f"bundled corpus ({names})"


def _eval_ids(tok, max_tokens: int | None):
    """The held-out text's token ids (the first max_tokens of them)."""
    import torch

    from flashscale.data.corpus import eval_text

    text = eval_text()
    if max_tokens is not None:  # a prefix of the text is enough; the whole one if it falls short
        ids = tok.encode(text[: 16 * max_tokens]).ids
        if len(ids) < max_tokens:
            ids = tok.encode(text).ids
        ids = ids[:max_tokens]
    else:
        ids = tok.encode(text).ids
    return torch.tensor(ids, dtype=torch.long)


def _ppl(model, ids, args, device, console) -> float:
    from flashscale.train.evaluate import perplexity

    window = min(model.config.max_position_embeddings, 2048)
    home = next(model.parameters()).device
    model.to(device)
    try:
        return perplexity(model, ids, window=window, batch_size=args.eval_batch_size, device=device,
                          progress=console.is_terminal)["ppl"]
    finally:
        model.to(home)


def run(args) -> int:
    import torch
    from rich.console import Console

    from flashscale.quant.api import check_model, quantize_model
    from flashscale.quant.calibrate import calibration_tokens
    from flashscale.quant.io import load_quantized, save_quantized

    cfg = _check_args(args)
    console = Console(stderr=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, dtype)
    path, out = Path(args.model).expanduser(), Path(args.out).expanduser()
    work = Path(args.work_dir) if args.work_dir else out.with_name(f".{out.name}.work")

    t_start = time.perf_counter()
    with console.status(f"loading {path.name}"):
        model, tok = _load(path, dtype)
    model.eval()
    check_model(model, cfg)  # NaN/Inf weights, group sizes: before any long step
    calib = None
    if cfg.method != "rtn":
        context = model.config.max_position_embeddings
        seqlen = args.seqlen if args.seqlen is not None else min(2048, context)
        if seqlen > context:
            raise ValueError(f"--seqlen: takes at most the model's context {context}, got {seqlen}")
        with console.status("tokenizing calibration text"):
            text, source = _calib_text(args.calib)
            calib = calibration_tokens(tok, text=text, nsamples=args.nsamples, seqlen=seqlen, seed=args.seed,
                                       source=source)
        console.print(f"calibration: {args.nsamples} x {seqlen} tokens of {source}")
    eval_ids = None if args.no_eval else _eval_ids(tok, args.eval_max_tokens)
    ppl_before = None if args.no_eval else _ppl(model, eval_ids, args, device, console)

    q = quantize_model(model, cfg.method, bits=cfg.bits, group_size=cfg.group_size, sym=cfg.sym,
                       act_order=cfg.act_order, static_groups=cfg.static_groups, damp_percent=cfg.damp_percent,
                       sink_weight=cfg.sink_weight, checkpoint_format=cfg.checkpoint_format, calib_tokens=calib,
                       device=device,
                       work_dir=None if cfg.method == "rtn" else work, progress=console.is_terminal)
    try:
        save_quantized(q, out, tokenizer=tok if not path.is_dir() else None,
                       tokenizer_dir=path if path.is_dir() else None, overwrite=args.overwrite)
    except FileExistsError as e:
        raise UserError(str(e)) from None
    shutil.rmtree(work, ignore_errors=True)  # the result is complete: the resume state is no longer needed
    summary = q.summary
    del model, q
    ppl_after = None
    if not args.no_eval:  # what was written, read back: the checkpoint itself is evaluated
        ppl_after = _ppl(load_quantized(out, device="cpu", dtype=dtype), eval_ids, args, device, console)
    _summary(cfg, path, out, ppl_before, ppl_after, summary, wall=time.perf_counter() - t_start)
    return 0


def _summary(cfg, path, out, ppl_before, ppl_after, s, *, wall) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"flashscale quantize: {path.name} -> {out}")
    table.add_column("", justify="left")
    table.add_column("", justify="right")
    gb = 1 << 30
    blocks = s.block_seconds
    rows = [("method", f"{cfg.method} {cfg.bits}-bit, group {cfg.group_size}, {'sym' if cfg.sym else 'asym'}"
                       + (", act-order" if cfg.act_order else "") + (", static groups" if cfg.static_groups else "")),
            ("format", cfg.checkpoint_format),
            ("device", s.device),
            ("blocks", f"{len(blocks)}" + (f" ({s.resumed_blocks} resumed)" if s.resumed_blocks else "")),
            ("time per block (mean / max)", f"{sum(blocks) / max(len(blocks), 1):.2f} s / {max(blocks, default=0):.2f} s"),
            ("quantization time", f"{s.total_seconds:.1f} s"),
            ("total time", f"{wall:.1f} s"),
            ("peak GPU memory", "-" if s.peak_gpu_bytes is None else f"{s.peak_gpu_bytes / gb:.2f} GiB"),
            ("peak host memory", f"{s.peak_host_bytes / gb:.2f} GiB")]
    if ppl_before is not None:
        rows += [("perplexity before (moby_dick)", f"{ppl_before:.3f}"),
                 ("perplexity after (moby_dick)", f"{ppl_after:.3f}")]
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)
    if blocks:
        Console().print("seconds per block: " + " ".join(f"{b:.2f}" for b in blocks))
