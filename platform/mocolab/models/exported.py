"""What leaves the platform: the trained encoder as a feature extractor, and the linear probe as a classifier.

Both take float images in [0, 1] (N×C×H×W, the channels and size the run
trained on) and normalise them the way training and evaluation did, so a
user never has to know our per-dataset means. ``FeatureExtractor`` gives
exactly the features the kNN monitor and the probe read (``extract_features``);
``ProbeClassifier`` adds the probe's standardisation and weights, giving
the logits behind ``linear_top1``. They are plain modules with no mocolab
code in their forward beyond tensor ops, so ``torch.export`` turns them into
a program that loads with torch alone (tracking/logged_models.py).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from mocolab.data.augment import Normalise


class FeatureExtractor(nn.Module):
    """Backbone features of [0, 1] images: ``extract_features`` on their uint8 originals, in one module."""

    def __init__(self, backbone: nn.Module, channels: int) -> None:
        super().__init__()
        self.normalise = Normalise(channels)
        self.backbone = backbone

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.normalise(images)).float()


class FittedProbe(Protocol):
    """What a classifier needs of a fitted probe (``evaluation.probe.ProbeResult`` carries it): logits are
    ((features - mean) / std) @ weight + bias."""

    weight: torch.Tensor | None
    bias: torch.Tensor | None
    mean: torch.Tensor | None
    std: torch.Tensor | None


class ProbeClassifier(nn.Module):
    """Features -> the probe's standardisation -> its linear layer: class logits."""

    def __init__(self, features: FeatureExtractor, probe: FittedProbe) -> None:
        super().__init__()
        if probe.weight is None or probe.bias is None or probe.mean is None or probe.std is None:
            raise ValueError("this probe result carries no fitted weights")
        self.features = features
        self.register_buffer("mean", probe.mean.float().clone())
        self.register_buffer("std", probe.std.float().clone())
        self.linear = nn.Linear(probe.weight.shape[0], probe.weight.shape[1])
        with torch.no_grad():
            self.linear.weight.copy_(probe.weight.T.float())
            self.linear.bias.copy_(probe.bias.float())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.linear((self.features(images) - self.mean) / self.std)


def backbone_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The backbone's own weights out of a ``FeatureExtractor``'s (or a checkpoint encoder's) state dict."""
    prefix = "backbone."
    out = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not out:
        raise ValueError(f"no '{prefix}*' weights in this state dict (keys: {sorted(state)[:5]} ...)")
    return out
