"""Compile the attention kernels for Hopper (sm_90a) without a GPU and report their resources.

For every (kernel, head dim, config) it runs the real launcher with CPU tensors, captures the launch,
compiles it ahead of time with Triton for GPUTarget("cuda", 90) and reads ptxas's report: registers per
thread, spill bytes, shared memory, and whether the SASS uses Hopper's warpgroup MMA (HGMMA). Configs
that spill or do not fit are the ones not to ship; this costs no device time.

    python benchmarks/attention_resources.py [--hdim 64 128 256] [--kernels fwd bwd dq] [--causal]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("unset TRITON_INTERPRET: this compiles real GPU code")

import torch  # noqa: E402
import triton  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from flashscale.kernels import attention_bwd as bwd_mod  # noqa: E402
from flashscale.kernels import attention_fwd as fwd_mod  # noqa: E402
from flashscale.kernels.attention_tune import BwdConfig, FwdConfig, bwd_candidates, dq_candidates  # noqa: E402
from flashscale.kernels.attention_tune import fwd_candidates  # noqa: E402

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


class _Capture:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kw)` records the call."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((args, kw))


def _compile(fn, args, kw, overrides):
    kw = {**kw, **overrides}
    opts = {k: kw.pop(k) for k in ("num_warps", "num_stages") if k in kw}
    names = fn.arg_names
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(names):
        val = args[i] if i < len(args) else kw[name]
        if name in kw and i >= len(args) and (isinstance(val, (bool, str)) or name.isupper()):
            signature[name] = "constexpr"
            constexprs[(i,)] = val
            continue
        ty, spec = native_specialize_impl(CUDABackend, val, False, True, True)
        signature[name] = ty
        if ty == "constexpr":
            constexprs[(i,)] = spec
        elif spec == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    t0 = time.time()
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    return compiled, time.time() - t0


def _ptxas_report(compiled) -> dict:
    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"
        ptx.write_text(compiled.asm["ptx"])
        r = subprocess.run([str(PTXAS), "-arch=sm_90a", "-v", str(ptx), "-o", str(Path(d) / "k.cubin")],
                           capture_output=True, text=True)
        text = r.stderr + r.stdout
        cub = Path(d) / "k.cubin"
        cub.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(CUOBJDUMP), "-sass", str(cub)], capture_output=True, text=True).stdout
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return dict(regs=int(regs.group(1)) if regs else -1, spill_st=int(spill.group(1)) if spill else -1,
                spill_ld=int(spill.group(2)) if spill else -1, smem=compiled.metadata.shared,
                hgmma=sass.count("HGMMA"), hmma=sass.count("HMMA"), warps=compiled.metadata.num_warps,
                red=sorted({m for m in re.findall(r"\bREDG?\.[A-Z0-9_.]+", sass)}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--kernels", nargs="+", default=["fwd", "bwd", "dq"], choices=["fwd", "bwd", "dq"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--features", action="store_true",
                    help="every optional branch on: window, softcap, ALiBi, dropout, varlen, GQA, dLSE")
    ap.add_argument("--first", action="store_true", help="only the default (first) config of each kernel")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    rows = []
    for d in args.hdim:
        B, S, H = 2, 1024, 2048 // d
        q, k, v = (torch.empty(B, S, H, d, dtype=dtype) for _ in range(3))
        lse = torch.empty(B, H, S)
        window = (-1, 0) if args.causal else (-1, -1)
        extra, bextra = {}, {}
        if args.features:  # odd sizes on purpose: no divisibility specialization to lean on
            T, Tk, Hkv = 2 * 999, 2 * 777, max(H // 4, 1)
            q, k, v = torch.empty(T, H, d, dtype=dtype), torch.empty(Tk, Hkv, d, dtype=dtype), \
                torch.empty(Tk, Hkv, d, dtype=dtype)
            lse = torch.empty(H, T)
            cu_q, cu_k = torch.tensor([0, 999, T], dtype=torch.int32), torch.tensor([0, 777, Tk], dtype=torch.int32)
            window = (100, 0) if args.causal else (100, 37)
            extra = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=999, max_seqlen_k=777, softcap=30.0,
                         alibi_slopes=torch.rand(2, H), dropout_p=0.1, seed=1234)
            bextra = dict(extra, dlse=torch.empty(H, T))
        for kind in args.kernels:
            if kind == "fwd":
                cands = fwd_candidates(d, dtype, gpu=True, hopper=True)[:1 if args.first else None]
                for cfg in cands:
                    cap = _Capture(fwd_mod._attn_fwd_kernel)
                    orig, fwd_mod._attn_fwd_kernel = fwd_mod._attn_fwd_kernel, cap
                    try:
                        fwd_mod.attention_fwd(q, k, v, torch.empty_like(q), lse, softmax_scale=d ** -0.5,
                                              window=window, config=cfg, **extra)
                    finally:
                        fwd_mod._attn_fwd_kernel = orig
                    a, kw = cap.calls[-1]
                    over = dict(USE_TMA=cfg.tma, WARP_SPEC=cfg.warp_specialize and cfg.tma)
                    rows.append(_row(kind, d, cfg, orig, a, kw, over))
            else:
                cands = (bwd_candidates if kind == "bwd" else dq_candidates)(d, dtype, gpu=True, hopper=True)
                cands = cands[:1 if args.first else None]
                for cfg in cands:
                    name = "_attn_bwd_dkdv_kernel" if kind == "bwd" else "_attn_bwd_dq_kernel"
                    saved = {n: getattr(bwd_mod, n) for n in
                             ("_bwd_preprocess", "_attn_bwd_dkdv_kernel", "_attn_bwd_dq_kernel")}
                    caps = {n: _Capture(f) for n, f in saved.items()}
                    for n, c in caps.items():
                        setattr(bwd_mod, n, c)
                    orig, cap = saved[name], caps[name]
                    try:
                        bcfg = cfg if kind == "bwd" else BwdConfig(block_m=16, block_n=16)
                        qcfg = cfg if kind == "dq" else FwdConfig(block_m=16, block_n=16)
                        bwd_mod.attention_bwd(q, q, k, v, q, lse, torch.empty_like(q), torch.empty_like(k),
                                              torch.empty_like(v), softmax_scale=d ** -0.5, window=window,
                                              deterministic=kind == "dq", config=bcfg, dq_config=qcfg, **bextra)
                    finally:
                        for n, f in saved.items():
                            setattr(bwd_mod, n, f)
                    a, kw = cap.calls[-1]
                    rows.append(_row(kind, d, cfg, orig, a, kw, {}))
                    if kind == "bwd" and args.features:  # the preprocess kernel, with dLSE
                        a, kw = caps["_bwd_preprocess"].calls[-1]
                        rows.append(_row("pre", d, cfg, saved["_bwd_preprocess"], a, kw, {}))
    print(f"{'kernel':6} {'d':>4} {'config':58} {'regs':>4} {'spill':>6} {'smem':>7} {'hgmma':>5} {'s':>5}")
    for r in rows:
        print(f"{r['kind']:6} {r['d']:>4} {r['cfg']:58} {r['regs']:>4} {r['spill_st']:>6} {r['smem']:>7} "
              f"{r['hgmma']:>5} {r['secs']:>5.1f}" + (f"  ERROR {r['error']}" if r.get("error") else "")
              + (f"  {' '.join(r['red'])}" if r.get("red") else ""))
    return 0


def _row(kind, d, cfg, fn, a, kw, over):
    desc = ", ".join(f"{k}={v}" for k, v in vars(cfg).items())
    try:
        compiled, secs = _compile(fn, a, kw, over)
        return dict(kind=kind, d=d, cfg=desc, secs=secs, **_ptxas_report(compiled))
    except Exception as e:  # report and go on: the point is to see which configs compile
        return dict(kind=kind, d=d, cfg=desc, secs=0.0, regs=-1, spill_st=-1, smem=-1, hgmma=-1,
                    error=f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")


if __name__ == "__main__":
    sys.exit(main())
