"""The kNN monitor: a weighted vote of the nearest training features, no training and no randomness, so
it can run every epoch and two calls on one encoder agree."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from mocolab.evaluation.precision import full_fp32

__all__ = ["knn_accuracy", "knn_predict"]  # stable (docs/api.md)


@torch.no_grad()
def knn_predict(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                classes: int, k: int = 200, t: float = 0.1, chunk: int = 1024,
                device: torch.device | str | None = None) -> torch.Tensor:
    """Weighted kNN (Wu et al. 2018): the k most cosine-similar training samples vote with weight exp(s/t).

    The weights are computed as exp((s − s_max)/t), the same votes up to one factor per query, so no
    temperature t > 0 overflows (exp(1/t) is inf in float32 for t < 0.012).  ``device``: where the
    similarities are computed (the training GPU: an ImageNet bank is 1.28 M rows); predictions come back
    on the CPU.
    """
    return knn_predict_ks(train_feats, train_labels, test_feats, classes, (k,), t, chunk, device)[k]


@torch.no_grad()
@full_fp32()
def knn_predict_ks(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                   classes: int, ks: Sequence[int], t: float = 0.1, chunk: int = 1024,
                   device: torch.device | str | None = None) -> dict[int, torch.Tensor]:
    """``knn_predict`` for several k from one pass over the similarities: {k: predictions}.  The largest k's
    neighbours come sorted, so a smaller k reads their first columns (a k = 20 vote beside the k = 200 one
    costs its scatter only)."""
    device = torch.device(device) if device is not None else train_feats.device
    bank = F.normalize(train_feats.to(device), dim=1)
    labels = train_labels.to(device)
    wanted = {k: min(k, bank.shape[0]) for k in ks}
    top = max(wanted.values())
    preds: dict[int, list[torch.Tensor]] = {k: [] for k in wanted}
    for i in range(0, test_feats.shape[0], chunk):
        q = F.normalize(test_feats[i:i + chunk].to(device), dim=1)
        sim, idx = (q @ bank.T).topk(top, dim=1)  # chunk×top, sorted
        weights = ((sim - sim[:, :1]) / t).exp()  # column 0 holds each row's maximum
        for k, n in wanted.items():
            votes = torch.zeros(q.shape[0], classes, dtype=weights.dtype, device=device)
            votes.scatter_add_(1, labels[idx[:, :n]], weights[:, :n])
            preds[k].append(votes.argmax(dim=1))
    return {k: torch.cat(p).cpu() if p else torch.empty(0, dtype=torch.long) for k, p in preds.items()}


def knn_accuracy(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, classes: int, k: int = 200, t: float = 0.1,
                 device: torch.device | str | None = None) -> float:
    """Top-1 of ``knn_predict`` against ``test_labels``, as a fraction in [0, 1]."""
    return knn_accuracies(train_feats, train_labels, test_feats, test_labels, classes, (k,), t, device=device)[k]


def knn_accuracies(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                   test_labels: torch.Tensor, classes: int, ks: Sequence[int], t: float = 0.1,
                   device: torch.device | str | None = None) -> dict[int, float]:
    """{k: top-1} for several k from one similarity pass (``knn_predict_ks``)."""
    preds = knn_predict_ks(train_feats, train_labels, test_feats, classes, ks, t, device=device)
    return {k: float((p == test_labels.cpu()).float().mean()) for k, p in preds.items()}
