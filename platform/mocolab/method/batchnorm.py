"""Batch-norm that cannot leak the sub-batch signature between query and key.

With plain BN, a query and its positive key are normalised with statistics of
the same samples, so the encoder can match them by the batch signature alone
and the pretext task "cheats".  MoCo's shuffle BN computes keys on a batch
permuted across devices.  One process has no devices to shuffle across, so
``SplitBatchNorm`` normalises G virtual groups separately (as if on G devices)
and ``LocalShuffle`` permutes the key batch across those groups. ``bn=groups``
keeps the groups and drops the shuffle: a query and its key then share a
group's statistics again, which is what the shuffle exists to prevent.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["GlobalBatchNorm", "SplitBatchNorm2d", "convert_global_bn", "convert_split_bn"]  # stable (docs/api.md)


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

    @staticmethod
    def _kernel(x: torch.Tensor):
        """Which groups, computed how, without copying the activations.  On the CPU: contiguous slices of
        the batch, torch's own kernels on each (its fp32 kernel would accumulate in float64, far slower:
        ``_float_batch_norm``).  On a GPU: an NCHW batch is viewed with its groups side by side as channels,
        strided across the batch as in the MoCo reference (group j: samples j, j+G, ...), one cuDNN call and no copy; a
        channels_last batch cannot be viewed so, and takes the per-slice kernels (no copy forward; backward,
        torch's out= variant copies each slice's input gradient once).  Strided and contiguous
        groups are the same partition of a permuted batch, and the batch order is random (the data order, and
        the key batch's shuffle), so both are split BN; tests/method/test_norm.py holds them equal."""
        if x.device.type == "cpu" or x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            return _GroupBatchNorm.apply
        return _strided_batch_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.groups == 1:
            return super().forward(x)
        n, c, h, w = x.shape
        g = self.groups
        if n % g:
            raise ValueError(f"batch of {n} is not divisible into {g} BN groups")
        running_mean = self.running_mean.repeat(g).view(g, c)
        running_var = self.running_var.repeat(g).view(g, c)
        out = self._kernel(x)(x, self.weight, self.bias, running_mean, running_var, g, self.momentum, self.eps)
        with torch.no_grad():
            self.running_mean.copy_(running_mean.mean(0))
            self.running_var.copy_(running_var.mean(0))
            self.num_batches_tracked += 1
        return out


def _strided_batch_norm(x, weight, bias, running_mean, running_var, groups: int, momentum: float,
                        eps: float) -> torch.Tensor:
    """Training-mode batch-norm of G strided groups (sample i in group i mod G) of an NCHW-contiguous batch:
    N×C×H×W viewed as (N/G)×(G·C)×H×W, where channel j·C + c holds channel c of group j.  Views both ways, so
    neither forward nor backward copies an activation; row j of ``running_mean``/``running_var`` (G×C) is
    group j's."""
    n, c, h, w = x.shape
    g = groups
    out = F.batch_norm(x.view(n // g, g * c, h, w), running_mean.view(-1), running_var.view(-1),
                       None if weight is None else weight.repeat(g), None if bias is None else bias.repeat(g),
                       True, momentum, eps)
    return out.view(n, c, h, w)


class _GroupBatchNorm(torch.autograd.Function):
    """Training-mode batch-norm of G contiguous slices of the batch, each with its own statistics.

    Each slice is contiguous, so torch's own batch-norm kernels run on it in
    place of a whole-batch transpose: forward and backward write their slice of
    one output tensor (``.out`` variants), and nothing is copied.  Row j of
    ``running_mean``/``running_var`` (G×C) is updated from slice j, as G
    separate ``BatchNorm2d`` layers would.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, groups: int, momentum: float, eps: float):
        cpu = x.device.type == "cpu"
        x = x.contiguous() if cpu else x  # a GPU's channels_last batch: each slice is contiguous as it is
        ref = weight if weight is not None else running_mean
        stats = ref.dtype if ref is not None else x.dtype  # what native_batch_norm keeps its statistics in
        out = torch.empty_like(x)
        means = torch.empty(groups, x.shape[1], dtype=stats, device=x.device)
        invstds = torch.empty_like(means)
        for j, (xj, oj) in enumerate(zip(x.chunk(groups), out.chunk(groups))):
            if x.dtype == torch.float32 and cpu:
                _float_batch_norm(xj, weight, bias, running_mean[j], running_var[j], momentum, eps, oj,
                                  means[j], invstds[j])
            else:
                torch.ops.aten.native_batch_norm.out(xj, weight, bias, running_mean[j], running_var[j], True,
                                                     momentum, eps, out=oj, save_mean=means[j], save_invstd=invstds[j])
        ctx.save_for_backward(x, weight, means, invstds)
        ctx.groups, ctx.eps = groups, eps
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, means, invstds = ctx.saved_tensors
        layout = torch.contiguous_format if x.is_contiguous() else torch.channels_last
        grad = grad.contiguous(memory_format=layout)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = torch.empty_like(x) if need_x else None
        grad_w = grad_b = None
        mask = [need_x, need_w, need_b]
        parts = grad_x.chunk(ctx.groups) if need_x else [None] * ctx.groups
        for j, (xj, gj, part) in enumerate(zip(x.chunk(ctx.groups), grad.chunk(ctx.groups), parts)):
            args = (gj, xj, weight, None, None, means[j], invstds[j], True, ctx.eps, mask)
            if all(mask):  # straight into this slice of grad_x
                gw = torch.empty(0, dtype=means.dtype, device=x.device)
                gb = torch.empty(0, dtype=means.dtype, device=x.device)
                torch.ops.aten.native_batch_norm_backward.out(*args, out0=part, out1=gw, out2=gb)
            else:  # the .out variant wants every output (an affine-free layer has no weight gradient)
                gx, gw, gb = torch.ops.aten.native_batch_norm_backward(*args)
                if need_x:
                    part.copy_(gx)
            if need_w:
                grad_w = gw if grad_w is None else grad_w + gw
            if need_b:
                grad_b = gb if grad_b is None else grad_b + gb
        return grad_x, grad_w, grad_b, None, None, None, None, None


def _float_batch_norm(x, weight, bias, running_mean, running_var, momentum: float, eps: float, out, save_mean,
                      save_invstd) -> None:
    """Training-mode batch-norm of float32 ``x`` on CPU, into ``out``: what ``native_batch_norm`` computes.

    torch's CPU kernel accumulates float32 statistics in float64, far slower than
    its bfloat16 kernel (benchmarks/RESULTS.md, "Performance: the faster
    step").  Here the two-pass mean and biased variance are float32 sums
    (cascaded, so accurate to float32 rounding), torch's eval-mode kernel
    normalises with them, and the running statistics take the unbiased
    variance, as in training mode.  The saved mean and 1/std feed torch's own
    backward unchanged.
    """
    n, c = x.shape[0], x.shape[1]
    v = x.view(n, c, -1)
    count = n * v.shape[2]
    mean = v.sum(2).sum(0).div_(count)
    var = (v - mean[None, :, None]).pow_(2).sum(2).sum(0).div_(count)
    torch.ops.aten.native_batch_norm.out(x, weight, bias, mean, var, False, momentum, eps, out=out,
                                         save_mean=torch.empty(0), save_invstd=torch.empty(0))
    save_mean.copy_(mean)
    save_invstd.copy_(var.add(eps).rsqrt_())
    running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)  # (autograd is off in a Function's forward)
    running_var.mul_(1 - momentum).add_(var * (count / max(count - 1, 1)), alpha=momentum)


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






class _GlobalBatchNorm(torch.autograd.Function):
    """Batch-norm over the batch of every rank together: sums all-reduced forward and backward.

    PyTorch's ``SyncBatchNorm`` refuses CPU tensors; this one speaks to any process group (gloo on CPU).
    Forward all-reduces Σx, Σx² and the count per channel; backward all-reduces Σdy and Σdy·x̂, so each
    rank's input gradient is exactly its slice of the gradient one process holding the whole batch computes.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, group):
        c = x.shape[1]
        dims = [0, *range(2, x.dim())]
        count = torch.tensor([x.numel() // c], dtype=torch.float64, device=x.device)
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
