"""How good are the features?  A kNN monitor each epoch and a linear probe at the end.

Both read the frozen backbone's features of un-augmented images and are
deterministic: kNN has no randomness, and the probe is full-batch L-BFGS from
a zero start on standardised features, so two calls on the same encoder give
the same number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .augment import Normalise, to_float


@torch.no_grad()
def extract_features(backbone: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor,
                     device: torch.device | str = "cpu", batch_size: int = 256,
                     dtype: torch.dtype | None = None) -> torch.Tensor:
    """uint8 N×C×H×W -> float32 N×D features in eval mode (BN uses running statistics).

    ``dtype``: the backbone runs under autocast to it, as training does (``run.precision``). On a CPU
    with native bf16 that makes a cpu-quick evaluation's features 2.3x faster, and its kNN and probe move
    by at most 8 of 10,000 test images over six encoders (benchmarks/eval_precision.py). None: float32.
    ``batch_size``: 256 keeps a convnet's activations in cache; 1024 ran 2.7x slower on one CPU thread
    (benchmarks/trial_overhead.py). In eval mode a sample's features do not depend on its batch.
    """
    module = backbone if isinstance(backbone, nn.Module) else None
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    norm = Normalise(images.shape[1]).to(device)
    kind = torch.device(device).type
    out = []
    try:
        for i in range(0, images.shape[0], batch_size):
            x = norm(to_float(images[i:i + batch_size].to(device)))
            with torch.autocast(kind, dtype=dtype or torch.float32, enabled=dtype is not None):
                out.append(backbone(x).float().cpu())
    finally:
        if module is not None:
            module.train(was_training)
    return torch.cat(out) if out else torch.empty(0)


@torch.no_grad()
def knn_predict(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                classes: int, k: int = 200, t: float = 0.1, chunk: int = 1024) -> torch.Tensor:
    """Weighted kNN (Wu et al. 2018): the k most cosine-similar training samples vote with weight exp(s/t).

    The weights are computed as exp((s − s_max)/t), the same votes up to one factor per query, so no
    temperature t > 0 overflows (exp(1/t) is inf in float32 for t < 0.012).
    """
    bank = F.normalize(train_feats, dim=1)
    k = min(k, bank.shape[0])
    preds = []
    for i in range(0, test_feats.shape[0], chunk):
        q = F.normalize(test_feats[i:i + chunk], dim=1)
        sim, idx = (q @ bank.T).topk(k, dim=1)  # chunk×k
        weights = ((sim - sim[:, :1]) / t).exp()  # topk sorts: column 0 holds each row's maximum
        votes = torch.zeros(q.shape[0], classes, dtype=weights.dtype)
        votes.scatter_add_(1, train_labels[idx], weights)
        preds.append(votes.argmax(dim=1))
    return torch.cat(preds)


def knn_accuracy(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, classes: int, k: int = 200, t: float = 0.1) -> float:
    pred = knn_predict(train_feats, train_labels, test_feats, classes, k, t)
    return float((pred == test_labels).float().mean())


@dataclass
class ProbeResult:
    train_top1: float
    test_top1: float
    # the fitted probe: logits = ((features - mean) / std) @ weight + bias (mean, std float64; weight, bias in the
    # probe's dtype; export.py turns it into a module)
    # (left out of == and repr: two probes compare by what they score)
    weight: torch.Tensor | None = field(default=None, compare=False, repr=False)  # D×classes
    bias: torch.Tensor | None = field(default=None, compare=False, repr=False)
    mean: torch.Tensor | None = field(default=None, compare=False, repr=False)
    std: torch.Tensor | None = field(default=None, compare=False, repr=False)

    def score(self, feats: torch.Tensor, labels: torch.Tensor) -> float:
        """Top-1 of the fitted probe on other features of the same encoder (a validation split)."""
        assert self.weight is not None and self.mean is not None, "a probe without its fitted weights"
        x = ((feats.double() - self.mean) / self.std).to(self.weight.dtype)
        return float(((x @ self.weight + self.bias).argmax(1) == labels).double().mean())


def linear_probe(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, classes: int, *, weight_decay: float = 1e-4,
                 steps: int = 200, dtype: torch.dtype = torch.float32) -> ProbeResult:
    """Multinomial logistic regression on standardised frozen features, fitted by full-batch L-BFGS.

    Standardising with the training mean/std makes one weight decay serve
    every encoder; L-BFGS from zeros has no randomness, so the probe is a
    deterministic function of the features.  The statistics are float64; the
    fit runs in ``dtype``: float32 is about 7 % faster than float64 at cpu-quick;
    its test top-1 stays within 7 of 10,000 images (benchmarks/eval_precision.py).
    """
    x = train_feats.double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    # features as D×N: the gradient of the weights is then (K×N)·(N×D) over contiguous rows, where the
    # N×D layout's Xᵀ·G ran 4-5x slower per L-BFGS evaluation on one CPU thread (benchmarks/trial_overhead.py)
    xs = ((x - mean) / std).to(dtype).T.contiguous()
    del x
    xt = ((test_feats.double() - mean) / std).to(dtype).T.contiguous()
    w = torch.zeros(classes, xs.shape[0], dtype=dtype, requires_grad=True)  # K×D: logitsᵀ = W·Xᵀ + b
    b = torch.zeros(classes, dtype=dtype, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=steps, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12)

    def logits(feats_t: torch.Tensor) -> torch.Tensor:
        return torch.addmm(b[:, None], w, feats_t).T  # N×K

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(logits(xs), train_labels) + 0.5 * weight_decay * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        train_top1 = float((logits(xs).argmax(1) == train_labels).double().mean())
        test_top1 = float((logits(xt).argmax(1) == test_labels).double().mean())
    return ProbeResult(train_top1, test_top1, w.detach().T.contiguous(), b.detach(), mean, std)
