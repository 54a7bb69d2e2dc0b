"""L2 -> SM read bandwidth against HBM's: every program reads a whole buffer, as every W4A16 GEMM tile reads all of
x (docs/w4a16_gemm.md, session 38: is the 64-token tile bound by x's L2 stream at ~6.5 TB/s?).

    python benchmarks/l2_bandwidth.py [--sizes-mb 1,4,16,24,1024] [--programs-per-sm 1,2,4] [--out DIR]
    TRITON_INTERPRET=1 python benchmarks/l2_bandwidth.py --smoke        # CPU: the kernel against torch, tiny
    python benchmarks/l2_bandwidth.py --plot results/l2-bandwidth-h200.json    # the png again, from the JSON

A buffer of S bytes (int32 words) up to half the L2 is read whole by each of P programs, each starting at its own
16 KB chunk and wrapping around (bytes moved S x P, from L2 after the first pass: the L2 -> SM rate); a larger one
is split among the programs and read once (HBM's rate). Each program XOR-folds what it reads into 16 KB it stores
(nothing is optimised away; checked against torch). Timing: median of CUDA-graph replays.
Writes DIR/l2-bandwidth-<gpu>.json: rows impl (flashscale), size_mb, programs, whole, us, TBps.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plotting import gpu_tag, plot_only, pyplot  # noqa: E402

from flashscale.data.cache import atomic_write_text  # noqa: E402

CHUNK = 4096  # int32 words a program reads a step (16 KB)


@triton.jit
def _read(x_ptr, out_ptr, n_chunks, per, step, CHUNK: tl.constexpr):
    """Program p reads `per` chunks from chunk p * step on, wrapping at n_chunks; stores the XOR of its words."""
    pid = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.int32)
    c = (pid * step) % n_chunks
    for _ in range(per):
        acc ^= tl.load(x_ptr + c * CHUNK + offs)
        c = (c + 1) % n_chunks  # one scalar modulo a 16 KB chunk
    tl.store(out_ptr + pid * CHUNK + offs, acc)


def read(x: torch.Tensor, programs: int, whole: bool) -> torch.Tensor:
    """x: int32 (n_chunks * CHUNK,) -> (programs, CHUNK): whole, every program XORs all chunks (from its own one on);
    else the programs split the chunks (programs must divide them). Bytes read: x's size x programs, or once."""
    if x.dtype != torch.int32 or x.dim() != 1 or x.numel() % CHUNK:
        raise ValueError(f"x must be a 1-D int32 tensor of a multiple of {CHUNK} words, got {x.dtype} {tuple(x.shape)}")
    n = x.numel() // CHUNK
    if programs < 1 or (not whole and n % programs):
        raise ValueError(f"programs must be >= 1 (and divide the {n} chunks when not whole), got {programs}")
    out = torch.empty((programs, CHUNK), dtype=torch.int32, device=x.device)
    per = n if whole else n // programs
    _read[(programs, )](x, out, n, per, 1 if whole else per, CHUNK=CHUNK, num_warps=8)
    return out


def xor_rows(t: torch.Tensor) -> torch.Tensor:
    """(R, CHUNK) int32 -> (CHUNK,) XOR of the rows (on t's device)."""
    while t.shape[0] > 1:
        if t.shape[0] % 2:
            t = torch.cat([t[:1] ^ t[-1:], t[1:-1]])
        else:
            t = t[0::2] ^ t[1::2]
    return t[0]


def agrees(got: torch.Tensor, want: torch.Tensor, whole: bool) -> bool:
    """read()'s rows against the buffer's XOR: every row equal to it (whole), or their XOR (split)."""
    return torch.equal(got, want.expand_as(got)) if whole else torch.equal(xor_rows(got), want)


def plot(doc: dict, path: Path) -> None:
    """TB/s against programs, one line a buffer size (dashed: the split reads of the buffers past half the L2)."""
    plt = pyplot()
    if plt is None:
        return
    rows = doc["rows"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mb in sorted({r["size_mb"] for r in rows}):
        rs = sorted((r for r in rows if r["size_mb"] == mb), key=lambda r: r["programs"])
        ax.plot([r["programs"] for r in rs], [r["TBps"] for r in rs], "o" + ("-" if rs[0]["whole"] else "--"),
                label=f"{mb} MiB ({'every program reads it all' if rs[0]['whole'] else 'read once, split'})")
    ax.set_xlabel("programs")
    ax.set_ylabel("TB/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"read rate, L2-resident buffers vs HBM, {doc['gpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="1,4,16,24,1024", help="buffer sizes, MiB (whole reads up to half the L2)")
    ap.add_argument("--programs-per-sm", default="1,2,4")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--rep", type=int, default=50, help="ms of replays a cell")
    ap.add_argument("--smoke", action="store_true", help="check the kernel against torch on tiny buffers and stop")
    args = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") else "cpu"
    gen = torch.Generator().manual_seed(0)
    if args.smoke:
        for chunks, programs, whole in ((1, 1, True), (3, 5, True), (4, 2, False), (6, 3, False)):
            x = torch.randint(-2**31, 2**31 - 1, (chunks * CHUNK, ), generator=gen, dtype=torch.int32).to(dev)
            assert agrees(read(x, programs, whole).cpu(), xor_rows(x.view(-1, CHUNK).cpu()), whole), (chunks, programs)
        print("l2_bandwidth smoke: the kernel matches torch")
        return 0
    if dev != "cuda":
        raise SystemExit("l2_bandwidth: needs a CUDA GPU (or --smoke under TRITON_INTERPRET=1)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for mb in (int(v) for v in args.sizes_mb.split(",")):
        x = torch.randint(-2**31, 2**31 - 1, (mb * 2**20 // 4, ), dtype=torch.int32, device="cuda")
        want = xor_rows(x.view(-1, CHUNK))
        whole = mb * 2**20 <= l2 // 2  # resident: every program reads it all; past L2 the programs split it once
        for pps in (int(v) for v in args.programs_per_sm.split(",")):
            programs = sms * pps
            if not whole:
                programs = max(p for p in range(1, programs + 1) if (x.numel() // CHUNK) % p == 0)
            assert agrees(read(x, programs, whole), want, whole), (mb, pps)
            ms = triton.testing.do_bench_cudagraph(lambda: read(x, programs, whole), rep=args.rep, return_mode="median")
            moved = mb * 2**20 * (programs if whole else 1)
            tbps = moved / (ms * 1e-3) / 1e12
            rows.append(dict(impl="flashscale", size_mb=mb, programs=programs, whole=whole, us=ms * 1e3, TBps=tbps))
            print(f"{mb:5d} MiB x {programs:4d} programs ({'each all' if whole else 'split'}): {ms * 1e3:9.1f} us"
                  f"  {tbps:6.2f} TB/s", flush=True)
        x = None  # free the buffer before the next size
    gpu = torch.cuda.get_device_name()
    out = Path(args.out) / f"l2-bandwidth-{gpu_tag(gpu)}.json"
    doc = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(), note="", rows=rows)
    atomic_write_text(out, json.dumps(doc, indent=1))
    plot(doc, out.with_suffix(".png"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(0 if plot_only(sys.argv[1:], plot) else main())
