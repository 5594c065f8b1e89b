"""The linear probe on few labels (1 % and 10 % of the probe's training images): how well an encoder's
features serve a task with little labelled data, which the full probe on 60,000 labels can hide.

Each fraction is read over several fixed draws of class-balanced subsets. A draw's indices are a function
of the probe's training labels and ``LOW_LABEL_SEED`` alone, never of ``run.seed``: every arm and every
seed of a study is scored on the same images, so a paired difference compares encoders, not subsets. The
subsets are drawn from the probe's training images (the training split, which ``data.val_size`` has
already left out), so a validation split that chose the probe's weight decay and steps is never in them.
"""

from __future__ import annotations

import math

import torch

from mocolab.evaluation.probe import linear_probe

__all__ = ["LOW_LABEL_SEED", "class_balanced_draw", "low_label_metric", "low_label_probes"]

LOW_LABEL_SEED = 20_200_911  # fixed: the draws are part of the instrument, not of a run


def low_label_metric(fraction: float) -> str:
    """The metric's name: ``linear_top1_1pct`` for 0.01, ``linear_top1_10pct`` for 0.1."""
    return f"linear_top1_{100 * fraction:.6g}pct"


def class_balanced_draw(labels: torch.Tensor, fraction: float, classes: int, draw: int,
                        seed: int = LOW_LABEL_SEED) -> torch.Tensor:
    """Sorted indices into ``labels``: round(fraction · N / classes) images of each class (at least one; all of
    a class that has fewer), chosen by draw ``draw``'s own generator.

    Each class's order in a draw does not depend on the fraction, so the 1 % subset of a draw lies inside its
    10 % subset. Labels below 0 (unreadable images) are never drawn.
    """
    labels = labels.cpu()
    per_class = max(1, round(fraction * int((labels >= 0).sum()) / classes))
    gen = torch.Generator().manual_seed(seed + 7919 * draw)
    picked = []
    for c in range(classes):
        idx = (labels == c).nonzero().flatten()
        picked.append(idx[torch.randperm(len(idx), generator=gen)[:per_class]])
    return torch.cat(picked).sort().values


def low_label_probes(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                     test_labels: torch.Tensor, classes: int, fractions: tuple[float, ...], draws: int, *,
                     weight_decay: float, steps: int,
                     device: torch.device | str | None = None) -> dict[float, list[float]]:
    """{fraction: test top-1 of each draw}: the linear probe (``probe.linear_probe``) fitted on each draw's
    subset of the given training features and scored on all the test features given. It reuses the features
    the full probe reads; each fit is on a few hundred or thousand rows, so it costs a fraction of the full
    probe's (benchmarks/evaluation/low_label.py)."""
    out: dict[float, list[float]] = {}
    for fraction in fractions:
        tops = []
        for d in range(draws):
            idx = class_balanced_draw(train_labels, fraction, classes, d)
            res = linear_probe(train_feats[idx], train_labels[idx], test_feats, test_labels, classes,
                               weight_decay=weight_decay, steps=steps, device=device)
            tops.append(res.test_top1)
        out[fraction] = tops
    return out


def mean(values: list[float]) -> float:
    """The mean over draws (NaN for none)."""
    return sum(values) / len(values) if values else math.nan
