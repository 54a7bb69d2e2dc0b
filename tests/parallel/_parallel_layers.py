"""Worker side of the layer tests: every tensor-parallel layer and primitive against its unsharded
version, forward and every gradient. Runs on a mesh whose tp axis is the whole world (float32).

Returns {"checks": [(name, ||got - want||, ||want||, exact required, bitwise equal)]}; the parent
asserts. Partial consumers: where a primitive's output feeds a tensor-parallel region, each rank
backpropagates its own upstream gradient gs[rank] and the unsharded reference gets their sum.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import _parallel_harness as H
from flashscale.models.llama import Llama, lm_loss
from flashscale.parallel import comm
from flashscale.parallel.config import ParallelConfig
from flashscale.parallel.loss import vocab_parallel_cross_entropy
from flashscale.parallel.mesh import ParallelMesh
from flashscale.parallel.stage import PipelineStage
from flashscale.parallel.tensor import (ColumnParallelLinear, ParallelRMSNorm, RowParallelLinear,
                                        VocabParallelEmbedding, apply_tensor_parallel, vocab_split)


def _err(a, b) -> tuple[float, float]:
    """(||a - b||, ||b||) in float64."""
    return float((a.double() - b.double()).norm()), float(b.double().norm())


def _sum_over(axis, t):
    t = t.clone()
    axis.all_reduce(t)
    return t


def layer_checks(job: dict) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    checks = []

    def check(name, got, want, exact=False):
        checks.append((name, *_err(got, want), exact, bool(torch.equal(got, want))))

    for model_name in job["models"]:
        cfg = H.model_config(model_name)
        mesh = ParallelMesh(ParallelConfig(tp=world), cfg, rank=rank, world_size=world)
        tp, r = mesh.tp, mesh.tp_rank
        g = torch.Generator().manual_seed(7)  # same draws on every rank
        B, S, E = 2, 4 * world, cfg.hidden_size
        sl = slice(r * S // world, (r + 1) * S // world)  # this rank's sequence chunk

        # ---- primitives -----------------------------------------------------------------------
        x = torch.randn(B, S, E, generator=g)
        gs = torch.randn(world, B, S, E, generator=g)  # each rank's own upstream gradient
        for name, fn, fwd_want, bwd_want, local_in in [
            ("copy_to_tp", comm.copy_to_tp, x, gs.sum(0), False),
            ("reduce_from_tp", comm.reduce_from_tp, x * world, gs[r], False),
            ("gather_from_sp", comm.gather_from_sp, x, gs.sum(0)[:, sl], True),
            ("scatter_to_sp", comm.scatter_to_sp, x[:, sl], None, False),
            ("gather_from_sp_replicated", comm.gather_from_sp_replicated, x, gs[r][:, sl], True),
        ]:
            inp = (x[:, sl] if local_in else x).clone().requires_grad_()
            out = fn(inp, tp)
            check(f"{model_name}:{name} forward", out, fwd_want, exact=True)
            up = gs[r] if out.shape == gs[r].shape else gs[r][:, sl]
            out.backward(up)
            if bwd_want is None:  # scatter: backward all-gathers every rank's chunk gradient
                want = torch.cat([gs[q][:, q * S // world:(q + 1) * S // world] for q in range(world)], dim=1)
                check(f"{model_name}:{name} backward", inp.grad, want)
            else:
                check(f"{model_name}:{name} backward", inp.grad, bwd_want)
        inp = x.clone().requires_grad_()
        out = comm.reduce_scatter_to_sp(inp, tp)
        check(f"{model_name}:reduce_scatter_to_sp forward", out, (x * world)[:, sl])
        out.backward(gs[r][:, sl])
        want = torch.cat([gs[q][:, q * S // world:(q + 1) * S // world] for q in range(world)], dim=1)
        check(f"{model_name}:reduce_scatter_to_sp backward", inp.grad, want)

        # ---- column / row parallel linear, with and without sequence parallelism -----------------
        F_ = cfg.intermediate_size
        w1, b1 = torch.randn(F_, E, generator=g) * 0.1, torch.randn(F_, generator=g)
        w2, b2 = torch.randn(E, F_, generator=g) * 0.1, torch.randn(E, generator=g)
        up_h, up_o = torch.randn(B, S, F_, generator=g), torch.randn(B, S, E, generator=g)
        fl = F_ // world
        cs = slice(r * fl, (r + 1) * fl)
        for sp in (False, True):
            tag = f"{model_name}:sp={sp}"
            xf = x.clone().requires_grad_()
            hf = F.linear(xf, w1, b1)
            of = F.linear(hf, w2, b2)
            ((hf * up_h).sum() + (of * up_o).sum()).backward()
            col = ColumnParallelLinear(E, fl, bias=True, axis=tp, enter=True, sequence_parallel=sp)
            row = RowParallelLinear(fl, E, bias=True, axis=tp, sequence_parallel=sp)
            with torch.no_grad():
                col.weight.copy_(w1[cs]), col.bias.copy_(b1[cs]), row.weight.copy_(w2[:, cs]), row.bias.copy_(b2)
            xl = (x[:, sl] if sp else x).clone().requires_grad_()
            h = col(xl)
            check(f"{tag} column forward", h, hf.detach()[..., cs], exact=True)
            o = row(h)
            o_want = of.detach()[:, sl] if sp else of.detach()
            check(f"{tag} row forward", o, o_want)
            ((h * up_h[..., cs]).sum() + (o * (up_o[:, sl] if sp else up_o)).sum()).backward()
            wg1, bg1, wg2, bg2 = _lin_grads(x, w1, b1, w2, b2, up_h, up_o)
            check(f"{tag} column weight grad", col.weight.grad, wg1[cs])
            check(f"{tag} column bias grad", col.bias.grad, bg1[cs])
            check(f"{tag} row weight grad", row.weight.grad, wg2[:, cs])
            bias_grad = _sum_over(tp, row.bias.grad) if sp else row.bias.grad  # sp: partial over tokens
            check(f"{tag} row bias grad", bias_grad, bg2)
            check(f"{tag} input grad", xl.grad, xf.grad[:, sl] if sp else xf.grad)

            # ---- vocab-parallel embedding (odd vocab: padded) and RMSNorm with sp
            V = cfg.vocab_size
            ids = torch.randint(0, V, (B, S), generator=g)
            wemb = torch.randn(V, E, generator=g)
            start, stop, local = vocab_split(V, world, r)
            emb = VocabParallelEmbedding(local, E, start=start, axis=tp, sequence_parallel=sp)
            with torch.no_grad():
                emb.weight.zero_()
                emb.weight[:stop - start].copy_(wemb[start:stop])
            wf = wemb.clone().requires_grad_()
            ef = F.embedding(ids, wf)
            (ef * up_o).sum().backward()
            el = emb(ids)
            check(f"{tag} vocab embedding forward", el, ef.detach()[:, sl] if sp else ef.detach(), exact=True)
            (el * (up_o[:, sl] if sp else up_o)).sum().backward()
            check(f"{tag} vocab embedding grad", emb.weight.grad[:stop - start], wf.grad[start:stop])
            check(f"{tag} vocab embedding padding grad", emb.weight.grad[stop - start:],
                  torch.zeros_like(emb.weight.grad[stop - start:]), exact=True)
            norm = ParallelRMSNorm(E, cfg.rms_norm_eps, tp, sp)
            with torch.no_grad():
                norm.weight.copy_(torch.rand(E, generator=g) + 0.5)
            xn = x.clone().requires_grad_()
            wn = norm.weight.detach().clone().requires_grad_()
            nf = wn * (xn * torch.rsqrt(xn.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps))
            (nf * gs.sum(0)).sum().backward()
            xnl = (x[:, sl] if sp else x).clone().requires_grad_()
            nl = norm(xnl)
            check(f"{tag} rmsnorm forward", nl, nf.detach())
            (nl * gs[r]).sum().backward()  # the norm's output enters a tp region: partial upstreams
            check(f"{tag} rmsnorm weight grad", _sum_over(tp, norm.weight.grad) if sp else norm.weight.grad, wn.grad)
            check(f"{tag} rmsnorm input grad", xnl.grad, xn.grad[:, sl] if sp else xn.grad)

        # ---- vocab-parallel cross-entropy, odd vocab, some targets ignored -------------------------
        V = cfg.vocab_size
        logits = torch.randn(B, S, V, generator=g) * 3
        tgt = torch.randint(0, V, (B, S), generator=g)
        tgt[0, :2] = -100
        lf = logits.clone().requires_grad_()
        loss_f = F.cross_entropy(lf.view(-1, V), tgt.view(-1), ignore_index=-100)
        loss_f.backward()
        start, stop, local = vocab_split(V, world, r)
        ll = torch.zeros(B, S, local)
        ll[..., :stop - start] = logits[..., start:stop]
        ll[..., stop - start:] = 1e4  # padding columns must not count, whatever they hold
        ll.requires_grad_()
        loss = vocab_parallel_cross_entropy(ll, tgt, vocab_start=start, vocab_stop=stop, axis=tp)
        loss.backward()
        check(f"{model_name}:vocab cross-entropy loss", loss.detach(), loss_f.detach())
        check(f"{model_name}:vocab cross-entropy grad", ll.grad[..., :stop - start], lf.grad[..., start:stop])
        check(f"{model_name}:vocab cross-entropy padding grad", ll.grad[..., stop - start:],
              torch.zeros_like(ll.grad[..., stop - start:]), exact=True)

        # ---- the whole model, tensor parallel (+ sp): logits and every parameter's gradient ---------
        for sp in (False, True):
            tag = f"{model_name}:model sp={sp}"
            full = Llama(cfg).init_weights(3)
            ids = torch.randint(0, V, (B, S), generator=g)
            tg = torch.randint(0, V, (B, S), generator=g)
            lm_loss(full(ids), tg).backward()
            want_grads = {n: p.grad for n, p in full.named_parameters()}
            with torch.no_grad():
                want_logits = full(ids)
            stage = PipelineStage(full, [(0, list(range(cfg.num_hidden_layers)))], 1)
            specs = apply_tensor_parallel(stage, mesh, sequence_parallel=sp)
            stage.sequence_parallel, stage.tp_size = sp, world
            out = stage.forward_chunk(0, ids, S)
            v0, v1 = stage.vocab_range
            vocab_parallel_cross_entropy(out, tg, vocab_start=v0, vocab_stop=v1, axis=tp).backward()
            with torch.no_grad():
                check(f"{tag} logits", stage(ids), want_logits)
            for n, p in stage.named_parameters():
                s = specs[n]
                grad = p.grad
                if s.grad_sync is not None:
                    grad = _sum_over(mesh.axes[s.grad_sync], grad)
                check(f"{tag} grad {n}", grad, s.local_from_logical(want_grads[s.logical_name]))
        mesh.destroy()
    return {"label": "layers", "checks": checks}


def _lin_grads(x, w1, b1, w2, b2, up_h, up_o):
    w1, b1, w2, b2 = (t.clone().requires_grad_() for t in (w1, b1, w2, b2))
    h = F.linear(x, w1, b1)
    o = F.linear(h, w2, b2)
    ((h * up_h).sum() + (o * up_o).sum()).backward()
    return w1.grad, b1.grad, w2.grad, b2.grad
