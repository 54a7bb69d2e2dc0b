"""The FP8 attention pre-pass (kernels.hadamard.hadamard_quant) at the grid's 16k tokens x 2048: configs swept.

Each of Q (Hadamard, 128-row blocks), K (Hadamard, the Gluon kernel's K/V blocks) and V^T (no transform, transposed,
keys permuted) at head dims 128 and 256 is quantized with every config of a small grid: chunk (rows a program holds;
0 = the whole block), num_warps, num_stages (the pieces' loads pipelined), hmat (the signed Hadamard matrix read from
memory instead of rebuilt in registers). Every config's output is compared with the default's (descales and e4m3
bytes, bit for bit). Times: triton.testing.do_bench median (as benchmarks/attention_fp8.py, host path included) and
do_bench_cudagraph (the kernel alone); GB/s on the bytes read + written (bf16 in, e4m3 out). Reference rows: the
default config (`default`) and torch's bf16 -> e4m3 cast of the same tensor (`cast`, the rate a one-pass kernel of
these bytes can reach).

    python benchmarks/fp8_prepass_sweep.py [--hdims 128 256] [--methods mma,kron] [--budget SECONDS] [--out DIR]
    python benchmarks/fp8_prepass_sweep.py --plot results/fp8-prepass-sweep-h200.json   # the png again
Writes DIR/fp8-prepass-sweep-<gpu>.json (+ .png) ({gpu, torch, triton, date, rows}); rows: impl (default, sweep, cast),
hdim, tensor (q, k, vt), method, chunk, num_warps, num_stages, hmat, ms, ms_graph, gbps, gbps_graph, mismatch (bytes
that differ from the default's), ok (bit for bit where the summation order is the default's; kron: the GPU tests'
bound).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from plotting import gpu_tag, plot_only, pyplot  # noqa: E402

TOKENS, HIDDEN = 16384, 2048


def tensors(hdim: int) -> dict:
    """tensor name -> hadamard_quant keyword arguments, as ops.attention_fp8 quantizes for its kernel's default."""
    from flashscale.kernels import attention_fa3_fp8 as fa3
    bn = fa3.quant_block_n(hdim, False)
    vperm = fa3.default_config(hdim, bn, False).v_perm
    return {"q": dict(block=128, hadamard=True), "k": dict(block=bn, hadamard=True),
            "vt": dict(block=bn, hadamard=False, transpose=True, key_perm=vperm)}


# method "kron": the configs ptxas compiles without spills (sm_90, kernels.hadamard.compile_sm90;
# tests/kernels/test_hadamard_compile.py), head dim -> (chunk, warps); whole blocks (chunk 0) only up to 128 x 128
KRON = {256: ((16, 2), (16, 4), (32, 4), (32, 8), (64, 8)), 128: ((0, 8), (32, 4), (64, 4), (64, 8)),
        64: ((0, 4), (0, 8), (64, 4))}


def kron_configs(block: int, hdim: int) -> list[tuple[int, int]]:
    return [(c, w) for c, w in KRON.get(hdim, ()) if c < block and (c or block * hdim <= 128 * 128)]


def configs(kw: dict, hdim: int, methods: tuple[str, ...] = ("mma",)) -> list[dict]:
    out = []
    if "mma" in methods:
        for chunk, warps, stages, hmat in itertools.product((0, 16, 32, 64), (2, 4, 8), (1, 3), (False, True)):
            rows = chunk or kw["block"]
            if (chunk and chunk >= kw["block"]) or (hmat and not kw["hadamard"]) or (chunk == 0 and stages > 1):
                continue
            if rows * hdim > 128 * 256 or not 16 <= rows * hdim // (32 * warps) <= 128:
                continue  # does not compile (the whole-block limit) / too many or too few values a thread
            out.append(dict(chunk=chunk, num_warps=warps, num_stages=stages, hmat=hmat))
    if "kron" in methods and kw["hadamard"]:
        out += [dict(method="kron", chunk=c, num_warps=w, num_stages=1, hmat=False)
                for c, w in kron_configs(kw["block"], hdim)]
    return out


def agrees(got: tuple, ref: tuple, same_bits: bool) -> tuple[int, bool]:
    """(bytes that differ, ok): ok is bit for bit where the config sums in the default's order (same_bits), else the
    GPU tests' bound for another order: descales within 1e-6, values within one e4m3 step on under 1 % of them."""
    diff = int((got[0].view(torch.uint8) != ref[0].view(torch.uint8)).sum() + (got[1] != ref[1]).sum())
    if same_bits:
        return diff, diff == 0
    a, b = got[0].float(), ref[0].float()
    d = (a - b).abs()
    ok = (torch.allclose(got[1], ref[1], rtol=1e-6, atol=0) and bool(torch.all(d <= 2.0 ** -3 * b.abs() + 2.0 ** -9))
          and (d > 0).float().mean().item() < 0.01)
    return diff, ok


def plot(doc: dict, path: Path) -> None:
    """Kernel time (CUDA graph, us) of each tensor: the default config, the sweep's fastest config with the same
    bytes, and torch's cast of the same bytes as the floor line."""
    plt = pyplot()
    if plt is None:
        return
    rows = doc["rows"]
    names = [(h, t) for h in sorted({r["hdim"] for r in rows}) for t in ("q", "k", "vt")]
    default, best, cast = [], [], []
    for h, t in names:
        cand = [r for r in rows if r["hdim"] == h and r.get("tensor") == t and "ms_graph" in r]
        default.append(next((r["ms_graph"] * 1e3 for r in cand if r["impl"] == "default"), 0.0))
        best.append(min((r["ms_graph"] * 1e3 for r in cand if r.get("ok", True)), default=0.0))
        cast.append(next((r["ms_graph"] * 1e3 for r in rows if r["hdim"] == h and r["impl"] == "cast"), 0.0))
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], default, 0.4, label="default config (when run)")
    ax.bar([x + 0.2 for x in xs], best, 0.4, label="fastest config that agrees")
    ax.plot(list(xs), cast, "k_", markersize=30, label="torch bf16 -> e4m3 cast (floor)")
    ax.set_xticks(list(xs), [f"d{h} {t}" for h, t in names])
    ax.set_ylabel("us (CUDA graph)")
    ax.set_title(f"FP8 pre-pass, {TOKENS} tokens x {HIDDEN}, {doc['gpu']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdims", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--methods", default="mma", help="comma-separated: mma (the matrix method's grid), kron "
                    "(H_(D/16) (x) H_16, its spill-free configs)")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds; configs past it are skipped (said so)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton
    import triton.testing as tt

    from flashscale.kernels.hadamard import hadamard_quant

    t0, rows, skipped = time.time(), [], 0
    share = args.budget / (3 * len(args.hdims))  # each tensor's part of the budget
    for hdim in args.hdims:
        heads = HIDDEN // hdim
        x = torch.randn(1, TOKENS, heads, hdim, device="cuda", dtype=torch.bfloat16,
                        generator=torch.Generator(device="cuda").manual_seed(hdim))
        x[0, 100, 1, 3] = 300.0  # an outlier: blocks' scales differ
        nbytes = x.numel() * 3
        y8 = torch.empty(x.shape, device="cuda", dtype=torch.float8_e4m3fn)

        def timed(fn):
            ms = tt.do_bench(fn, warmup=10, rep=40, return_mode="median")
            msg = tt.do_bench_cudagraph(fn, rep=40, return_mode="median")
            return dict(ms=ms, ms_graph=msg, gbps=nbytes / ms * 1e-6, gbps_graph=nbytes / msg * 1e-6)

        rows.append(dict(impl="cast", hdim=hdim, tensor="x", **timed(lambda: y8.copy_(x))))
        print(f"d{hdim} cast: {rows[-1]['ms_graph'] * 1e3:.1f} us graph, {rows[-1]['gbps_graph']:.0f} GB/s", flush=True)
        for name, kw in tensors(hdim).items():
            ref = hadamard_quant(x, **kw)
            r = dict(impl="default", hdim=hdim, tensor=name, block=kw["block"],
                     **timed(lambda: hadamard_quant(x, **kw)))
            t1 = time.time()
            rows.append(r)
            print(f"d{hdim} {name} default: {r['ms'] * 1e3:.1f} us ({r['ms_graph'] * 1e3:.1f} graph)", flush=True)
            for cfg in configs(kw, hdim, tuple(args.methods.split(","))):
                if time.time() - t1 > share:
                    skipped += 1
                    continue
                row = dict(impl="sweep", hdim=hdim, tensor=name, block=kw["block"], **cfg)
                try:
                    got = hadamard_quant(x, **kw, **cfg)
                    row["mismatch"], row["ok"] = agrees(got, ref, cfg.get("method", "mma") == "mma")
                    row.update(timed(lambda: hadamard_quant(x, **kw, **cfg)))
                except Exception as e:  # noqa: BLE001  (a config this GPU cannot compile is a row saying so)
                    row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                rows.append(row)
                said = (f"{row['ms'] * 1e3:.1f} us ({row['ms_graph'] * 1e3:.1f} graph), mismatch {row['mismatch']}"
                        f"{'' if row['ok'] else ' NOT OK'}"
                        if "ms" in row else row["error"])
                print(f"  {name} {cfg}: {said}", flush=True)
    if skipped:
        print(f"{skipped} configs skipped: past --budget {args.budget:.0f} s", flush=True)
    for hdim in args.hdims:
        for name in ("q", "k", "vt"):
            cand = [r for r in rows if r["hdim"] == hdim and r.get("tensor") == name and "ms_graph" in r]
            if cand:
                d = next(r for r in cand if r["impl"] == "default")
                b = min((r for r in cand if r.get("ok", True)), key=lambda r: r["ms_graph"])
                cfg = {k: b.get(k) for k in ("method", "chunk", "num_warps", "num_stages", "hmat")}
                print(f"d{hdim} {name}: default {d['ms_graph'] * 1e3:.1f} us -> best {b['ms_graph'] * 1e3:.1f} us "
                      f"({b['gbps_graph']:.0f} GB/s) {cfg}")
    gpu = torch.cuda.get_device_name()
    slug = gpu_tag(gpu)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               setting=dict(tokens=TOKENS, hidden=HIDDEN, skipped=skipped), rows=rows)
    path = out / f"fp8-prepass-sweep-{slug}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(path)
    plot(res, path.with_suffix(".png"))
    print(f"wrote {path} ({len(rows)} rows, {time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(0 if plot_only(sys.argv[1:], plot) else main())
