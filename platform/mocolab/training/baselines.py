"""What a trained encoder must beat before anyone reads an ablation: the same seed's encoder before training,
and the raw pixels, scored by the same kNN and linear probe on the same images.

On Fashion-MNIST a randomly initialised convnet already reaches ~85 % linear and ~74 % kNN top-1 at the
cpu-quick evaluation: an accuracy means little until it is shown as the difference from these.  The
random-init encoder of seed s is the exact network trial s starts from (``Trainer`` seeds its weights from
``run.seed``); the pixel probe has no seed (the probe is deterministic and the evaluation images are the same
draw in every run).  Pure PyTorch: the command that logs these to MLflow is ``mocolab baselines``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from mocolab.data.augment import to_float
from mocolab.config import Config
from mocolab.training.trainer import Trainer

PIXEL_SIDE = 32  # larger images are average-pooled to 32x32 before the pixel probe (ImageNet: 3,072 features)


def pixel_features(images: torch.Tensor) -> torch.Tensor:
    """uint8 N×C×H×W -> float32 N×(C·h·w): the pixels in [0, 1], pooled to at most 32×32 (the probe
    standardises each feature, so the scale does not matter)."""
    x = to_float(images)
    if max(x.shape[-2:]) > PIXEL_SIDE:
        x = F.adaptive_avg_pool2d(x, (min(x.shape[-2], PIXEL_SIDE), min(x.shape[-1], PIXEL_SIDE)))
    return x.flatten(1)


@dataclass(frozen=True)
class Baseline:
    """One baseline's scores (fractions, as the runs log them)."""

    kind: str  # "random-init" or "raw-pixels"
    seed: int | None  # the run seed whose initial encoder this is; None for pixels
    knn_top1: float
    linear_top1: float
    # the final evaluation's other scores (``FinalScores.extra_metrics``: the k = 20 kNN, the low-label probes),
    # so that a table sets an encoder's 1 % probe beside its start's
    extra: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        return {"knn_top1": self.knn_top1, "linear_top1": self.linear_top1, **self.extra}

    def metric(self, name: str) -> float:
        """One score by its logged name; NaN where this baseline has none."""
        return self.metrics().get(name, math.nan)


def measure(cfg: Config, *, pixels: bool = True, progress=None) -> list[Baseline]:
    """The random-init encoder of ``cfg.run.seed`` (and, with ``pixels``, the raw pixels) under ``cfg.eval``."""
    tr = Trainer(cfg)
    s = tr.evaluation.final_scores(progress, validation=False)
    out = [Baseline("random-init", cfg.run.seed, s.knn, s.probe.test_top1, s.extra_metrics())]
    if pixels:
        s = tr.evaluation.final_scores(None, pixel_features, validation=False)
        out.append(Baseline("raw-pixels", None, s.knn, s.probe.test_top1, s.extra_metrics()))
    return out
