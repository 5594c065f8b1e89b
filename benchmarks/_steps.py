"""What the step benchmarks share: a Trainer's first batches held in memory, and timing its real steps."""

from __future__ import annotations

import time

import torch

from mocolab.loop import Trainer


def held_batches(tr: Trainer, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``n`` (images, index) batches of one epoch, decoded ahead so the timing is the step alone;
    the schedule is moved out of reach so no benchmark step is the run's last."""
    tr.total_steps = 10**9
    batches = tr.data.epoch_indexed(torch.Generator().manual_seed(0), tr.batch, 0, 1, 0)
    return [next(batches) for _ in range(n)]


def timed_steps(tr: Trainer, data: list, warmup: int, sync=lambda: None) -> float:
    """Images/s of ``Trainer.train_step`` over ``data`` after its first ``warmup`` batches (the augment
    stream is the trainer's own; ``sync`` waits for a GPU)."""
    with torch.random.fork_rng(devices=[]):
        for images, index in data[:warmup]:
            tr.train_step(images, index)
        sync()
        t0 = time.perf_counter()
        for images, index in data[warmup:]:
            tr.train_step(images, index)
        sync()
        return (len(data) - warmup) * tr.batch / (time.perf_counter() - t0)
