"""flashscale.ops.attention: FlashAttention-2 (Triton) with flash-attn's layouts and features.

    out = attention(q, k, v, causal=True)                               # (B, S, H, D), the model's call
    out, lse = attention(q, k, v, window=(256, 0), softcap=30.0, return_lse=True)
    out = attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m, max_seqlen_k=m)  # packed

Dense layout q (B, Sq, H, D), k/v (B, Sk, Hkv, D); packed varlen layout q (Tq, H, D), k/v (Tk, Hkv, D)
with int32 cu_seqlens (B+1,). H % Hkv == 0 (GQA/MQA, no K/V copy). Causal is aligned bottom-right when
Sq != Sk. The semantics of every feature are written down in flashscale.reference.attention.
Under autocast, attention runs in the autocast dtype (as torch's SDPA does).
"""

from __future__ import annotations

import math
import os
import weakref

import torch

from flashscale.kernels.interpreter import require_launchable
from flashscale.ops.attention_op import PATHS, AttentionFunction, attention_fwd_op

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_IMPLS = ("auto", "triton", "fa3", "reference")
# impl="auto" on an sm_90 GPU takes the Hopper forward (kernels.attention_fa3, FA2's backward) where the H200
# measured it faster than the tuned FA2 forward (benchmarks/results/attention-fa3-sweep-h200.json, ping-pong
# consumers, against attention-h200.json; 2026-11-29): head_dim 128 from 1024 query rows (1.1-1.2x), 256 from
# 2048 (1.2-1.3x), 64 from 2048 (1.0x causal, 1.1x full at 2k; 1.15-1.2x at 16k); short sequences stay FA2's.
# Session 19 (benchmarks/attention_host.py --rule, results/attention_rule-h200.json: GPU kernel time of each
# forward): head dim 256 from 1024 rows too (fa3 442 / 358 TFLOP/s full / causal against the tuned FA2's 402 /
# 289; the grid then measured 438 full). At 512 fa3's kernels are faster still at 128 and 256 (227-389 against
# 175-326) but run for 0.13-0.19 ms, under the ~0.15-0.25 ms of host time a call: eager calls there are
# host-bound and the grid measured fa3 at 0.5-0.9x FA2 (attention-h200.json runs of session 19), so 512 stays
# FA2's. At 64 FA2 stayed ahead below 2048 (causal 1k: 209 against 240) until the head-grouped tile order and the
# persistent configs of attention_fa3.SEQLEN_CONFIGS (2026-12-03 sweeps: 1k full 371, causal 259 against FA2's 324 /
# 240 in the grid): 64 from 1024 as well.
# Session 26 (the launch cache has cut a call's host time to ~0.1 ms): the grid's 512 cells with fa3 forced
# (FLASHSCALE_FA3=1, benchmarks/results/attention-fa3-512-h200.json) measured the fa3 forward at 343 / 194 (d64
# full / causal), 421 / 267 (d128), 445 / 237 (d256) TFLOP/s against FA2's 262 / 160, 261 / 173, 323 / 209 in the
# grid before: every head dim from 512 now.
# FLASHSCALE_FA3=1 takes it wherever it applies, =0 never.
FA3_ENV = "FLASHSCALE_FA3"
FA3_AUTO_MIN_SEQLEN_Q = {64: 512, 128: 512, 256: 512}
# The packed varlen layout goes to the fa3 forward under "auto" since its GPU tests (tests/kernels/
# test_attention_fa3_gpu.py -k varlen: 43 passed on an H200, 2026-12-02), by its own rule: (head_dim, causal) ->
# from which max_seqlen_q. benchmarks/attention_varlen.py on the H200 (attention-varlen-h200.json, 2026-12-02;
# 16k tokens a call, lengths uniform in [max/4, max]) measured fa3 faster than FA2's varlen forward in every cell
# from max 4096 (d64 full), 8192 (d64 causal), 1024 (d128 full, 1.15x), 2048 (d128 causal), 1024 (d256, 1.2-1.8x)
# and FA2 ahead below those (d64 causal up to 1.2x); the thresholds are 3/4 of those lengths (a batch's
# max_seqlen_q sits a little under the nominal max). False keeps varlen on FA2 (impl="fa3" still takes it).
FA3_AUTO_VARLEN = True
FA3_AUTO_VARLEN_MIN_SEQLEN_Q = {(64, False): 3072, (64, True): 6144, (128, False): 768, (128, True): 1536,
                                (256, False): 768, (256, True): 768}


def _auto_wants_fa3(q: torch.Tensor, seqlen_q: int, varlen: bool = False, causal: bool = False) -> bool:
    mode = os.environ.get(FA3_ENV, "")
    if mode not in ("", "0", "1"):
        raise ValueError(f"{FA3_ENV}={mode!r}: takes 1 (the fa3 forward wherever it applies), 0 (never) or unset "
                         "(where it measured faster: " + ", ".join(f"head_dim {d} from {n} query rows"
                                                         for d, n in FA3_AUTO_MIN_SEQLEN_Q.items()) + ")")
    if mode == "0" or not q.is_cuda:
        return False
    d = q.shape[-1]
    need = FA3_AUTO_VARLEN_MIN_SEQLEN_Q.get((d, bool(causal))) if varlen else FA3_AUTO_MIN_SEQLEN_Q.get(d)
    return mode == "1" or (need is not None and seqlen_q >= need)


def _auto_takes_fa3(q: torch.Tensor, seqlen_q: int, varlen: bool, causal: bool = False) -> bool:
    """impl="auto": whether to try the fa3 forward (then only if fa3_unsupported finds nothing)."""
    if varlen and not FA3_AUTO_VARLEN:
        _auto_wants_fa3(q, seqlen_q)  # still rejects a bad FLASHSCALE_FA3 value
        return False
    return _auto_wants_fa3(q, seqlen_q, varlen, causal)


def fa3_unsupported(q, k, v, *, varlen: bool, left: int, right: int, causal: bool, softcap: float,
                    alibi_slopes, dropout_p: float, softmax_scale: float) -> str | None:
    """Why the FA3 forward cannot take this call (None: it can). Features first, then the tensors (dense, or
    the packed varlen layout)."""
    if not softmax_scale > 0:
        return f"softmax_scale={softmax_scale}: fa3 takes a scale > 0 (the FA2 kernels take any)"
    if left != -1 or (right != -1 and not causal):
        return f"window={(left, right)}: sliding windows run on the FA2 kernels (fa3 takes causal or none)"
    if softcap:
        return f"softcap={softcap}: runs on the FA2 kernels"
    if alibi_slopes is not None:
        return "alibi_slopes: runs on the FA2 kernels"
    if dropout_p:
        return f"dropout_p={dropout_p}: runs on the FA2 kernels"
    from flashscale.kernels.attention_fa3 import unsupported

    # the op copies non-contiguous and misaligned ones (attention_op.fwd_impl); no data pointer is read here, so
    # torch.compile traces this decision without a graph break
    return unsupported(q, k, v, need_contiguous=False, varlen=varlen, need_aligned=False)



def _check_tensor(name: str, t: torch.Tensor, rank: int, layout: str) -> None:
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name}.dtype must be float16, bfloat16, float32 or float64; got {t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D {layout}; got shape {tuple(t.shape)}")
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must have a contiguous last (head_dim) dimension, stride 1; got stride "
                         f"{t.stride(-1)} (call .contiguous())")


# The last cu_seqlens tensors whose values passed the checks below: (weak reference, its version counter, total,
# max_seqlen given) -> the max_seqlen returned. A model calls attention once a layer with the same cu_seqlens
# (document masking); re-reading its values every layer costs a host sync each. A tensor changed in place (its
# _version moves) or freed (the weak reference dies) is checked again.
_CHECKED_CU: list = []


def _check_cu_seqlens(name: str, cu, q: torch.Tensor, total: int, max_seqlen, max_name: str) -> int:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be int32 (flash-attn's layout); got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 offsets; got shape {tuple(cu.shape)}")
    if cu.device != q.device:
        raise ValueError(f"{name} is on {cu.device} but q is on {q.device}")
    if max_seqlen is not None and (not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool)
                                   or max_seqlen < 0):
        raise ValueError(f"{max_name} must be a non-negative int; got {max_seqlen!r}")
    if torch.compiler.is_compiling():  # values are data: checking them would break the graph
        if max_seqlen is None:
            raise ValueError(f"{max_name} is required under torch.compile (it sizes the launch grid)")
        return max_seqlen
    cacheable = not cu.is_inference()  # inference tensors keep no version counter: checked every call
    for ref, version, tot, given, result in _CHECKED_CU if cacheable else ():
        if ref() is cu and version == cu._version and tot == total and given == max_seqlen:
            return result
    offs = cu.tolist()  # one small device-to-host copy: the checks below guard against out-of-bounds reads
    lengths = [b - a for a, b in zip(offs, offs[1:])]
    if offs[0] != 0 or min(lengths) < 0:
        raise ValueError(f"{name} must start at 0 and never decrease; got {offs[:8]}{'...' if len(offs) > 8 else ''}")
    if offs[-1] != total:
        raise ValueError(f"{name}[-1] must equal the number of packed tokens {total}; got {offs[-1]}")
    longest = max(lengths)
    if max_seqlen is not None and max_seqlen < longest:
        raise ValueError(f"{max_name}={max_seqlen} is shorter than the longest sequence in {name} ({longest})")
    # the longest sequence, even where a larger bound was given (a model passes its row length): launch grids and
    # the fa3 rule then follow the lengths there are
    result = longest
    if cacheable:
        _CHECKED_CU[:] = [e for e in _CHECKED_CU[-3:] if e[0]() is not None] + [
            (weakref.ref(cu), cu._version, total, max_seqlen, result)]
    return result


def _sdpa_cpu(q, k, v, *, causal: bool, softmax_scale: float) -> torch.Tensor:
    """q (B, Sq, H, D), k/v (B, Sk, Hkv, D) -> (B, Sq, H, D) through F.scaled_dot_product_attention."""
    H, Hkv = q.shape[2], k.shape[2]
    if H != Hkv:  # GQA: K/V heads repeated (enable_gqa needs torch >= 2.5; the copy is small on a CPU)
        k, v = k.repeat_interleave(H // Hkv, dim=2), v.repeat_interleave(H // Hkv, dim=2)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=softmax_scale)
    return out.transpose(1, 2)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: tuple[int, int] | None = None,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
    return_lse: bool = False,
    deterministic: bool = False,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    impl: str = "auto",
    fp8: bool = False,
):
    """Scaled dot-product attention; differentiable in q, k, v (and through lse when it is returned).

    causal: mask keys after the query (bottom-right aligned). window=(left, right): keys within
    [i + off - left, i + off + right], -1 = unbounded (causal fixes right = 0). softcap > 0: scores
    softcap * tanh(scores / softcap). alibi_slopes (H,) or (B, H) float32: bias -slope * |i + off - j|.
    dropout_p with seed (None: drawn from torch's default generator): reproducible mask, regenerated in
    the backward. return_lse: also return the natural-log LSE, float32, (B, H, Sq) or (H, Tq).
    deterministic: bitwise-reproducible gradients (a separate dQ pass instead of atomics).
    impl: "auto" (Triton kernels on CUDA, reference elsewhere), "triton" (also on CPU when
    TRITON_INTERPRET=1, for tests), "fa3" (the Hopper forward of kernels.attention_fa3, and its backward
    where that applies, else FA2's; dense or packed varlen, causal or full, no softcap/alibi/dropout, head_dim 64/128/256, 16-bit, sm_90:
    anything else raises) or "reference". On an sm_90 GPU "auto" takes "fa3" for the dense layout where it
    is the faster forward (FA3_AUTO_MIN_SEQLEN_Q), and the Hopper backward where that is the faster one
    (attention_op.FA3_BWD_AUTO_MIN_SEQLEN_Q); FLASHSCALE_FA3=1: wherever it applies, =0: never; the packed
    varlen layout by its own measured rule on max_seqlen_q (FA3_AUTO_VARLEN_MIN_SEQLEN_Q).
    fp8: FlashAttention-3's FP8 forward (flashscale.ops.attention_fp8 with its defaults: Hadamard, block
    quantization; bf16 backward); dense layout, causal and softmax_scale only.
    Returns out like q [, lse].
    """
    if fp8:
        extras = dict(window=window, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p, seed=seed,
                      return_lse=return_lse, deterministic=deterministic, cu_seqlens_q=cu_seqlens_q,
                      cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
        unsupported = [n for n, val in extras.items() if isinstance(val, torch.Tensor) or val not in (None, 0, False)]
        if unsupported or impl != "auto":
            raise ValueError(f"fp8=True takes only q, k, v, causal and softmax_scale; got {unsupported or ['impl']}")
        from flashscale.ops.attention_fp8 import attention_fp8
        return attention_fp8(q, k, v, causal=causal, softmax_scale=softmax_scale)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    layout = "(total_tokens, heads, head_dim)" if varlen else "(batch, seqlen, heads, head_dim)"
    rank = 3 if varlen else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if torch.is_autocast_enabled(q.device.type) and all(t.is_floating_point() for t in (q, k, v)):
        dt = torch.get_autocast_dtype(q.device.type)  # autocast hands over mixed dtypes; SDPA runs in dt
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, rank, layout)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must match q.dtype ({q.dtype})")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}; got {tuple(v.shape)}")
    D, H, Hkv = q.shape[-1], q.shape[-2], k.shape[-2]
    if k.shape[-1] != D:
        raise ValueError(f"k's head_dim ({k.shape[-1]}) must equal q's ({D})")
    if D % 8 or not 8 <= D <= 256:
        raise ValueError(f"head_dim must be a multiple of 8 in [8, 256]; got {D}")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"q's heads ({H}) must be a multiple of k/v's heads ({Hkv}) (GQA/MQA)")
    if not varlen and k.shape[0] != q.shape[0]:
        raise ValueError(f"k's batch ({k.shape[0]}) must equal q's ({q.shape[0]})")
    if varlen:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together (packed varlen layout)")
        max_seqlen_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q, q.shape[0], max_seqlen_q, "max_seqlen_q")
        max_seqlen_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q, k.shape[0], max_seqlen_k, "max_seqlen_k")
        if cu_seqlens_k.numel() != cu_seqlens_q.numel():
            raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1); got "
                             f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
        batch = cu_seqlens_q.numel() - 1
    else:
        if max_seqlen_q is not None or max_seqlen_k is not None:
            raise ValueError("max_seqlen_q/k belong to the packed varlen layout (with cu_seqlens_q/k)")
        max_seqlen_q, max_seqlen_k, batch = q.shape[1], k.shape[1], q.shape[0]

    if window is None:
        window = (-1, -1)
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window)):
        raise ValueError(f"window must be (left, right) ints >= -1 (-1 = unbounded); got {window!r}")
    left, right = window
    if causal:
        if right > 0:
            raise ValueError(f"causal=True fixes the right window at 0; got window={tuple(window)}")
        right = 0
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(D)
    if not isinstance(softmax_scale, (int, float)) or not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be a finite float; got {softmax_scale!r}")
    if not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0 = off); got {softcap!r}")
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
        raise ValueError(f"seed must be an int in [0, 2**63) or None; got {seed!r}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32:
            raise TypeError(f"alibi_slopes must be a float32 tensor; got "
                            f"{getattr(alibi_slopes, 'dtype', type(alibi_slopes).__name__)}")
        if tuple(alibi_slopes.shape) not in ((H,), (batch, H)):
            raise ValueError(f"alibi_slopes must have shape ({H},) or ({batch}, {H}); got {tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != q.device:
            raise ValueError(f"alibi_slopes is on {alibi_slopes.device} but q is on {q.device}")
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}; got {impl!r}")
    if impl == "triton":
        if q.dtype == torch.float64:
            raise ValueError("impl='triton' takes float16, bfloat16 or float32; float64 runs on impl='reference'")
        require_launchable(q, "q", "attention(impl='triton')")

    if impl == "fa3" or (impl == "auto" and _auto_takes_fa3(q, max_seqlen_q, varlen, causal)):
        why = fa3_unsupported(q, k, v, varlen=varlen, left=left, right=right, causal=causal, softcap=softcap,
                              alibi_slopes=alibi_slopes, dropout_p=dropout_p, softmax_scale=softmax_scale)
        if why is None:
            impl = "fa3" if impl == "fa3" else "auto_fa3"  # auto's choice keeps auto's backward rule
        elif impl == "fa3":
            raise ValueError(f"impl='fa3' cannot take this call: {why}; use impl='auto' or 'triton'")
    if (impl == "auto" and q.device.type == "cpu" and not varlen and not return_lse and left == -1
            and (causal or right == -1) and softcap == 0 and alibi_slopes is None and dropout_p == 0
            and (not causal or max_seqlen_q == max_seqlen_k) and q.dtype != torch.float64
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
            and not torch.compiler.is_compiling()):
        # Inference on the CPU, plain case (evaluation, generation without a GPU): torch's SDPA runs a
        # blocked kernel there, where the reference materializes every (Sq, Sk) score matrix (150 MB a
        # head group at 2048 tokens: page faults were most of a SmolLM2 evaluation's CPU time). Causal
        # only at Sq == Sk, where SDPA's top-left alignment equals ours (bottom-right). Training keeps
        # the reference: its sums do not depend on how heads are split, so tensor-parallel runs match
        # one process to 1e-5 (SDPA's blocking differed by 2e-5 after a few steps).
        PATHS["fwd", "sdpa_cpu"] += 1
        return _sdpa_cpu(q, k, v, causal=causal, softmax_scale=float(softmax_scale))
    args = (int(max_seqlen_q), int(max_seqlen_k), float(softmax_scale), int(left), int(right), float(softcap),
            float(dropout_p), bool(deterministic), impl)
    if torch.compiler.is_compiling():  # the custom op: one node in the graph, fake-traceable
        if dropout_p > 0 and seed is None:
            seed_t = torch.randint(0, 2**62, (), dtype=torch.int64)  # CPU generator: follows torch.manual_seed
        else:
            seed_t = torch.tensor(seed or 0, dtype=torch.int64)
        out, lse = attention_fwd_op(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seed_t, *args)
    else:  # eager: the autograd.Function, without the custom-op dispatch cost (see attention_op)
        if dropout_p > 0 and seed is None:
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))  # the same draw as under compile
        out, lse = AttentionFunction.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seed or 0, *args)
    return (out, lse) if return_lse else out
