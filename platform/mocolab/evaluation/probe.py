"""The linear probe: logistic regression on frozen, standardised features, fitted by full-batch L-BFGS from
zeros, so the same features always give the same number."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from mocolab.evaluation.precision import full_fp32

__all__ = ["ProbeResult", "linear_probe"]  # stable (docs/api.md)


@dataclass
class ProbeResult:
    train_top1: float
    test_top1: float
    # the fitted probe: logits = ((features - mean) / std) @ weight + bias (mean, std float64; weight, bias in the
    # probe's dtype; models/exported.py turns it into a module)
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


@full_fp32()
def linear_probe(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, classes: int, *, weight_decay: float = 1e-4,
                 steps: int = 200, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> ProbeResult:
    """Multinomial logistic regression on standardised frozen features, fitted by full-batch L-BFGS.

    Standardising with the training mean/std makes one weight decay serve
    every encoder; L-BFGS from zeros has no randomness, so the probe is a
    deterministic function of the features.  The statistics are float64; the
    fit runs in ``dtype``: float32 is cheaper than float64 and its test top-1 stays within a few images
    (benchmarks/RESULTS.md, "Time to a result: what a trial spends besides training").  ``device``: where
    the fit runs (the training GPU for a large set); the fitted probe comes back on the CPU.  The fit runs
    in full float32 (``precision.full_fp32``), TF32 off, whatever training set.
    """
    device = torch.device(device) if device is not None else train_feats.device
    train_feats, test_feats = train_feats.to(device), test_feats.to(device)
    train_labels, test_labels = train_labels.to(device), test_labels.to(device)
    x = train_feats.double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    # features as D×N: the gradient of the weights is then (K×N)·(N×D) over contiguous rows, where the
    # N×D layout's Xᵀ·G strides across rows (benchmarks/RESULTS.md, "Time to a result, second part: the
    # evaluation, and Ray Train against torchrun")
    xs = ((x - mean) / std).to(dtype).T.contiguous()
    del x
    xt = ((test_feats.double() - mean) / std).to(dtype).T.contiguous()
    w = torch.zeros(classes, xs.shape[0], dtype=dtype, device=device, requires_grad=True)  # K×D: logitsᵀ = W·Xᵀ + b
    b = torch.zeros(classes, dtype=dtype, device=device, requires_grad=True)
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
    return ProbeResult(train_top1, test_top1, w.detach().T.contiguous().cpu(), b.detach().cpu(), mean.cpu(),
                       std.cpu())
