"""Vocab-parallel cross-entropy (Megatron-LM): the logits stay split along the vocabulary across the
tp axis; three reductions (max, then sum-exp and target logit together) replace gathering (N, V).

    loss_i = log(sum_v exp(z_iv - m_i)) - (z_i,t_i - m_i),   m_i = max_v z_iv
    dloss/dz = softmax(z) - onehot(t)

Columns past the real vocabulary (padding when V is not divisible by tp) are left out of every sum, so
the loss equals the unpadded one. At tp == 1 (nothing split, nothing padded) it is F.cross_entropy.
Shapes: N tokens (B*S), Vl local vocab columns (padded), V real vocab.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from flashscale.parallel.mesh import Axis


class VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, vocab_start, valid, axis, ignore_index):
        # logits (N, Vl) float32; target (N,) global ids; valid: real columns held here (<= Vl)
        z = logits[:, :valid]  # (N, valid)
        m = z.max(dim=-1).values if valid > 0 else logits.new_full((logits.shape[0],), float("-inf"))
        axis.all_reduce(m, op=dist.ReduceOp.MAX, what="vocab-parallel cross-entropy max")
        z = z - m[:, None]
        local_t = target - vocab_start
        inside = (local_t >= 0) & (local_t < valid)
        idx = local_t.clamp(0, max(valid - 1, 0))[:, None]
        picked = torch.where(inside, z.gather(1, idx).squeeze(1), z.new_zeros(())) if valid > 0 \
            else z.new_zeros(z.shape[0])
        e = z.exp_()  # (N, valid): z is a fresh tensor (z - m), reused in place for the softmax
        sums = torch.stack([e.sum(dim=-1), picked], dim=1)  # (N, 2): one all-reduce for both
        axis.all_reduce(sums, what="vocab-parallel cross-entropy sum")
        sum_exp, picked = sums[:, 0], sums[:, 1]
        loss = torch.log(sum_exp) - picked
        keep = target != ignore_index
        loss = loss.masked_fill(~keep, 0.0)
        e.div_(sum_exp[:, None])  # softmax over the whole vocabulary, this rank's columns
        ctx.save_for_backward(e, idx, inside & keep, keep)
        ctx.width = logits.shape[1]
        return loss

    @staticmethod
    def backward(ctx, g):  # g (N,)
        softmax, idx, hit, keep = ctx.saved_tensors
        grad = softmax  # backward runs once (no retain_graph): the saved softmax becomes the gradient
        grad.scatter_add_(1, idx, -hit.to(grad.dtype)[:, None])
        grad.mul_((g * keep.to(g.dtype))[:, None])
        if grad.shape[1] < ctx.width:  # padded columns get no gradient
            grad = torch.cat([grad, grad.new_zeros(grad.shape[0], ctx.width - grad.shape[1])], dim=1)
        return grad, None, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, vocab_start: int,
                                 vocab_stop: int, axis: Axis, ignore_index: int = -100,
                                 reduction: str = "mean") -> torch.Tensor:
    """logits (B, S, Vl) this rank's vocab columns [vocab_start, vocab_stop) (+ padding), target (B, S).

    reduction "mean": mean over tokens whose target != ignore_index (F.cross_entropy's); "sum"; "none"
    gives (B, S)."""
    if logits.dim() != 3 or target.shape != logits.shape[:2]:
        raise ValueError(f"logits must be (B, S, V_local) and target (B, S); got {tuple(logits.shape)} and "
                         f"{tuple(target.shape)}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    valid = vocab_stop - vocab_start
    if axis.size == 1 and valid == logits.shape[-1]:
        # The whole vocabulary on this rank: the same formula as torch's fused kernel, which reads the
        # (N, V) logits fewer times (it matters at V = 128K: each pass is B*S*V*4 bytes).
        return F.cross_entropy(logits.reshape(-1, valid).float(), target.reshape(-1), ignore_index=ignore_index,
                               reduction=reduction).view(target.shape if reduction == "none" else ())
    loss = VocabParallelCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1),
                                           vocab_start, valid, axis, ignore_index)  # (N,)
    if reduction == "none":
        return loss.view(target.shape)
    if reduction == "sum":
        return loss.sum()
    count = (target != ignore_index).sum()
    return loss.sum() / count.clamp(min=1)
