"""Batch-norm that cannot leak the sub-batch signature between query and key.

With plain BN, a query and its positive key are normalised with statistics of
the same samples, so the encoder can match them by the batch signature alone
and the pretext task "cheats".  MoCo's shuffle BN computes keys on a batch
permuted across devices.  One process has no devices to shuffle across, so
``SplitBatchNorm`` normalises G virtual groups separately (as if on G devices)
and ``LocalShuffle`` permutes the key batch across those groups.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SplitBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics come from ``groups`` equal slices of the batch.

    Running statistics are the average over groups, so eval mode is ordinary BN
    and a checkpoint loads into a plain ``BatchNorm2d``.
    """

    def __init__(self, num_features: int, groups: int, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        if groups < 1:
            raise ValueError(f"groups: {groups} must be >= 1")
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.groups == 1:
            return super().forward(x)
        n, c, h, w = x.shape
        g = self.groups
        if n % g:
            raise ValueError(f"batch of {n} is not divisible into {g} BN groups")
        # N×C×H×W -> (N/G)×(G·C)×H×W: group j's channels sit at j·C..(j+1)·C
        xg = x.view(g, n // g, c, h, w).transpose(0, 1).reshape(n // g, g * c, h, w)
        running_mean = self.running_mean.repeat(g)
        running_var = self.running_var.repeat(g)
        out = F.batch_norm(xg, running_mean, running_var, self.weight.repeat(g), self.bias.repeat(g),
                           True, self.momentum, self.eps)
        with torch.no_grad():
            self.running_mean.copy_(running_mean.view(g, c).mean(0))
            self.running_var.copy_(running_var.view(g, c).mean(0))
            self.num_batches_tracked += 1
        return out.view(n // g, g, c, h, w).transpose(0, 1).reshape(n, c, h, w)


def convert_split_bn(module: nn.Module, groups: int) -> nn.Module:
    """Replace every BatchNorm2d by a SplitBatchNorm2d carrying over its weights and statistics."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d) and not isinstance(child, SplitBatchNorm2d):
            new = SplitBatchNorm2d(child.num_features, groups, eps=child.eps, momentum=child.momentum,
                                   affine=child.affine, track_running_stats=child.track_running_stats)
            new.load_state_dict(child.state_dict())
            setattr(module, name, new)
        else:
            convert_split_bn(child, groups)
    return module


class LocalShuffle:
    """Permute the key batch within this process; pairs with split BN.

    ``shuffle`` returns the permuted batch and the inverse permutation that
    ``unshuffle`` applies to the keys, so every key returns to its query.
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    def shuffle(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        perm = torch.randperm(x.shape[0], generator=self.generator, device="cpu").to(x.device)
        return x[perm], torch.argsort(perm)

    def unshuffle(self, k: torch.Tensor, restore: torch.Tensor) -> torch.Tensor:
        return k[restore]


class NoShuffle:
    """Keys computed on the batch as it is (bn=plain: shows the pretext task cheating)."""

    def shuffle(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return x, None

    def unshuffle(self, k: torch.Tensor, restore: None) -> torch.Tensor:
        return k
