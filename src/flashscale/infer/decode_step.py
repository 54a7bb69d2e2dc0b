"""The kernel launches of one StaticDecoder step (flashscale.infer.decode, where the design, the public API and
the state these methods read are): StepLaunches, StaticDecoder's base class, holds _step / _step_body (the token's
embedding, each block's norms, linears and attention, the head, the argmax) and their helpers (a launch's trace and
work-counter slots, the small norm kernel, the prologue XNorm, a block linear). Apart from decode.py by concern
(DESIGN.md: ~400 lines a file); moved verbatim.
"""

from __future__ import annotations

import torch
import triton
from torch import nn

from flashscale.kernels.decode import (add_rmsnorm_kernel, decode_attention_kernel, silu_mul_kernel, step_begin_kernel,
                                      step_end_kernel)
from flashscale.kernels.pdl import active as pdl_active
from flashscale.kernels.pdl import launch_options
from flashscale.kernels.pdl import pdl as pdl_launches
from flashscale.kernels.w4a16_prologue import XAttn, XNorm, XSiLU


class StepLaunches:
    """One decode step's launches: StaticDecoder's base (its __init__ sets every attribute these methods read)."""

    LAUNCHES = ("qkv", "attn", "o", "gu", "down")  # a layer's launches: trace and dyn counter slots (head: layer L)

    def _trace(self, layer: int, slot: str) -> torch.Tensor | None:
        return None if self.trace is None else self.trace[layer, self.LAUNCHES.index(slot)]

    def _ctr(self, layer: int, slot: str) -> torch.Tensor | None:
        """The launch's work counter (dyn: its own int32, zeroed at the step's start), else None."""
        if not self.dyn:
            return None
        i = layer * len(self.LAUNCHES) + self.LAUNCHES.index(slot)
        return self.dyn_ctr[i:i + 1]

    def _attn_trace(self, layer: int) -> dict:
        return {} if self.trace is None else {"trace_ptr": self._trace(layer, "attn"), "TRACE": True}

    def _norm(self, norm: nn.Module, r: torch.Tensor | None, po: dict) -> None:
        e = self.cfg.hidden_size
        add_rmsnorm_kernel[(1,)](self.x, self.x if r is None else r, norm.weight, self.h, e, norm.eps,
                                 HAS_R=r is not None, BLOCK=triton.next_power_of_2(e), num_warps=8, **po)

    def _xnorm(self, norm: nn.Module, res: torch.Tensor, r: torch.Tensor | None, res_out: torch.Tensor) -> XNorm:
        """The prologue res_out <- res + r, h <- RMSNorm(res_out) * weight (norm's)."""
        return XNorm(res=res, weight=norm.weight, eps=float(norm.eps), res_out=res_out, r=r)

    def _linear(self, i: int, key: str, h: torch.Tensor) -> torch.Tensor:
        """Layer i's linear `key` (LINEARS) of h: its float32 sum (accumulate) or its output."""
        mods = self.blocks[i][key]
        if self.accumulate:
            return mods.accumulate_(h, self.acc_views[i][key], trace=self._trace(i, key),
                                    counter=self._ctr(i, key) if key != "down" else None)
        return torch.cat([m(h) for m in mods], dim=-1) if isinstance(mods, tuple) else mods(h)

    @torch.no_grad()
    def _step(self) -> None:
        """logits <- the logits (1, V) of `tok` at `pos`; pos += 1 (and tok <- argmax with greedy), in place."""
        with pdl_launches(self.pdl, l2_prefetch=self.l2_prefetch, trigger=self.trigger, pre_l2=self.pre_l2):
            self._step_body()

    def _step_body(self) -> None:
        cfg, m = self.cfg, self.model
        po = launch_options(pdl_active(self.x.device))  # the step's small kernels' launch options
        h_q, h_kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if self.glue:  # x <- embedding of tok; the linears' float32 sums <- 0 (accumulate)
            n_acc = self.acc.numel() if self.accumulate else 0
            step_begin_kernel[(max(1, triton.cdiv(n_acc, 8192)),)](
                self.tok, m.embed_tokens.weight, self.x, self.acc, self.dyn_ctr, self.cfg.hidden_size, n_acc,
                self.dyn_ctr.numel() if self.dyn else 0, BLOCK_E=1024, BLOCK_Z=8192, num_warps=4, **po)
        else:
            self.x.copy_(m.embed_tokens(self.tok))
            if self.accumulate:
                self.acc.zero_()
            if self.dyn:
                self.dyn_ctr.zero_()
        r = None
        pro = self.accumulate and self.prologue
        for i, b in enumerate(self.blocks):
            if pro:  # x + r -> x2, RMSNorm -> h, inside the q/k/v GEMV
                qkv = b["qkv"].accumulate_(self.h, self.acc_views[i]["qkv"], self._xnorm(b["ln1"], self.x, r, self.x2),
                                           trace=self._trace(i, "qkv"), counter=self._ctr(i, "qkv"))
            else:
                self._norm(b["ln1"], r, po)
                qkv = self._linear(i, "qkv", self.h)  # (1, (H + 2G) D)
            comb = pro and self.attn_in_o and self.splits > 1  # the split combine in the o GEMV's prologue
            decode_attention_kernel[(h_q, self.splits)](qkv, self.rope_cos, self.rope_sin, self.k[i], self.v[i],
                                                        self.attn, self.pos, self.attn_ws, self.attn_cnt, self.max_len,
                                                        d ** -0.5, H=h_q, G=h_kv, D=d, BT=self.attn_block,
                                                        NS=self.splits,
                                                        COMBINE=not comb, num_warps=4, **po, **self._attn_trace(i))
            if comb:
                o = b["o"].accumulate_(self.attn, self.acc_views[i]["o"],
                                       XAttn(ws=self.attn_ws, splits=self.splits, head_dim=d),
                                       trace=self._trace(i, "o"))  # XAttn: x written chunk by chunk, no dyn
            else:
                o = self._linear(i, "o", self.attn)
            if pro:  # x2 + o -> x, RMSNorm -> h in the gate/up GEMV; SiLU(g) * u -> act in the down GEMV
                av = self.acc_views[i]
                b["gu"].accumulate_(self.h, av["gu"], self._xnorm(b["ln2"], self.x2, o, self.x),
                                    trace=self._trace(i, "gu"), counter=self._ctr(i, "gu"))
                r = b["down"].accumulate_(self.act, av["down"], XSiLU(gu=av["gu"]), trace=self._trace(i, "down"))
                continue
            self._norm(b["ln2"], o, po)
            f = cfg.intermediate_size
            if isinstance(b["gu"], tuple):
                g, u = (mod(self.h) for mod in b["gu"])
            else:
                gu = self._linear(i, "gu", self.h)  # (1, 2F)
                g, u = gu[:, :f], gu[:, f:]
            silu_mul_kernel[(triton.cdiv(f, 1024),)](g, u, self.act, F_=f, BLOCK=1024, num_warps=4, **po)
            r = self._linear(i, "down", self.act)
        if pro and self.head_acc:  # x + r, the final norm and the lm_head in one GEMV, into the zeroed logits
            last = len(self.blocks)
            self.lm_head.accumulate_(self.h, self.logits, self._xnorm(m.norm, self.x, r, self.x2),
                                     trace=self._trace(last, "qkv"), counter=self._ctr(last, "qkv"))
        else:
            self._norm(m.norm, r, po)
            self.logits.copy_(self.lm_head(self.h))
        if self.glue:  # tok <- argmax(logits) (greedy); pos += 1
            v = self.cfg.vocab_size
            step_end_kernel[(triton.cdiv(v, 4096) if self.greedy else 1,)](
                self.logits, self.tok, self.pos, self.argmax_best, self.argmax_cnt, v, BLOCK=4096,
                GREEDY=self.greedy, num_warps=8, **po)
            return
        if self.greedy:
            self.tok.copy_(self.logits.argmax(-1))
        self.pos.add_(1)
