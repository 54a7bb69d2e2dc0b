"""End-to-end decode speed: a Llama-3-8B-shaped model (random weights) at batch 1, greedy, in bf16 and
with its linears in 4 bits (QuantLinear, group 128, the W4A16 kernels), both in this run.

    python benchmarks/generate_w4a16.py [--layers 32] [--tokens 128] [--keep-lm-head] [--out DIR]
    python benchmarks/generate_w4a16.py --plot results/generate_w4a16-h200.json   # its png again
    TRITON_INTERPRET=1 python benchmarks/generate_w4a16.py --device cpu   # self-check, tiny model

Decode step: flashscale.infer.decode.StaticDecoder (what generate(cuda_graph=True) runs) with fuse=True: q/k/v
and gate/up weights fused into one linear each (as serving engines do), a static KV cache (L, G, T, D), token
and position on the device, and three small Triton kernels for the rest of a block (flashscale.kernels.decode:
residual add + RMSNorm; RoPE + cache write + attention for one query; SiLU(gate) * up): 8 launches a block, the
same for both precisions. With greedy=True the step writes argmax(logits) and position + 1 back into its
inputs, so replaying the graph N times is the whole generation; tokens/s = N / (CUDA-event time). Before timing, the step is checked against
Llama.forward with a KVCache (attention through torch SDPA there) on the first positions. The
embedding stays bf16; the lm_head is quantized too unless --keep-lm-head. Each precision is timed three ways: plain
launches; with programmatic dependent launch for the step's Triton kernels (rows "+pdl": kernels.pdl; the bf16
linears are cuBLAS's and launch plainly); and with the W4A16 kernels also prefetching their weights into L2
before they wait (rows "+pdl+l2"; the bf16 rows only differ by run-to-run noise there). The 4-bit model once more
with StaticDecoder(accumulate=True) (row "+acc": each GEMV red.adds its fp32 partials into the layer's output and the
next kernel reads the sum, no split-K fold at the GEMV's end), and that with PDL (row "+pdl+acc": the ring kernel
loads its first items' weight words before it waits for the kernel ahead, and never lets the next one in early).
Rows "+trig": each ring GEMV lets the next kernel launch once its programs all run (its programs then take the SM
slots the ring's leave and load their first weight words while it ends); "+pro": the RMSNorms and SiLU * up run
inside the GEMVs that read them (w4a16_prologue: 5 launches a block instead of 8); "+head": the final norm and the
4-bit lm_head in one GEMV adding into the float32 logits (StaticDecoder's default with prologue). --all adds the rows
+trig and +pro alone (results/generate_w4a16-trig-h200.json has them: +pro alone lost, +trig alone gained ~1 %) and
+pre4 / +pre8 (session 31: slower). "+glue": the step's first and last kernels are flashscale's (embedding and the
zeroed sums; argmax and pos + 1; PDL-aware) instead of torch's ops, for both precisions ("bf16+glue" is the anchor of
the rows with it); "+comb": the attention's split combine in the o GEMV's prologue (StaticDecoder.attn_in_o); "+sN":
N context splits a head instead of the automatic (4 at 144 positions since session 32; 8 before); "+tuned": each
GEMV's config chosen by the whole step's time (StaticDecoder.tune_in_step; the run's last rows: it pins them);
"+dyn": the GEMVs but down take their items from a counter a launch (StaticDecoder.dyn, w4a16_ring's DYN build: slow
programs take fewer; measured 1.65x slower a step); "+lateN[sM]": every accumulating GEMV's tuned config with uneven
static shares (RingConfig.late = N eighths of a share for the last M / per_sm of its programs, those placed last on
their SMs; --all: measured 2-7 % slower, results/generate_w4a16-late-h200.json). PDL and +acc rows are checked against the model again first. --only runs the listed 4-bit rows (and
bf16+glue) into generate_w4a16-<gpu>-only.json; rows that pin configs need a row before them that tuned the GEMVs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from plotting import gpu_tag, plot_only, pyplot  # noqa: E402

import flashscale.models.llama as llama_mod  # noqa: E402
from flashscale.infer.decode import StaticDecoder  # noqa: E402
from flashscale.kernels.w4a16 import pin_config, precompile, ring_add_choices, tuned_configs  # noqa: E402
from flashscale.models.config import LlamaConfig, preset  # noqa: E402
from flashscale.models.llama import KVCache, Llama  # noqa: E402
from flashscale.quant.qlinear import QuantLinear  # noqa: E402


def _sdpa(q, k, v, *, causal=False, softmax_scale=None):
    """(B, S, H, D) attention through torch SDPA, bottom-right causal (Llama.forward's contract)."""
    sq, sk = q.shape[1], k.shape[1]
    mask = None
    if causal and sq > 1:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                       scale=softmax_scale, enable_gqa=True)
    return o.transpose(1, 2)


@torch.no_grad()
def check_against_model(dec: StaticDecoder, model: Llama, prompt: list[int]) -> float:
    """Worst relative difference of step() logits vs Llama.forward with a KVCache over the prompt."""
    dev = dec.x.device
    cache = KVCache.empty(model.config, 1, dec.max_len, device=dev, dtype=dec.x.dtype)
    dec.greedy, dec.length = False, 0
    dec.pos.zero_()
    worst = 0.0
    saved, llama_mod.attention = llama_mod.attention, _sdpa
    try:
        for t in prompt:
            got = dec.step(t)[0]
            want = model(torch.tensor([[t]], device=dev), cache=cache)[0, -1].float()
            worst = max(worst, ((got - want).norm() / want.norm()).item())
    finally:
        llama_mod.attention = saved
    return worst


@torch.no_grad()
def random_model(cfg: LlamaConfig, device: str, dtype: torch.dtype) -> Llama:
    """The benchmark's model: cfg's shape, weights N(0, initializer_range) from seed 0, eval mode."""
    torch.manual_seed(0)
    with torch.device(device):
        torch.set_default_dtype(dtype)
        model = Llama(cfg)
        torch.set_default_dtype(torch.float32)
    for p in model.parameters():
        if p.dim() == 2:
            p.normal_(0.0, cfg.initializer_range)
    return model.eval()


@torch.no_grad()
def time_decode(dec: StaticDecoder, tokens: int, first: int) -> float:
    dec.greedy = True  # the graph feeds its own argmax back: N replays are the whole generation
    dec.prefill(torch.tensor([[first]], device=dec.x.device))
    dec.capture()
    return dec.replay_ms(tokens)  # ms per token


@torch.no_grad()
def kernel_breakdown(dec: StaticDecoder, replays: int = 4) -> dict:
    """Device time a token by kernel (torch.profiler over graph replays; CUPTI sees the kernels inside a graph):
    {"kernel_ms": sum a token, "by_kernel": {name: ms a token}} for the 8 largest; the difference to ms_per_token
    is the GPU's idle time between kernels (the bubbles the PDL rows aim at)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            dec.graph.replay()
        torch.cuda.synchronize()
    per = {}
    for e in prof.key_averages():
        if e.device_time_total > 0:
            per[e.key] = per.get(e.key, 0.0) + e.device_time_total / 1e3 / replays  # us -> ms a token
    top = dict(sorted(per.items(), key=lambda kv: -kv[1])[:8])
    return {"kernel_ms": sum(per.values()), "by_kernel": {k[:60]: round(v, 4) for k, v in top.items()},
            "critical_ms": critical_path(prof, replays, len(dec.blocks))}


def critical_path(prof, replays: int, layers: int) -> dict:
    """What each kernel adds to the step: kernels in order of their end, each charged end - the previous kernel's
    end (under PDL a grid starts early, so its own duration overstates it), summed by name over a token (ms); the
    W4A16 GEMVs by their place in a block (w4a16[0] q/k/v, [1] o, [2] gate/up, [3] down, [head] the lm_head)."""
    ev = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start),
                key=lambda e: e.time_range.end)
    per_step = len(ev) // replays
    out, last = {}, None
    for i, e in enumerate(ev):
        if i % per_step == 0:
            ring = 0
        name = e.name.split("(")[0].replace("void ", "")[:40]
        if name.startswith("w4a16_"):
            name = f"w4a16[{ring % 4 if ring < 4 * layers else 'head'}]"
            ring += 1
        if last is not None:
            out[name] = out.get(name, 0.0) + (e.time_range.end - last) / 1e3 / replays
        last = e.time_range.end
    return {k: round(v, 4) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def weight_bytes(dec: StaticDecoder) -> int:
    mods = [dec.lm_head] + [b[k] for b in dec.blocks for k in ("qkv", "o", "gu", "down")]
    n = 0
    for mod in mods:
        if isinstance(mod, QuantLinear):
            n += mod.pk_qweight.numel() * 4 + mod.pk_sz.numel() * 4
        else:
            n += mod.weight.numel() * mod.weight.element_size()
    return n


def _quantize_model(model: Llama, group_size: int, lm_head: bool) -> None:
    for name, mod in list(model.named_modules()):
        for leaf, child in list(mod.named_children()):
            full = f"{name}.{leaf}" if name else leaf
            if isinstance(child, nn.Linear) and (lm_head or full != "lm_head"):
                setattr(mod, leaf, QuantLinear.from_float(child, group_size=group_size, sym=True))


def variant_name(impl: str, v: dict, head_acc: bool) -> str:
    l2, pre = (False, v["l2"]) if v["l2"] is not True and v["l2"] else (v["l2"], 0)
    return (impl + ("+pdl" if v["pdl"] else "") + ("+l2" if l2 else "") + ("+acc" if v["acc"] else "")
            + ("+pro" if v["pro"] else "") + ("+trig" if v["trig"] else "") + ("+head" if v["head"] and head_acc else "")
            + (f"+pre{pre}" if pre else "") + ("+glue" if v["glue"] else "")
            + ("+comb" if v["comb"] and v["pro"] else "") + (f"+s{v['splits']}" if v["splits"] else "")
            + ("+dyn" if v["dyn"] else "")
            + (f"+late{v['late'][0]}" + (f"s{v['late'][1]}" if v["late"][1] > 1 else "") if v["late"] else "")
            + ("+tuned" if v["tune"] else ""))


def pin_late(late: int, share: int) -> dict:
    """Pin every accumulating ring GEMV's tuned config of this process with uneven shares (RingConfig.late,
    late_share); returns the configs pinned before, to put back."""
    before = {}
    for key, choices in ring_add_choices().items():
        cfg, split = choices[0]
        before[key] = (cfg, split)
        pin_config(key, replace(cfg, late=late, late_share=min(share, split)), split)
    return before


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--layers", type=int, default=32, help="blocks (32 = Llama-3-8B)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--keep-lm-head", action="store_true", help="leave the lm_head in bf16")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu: a tiny model, eager, a self-check only")
    ap.add_argument("--no-pdl", action="store_true", help="skip the +pdl and +pdl+l2 rows (not +pdl+acc)")
    ap.add_argument("--only", default="",
                    help="comma-separated 4-bit row suffixes to run (e.g. +pdl+acc+pro+trig+head+glue+late6); bf16+glue "
                         "always runs; the file is then generate_w4a16-<gpu>-only.json")
    ap.add_argument("--all", action="store_true", help="also the rows +pdl+acc+trig and +pdl+acc+pro (no trigger)")
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu with TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    if not cpu:  # the GEMV configs, compiled in parallel before the model takes the GPU's time
        precompile([dict(m=1, k=256, n=256, group_size=args.group_size, dtype="bfloat16", act_order=False,
                         bias=False)])
    cfg = (LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128) if cpu
           else preset("llama3-8B", num_hidden_layers=args.layers))
    model = random_model(cfg, args.device, torch.float16 if cpu else torch.bfloat16)  # interpreter: no bf16 casts
    max_len = (8 if cpu else args.tokens) + 16
    prompt = [int(t) for t in torch.randint(0, cfg.vocab_size, (6,))]
    rows, checks, tuned_in_step = [], {}, {}
    for quantize in (False, True):
        impl = "flashscale-w4a16" if quantize else "bf16"
        lm_head = model.lm_head
        if quantize and not args.keep_lm_head:
            lm_head = QuantLinear.from_float(model.lm_head, group_size=args.group_size, sym=True)
        qfn = (lambda lin: QuantLinear.from_float(lin, group_size=args.group_size, sym=True)) if quantize else None
        dec = StaticDecoder(model, max_len, fuse=True, linear_fn=qfn, lm_head=lm_head, accumulate=False)
        if quantize:
            _quantize_model(model, args.group_size, lm_head=not args.keep_lm_head)  # the check's reference
            torch.cuda.empty_cache() if not cpu else None
        checks[impl] = check_against_model(dec, model, prompt)
        print(f"  {impl}: decode step vs Llama.forward, worst relative logit difference {checks[impl]:.2e}", flush=True)
        if checks[impl] > 0.25:  # far past rounding (bf16 over 32 blocks gives ~1e-2): a broken step
            raise SystemExit(f"{impl}: the decode step disagrees with Llama.forward")
        if cpu:
            continue
        base = dict(pdl=False, l2=False, acc=False, pro=False, trig=False, head=False, glue=False, comb=False,
                    splits=None, tune=False, dyn=False, late=None)
        variants = [base, {**base, "glue": True}]  # the step's first/last kernels: torch's ops, then ours
        if quantize:
            variants += [{**base, "acc": True}, {**base, "pdl": True, "acc": True}]
            variants += [{**base, "pdl": True, "acc": True, "trig": True},
                         {**base, "pdl": True, "acc": True, "pro": True}] * args.all
            top = {**base, "pdl": True, "acc": True, "pro": True, "trig": True, "head": True}  # session 31's default
            variants += [top, {**top, "glue": True}, {**top, "glue": True, "comb": True}]
            variants += [{**top, "glue": True, "splits": n} for n in (8,)] * args.all  # session 31's automatic
            variants += [{**top, "glue": True, "dyn": True}]  # items taken from a counter a launch (w4a16_ring DYN)
            # uneven static shares: the programs placed last on an SM take late/8 of a share (RingConfig.late)
            variants += [{**top, "glue": True, "late": lt} for lt in ((6, 1), (7, 1), (6, 2))] * args.all  # slower
            variants += [{**top, "glue": True, "tune": True}]  # last: tune_in_step pins the step GEMVs' configs
            variants += [{**top, "l2": n} for n in (4, 8)] * args.all  # pre-wait L2 items (session 31: slower)
        variants += [] if args.no_pdl else [{**base, "pdl": True}, {**base, "pdl": True, "l2": True}]
        head_acc = dec.head_acc
        auto_splits = dec.splits
        only = [o for o in args.only.split(",") if o]
        if only:
            variants = [v for v in variants if not quantize and v["glue"] and not v["pdl"]
                        or variant_name(impl, v, head_acc)[len(impl):] in only]
        for v in variants:
            use_pdl, l2, acc, pro, trig, head = (v[k] for k in ("pdl", "l2", "acc", "pro", "trig", "head"))
            pre, l2 = (l2, False) if l2 is not True and l2 else (0, l2)  # an int: items asked of L2 before the wait
            name = variant_name(impl, v, head_acc)
            late_pins = pin_late(*v["late"]) if v["late"] else {}
            # eager until time_decode captures the variant
            dec.pdl, dec.l2_prefetch, dec.accumulate, dec.graph = use_pdl, l2, acc, None
            dec.prologue, dec.trigger, dec.head_acc, dec.pre_l2 = pro, trig, head and head_acc, pre
            dec.glue, dec.attn_in_o, dec.dyn = v["glue"], v["comb"], v["dyn"]
            dec.set_attn_splits(v["splits"] or auto_splits)
            if use_pdl or acc:  # the eager step of the variant, against the model again (ordering on the GPU)
                checks[name] = check_against_model(dec, model, prompt)
                print(f"  {name}: decode step vs Llama.forward, worst relative logit difference {checks[name]:.2e}",
                      flush=True)
                if checks[name] > 0.25:
                    raise SystemExit(f"{name}: the decode step disagrees with Llama.forward")
            if v["tune"]:  # each GEMV's config by the whole step's time (StaticDecoder.tune_in_step)
                dec.prefill(torch.tensor([[prompt[-1]]], device=dec.x.device))
                tuned_in_step.update(dec.tune_in_step())
                print(f"  tuned in the step: {tuned_in_step}", flush=True)
            ms = time_decode(dec, args.tokens, prompt[-1])
            try:  # where the time goes: kernels vs the gaps between them
                breakdown = kernel_breakdown(dec)
            except Exception as e:  # the profiler is a diagnostic: never lose the timing for it
                breakdown = {"profile_error": f"{type(e).__name__}: {e}"[:200]}
            nbytes = weight_bytes(dec)
            for key, (cfg, split) in late_pins.items():  # the tuned configs back
                pin_config(key, cfg, split)
            rows.append(dict(impl=name, layers=args.layers, batch=1, tokens=args.tokens, ms_per_token=ms,
                             tokens_per_s=1e3 / ms, weight_bytes=nbytes, TBps=nbytes / (ms * 1e9),
                             lm_head="bf16" if (args.keep_lm_head or not quantize) else "w4a16", pdl=use_pdl,
                             l2_prefetch=l2, accumulate=acc, prologue=pro, trigger=trig,
                             head_in_acc=bool(head and head_acc), pre_l2=pre, glue=v["glue"],
                             attn_in_o=bool(v["comb"] and pro), attn_splits=dec.splits, dyn=v["dyn"],
                             late=list(v["late"] or (8, 1)), **breakdown))
            print(f"  {name:22s} {1e3 / ms:8.1f} tok/s  {ms:7.3f} ms/token  {nbytes / 1e9:6.2f} GB read/token  "
                  f"{nbytes / (ms * 1e9):5.2f} TB/s  kernels {breakdown.get('kernel_ms', float('nan')):.3f} ms",
                  flush=True)
        del dec
    if cpu:
        print("cpu self-check passed")
        return 0
    gpu = torch.cuda.get_device_name()
    tag = gpu_tag(gpu)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"generate_w4a16-{tag}{'-only' if args.only else ''}.json"
    tmp = path.with_name(path.name + ".tmp")  # atomic: a reader never sees half a file
    tmp.write_text(json.dumps(dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                                    date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                    model=f"llama3-8B shape, {args.layers} layers, random weights",
                                    group_size=args.group_size, rows=rows, step_checks=checks,
                                    tuned=tuned_configs(), tuned_in_step=tuned_in_step), indent=1))
    tmp.replace(path)
    plot(json.loads(path.read_text()), path.with_suffix(".png"))
    by = {r["impl"]: r for r in rows}
    print(f"\nLlama-3-8B-shaped decode, batch 1, {args.tokens} tokens, CUDA graph, {gpu}")
    print(f"{'impl':22s} {'tok/s':>8} {'ms/tok':>8} {'GB/tok':>7} {'TB/s':>6}")
    for r in rows:
        print(f"{r['impl']:22s} {r['tokens_per_s']:8.1f} {r['ms_per_token']:8.3f} {r['weight_bytes'] / 1e9:7.2f} "
              f"{r['TBps']:6.2f}")
    for r in rows:  # each 4-bit row against bf16 with the same step glue, and against plain bf16
        if r["impl"].startswith("flashscale"):
            b = by.get("bf16+glue" if r["glue"] else "bf16")
            tag = r["impl"][len("flashscale-w4a16"):] or "plain"
            plain = (f" (against plain bf16: {r['tokens_per_s'] / by['bf16']['tokens_per_s']:.2f}x)" if "bf16" in by
                     else "")
            if b is not None:  # (--only runs bf16+glue alone)
                print(f"speedup {tag}: {r['tokens_per_s'] / b['tokens_per_s']:.2f}x{plain}")
    print(f"wrote {path}")
    return 0


def plot(doc: dict, path: Path) -> None:
    """ms a token by variant (bf16 rows grey, 4-bit blue), the 3x target as a line."""
    plt = pyplot()
    if plt is None:
        return
    rows = doc["rows"]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    names = [r["impl"].replace("flashscale-w4a16", "w4a16") for r in rows]
    ax.barh(names, [r["ms_per_token"] for r in rows],
            color=["#999999" if r["impl"].startswith("bf16") else "#3070b0" for r in rows])
    ref = next((r for r in rows if r["impl"] == "bf16+glue"), rows[0])
    ax.axvline(ref["ms_per_token"] / 3, color="red", linestyle="--", label=f"3x {ref['impl']}")
    ax.invert_yaxis()
    ax.set_xlabel("ms a token (batch 1, CUDA graph)")
    ax.set_title(f"Llama-3-8B-shaped decode, {doc['gpu']}")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(0 if plot_only(sys.argv[1:], plot) else main())
