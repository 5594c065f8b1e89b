"""The dictionary of negatives: a ring of K key embeddings, FIFO or random replacement.

Invariants (tested): under ``fifo`` keys leave in the order they entered; K is
a multiple of the batch so the ring wraps on a batch boundary and no key is
ever dropped; once full, the oldest key was written exactly K / batch steps
before the step that reads it.  Under ``random`` the queue fills as FIFO, then
each step's keys overwrite B·W slots drawn at random, so a key survives any
number of steps with some probability: its age is unbounded (the ablation's
point).  ``write_step`` records when each slot was filled and ``source`` which
training image the key came from, so staleness and key drift are measured, not
assumed.  The queue's buffers (and the random policy's generator) are part of
the state dict, so a resumed run continues with the same negatives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mocolab.config.choices import QUEUE_POLICIES as POLICIES  # noqa: F401  (queue.policy: config/choices.py)
from mocolab.method.losses import fused_queue_info_nce
from mocolab.method.async_copy import to_device

__all__ = ["KeyQueue", "KeySnapshot"]  # stable (docs/api.md); the rest is internal

POLICY_SEED = 0x5107  # random replacement: one fixed stream, the same on every rank (replicated queues agree)


@dataclass(frozen=True)
class KeySnapshot:
    """A queue's keys as a step's contrast must read them: before that step's ``enqueue``.  No copy.

    ``enqueue`` overwrites the keys in place; a contrast that read them after
    it would score queries against their own step's keys.  ``MoCo.forward``
    takes the snapshot before anything else and ``contrast`` reads the keys
    through it, which fails once the keys have been written since.  Backward
    never reads them: the losses copy what they need or form the gradient
    before they return (method/losses.py).
    """

    keys: torch.Tensor
    version: int  # the keys' in-place version counter when taken

    def read(self) -> torch.Tensor:
        if self.keys._version != self.version:
            raise RuntimeError("the queue was written after its snapshot: contrast must run before enqueue")
        return self.keys


class WrittenAges:
    """Ages of a dictionary's entries from its ``write_step`` buffer (-1: never written by a real key)."""

    write_step: torch.Tensor

    @torch.no_grad()
    def ages(self, step: int) -> torch.Tensor:
        """Age in steps, as seen by the step after ``step`` steps, of every entry written so far."""
        return (step - self.write_step[self.write_step >= 0]).float()

    def staleness(self, step: int) -> tuple[float, float]:
        """(mean, max) age in steps of the written entries as seen at ``step``; (0, 0) while none is."""
        age = self.ages(step)
        return (float(age.mean()), float(age.max())) if age.numel() else (0.0, 0.0)


class KeyQueue(WrittenAges, nn.Module):
    """A ring of ``size`` = K slots that receives the global batch of keys every step.

    Names used by every queue (method/queue_layouts.py's layouts too): ``size`` K, the logical
    queue; ``batch_size`` B, the per-rank batch; ``world_size`` W;
    ``global_batch`` B·W; ``slots`` the keys this process holds (K here, K/W
    for a shard); ``enqueue_batch`` the keys one ``enqueue`` writes here.
    """

    def __init__(self, size: int, dim: int, batch_size: int, generator: torch.Generator | None = None, *,
                 world_size: int = 1, policy: str = "fifo", seed: int = 0) -> None:
        super().__init__()
        if size <= 0:
            raise ValueError(f"queue.size: {size} must be > 0")
        if batch_size <= 0 or world_size <= 0 or size % (batch_size * world_size):
            raise ValueError(f"queue.size: {size} must be a positive multiple of the global batch "
                             f"{batch_size * world_size}")
        if policy not in POLICIES:
            raise ValueError(f"queue.policy: unknown value {policy!r}; choose one of {list(POLICIES)}")
        self.size, self.dim, self.batch_size, self.world_size = size, dim, batch_size, world_size
        self.policy = policy
        # random replacement draws its slots from its own stream of (seed): identical on every rank
        self.slot_generator = torch.Generator().manual_seed(POLICY_SEED + seed) if policy == "random" else None
        self.global_batch = batch_size * world_size
        self.slots, self.enqueue_batch = size, self.global_batch
        # Random unit vectors until real keys arrive, as in the MoCo reference; write_step -1 marks them.
        self.register_buffer("keys", F.normalize(torch.randn(size, dim, generator=generator), dim=1))
        self.register_buffer("write_step", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        # the training image each key came from (-1: the random init), for the key-drift diagnostic
        self.register_buffer("source", torch.full((size,), -1, dtype=torch.long))
        # ``ptr`` and whether every slot holds a real key, mirrored on the host: reading the buffers each
        # step would make the CPU wait for the GPU (the buffers stay, for checkpoints)
        self._ptr, self._full = 0, False

    def get_extra_state(self) -> dict:
        return {"slot_generator": self.slot_generator.get_state()} if self.slot_generator is not None else {}

    def set_extra_state(self, state: dict) -> None:
        if self.slot_generator is not None and state.get("slot_generator") is not None:
            self.slot_generator.set_state(state["slot_generator"])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # a checkpoint without ``source`` loads with its keys' images unknown (-1)
        state_dict.setdefault(prefix + "source", torch.full_like(self.source, -1))
        state_dict.setdefault(prefix + "_extra_state", {})
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._ptr, self._full = int(self.ptr), bool((self.write_step >= 0).all())

    def _slots_to_write(self, b: int) -> tuple[torch.Tensor, bool]:
        """(the ``b`` slots the next keys go to, whether the ring pointer advances): the oldest under FIFO
        (and under ``random`` until the ring is full), else ``b`` distinct slots drawn at random."""
        p = self._ptr
        if self.slot_generator is None or not self._full:
            return torch.arange(p, p + b), True
        return torch.randperm(self.slots, generator=self.slot_generator)[:b], False

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, step: int | torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Write ``keys`` (enqueue_batch×C; ``index``: their training images) over the slots the policy
        picks (FIFO: the oldest).  Returns those slots (on the CPU), in the keys' order.  ``step`` may be a
        0-d tensor on the keys' device: it is written as is, never read on the host."""
        b = keys.shape[0]
        if b != self.enqueue_batch:
            raise ValueError(f"enqueue got {b} keys; the queue was built for batches of {self.enqueue_batch}")
        slots, advance = self._slots_to_write(b)
        at = to_device(slots, self.keys.device)
        self.keys[at] = keys.detach().to(self.keys.dtype)
        self.write_step[at] = step
        self.source[at] = to_device(index, self.source.device) if index is not None else -1
        if advance:
            self._ptr = (self._ptr + b) % self.slots
            self._full = self._full or self._ptr == 0
            self.ptr.fill_(self._ptr)
        return slots

    def negative_logits(self, q: torch.Tensor) -> torch.Tensor:
        """q: N×C -> N×K similarities to every key.

        A copy, because ``enqueue`` overwrites slots in place before backward
        needs them; the queue itself never gets a gradient.
        """
        return q @ self.keys.detach().clone().T

    def snapshot(self) -> KeySnapshot:
        """The keys as they are now, for this step's ``contrast``, which must run before ``enqueue``."""
        return KeySnapshot(self.keys, self.keys._version)

    def contrast(self, q: torch.Tensor, l_pos: torch.Tensor, tau: float,
                 negatives: KeySnapshot | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """InfoNCE of queries q (N×C) with positives l_pos (N×1) against the queue (``negatives``: the
        keys as ``snapshot`` took them; by default as they are now).

        Returns (loss, correct): ``correct`` (N, bool) says whether a query's
        positive beat every negative (pretext accuracy).  Distributed layouts
        override this; the loss they return must equal this one.  The keys may
        be overwritten once this returns.
        """
        keys = (negatives if negatives is not None else self.snapshot()).read()
        return fused_queue_info_nce(q, l_pos, keys, tau)  # losses.queue_info_nce, fused

    def ordered(self) -> torch.Tensor:
        """Keys oldest first: the FIFO order, for tests and for comparing layouts."""
        p = self._ptr
        return torch.cat([self.keys[p:], self.keys[:p]])

    @property
    def max_staleness(self) -> float:
        """K / (B·W): the age in steps of the oldest key in a full FIFO queue."""
        return self.size / self.global_batch
