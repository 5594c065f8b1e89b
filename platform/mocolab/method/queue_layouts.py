"""MoCo's queue across W ranks, in two layouts that give the same loss and gradients.

Logically there is one FIFO of K keys; batch n of the global stream (G = B·W keys, rank-major: rank 0's B
keys, then rank 1's, ...) occupies global slots ``(n mod K/G)·G ..+G`` (docs/ARCHITECTURE.md, "Queue
layouts").

- ``ReplicatedKeyQueue``: every rank holds all K slots and all-gathers the keys before enqueueing them
  (the MoCo reference).  Memory O(K) per rank.
- ``ShardedKeyQueue``: rank r holds the K/W slots ``n·G + r·B + i`` (i < B), its own B keys of every
  batch.  Both rings wrap after K/G batches, so the union of the shards is the replicated queue's key set
  at every step.  Logits are computed where the keys live and the softmax denominator is combined across
  ranks.  Memory O(K/W) per rank; per step only G×C queries and G-sized vectors travel.

``contrast`` and ``enqueue`` are collectives: every rank calls them in lockstep.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mocolab.config.choices import QUEUE_LAYOUTS as LAYOUTS
from mocolab.method.collectives import (
    _all_gather_cat,
    gather_no_grad,
    gather_with_grad,
    rank_and_world,
    reduce_scatter_with_grad,
)
from mocolab.method.key_queue import KeyQueue, KeySnapshot
from mocolab.method.losses import sharded_queue_info_nce
from mocolab.method.async_copy import to_device

__all__ = ["ReplicatedKeyQueue", "ShardedKeyQueue", "build_queue", "gather_queue_state"]  # stable (docs/api.md)


class ReplicatedKeyQueue(KeyQueue):
    """Every rank holds all K keys; ``enqueue`` all-gathers the B·W keys first.

    ``batch_size`` is the per-rank batch B, as everywhere.  ``contrast`` is
    KeyQueue's, local: this rank's B queries against all K keys.  Keep the
    buffers out of DDP's per-step buffer broadcast (K×C each step otherwise).
    """

    def __init__(self, size: int, dim: int, batch_size: int, generator: torch.Generator | None = None, *,
                 world_size: int | None = None, policy: str = "fifo", seed: int = 0) -> None:
        world = rank_and_world()[1] if world_size is None else world_size
        super().__init__(size, dim, batch_size, generator, world_size=world, policy=policy, seed=seed)

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, step: int | torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """keys: B×C on this rank; enqueues the global (B·W)×C batch, rank-major (``index`` likewise, moved to
        the keys' device first: the loader hands it on the CPU, and NCCL gathers device tensors only).
        Every rank draws the same random slots (one seed), so the replicas stay equal."""
        if index is not None:
            index = gather_no_grad(to_device(index, keys.device))
        return super().enqueue(gather_no_grad(keys), step, index)


class ShardedKeyQueue(KeyQueue):
    """Rank r holds K/W of the K slots: its own B keys of every global batch.

    Buffers (``keys`` (K/W)×C, ``write_step``, ``ptr``) are this rank's ring
    of ``shard_size`` = ``slots`` = K/W; ``size`` = K and ``batch_size`` = B,
    as in every queue, and each ``enqueue`` writes this rank's B keys.  Local
    slot ``n·B + i`` is global slot ``n·G + r·B + i`` of the replicated queue
    (G = B·W); both rings wrap after K/G batches, so the union of the shards
    equals the replicated queue at every step.  The random initial keys are
    drawn as the full K×C from ``generator`` and sliced the same way, so both
    layouts start from the same negatives (and consume the same RNG draws).

    Loss (``contrast``): the local InfoNCE of this rank's B queries against all
    K keys, the same value ReplicatedKeyQueue.contrast returns on this rank.
    It is computed where the keys live: the queries are all-gathered with
    autograd, scored against the local shard, and the softmax denominator is
    summed across ranks (reduce-scatter, with autograd).  Backward sends every
    query's gradient back to its owner, and rank r's loss depends only on rank
    r's queries, so the gradient each rank's query encoder receives equals the
    replicated layout's on that rank; hence also the average over ranks (what
    DDP computes) equals the replicated average, which is the gradient of the
    global mean loss over the B·W queries.  (tests/method/test_dist.py checks both.)
    A state dict holds this rank's shard only: checkpoint every rank's (or
    ``gather_queue_state``), and keep the buffers out of DDP's buffer
    broadcast, which would overwrite every shard with rank 0's.
    """

    def __init__(self, size: int, dim: int, batch_size: int, generator: torch.Generator | None = None,
                 *, rank: int | None = None, world_size: int | None = None) -> None:
        r0, w0 = rank_and_world()
        rank = r0 if rank is None else rank
        world = w0 if world_size is None else world_size
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank {rank} / world size {world} are inconsistent")
        if batch_size <= 0:
            raise ValueError(f"per-rank batch: {batch_size} must be > 0")
        g = batch_size * world
        if size <= 0 or size % g:
            raise ValueError(f"queue.size: {size} must be a positive multiple of world size × per-rank batch "
                             f"= {world}×{batch_size} = {g} for the sharded layout")
        # The base draws its own random init; give it a throwaway generator and overwrite below.
        super().__init__(size // world, dim, batch_size, generator=torch.Generator().manual_seed(0))
        # the base built a one-process ring of K/W slots fed B keys a step; name the logical queue
        self.rank, self.world_size, self.size, self.shard_size = rank, world, size, size // world
        self.global_batch = batch_size * world
        full = F.normalize(torch.randn(size, dim, generator=generator), dim=1)  # K×C, as KeyQueue draws it
        self.keys.copy_(full.view(size // g, world, batch_size, dim)[:, rank].reshape(size // world, dim))

    def contrast(self, q: torch.Tensor, l_pos: torch.Tensor, tau: float,
                 negatives: KeySnapshot | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """q: B×C this rank's queries, l_pos: B×1 -> (mean InfoNCE over this rank's B queries, correct B);
        ``negatives``: this rank's shard as ``snapshot`` took it.

        Equal (to float tolerance) to KeyQueue.contrast of q against all K keys.
        """
        b = q.shape[0]
        if b != self.batch_size:
            raise ValueError(f"contrast got {b} queries; the queue was built for batches of {self.batch_size}")
        shard = (negatives if negatives is not None else self.snapshot()).read()
        return sharded_queue_info_nce(q, l_pos, shard, tau, rank=self.rank, gather=gather_with_grad,
                                      reduce_scatter=reduce_scatter_with_grad)

    @torch.no_grad()
    def _global_order(self, local: torch.Tensor) -> torch.Tensor:
        """local: (K/W)×… this rank's slots -> K×… in global (replicated) slot order, oldest first."""
        world, b, g = self.world_size, self.batch_size, self.global_batch
        parts = _all_gather_cat(local.contiguous()).view(world, self.size // g, b, *local.shape[1:])
        flat = parts.transpose(0, 1).reshape(self.size, *local.shape[1:])  # slot n·G + r·B + i
        p = self._ptr // b * g  # the replicated queue's ptr
        return torch.cat([flat[p:], flat[:p]])

    def ordered_global(self) -> torch.Tensor:
        """All K keys oldest first, on every rank, in the replicated queue's order (a K×C gather: tests only)."""
        return self._global_order(self.keys)

    def ordered_write_step_global(self) -> torch.Tensor:
        return self._global_order(self.write_step)


def gather_queue_state(queue: KeyQueue) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys K×C, write_step K) of the logical queue, oldest first, on every rank, for any layout.

    For tests and checkpoints, never per step: the sharded layout gathers K×C.
    """
    if isinstance(queue, ShardedKeyQueue):
        return queue.ordered_global(), queue.ordered_write_step_global()
    p = queue._ptr
    return queue.ordered(), torch.cat([queue.write_step[p:], queue.write_step[:p]])


def build_queue(layout: str, size: int, dim: int, per_rank_batch: int,
                generator: torch.Generator | None = None, policy: str = "fifo", seed: int = 0) -> KeyQueue:
    """The queue for ``queue.layout`` in the current process group.

    One process: KeyQueue (both layouts are the same thing).  Replicated:
    K slots per rank, built for the global batch B·W.  Sharded: K/W slots,
    FIFO only (random replacement over shards would break the shards' union
    being the replicated queue; config.validate says so first).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"queue.layout: unknown layout {layout!r}; allowed {', '.join(LAYOUTS)}")
    _, world = rank_and_world()
    if world == 1:
        return KeyQueue(size, dim, per_rank_batch, generator=generator, policy=policy, seed=seed)
    if layout == "replicated":
        return ReplicatedKeyQueue(size, dim, per_rank_batch, generator=generator, world_size=world,
                                  policy=policy, seed=seed)
    if policy != "fifo":
        raise ValueError(f"queue.policy: {policy!r} needs queue.layout=replicated with several ranks")
    return ShardedKeyQueue(size, dim, per_rank_batch, generator=generator)
