"""kernels.pdl: the pdl() switch (nesting, reset, bad input), where it applies (sm_90+ CUDA, not interpreted), and
the machine code of every PDL-aware kernel compiled for sm_90 without a GPU: with PDL on, griddepcontrol.wait
(SASS ACQBULK) comes before any global load or store (the decode attention: before any store, its loads of
position, RoPE table and first cached tile may come first) and launch_dependents (PREEXIT) right after it, and the
W4A16 kernels' L2 prefetch (UBLKPF.L2) before the wait when asked for; with PDL off none of them is there. The ordering on a GPU: tests/test_infer_decode.py (pdl=True against the model, and a captured
graph against eager steps)."""

from __future__ import annotations

import json

import pytest
import torch

from flashscale.kernels import pdl as P
from offline_compile import compile_offline


def test_switch_nests_and_resets():
    cpu = torch.device("cpu")
    assert P.launch_options(False) == {} and P.launch_options(True) == {"PDL": True, "launch_pdl": True}
    assert P.launch_options(True, True) == {"PDL": True, "launch_pdl": True, "L2PF": True}
    with P.pdl():
        assert P._ON.get() and not P.l2_prefetch_active()  # the prefetch is opt-in (measured slower)
    with P.pdl(l2_prefetch=True):
        assert P._ON.get() and P.l2_prefetch_active()
        with P.pdl(False):
            assert not P._ON.get() and not P.l2_prefetch_active()
        with P.pdl(l2_prefetch=False):
            assert P._ON.get() and not P.l2_prefetch_active()
        assert P._ON.get() and P.l2_prefetch_active()
        assert not P.active(cpu)  # not CUDA
    assert not P._ON.get() and not P.l2_prefetch_active()
    with pytest.raises(TypeError, match="takes a bool"):
        with P.pdl("yes"):
            pass
    assert not P._ON.get()
    with P.pdl(trigger=True, pre_l2=4):  # the accumulating ring GEMV's options
        assert P.trigger_active() and P.pre_l2_items() == 4
        with P.pdl(False, trigger=True, pre_l2=4):  # off: no trigger, no pre-wait prefetch
            assert not P.trigger_active() and P.pre_l2_items() == 0
    assert not P.trigger_active() and P.pre_l2_items() == 0
    with pytest.raises(TypeError, match=r"pdl\(trigger\) takes a bool"):
        with P.pdl(trigger=1):
            pass
    with pytest.raises(ValueError, match=r"pdl\(pre_l2\) takes an int 0..8"):
        with P.pdl(pre_l2=9):
            pass


_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashscale.kernels import w4a16_aot as aot
from flashscale.kernels.aot import sass, sass_instructions, sass_opcode
from flashscale.kernels.decode import (add_rmsnorm_kernel, decode_attention_kernel, silu_mul_kernel,
                                      step_begin_kernel, step_end_kernel)
from flashscale.kernels.w4a16 import DecodeConfig, GemvConfig

def small(fn, sig, cx, pdl):
    sig = {**sig, **{k: "constexpr" for k in cx}, "PDL": "constexpr"}
    names = list(sig)
    cx = {**cx, "PDL": pdl}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})

bf = "*bf16"
out = {}
for pdl in (False, True):
    kernels = {
        "gemv": aot.compile_sm90(GemvConfig(bn=128, kt=2), pdl=pdl),
        "decode": aot.compile_sm90(DecodeConfig(), pdl=pdl),
        "gemv_l2": aot.compile_sm90(GemvConfig(bn=256, kt=2), pdl=pdl, l2pf=pdl),
        "decode_l2": aot.compile_sm90(DecodeConfig(), pdl=pdl, l2pf=pdl),
        "add_rmsnorm": small(add_rmsnorm_kernel, dict(x_ptr=bf, r_ptr=bf, w_ptr=bf, h_ptr=bf, E="i32", eps="fp32"),
                             dict(HAS_R=True, BLOCK=4096), pdl),
        "attention": small(decode_attention_kernel, dict(qkv_ptr=bf, cos_ptr=bf, sin_ptr=bf, kc_ptr=bf, vc_ptr=bf,
                                                         out_ptr=bf, pos_ptr="*i64", ws_ptr="*fp32",
                                                         cnt_ptr="*i32", T_MAX="i32", scale="fp32"),
                           dict(H=32, G=8, D=128, BT=32, NS=8), pdl),
        "silu_mul": small(silu_mul_kernel, dict(g_ptr=bf, u_ptr=bf, out_ptr=bf), dict(F_=14336, BLOCK=1024), pdl),
        "step_begin": small(step_begin_kernel, dict(tok_ptr="*i64", emb_ptr=bf, x_ptr=bf, acc_ptr="*fp32",
                                                    ctr_ptr="*i32", E="i32", N_ACC="i32", N_CTR="i32"),
                            dict(BLOCK_E=1024, BLOCK_Z=8192, BLOCK_C=256), pdl),
        "step_end": small(step_end_kernel, dict(logits_ptr="*fp32", tok_ptr="*i64", pos_ptr="*i64", best_ptr="*i64",
                                                cnt_ptr="*i32", V="i32"), dict(BLOCK=4096, GREEDY=True), pdl),
    }
    for name, k in kernels.items():
        ops = [sass_opcode(i) for _, i in sass_instructions(sass(k.asm["cubin"]))]
        first_mem = next(i for i, o in enumerate(ops) if o.startswith(("LDG", "STG", "ATOM", "RED", "LD.", "ST.")))
        first_write = next(i for i, o in enumerate(ops) if o.startswith(("STG", "ATOM", "RED", "ST.")))
        last_load = max(i for i, o in enumerate(ops) if o.startswith(("LDG", "LD.")))
        out[f"{name} {pdl}"] = dict(wait=ops.index("ACQBULK") if "ACQBULK" in ops else None,
                                    prefetch=[i for i, o in enumerate(ops) if o.startswith("UBLKPF")],
                                    launch=ops.index("PREEXIT") if "PREEXIT" in ops else None, first_mem=first_mem,
                                    first_write=first_write, last_load=last_load,
                                    ptx_wait=k.asm["ptx"].count("griddepcontrol.wait"))
json.dump(out, open(sys.argv[1], "w"))
"""


def test_pdl_kernels_wait_before_touching_memory(tmp_path):
    pytest.importorskip("triton.compiler")
    out = tmp_path / "pdl.json"
    compile_offline(_COMPILE, str(out), timeout=600)
    got = json.loads(out.read_text())
    for name in ("gemv", "decode", "gemv_l2", "decode_l2", "add_rmsnorm", "attention", "silu_mul", "step_begin",
                 "step_end"):
        off, on = got[f"{name} False"], got[f"{name} True"]
        assert off["wait"] is None and off["launch"] is None and off["ptx_wait"] == 0, (name, off)
        assert on["ptx_wait"] == 1 and on["wait"] is not None and on["launch"] is not None, (name, on)
        if name == "attention":  # position, RoPE table and the first cached tile load before the wait, by design;
            # nothing is written before it, and the q/k/v reads come after it
            assert on["wait"] < on["launch"] < on["first_write"] and on["last_load"] > on["wait"], (name, on)
        else:
            assert on["wait"] < on["launch"] < on["first_mem"], (name, on)
        assert not off["prefetch"]
        # the L2 prefetch (one request a fragment row; the decode kernel's second tile is a second one) before the
        # wait, and only where asked for
        assert len(on["prefetch"]) == {"gemv_l2": 1, "decode_l2": 2}.get(name, 0), (name, on)
        assert all(i < on["wait"] for i in on["prefetch"]), (name, on)
