"""Every contrastive loss of mocolab: the readable definitions, and the fast or distributed variants of them.

Definitions (plain autograd, what the papers write):

- ``info_nce``: cross-entropy over [l_pos, l_neg] / τ, the positive at index 0
  (MoCo, Algorithm 1).
- ``contrastive_cross_entropy``: cross-entropy over q·keysᵀ / τ, each query's
  positive a given column.  ``nt_xent`` (SimCLR) and ``v3_info_nce`` (MoCo v3,
  scaled by 2τ) are this with their own columns.
- ``queue_info_nce``: ``info_nce`` of queries against a queue of keys.

Variants of ``queue_info_nce``, with its signature (or a superset the
docstring states): ``fused_queue_info_nce`` (one pass, equal to float
rounding) and ``sharded_queue_info_nce`` (keys split across ranks).
tests/method/test_losses.py compares every variant with its definition, values and
gradients.

Every loss but ``info_nce`` (which returns its logits, as Algorithm 1 has them) returns
(loss, correct): ``correct`` (one bool per query) says
whether the query's positive scored at least as high as every candidate
(pretext accuracy; a tie counts for the positive, as ``argmax`` does).
Distributed losses take the collectives they need as arguments (``gather_with_grad``,
``gather_no_grad``, ``reduce_scatter_with_grad`` of method/collectives.py); their defaults
are one process.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["contrastive_cross_entropy", "fused_queue_info_nce", "info_nce", "nt_xent", "queue_info_nce",
           "sharded_queue_info_nce", "v3_info_nce"]  # stable (docs/api.md)

Collective = Callable[[torch.Tensor], torch.Tensor]


def _alone(x: torch.Tensor) -> torch.Tensor:
    """A collective over one process."""
    return x


# ---------------------------------------------------------------------------------------------
# Definitions


def info_nce(l_pos: torch.Tensor, l_neg: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy over [l_pos, l_neg] / tau with the positive at index 0.

    l_pos: N×1, l_neg: N×K.  Returns (loss, logits N×(1+K)).
    """
    logits = torch.cat([l_pos, l_neg], dim=1) / tau
    labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, labels), logits


def contrastive_cross_entropy(q: torch.Tensor, keys: torch.Tensor, positive: torch.Tensor, tau: float,
                              exclude: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy of the logits q·keysᵀ / tau (q: N×C, keys: M×C) with query i's positive at column
    ``positive[i]``; column ``exclude[i]`` (optional) is not a candidate for query i.  Returns (loss, correct N)."""
    logits = q @ keys.T / tau  # N×M
    if exclude is not None:
        logits = logits.masked_fill(F.one_hot(exclude, keys.shape[0]).bool(), float("-inf"))
    loss = F.cross_entropy(logits, positive)
    return loss, logits.detach().argmax(dim=1) == positive


def queue_info_nce(q: torch.Tensor, l_pos: torch.Tensor, keys: torch.Tensor,
                   tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``info_nce`` of queries q (N×C) with positives l_pos (N×1) against keys (K×C), which get no gradient.

    The keys are copied, so the caller may overwrite them (``enqueue``) once
    this returns, before backward.
    """
    l_neg = q @ keys.detach().clone().T  # N×K
    loss, logits = info_nce(l_pos, l_neg, tau)
    return loss, logits.detach().argmax(dim=1) == 0


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, tau: float, *, rank: int = 0,
            gather: Collective = _alone) -> tuple[torch.Tensor, torch.Tensor]:
    """SimCLR's NT-Xent of the B pairs (z1[i], z2[i]) (normalised, B×C each).  Returns (loss, correct 2B).

    Each of the 2B views is a query whose positive is the other view of its
    image and whose candidates are every other view; a view is never its own
    negative.  Across W ranks, pass this rank's ``rank`` and an all-gather that
    carries autograd back to the rows' owners (``collectives.gather_with_grad``): the
    candidates are then the 2·B·W views of the global batch, the loss is the
    mean over this rank's 2B queries, the mean over ranks is the one-process
    loss of the global batch, and DDP's average of the ranks' gradients is its
    gradient.  Exact on one process.
    """
    b = z1.shape[0]
    keys = torch.cat([gather(z1), gather(z2)])  # 2·B·W candidates: views 1, then views 2
    n = keys.shape[0] // 2  # B·W images
    own = torch.arange(b, device=z1.device) + b * rank  # this rank's images in the gathered order
    self_col = torch.cat([own, own + n])  # each query's own column
    positive = torch.cat([own + n, own])  # the other view of its image
    return contrastive_cross_entropy(torch.cat([z1, z2]), keys, positive, tau, exclude=self_col)


def v3_info_nce(q: torch.Tensor, k: torch.Tensor, tau: float, *, rank: int = 0,
                gather: Collective = _alone) -> tuple[torch.Tensor, torch.Tensor]:
    """One direction of MoCo v3's loss: queries q (B×C) against the keys k (B×C) of the other view,
    query i's positive k[i], every other key a negative; the cross-entropy is scaled by 2τ as in the
    reference (``moco/builder.py`` of facebookresearch/moco-v3).  Returns (loss, correct B).

    Across W ranks, pass this rank's ``rank`` and an all-gather (the keys carry
    no gradient: ``collectives.gather_no_grad``): the negatives are then the global
    batch's keys.  Exact on one process.
    """
    k_all = gather(k)  # (B·W)×C, rank-major
    positive = torch.arange(q.shape[0], device=q.device) + q.shape[0] * rank
    loss, correct = contrastive_cross_entropy(q, k_all, positive, tau)
    return loss * (2 * tau), correct


# ---------------------------------------------------------------------------------------------
# Variants of queue_info_nce


class _QueueInfoNCE(torch.autograd.Function):
    """``queue_info_nce`` and its arg-max test in one pass over the N×K logits.

    The definition walks the N×K matrix a dozen times (copy of the keys, the
    product, concatenation, division, log-softmax, arg-max, and as many again
    backward), a cost that grows with K and takes a large share of a CPU step
    (benchmarks/RESULTS.md, "Performance: the faster step").  Here the
    logits are exponentiated in place and the query gradient is formed in the
    forward pass, while the keys are the ones the logits were computed against;
    backward reads nothing but that gradient, so the keys need no copy and may
    be overwritten as soon as forward returns.
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
            ctx.save_for_backward(grad_q, grad_pos)  # never the keys: the caller overwrites them next
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_correct):
        grad_q, grad_pos = ctx.saved_tensors
        return grad_q * grad_loss, grad_pos * grad_loss, None, None


def fused_queue_info_nce(q: torch.Tensor, l_pos: torch.Tensor, keys: torch.Tensor,
                         tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``queue_info_nce`` in one pass over the N×K logits, without the copy of the keys.

    Equal to the definition to float rounding (not bit for bit), hence opt-in:
    the queue opts in for speed.  Reads ``keys`` only before it returns, so the
    caller may overwrite them (``enqueue``) before backward.  No double
    backward.
    """
    return _QueueInfoNCE.apply(q, l_pos, keys.detach(), tau)


def sharded_queue_info_nce(q: torch.Tensor, l_pos: torch.Tensor, keys: torch.Tensor, tau: float, *,
                           rank: int = 0, gather: Collective = _alone,
                           reduce_scatter: Collective = _alone) -> tuple[torch.Tensor, torch.Tensor]:
    """``queue_info_nce`` of this rank's B queries when each of W ranks holds K/W of the keys (``keys``).

    Pass this rank's ``rank``, an all-gather with autograd (B×… -> (B·W)×…,
    ``collectives.gather_with_grad``) and a reduce-scatter (sum) with autograd
    ((B·W)×… -> B×…, ``collectives.reduce_scatter_with_grad``); the defaults are one
    process, where this is the definition computed with a max shift.  The
    logits are computed where the keys live: the queries are gathered, scored
    against the local shard, and the softmax denominator is summed across
    ranks.  Backward sends every query's gradient back to its owner, and this
    rank's loss depends only on its own queries, so its gradient equals the
    definition's against all K keys.  Equal to the definition to float
    rounding (the sum over K is taken in another order).  The shard is copied,
    as in the definition, so the caller may overwrite it before backward.
    """
    b = q.shape[0]
    queries = gather(q)  # (B·W)×C, rank-major; gradients go back to their owners
    world = queries.shape[0] // b
    neg = queries @ keys.detach().clone().T / tau  # (B·W)×(K/W): every query against the local shard
    with torch.no_grad():  # global max negative per query: the LSE shift, and what a positive must beat
        m = neg.max(dim=1).values  # B·W
        if world > 1:
            dist.all_reduce(m, op=dist.ReduceOp.MAX)
    # exp(neg - m) <= 1, and the arg-max term is 1 on its rank, so the summed S >= 1: no overflow, no log 0
    part = torch.exp(neg - m[:, None]).sum(dim=1)  # B·W partial denominators of this shard
    s = reduce_scatter(part)  # B: this rank's queries, summed over all K negatives
    m_own = m.view(world, b)[rank]  # B
    pos = l_pos.squeeze(1) / tau  # B
    lse = torch.logaddexp(pos, m_own + torch.log(s))  # B: log Σ over [positive, all K negatives]
    loss = (lse - pos).mean()
    correct = pos.detach() >= m_own  # ties go to the positive, as argmax(...) == 0 does
    return loss, correct
