"""Check and time the FA3-style Gluon backward (src/flashscale/kernels/attention_fa3_bwd.py, issues #4/#3)
against torch SDPA's cuDNN and flash backends, on one Hopper GPU.

1. Correctness first, per head dim x causal: dq, dk, dv against a float32 PyTorch reference on awkward
   shapes (ragged lengths, Sq != Sk, GQA); the error must be at most 2x that of the same math in bf16
   PyTorch + 1e-3 (flash-attn's rule, as tests/kernels/attention_checks.py). A failing config is not timed.
2. Timing (FlashAttention papers' grid: bf16, batch * seqlen = 16384, heads * head_dim = 2048): backward
   TFLOP/s (2.5x the forward's 4 B S^2 H D, halved when causal), triton.testing.do_bench median. Ours is the
   whole call: delta pre-pass, kernel, dq cast. SDPA rows: autograd backward only.

    python benchmarks/attention_fa3_bwd_sweep.py --out $OUT/attention-fa3-bwd-sweep-h200.json

The JSON (gpu, torch, triton, date, rows) is rewritten after every row, so a run cut short keeps its rows.
Rows: impl (fa3_bwd, sdpa_cudnn, sdpa_flash), variant, pass "bwd", hdim, causal, seqlen, batch, heads, ms,
tflops; check rows: impl "fa3_bwd", kind "check", shape, err_dq/dk/dv, limit_dq/dk/dv, ok.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))
TOKENS, HIDDEN = 16384, 2048


def flops_bwd(batch, seqlen, heads, hdim, causal):
    return 2.5 * 4.0 * batch * seqlen * seqlen * heads * hdim / (2 if causal else 1)


def _ref(q, k, v, do, causal, dtype):
    """dq, dk, dv of softmax(q k^T / sqrt(D)) v in `dtype` (bottom-right causal, GQA by repeat)."""
    q, k, v, do = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v, do))
    B, Sq, H, D = q.shape
    Sk, G = k.shape[1], H // k.shape[2]
    kk, vv = k.repeat_interleave(G, 2), v.repeat_interleave(G, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * D ** -0.5
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + Sk - Sq, float("-inf"))
    p = torch.softmax(s.float(), -1).nan_to_num(0.0).to(dtype)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    return torch.autograd.grad(o, (q, k, v), do)


def check(hdim, causal, variant, cfg, seed=0):
    from flashscale.kernels import attention_fa3 as fwd
    from flashscale.kernels import attention_fa3_bwd as bwd

    rows = []
    for B, Sq, Sk, H, Hkv in ((2, 1000, 1000, 4, 2), (1, 384, 700, 4, 4), (1, 700, 384, 4, 1), (1, 129, 1, 2, 1)):
        g = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(B, Sq, H, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, Sk, Hkv, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, Sk, Hkv, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
        do = torch.randn(B, Sq, H, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
        o, lse = fwd.attention_fa3_fwd(q, k, v, causal=causal)
        got = bwd.attention_fa3_bwd(do, q, k, v, o, lse, causal=causal, config=cfg)
        torch.cuda.synchronize()
        ref = _ref(q, k, v, do, causal, torch.float32)
        low = _ref(q, k, v, do, causal, torch.bfloat16)
        row = dict(impl="fa3_bwd", kind="check", variant=variant, hdim=hdim, causal=causal,
                   shape=[B, Sq, Sk, H, Hkv], ok=True)
        for name, a, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
            err = (a.float() - r).abs().max().item()
            lim = 2 * (lo.float() - r).abs().max().item() + 1e-3
            row[f"err_{name}"], row[f"limit_{name}"] = err, lim
            row["ok"] &= bool(err <= lim) and bool(torch.isfinite(a).all())
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="results JSON (a .png plot is written beside it)")
    ap.add_argument("--replot", metavar="JSON", help="only redraw the .png of an existing results file")
    ap.add_argument("--hdims", default="128,64,256")
    ap.add_argument("--seqlens", default="2048,4096,8192,16384")
    ap.add_argument("--rep", type=int, default=60, help="do_bench rep (ms)")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds; stops timing new cells after it")
    ap.add_argument("--variants", default="", help="comma-separated substrings: only the TUNING_CONFIGS names "
                    "holding one (e.g. ws; a trailing $ for exactly that name), checked and timed; default all")
    ap.add_argument("--no-sdpa", action="store_true", help="skip the SDPA anchor rows (known from earlier runs)")
    args = ap.parse_args(argv)
    if args.replot:
        path = Path(args.replot)
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return 0
    if not args.out:
        ap.error("--out is required (or --replot JSON)")
    import triton
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashscale.kernels import attention_fa3 as fwd
    from flashscale.kernels import attention_fa3_bwd as bwd

    t_start = time.time()
    out = Path(args.out)
    doc = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               date=datetime.date.today().isoformat(), rows=[])

    def emit(row):
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, out)

    hdims = [int(x) for x in args.hdims.split(",")]
    seqlens = [int(x) for x in args.seqlens.split(",")]
    wanted = [w for w in args.variants.split(",") if w]

    def configs(hdim):
        return {n: c for n, c in bwd.TUNING_CONFIGS[hdim].items()
                if not wanted or any(w[:-1] == n if w.endswith("$") else w in n for w in wanted)}

    good = {}
    for hdim in hdims:
        for causal in (False, True):
            for variant, cfg in configs(hdim).items():
                try:
                    rows = check(hdim, causal, variant, cfg)
                    for r in rows:
                        emit(r)
                    good[(hdim, causal, variant)] = all(r["ok"] for r in rows)
                except Exception as e:  # noqa: BLE001 - a failure is a result
                    emit(dict(impl="fa3_bwd", kind="check", variant=variant, hdim=hdim, causal=causal, ok=False,
                              error=f"{type(e).__name__}: {e}"[:1500]))
                    good[(hdim, causal, variant)] = False
    for hdim in hdims:
        for causal in (False, True):
            for seqlen in seqlens:
                if time.time() - t_start > args.budget:
                    print("budget spent: stopping", flush=True)
                    return 0
                batch, heads = TOKENS // seqlen, HIDDEN // hdim
                shape = (batch, seqlen, heads, hdim)
                q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                o, lse = fwd.attention_fa3_fwd(q, k, v, causal=causal)
                base = dict(**{"pass": "bwd"}, hdim=hdim, causal=causal, seqlen=seqlen, batch=batch, heads=heads)
                fl = flops_bwd(batch, seqlen, heads, hdim, causal)
                for variant, cfg in configs(hdim).items():
                    if not good.get((hdim, causal, variant)):
                        continue
                    ms = triton.testing.do_bench(lambda: bwd.attention_fa3_bwd(do, q, k, v, o, lse, causal=causal,
                                                                               config=cfg), warmup=20, rep=args.rep)
                    emit(dict(impl="fa3_bwd", variant=variant, **base, ms=ms, tflops=fl / ms * 1e-9))
                qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_(True) for t in (q, k, v))
                dot = do.transpose(1, 2)
                anchors = () if args.no_sdpa else (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                                                   ("sdpa_flash", SDPBackend.FLASH_ATTENTION))
                for impl, backend in anchors:
                    try:
                        with sdpa_kernel(backend):
                            ot = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        ms = triton.testing.do_bench(
                            lambda: torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True), warmup=20,
                            rep=args.rep)
                        emit(dict(impl=impl, variant="", **base, ms=ms, tflops=fl / ms * 1e-9))
                    except Exception as e:  # noqa: BLE001
                        emit(dict(impl=impl, variant="", **base, error=f"{type(e).__name__}: {e}"[:500]))
                del q, k, v, do, o, lse, qt, kt, vt
    plot(doc, out.with_suffix(".png"))
    return 0


def plot(res: dict, path: Path) -> None:
    """attention_fa3_sweep's bars: each fa3_bwd variant and SDPA flash per (causal, seqlen), cuDNN a line."""
    from attention_fa3_sweep import plot as bars

    bars(res, path, label=lambda r: r["variant"] if r["impl"] == "fa3_bwd" else r["impl"], title="FA3 backward",
         ylabel="backward TFLOP/s")


if __name__ == "__main__":
    sys.exit(main())
