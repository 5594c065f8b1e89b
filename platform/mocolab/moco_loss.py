"""InfoNCE, the contrastive loss of MoCo: its own module so the queue layouts can share it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def info_nce(l_pos: torch.Tensor, l_neg: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy over [l_pos, l_neg] / tau with the positive at index 0.

    l_pos: N×1, l_neg: N×K.  Returns (loss, logits N×(1+K)).
    """
    logits = torch.cat([l_pos, l_neg], dim=1) / tau
    labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, labels), logits


class _QueueInfoNCE(torch.autograd.Function):
    """``info_nce(l_pos, q @ keys.T, tau)`` and its arg-max test in one pass over the N×K logits.

    The unfused loss walks the N×K matrix a dozen times (copy of the keys, the
    product, concatenation, division, log-softmax, arg-max, and as many again
    backward): at K = 16,384 that was a tenth of a cpu-quick step.  Here the
    logits are exponentiated in place and the query gradient is formed in the
    forward pass, while the keys are still the ones the logits were computed
    against (``enqueue`` overwrites them before backward runs), so nothing is
    copied.  The loss equals ``info_nce`` to float rounding (tests/test_moco.py).
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, l_pos: torch.Tensor, keys: torch.Tensor, tau: float):
        n = q.shape[0]
        e = torch.mm(q, keys.T).div_(tau)  # N×K negative logits
        pos = l_pos.squeeze(1) / tau
        neg_max = e.amax(dim=1)
        correct = pos >= neg_max  # argmax over [pos, neg] is 0: ties go to the positive
        m = torch.maximum(pos, neg_max)
        e.sub_(m[:, None]).exp_()
        e_pos = torch.exp(pos - m)
        s = e.sum(dim=1).add_(e_pos)
        loss = (m + torch.log(s) - pos).mean()
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            # d loss / d logits = (softmax - onehot) / N, and the logits are (·) / tau
            e.div_(s[:, None])
            grad_q = torch.mm(e, keys).mul_(1.0 / (n * tau))
            grad_pos = ((e_pos / s - 1.0) / (n * tau))[:, None]
            ctx.save_for_backward(grad_q, grad_pos)
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_correct):
        grad_q, grad_pos = ctx.saved_tensors
        return grad_q * grad_loss, grad_pos * grad_loss, None, None


def queue_info_nce(q: torch.Tensor, l_pos: torch.Tensor, keys: torch.Tensor,
                   tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(InfoNCE loss, correct per query) of queries q (N×C) with positives l_pos (N×1) against keys (K×C),
    which get no gradient; the keys may be overwritten once this returns."""
    return _QueueInfoNCE.apply(q, l_pos, keys.detach(), tau)
