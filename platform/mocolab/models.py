"""Backbones and projection heads.

A backbone maps images to a feature vector (what kNN and the linear probe
read); the head maps features to the C-dimensional embedding the contrastive
loss sees (v1: linear, v2: MLP).
"""

from __future__ import annotations

import torch
from torch import nn

from .norm import convert_split_bn

BACKBONES = ("convnet", "resnet18", "resnet50")
HEADS = ("linear", "mlp")  # MoCo v1: linear, v2: MLP


class ConvNet(nn.Module):
    """Four conv-BN-ReLU blocks (w, 2w, 4w, 8w channels), three 2×2 max-pools, global average pool.

    The CPU default: ~10 MFLOPs per 28×28 image, so a MoCo step on batch 256
    takes a fraction of a second on one core.
    """

    def __init__(self, in_channels: int = 1, width: int = 32) -> None:
        super().__init__()
        chans = [in_channels, width, 2 * width, 4 * width, 8 * width]
        layers: list[nn.Module] = []
        for i in range(4):
            layers += [nn.Conv2d(chans[i], chans[i + 1], 3, padding=1, bias=False),
                       nn.BatchNorm2d(chans[i + 1]), nn.ReLU(inplace=True)]
            if i < 3:
                layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.out_dim = chans[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1)


def _torchvision_resnet(name: str, in_channels: int, cifar_stem: bool) -> nn.Module:
    import torchvision  # here, not at the top: config imports BACKBONES, and torchvision costs seconds

    net = getattr(torchvision.models, name)(weights=None)
    if cifar_stem:  # 3×3 stride-1 stem, no max-pool: small images keep their resolution
        net.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        net.maxpool = nn.Identity()
    elif in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    out_dim = net.fc.in_features
    net.fc = nn.Identity()
    net.out_dim = out_dim
    return net


def build_backbone(name: str, in_channels: int, width: int = 32) -> nn.Module:
    if name == "convnet":
        return ConvNet(in_channels, width)
    if name == "resnet18":
        return _torchvision_resnet("resnet18", in_channels, cifar_stem=True)
    if name == "resnet50":
        return _torchvision_resnet("resnet50", in_channels, cifar_stem=False)
    raise ValueError(f"model.backbone: unknown value {name!r}; choose one of {list(BACKBONES)}")


def build_head(kind: str, in_dim: int, dim: int, hidden: int = 0) -> nn.Module:
    if kind == "linear":
        return nn.Linear(in_dim, dim)
    if kind == "mlp":
        hidden = hidden or in_dim
        return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, dim))
    raise ValueError(f"model.head: unknown value {kind!r}; choose one of {list(HEADS)}")


class Encoder(nn.Module):
    """backbone + head; ``features`` is what evaluation reads, ``forward`` what the loss reads."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def build_encoder(backbone: str, in_channels: int, *, width: int = 32, head: str = "mlp", dim: int = 128,
                  hidden: int = 0, bn_groups: int = 1) -> Encoder:
    net = build_backbone(backbone, in_channels, width)
    if bn_groups > 1:
        convert_split_bn(net, bn_groups)
    return Encoder(net, build_head(head, net.out_dim, dim, hidden))
