"""What the method says to other ranks: rank and world, gathers with and without autograd, reductions.

Pure PyTorch + ``torch.distributed`` (any backend: gloo on CPU, NCCL on GPUs); every tensor a collective
touches lives on the input's device (NCCL takes no other).  With the process group not initialised
everything degrades to one process (W = 1).  Every rank calls each of these in the same order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# gloo gained reduce_scatter in torch 2.8; older gloo falls back to all_reduce + slice.
_TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

# stable (docs/api.md): what the distributed losses and queues take as their collectives
__all__ = ["gather_no_grad", "gather_with_grad", "rank_and_world", "reduce_scatter_with_grad"]


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) when there is none."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_gather_cat(x: torch.Tensor) -> torch.Tensor:
    """x: n×… on every rank -> (W·n)×…, rank-major.  No autograd."""
    _, world = rank_and_world()
    if world == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    return torch.cat(parts)


def _reduce_scatter_sum(x: torch.Tensor) -> torch.Tensor:
    """x: (W·n)×… on every rank -> n×…: this rank's rows, summed over ranks.  No autograd."""
    rank, world = rank_and_world()
    if world == 1:
        return x
    chunks = list(x.contiguous().chunk(world))
    if dist.get_backend() == "gloo" and _TORCH_VERSION < (2, 8):
        total = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(total)
        return total.chunk(world)[rank].clone()
    out = torch.empty_like(chunks[rank])
    dist.reduce_scatter(out, chunks)
    return out


def any_rank(flag: bool) -> bool:
    """True on every rank if ``flag`` is True on any: decisions that must be taken together (divergence)."""
    return max_over_ranks(1.0 if flag else 0.0) > 0


def any_rank_tensor(flag: torch.Tensor) -> torch.Tensor:
    """``flag`` (a 0-d bool on the rank's device) OR-ed over ranks, still on the device: the caller reads it
    with whatever else it reads that step, in one transfer."""
    _, world = rank_and_world()
    if world == 1:
        return flag
    t = flag.to(torch.int32).reshape(1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t[0] > 0


def max_over_ranks(value: float) -> float:
    """The largest ``value`` of all ranks, on every rank (a collective: every rank must call it)."""
    _, world = rank_and_world()
    if world == 1:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


@torch.no_grad()
def mean_over_ranks(x: torch.Tensor) -> torch.Tensor:
    """The element-wise mean of ``x`` over ranks, on every rank (a collective); ``x`` itself when alone."""
    _, world = rank_and_world()
    if world == 1:
        return x
    out = x.detach().clone()
    dist.all_reduce(out)
    return out / world


@torch.no_grad()
def gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    """All-gather along dim 0 (B×… -> (B·W)×…, rank-major), outside autograd."""
    return _all_gather_cat(x.detach())


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward sums the gradient every rank computed for our rows (reduce-scatter).

    The adjoint of all-gather: rank s's graph uses our rows, so their gradient
    comes back to us from every rank.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _all_gather_cat(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter_sum(grad)


class _ReduceScatterWithGrad(torch.autograd.Function):
    """Reduce-scatter (sum); its backward all-gathers the gradients (its adjoint)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter_sum(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _all_gather_cat(grad)


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """All-gather along dim 0 (B×… -> (B·W)×…) carrying autograd back to the rows' owners."""
    return _GatherWithGrad.apply(x) if rank_and_world()[1] > 1 else x


def reduce_scatter_with_grad(x: torch.Tensor) -> torch.Tensor:
    """(B·W)×… -> B×… (this rank's rows summed over ranks), carrying autograd."""
    return _ReduceScatterWithGrad.apply(x) if rank_and_world()[1] > 1 else x


# ---------------------------------------------------------------------------------------------
# Shuffle BN across ranks






# ---------------------------------------------------------------------------------------------
# Queue layouts








