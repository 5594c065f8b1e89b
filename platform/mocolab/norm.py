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


class _GlobalBatchNorm(torch.autograd.Function):
    """Batch-norm over the batch of every rank together: sums all-reduced forward and backward.

    PyTorch's ``SyncBatchNorm`` refuses CPU tensors; this one speaks to any process group (gloo on CPU).
    Forward all-reduces Σx, Σx² and the count per channel; backward all-reduces Σdy and Σdy·x̂, so each
    rank's input gradient is exactly its slice of the gradient one process holding the whole batch computes.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, group):
        import torch.distributed as dist

        c = x.shape[1]
        dims = [0, *range(2, x.dim())]
        count = torch.tensor([x.numel() // c], dtype=torch.float64)
        stats = torch.cat([x.double().sum(dims), (x.double() ** 2).sum(dims), count])
        dist.all_reduce(stats, group=group)
        total = stats[-1]
        mean = stats[:c] / total
        var = (stats[c:2 * c] / total - mean ** 2).clamp_min(0)  # biased: what the normalisation uses
        invstd = (var + eps).rsqrt()
        shape = [1, c] + [1] * (x.dim() - 2)
        xhat = ((x.double() - mean.view(shape)) * invstd.view(shape)).to(x.dtype)
        out = xhat * weight.view(shape) + bias.view(shape) if weight is not None else xhat
        ctx.save_for_backward(xhat, invstd.to(x.dtype), weight)
        ctx.group, ctx.total, ctx.has_affine = group, total, weight is not None
        unbiased = var * total / (total - 1).clamp_min(1)  # what running_var tracks, as nn.BatchNorm does
        return out, mean.to(x.dtype), unbiased.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out, _grad_mean, _grad_var):
        import torch.distributed as dist

        xhat, invstd, weight = ctx.saved_tensors
        c = xhat.shape[1]
        dims = [0, *range(2, xhat.dim())]
        shape = [1, c] + [1] * (xhat.dim() - 2)
        local = torch.cat([grad_out.sum(dims), (grad_out * xhat).sum(dims)])  # this rank's Σdy, Σdy·x̂
        sums = local.clone()
        dist.all_reduce(sums, group=ctx.group)
        mean_dy = (sums[:c] / ctx.total).view(shape)
        mean_dy_xhat = (sums[c:] / ctx.total).view(shape)
        scale = invstd.view(shape) * (weight.view(shape) if ctx.has_affine else 1.0)
        grad_x = scale * (grad_out - mean_dy - xhat * mean_dy_xhat)
        # parameters: this rank's share, as for any parameter under DDP (which then averages the ranks)
        grad_w = local[c:] if ctx.has_affine else None
        grad_b = local[:c] if ctx.has_affine else None
        return grad_x, grad_w, grad_b, None, None


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm1d/2d whose training statistics cover the global batch of every rank (MoCo v3's ``bn=sync``).

    Without an initialised process group, or with one rank, it is ordinary batch-norm; in eval mode it
    uses its running statistics like any BN, and its state dict is a plain BN's.
    """

    def __init__(self, num_features: int, group=None, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.group = group

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() not in (2, 3, 4):
            raise ValueError(f"GlobalBatchNorm: expected 2-D to 4-D input, got {x.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        self._check_input_dim(x)
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(self.group) > 1
        if not (self.training and distributed):
            return super().forward(x)
        out, mean, var = _GlobalBatchNorm.apply(x, self.weight, self.bias, self.eps, self.group)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(var.detach(), alpha=m)
        return out


def convert_global_bn(module: nn.Module, group=None) -> nn.Module:
    """Replace every BatchNorm1d/2d (split BN included) by a GlobalBatchNorm carrying its weights and statistics."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, GlobalBatchNorm):
        new = GlobalBatchNorm(module.num_features, group, eps=module.eps, momentum=module.momentum,
                              affine=module.affine, track_running_stats=module.track_running_stats)
        new.load_state_dict(module.state_dict())
        return new
    for name, child in module.named_children():
        setattr(module, name, convert_global_bn(child, group))
    return module
