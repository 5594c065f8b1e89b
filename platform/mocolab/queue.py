"""The dictionary of negatives: a FIFO ring of K key embeddings.

Invariants (tested): keys leave in the order they entered; K is a multiple of
the batch so the ring wraps on a batch boundary and no key is ever dropped;
once full, the oldest key was written exactly K / batch steps before the step
that reads it.  ``write_step`` records when each slot was filled so staleness
is measured, not assumed.  The queue's buffers are part of the state dict, so
a resumed run continues with the same negatives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .moco_loss import info_nce

POLICIES = ("fifo",)  # queue.policy: how an enqueued key chooses the slot it replaces


class KeyQueue(nn.Module):
    """A ring of ``size`` = K slots that receives the global batch of keys every step.

    Names used by every queue (dist.py's layouts too): ``size`` K, the logical
    queue; ``batch_size`` B, the per-rank batch; ``world_size`` W;
    ``global_batch`` B·W; ``slots`` the keys this process holds (K here, K/W
    for a shard); ``enqueue_batch`` the keys one ``enqueue`` writes here.
    """

    def __init__(self, size: int, dim: int, batch_size: int, generator: torch.Generator | None = None, *,
                 world_size: int = 1) -> None:
        super().__init__()
        if size <= 0:
            raise ValueError(f"queue.size: {size} must be > 0")
        if batch_size <= 0 or world_size <= 0 or size % (batch_size * world_size):
            raise ValueError(f"queue.size: {size} must be a positive multiple of the global batch "
                             f"{batch_size * world_size}")
        self.size, self.dim, self.batch_size, self.world_size = size, dim, batch_size, world_size
        self.global_batch = batch_size * world_size
        self.slots, self.enqueue_batch = size, self.global_batch
        # Random unit vectors until real keys arrive, as in the MoCo reference; write_step -1 marks them.
        self.register_buffer("keys", F.normalize(torch.randn(size, dim, generator=generator), dim=1))
        self.register_buffer("write_step", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, step: int) -> None:
        """Overwrite the oldest ``enqueue_batch`` slots with ``keys`` (enqueue_batch×C)."""
        b = keys.shape[0]
        if b != self.enqueue_batch:
            raise ValueError(f"enqueue got {b} keys; the queue was built for batches of {self.enqueue_batch}")
        p = int(self.ptr)
        self.keys[p:p + b] = keys.detach().to(self.keys.dtype)
        self.write_step[p:p + b] = step
        self.ptr.fill_((p + b) % self.slots)

    def negative_logits(self, q: torch.Tensor) -> torch.Tensor:
        """q: N×C -> N×K similarities to every key.

        A copy, because ``enqueue`` overwrites slots in place before backward
        needs them; the queue itself never gets a gradient.
        """
        return q @ self.keys.detach().clone().T

    def contrast(self, q: torch.Tensor, l_pos: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
        """InfoNCE of queries q (N×C) with positives l_pos (N×1) against the queue.

        Returns (loss, correct): ``correct`` (N, bool) says whether a query's
        positive beat every negative (pretext accuracy).  Distributed layouts
        override this; the loss they return must equal this one.
        """
        loss, logits = info_nce(l_pos, self.negative_logits(q), tau)
        return loss, logits.detach().argmax(dim=1) == 0

    def ordered(self) -> torch.Tensor:
        """Keys oldest first: the FIFO order, for tests and for comparing layouts."""
        p = int(self.ptr)
        return torch.cat([self.keys[p:], self.keys[:p]])

    @torch.no_grad()
    def staleness(self, step: int) -> tuple[float, float]:
        """(mean, max) age in steps of the filled slots as seen at ``step``; (0, 0) while empty."""
        filled = self.write_step >= 0
        if not bool(filled.any()):
            return 0.0, 0.0
        age = (step - self.write_step[filled]).float()
        return float(age.mean()), float(age.max())

    @property
    def max_staleness(self) -> float:
        """K / (B·W): the age in steps of the oldest key in a full FIFO queue."""
        return self.size / self.global_batch
