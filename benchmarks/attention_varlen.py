"""Packed variable-length attention (cu_seqlens) forward: flashscale's FA3 (Gluon) and FA2 (Triton) varlen
kernels, and what `impl="auto"` picks, beside torch SDPA (cuDNN and flash) on the same sequences padded to a
batch, the thing a user without a varlen kernel runs.

Setting (the FlashAttention grid's): bf16, heads x head_dim = 2048, 16384 tokens a call, MHA. Sequence lengths
are drawn (seeded) uniformly from [max_seqlen / 4, max_seqlen] until 16384 tokens, the last one cut to fit.
Causal is bottom-right in each sequence (square here, so top-left too). TFLOP/s counts the useful work only,
4 * sum(len^2) * H * D (halved when causal): SDPA's padded batch does more, and its rate says what the user gets.
Times are triton.testing.do_bench medians. Each (head dim, causal) group is checked first at max_seqlen 1024:
fa3 and triton against the float64 varlen reference (ours within 2x SDPA-flash's error on the padded batch
+ one bf16 rounding, the rule of benchmarks/attention.py).

    python benchmarks/attention_varlen.py [--quick] [--out DIR]

Writes DIR/attention-varlen-<gpu>.json ({gpu, torch, triton, date, rows, checks}) and a .png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import torch

from plotting import gpu_tag

TOKENS, HIDDEN = 16384, 2048
HDIMS = [64, 128, 256]
MAX_SEQLENS = [1024, 2048, 4096, 8192, 16384]
QUICK = [2048, 8192]
IMPLS = ["flashscale_fa3", "flashscale_triton", "flashscale_auto", "sdpa_cudnn_padded", "sdpa_efficient_padded",
         "sdpa_flash_padded"]


def lengths(max_seqlen: int, tokens: int = TOKENS, seed: int = 0) -> list[int]:
    """Seeded lengths in [max_seqlen // 4, max_seqlen] summing to tokens (the last one cut)."""
    g = torch.Generator().manual_seed(seed + max_seqlen)
    out, left = [], tokens
    while left > 0:
        n = int(torch.randint(max(1, max_seqlen // 4), max_seqlen + 1, (1,), generator=g))
        out.append(min(n, left))
        left -= out[-1]
    return out


def useful_flops(lens: list[int], heads: int, hdim: int, causal: bool) -> float:
    return sum(4.0 * n * n * heads * hdim / (2 if causal else 1) for n in lens)


def packed(lens: list[int], heads: int, hdim: int, seed: int = 0, device="cuda", dtype=torch.bfloat16):
    """q, k, v (T, H, D) and int32 cu_seqlens (B + 1,)."""
    g = torch.Generator(device=device).manual_seed(seed)
    t = sum(lens)
    q, k, v = (torch.randn(t, heads, hdim, device=device, dtype=dtype, generator=g) for _ in range(3))
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), device=device, dtype=torch.int32)
    return q, k, v, cu


def padded(q, cu, lens):
    """(T, H, D) packed -> (B, H, max, D) zero-padded, SDPA's layout."""
    b, s = len(lens), max(lens)
    out = q.new_zeros(b, s, *q.shape[1:])
    for i, n in enumerate(lens):
        out[i, :n] = q[int(cu[i]):int(cu[i]) + n]
    return out.transpose(1, 2)


def _mask(lens, causal, device):
    """SDPA boolean mask (B, 1, S, S) keeping each sequence's own keys (bottom-right causal)."""
    s = max(lens)
    i = torch.arange(s, device=device)
    n = torch.tensor(lens, device=device)[:, None, None]
    m = (i[None, None, :] < n) & (i[None, :, None] < n)  # (B, S, S): real query rows, real keys
    if causal:
        m = m & (i[None, None, :] <= i[None, :, None])
    return m[:, None]


def forward_fn(impl: str, q, k, v, cu, lens, causal: bool):
    if impl.startswith("flashscale"):
        from flashscale.ops import attention
        which = impl.split("_")[1]
        kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens), causal=causal,
                  impl=which)
        return lambda: attention(q, k, v, **kw)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
          "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[impl.split("_")[1]]
    pq, pk, pv = (padded(t, cu, lens) for t in (q, k, v))
    if be == SDPBackend.FLASH_ATTENTION:
        # no mask argument: exact for the real rows only when causal (padding sits after every real key)
        if not causal:
            raise ValueError("SDPA's flash backend takes no mask: padded non-causal rows would attend to padding")

        def fn():
            with sdpa_kernel([be]):
                return torch.nn.functional.scaled_dot_product_attention(pq, pk, pv, is_causal=causal)
        return fn
    mask = _mask(lens, causal, q.device)

    def fn():
        with sdpa_kernel([be]):
            return torch.nn.functional.scaled_dot_product_attention(pq, pk, pv, attn_mask=mask)
    return fn


def check_group(hdim: int, causal: bool) -> dict:
    """fa3 and triton varlen vs the float64 varlen reference, against SDPA-flash's error on the same sequences
    run one at a time (exact, unpadded)."""
    from flashscale.ops import attention
    from flashscale.reference.attention import attention_ref
    heads = HIDDEN // hdim
    lens = lengths(1024, tokens=4096, seed=1)
    q, k, v, cu = packed(lens, heads, hdim, seed=1)
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens), causal=causal)
    ref = attention_ref(q.double(), k.double(), v.double(), **kw)
    sd = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        *(t[int(cu[i]):int(cu[i + 1])].transpose(0, 1)[None] for t in (q, k, v)), is_causal=causal)[0].transpose(0, 1)
        for i in range(len(lens))])
    e_sdpa = (sd.double() - ref).abs().max().item()
    bound = 2 * e_sdpa + torch.finfo(torch.bfloat16).eps * max(ref.abs().max().item(), 0.3)
    out = {}
    for impl in ("fa3", "triton"):
        e = (attention(q, k, v, impl=impl, **kw).double() - ref).abs().max().item()
        out[impl] = dict(err=e, sdpa_err=e_sdpa, ok=math.isfinite(e) and e <= bound)
    return out


def plot(rows, path: Path, gpu: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    groups = sorted({(r["hdim"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 3.6), squeeze=False)
    for ax, (d, c) in zip(axes[0], groups):
        for impl in IMPLS:
            pts = sorted((r["max_seqlen"], r["tflops"]) for r in rows if (r["hdim"], r["causal"], r["impl"]) == (d, c, impl))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d{d} {'causal' if c else 'full'}")
        ax.set_xlabel("max_seqlen")
        ax.set_ylabel("useful TFLOP/s")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"varlen forward, {TOKENS} tokens, {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"max_seqlen {QUICK} only")
    p.add_argument("--hdims", default=",".join(map(str, HDIMS)))
    p.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("attention_varlen.py: needs a CUDA GPU (the kernels' CPU checks are the tests)")
    try:
        hdims = [int(d) for d in args.hdims.split(",")]
    except ValueError:
        p.error(f"--hdims: takes comma-separated ints, got {args.hdims!r}")
    if bad := [d for d in hdims if d not in HDIMS]:
        p.error(f"--hdims: takes {HDIMS}, got {bad}")
    import triton
    gpu = torch.cuda.get_device_name()
    rows, checks = [], []
    for d in hdims:
        for causal in (False, True):
            chk = check_group(d, causal)
            checks.append(dict(hdim=d, causal=causal, **{f"{k}_{f}": v[f] for k, v in chk.items() for f in v}))
            print(f"check d{d} causal={causal}: " + ", ".join(f"{k} err {v['err']:.2e} ({'ok' if v['ok'] else 'FAIL'})"
                                                          for k, v in chk.items()), flush=True)
            for s in (QUICK if args.quick else MAX_SEQLENS):
                lens = lengths(s)
                heads = HIDDEN // d
                q, k, v, cu = packed(lens, heads, d)
                fl = useful_flops(lens, heads, d, causal)
                for impl in IMPLS:
                    if impl == "flashscale_fa3" and not all(v_["ok"] for v_ in chk.values()):
                        continue
                    try:
                        fn = forward_fn(impl, q, k, v, cu, lens, causal)
                        fn()
                        ms = triton.testing.do_bench(fn, warmup=25, rep=args.rep, return_mode="median")
                    except Exception as e:  # noqa: BLE001 - a backend that refuses a shape is a row, not a crash
                        print(f"  d{d} causal={causal} max {s}: {impl} failed: {type(e).__name__}: {e}"[:300])
                        continue
                    rows.append(dict(impl=impl, hdim=d, causal=causal, max_seqlen=s, nseq=len(lens), tokens=sum(lens),
                                     heads=heads, ms=ms, tflops=fl / ms / 1e9))
                    print(f"  d{d} causal={causal} max {s} ({len(lens)} seqs): {impl:<18} {ms:8.3f} ms "
                          f"{rows[-1]['tflops']:7.1f} TFLOP/s", flush=True)
                del q, k, v
                torch.cuda.empty_cache()
    result = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                  date=datetime.date.today().isoformat(), rows=rows, checks=checks,
                  setting=f"bf16 forward, {TOKENS} tokens a call, heads x head_dim = {HIDDEN}, lengths uniform in "
                          "[max/4, max], useful FLOPs only")
    args.out.mkdir(parents=True, exist_ok=True)
    name = "attention-varlen-" + gpu_tag(gpu)
    tmp = args.out / f"{name}.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(args.out / f"{name}.json")
    plot(rows, args.out / f"{name}.png", gpu)
    print(f"wrote {args.out / name}.json")
    return 0 if all(c.get("fa3_ok", True) and c.get("triton_ok", True) for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
