"""The kNN monitor: a weighted vote of the nearest training features, no training and no randomness, so
it can run every epoch and two calls on one encoder agree."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
    device = torch.device(device) if device is not None else train_feats.device
    bank = F.normalize(train_feats.to(device), dim=1)
    labels = train_labels.to(device)
    k = min(k, bank.shape[0])
    preds = []
    for i in range(0, test_feats.shape[0], chunk):
        q = F.normalize(test_feats[i:i + chunk].to(device), dim=1)
        sim, idx = (q @ bank.T).topk(k, dim=1)  # chunk×k
        weights = ((sim - sim[:, :1]) / t).exp()  # topk sorts: column 0 holds each row's maximum
        votes = torch.zeros(q.shape[0], classes, dtype=weights.dtype, device=device)
        votes.scatter_add_(1, labels[idx], weights)
        preds.append(votes.argmax(dim=1))
    return torch.cat(preds).cpu() if preds else torch.empty(0, dtype=torch.long)


def knn_accuracy(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, classes: int, k: int = 200, t: float = 0.1,
                 device: torch.device | str | None = None) -> float:
    """Top-1 of ``knn_predict`` against ``test_labels``, as a fraction in [0, 1]."""
    pred = knn_predict(train_feats, train_labels, test_feats, classes, k, t, device=device)
    return float((pred == test_labels.cpu()).float().mean())
