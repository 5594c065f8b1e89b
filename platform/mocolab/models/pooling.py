"""2×2 max pooling with stride 2, computed as three element-wise maxima of strided views.

The convnet backbone pools three times per forward.  On CPU, torch's NCHW
``max_pool2d`` scans each window with a per-element loop and runs at a
fraction of memory bandwidth, a large share of a CPU step
(benchmarks/RESULTS.md, "Performance: the faster step").  The four corners of every window are strided views
of the input, so the maximum is ``max(max(a, b), max(c, d))`` in vectorised
element-wise ops.  The result is exact: the same values, and (with gradient)
the same arg-max as ``max_pool2d`` — the first maximum in the window's
row-major order — handed to torch's own ``max_pool2d_with_indices_backward``,
so the input gradient is bit for bit the native one (tests/models/test_pooling.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _corners(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The windows' four corners in row-major order; odd edges are dropped, as floor mode does."""
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    return (x[..., 0:h:2, 0:w:2], x[..., 0:h:2, 1:w:2], x[..., 1:h:2, 0:w:2], x[..., 1:h:2, 1:w:2])


class _MaxPool2x2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        a, b, c, d = _corners(x)
        top, bottom = torch.maximum(a, b), torch.maximum(c, d)
        out = torch.maximum(top, bottom)
        # max_pool2d's arg-max is the first maximum in row-major order: the bottom row only where it is
        # strictly larger, and within a row the right column only where strictly larger
        row = bottom > top
        right_top, right_bottom = b > a, d > c
        col = right_top ^ (row & (right_top ^ right_bottom))
        ctx.save_for_backward(row, col)
        ctx.input_shape, ctx.input_stride, ctx.input_dtype = x.shape, x.stride(), x.dtype
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        row, col = ctx.saved_tensors
        w = ctx.input_shape[-1]
        oh, ow = row.shape[-2:]
        # the flat position in the H×W plane, as max_pool2d's indices hold it
        corner = (torch.arange(oh, device=row.device) * (2 * w)).view(oh, 1) \
            + torch.arange(0, 2 * ow, 2, device=row.device).view(1, ow)
        indices = row.long().mul_(w).add_(col.long()).add_(corner)
        x = torch.empty_strided(ctx.input_shape, ctx.input_stride, dtype=ctx.input_dtype, device=row.device)
        return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False,
                                                               indices)


def max_pool_2x2(x: torch.Tensor) -> torch.Tensor:
    """``F.max_pool2d(x, 2)`` for N×C×H×W input, faster on CPU; elsewhere torch's own kernel."""
    if x.device.type != "cpu" or x.dim() != 4 or min(x.shape[-2:]) < 2:  # (too small: torch's own error)
        return F.max_pool2d(x, 2)
    if torch.is_grad_enabled() and x.requires_grad:
        return _MaxPool2x2.apply(x)
    a, b, c, d = _corners(x)
    return torch.maximum(torch.maximum(a, b), torch.maximum(c, d))


class MaxPool2x2(nn.Module):
    """Drop-in for ``nn.MaxPool2d(2)`` (no parameters, so checkpoints are unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return max_pool_2x2(x)
