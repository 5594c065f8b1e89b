"""Backbones and projection heads.

A backbone maps images to a feature vector (what kNN and the linear probe
read); the head maps features to the C-dimensional embedding the contrastive
loss sees (v1: linear, v2: MLP, v3: MLPs with batch-norm).  MoCo v3 adds a
predictor on the query branch only (``Encoder.predictor``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from mocolab.config.choices import BACKBONES, HEADS, named_backbone  # model.backbone, model.head: config/choices.py
from mocolab.method.batchnorm import convert_split_bn
from mocolab.models.named import build_named
from mocolab.models.pooling import MaxPool2x2

from mocolab.models.vision_transformer import VIT_SIZES, build_vit


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
            layers += [nn.Conv2d(chans[i], chans[i + 1], 3, padding=1, bias=False), nn.BatchNorm2d(chans[i + 1])]
            # pool, then ReLU: the same values and gradients as ReLU then pool (max and ReLU commute, and a
            # window whose maximum is <= 0 passes no gradient either way), with the ReLU on a quarter of
            # the elements.  MaxPool2x2 is nn.MaxPool2d(2), exactly, at a fraction of its CPU time.
            if i < 3:
                layers.append(MaxPool2x2())
            layers.append(nn.ReLU(inplace=True))
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


def build_backbone(name: str, in_channels: int, width: int = 32, *, image_size: int = 28, patch_size: int = 0,
                   depth: int = 0, freeze_patch_embed: bool = False) -> nn.Module:
    """``image_size``, ``patch_size``, ``depth`` and ``freeze_patch_embed`` shape the ViTs only (vision_transformer.py);
    ``timm:NAME`` and ``tv:NAME`` are built for ``in_channels`` and ``image_size`` by models/named.py."""
    if named_backbone(name):
        return build_named(name, in_channels, image_size)
    if name in VIT_SIZES:
        return build_vit(name, image_size, in_channels, patch_size=patch_size, depth=depth,
                         freeze_patch_embed=freeze_patch_embed)
    if name == "convnet":
        return ConvNet(in_channels, width)
    if name == "resnet18":
        return _torchvision_resnet("resnet18", in_channels, cifar_stem=True)
    if name == "resnet50":
        return _torchvision_resnet("resnet50", in_channels, cifar_stem=False)
    raise ValueError(f"model.backbone: unknown value {name!r}; choose one of {list(BACKBONES)}, timm:NAME or "
                     f"tv:NAME")


def bn_mlp(layers: int, in_dim: int, hidden: int, out_dim: int, last_bn: bool = True) -> nn.Sequential:
    """MoCo v3's MLP: Linear (no bias) - BN - ReLU ..., and a last Linear followed by a non-affine BN."""
    mods: list[nn.Module] = []
    for i in range(layers):
        d1 = in_dim if i == 0 else hidden
        d2 = out_dim if i == layers - 1 else hidden
        mods.append(nn.Linear(d1, d2, bias=False))
        if i < layers - 1:
            mods += [nn.BatchNorm1d(d2), nn.ReLU(inplace=True)]
        elif last_bn:
            mods.append(nn.BatchNorm1d(d2, affine=False))
    return nn.Sequential(*mods)


def build_head(kind: str, in_dim: int, dim: int, hidden: int = 0) -> nn.Module:
    """The projection head; ``hidden`` 0 = the backbone's feature width."""
    hidden = hidden or in_dim
    if kind == "linear":
        return nn.Linear(in_dim, dim)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, dim))
    if kind == "mlp-bn":
        return bn_mlp(2, in_dim, hidden, dim)
    if kind == "mlp3-bn":
        return bn_mlp(3, in_dim, hidden, dim)
    raise ValueError(f"model.head: unknown value {kind!r}; choose one of {list(HEADS)}")


def build_predictor(dim: int, hidden: int) -> nn.Sequential:
    """MoCo v3's predictor on the query branch: two layers, no final batch-norm."""
    return bn_mlp(2, dim, hidden, dim, last_bn=False)


class Encoder(nn.Module):
    """backbone + head (+ predictor, MoCo v3's query branch); ``features`` is what evaluation reads,
    ``forward`` what the loss reads.

    The predictor is registered last, so a key encoder built from backbone and
    head pairs with the query encoder's first parameters (``MoCo.momentum_update``).
    """

    def __init__(self, backbone: nn.Module, head: nn.Module, predictor: nn.Module | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.predictor = predictor

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.head(self.backbone(x))
        return self.predictor(z) if self.predictor is not None else z

    def without_predictor(self) -> "Encoder":
        """A copy of backbone and head only: MoCo v3's key encoder."""
        return Encoder(copy.deepcopy(self.backbone), copy.deepcopy(self.head))


def build_encoder(backbone: str, in_channels: int, *, width: int = 32, head: str = "mlp", dim: int = 128,
                  hidden: int = 0, bn_groups: int = 1, predictor: bool = False, image_size: int = 28,
                  patch_size: int = 0, depth: int = 0, freeze_patch_embed: bool = False) -> Encoder:
    net = build_backbone(backbone, in_channels, width, image_size=image_size, patch_size=patch_size, depth=depth,
                         freeze_patch_embed=freeze_patch_embed)
    if bn_groups > 1:
        convert_split_bn(net, bn_groups)
    pred = build_predictor(dim, hidden or net.out_dim) if predictor else None
    return Encoder(net, build_head(head, net.out_dim, dim, hidden), pred)
