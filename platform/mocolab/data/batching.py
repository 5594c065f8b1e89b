"""The per-rank batch order of a data set held in memory: the rule every loader follows (streamed in
training/stream.py), so ranks together see one process's global batches."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from mocolab.data.image_dataset import ImageDataset

__all__ = ["batches_per_epoch", "fill_unreadable", "iterate_batches", "rank_positions"]


def batches_per_epoch(n: int, batch_size: int, world_size: int = 1) -> int:
    """Batches each rank yields per epoch under ``drop_last=True``.

    Schedules (lr, momentum, queue staleness) need this number before the
    first batch, and it must be the same on every rank.
    """
    _check_batching(batch_size, 0, world_size)
    if n < 0:
        raise ValueError(f"dataset size must be >= 0, got {n}")
    return n // (batch_size * world_size)


def _check_batching(batch_size: int, rank: int, world_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"train.batch_size must be >= 1, got {batch_size}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")


def rank_positions(perm: torch.Tensor, step: int, batch_size: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's slice of global batch ``step`` of one epoch's permutation: the rule every loader follows
    (in memory here, streamed in training/stream.py), so ranks together see one process's global batches."""
    begin = step * batch_size * world_size + rank * batch_size
    return perm[begin:begin + batch_size]


def iterate_batches(
    dataset: ImageDataset,
    batch_size: int,
    generator: torch.Generator,
    *,
    drop_last: bool = True,
    rank: int = 0,
    world_size: int = 1,
    start: int = 0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One epoch of this rank's share of every global batch: (uint8 images, labels, indices).

    Every rank draws the same permutation (generators seeded alike), cuts it
    into global batches of ``batch_size * world_size`` and takes its own
    contiguous slice, so the ranks together see exactly the batches one process
    with the global batch size would see; only the generator is consumed, so
    resuming from a saved generator state reproduces the order.

    ``drop_last=True`` (the default, and required for training) drops the
    incomplete tail so every rank yields the same number of batches of the
    same size: ``all_gather`` of keys (queue enqueue, shuffle BN) needs equal
    shapes on every rank, and a rank with one batch more would hang the
    others in a collective. ``drop_last=False`` splits the tail as evenly as
    possible across ranks (a rank may then get a smaller batch, or none); use
    it for single-process evaluation that must see every sample.

    ``start`` skips the first global batches without indexing them: a run restarted mid-epoch.
    An unreadable row (negative label) is replaced in its batch as ``fill_unreadable`` says; its label
    stays negative.
    """
    _check_batching(batch_size, rank, world_size)
    n = len(dataset)
    perm = torch.randperm(n, generator=generator)
    global_batch = batch_size * world_size
    full = n // global_batch
    for b in range(start, full):
        idx = rank_positions(perm, b, batch_size, rank, world_size)
        yield _batch(dataset, idx)
    tail = perm[full * global_batch :]
    if not drop_last and tail.numel() > 0:
        idx = torch.tensor_split(tail, world_size)[rank]
        if idx.numel() > 0:
            yield _batch(dataset, idx)


def _batch(dataset: ImageDataset, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    labels = dataset.labels[idx]
    return fill_unreadable(dataset.images[idx], labels < 0), labels, idx


def fill_unreadable(images: torch.Tensor, unreadable: torch.Tensor) -> torch.Tensor:
    """The batch with each unreadable image replaced by the batch's previous readable one (the next one for
    those before the first): the rule both loaders follow, so their batches agree image for image.

    A batch keeps its length because every rank must step equally often with equal shapes; the
    stand-in is counted and reported (data/sources.py), and a set damaged beyond ``data.max_bad_fraction``
    is refused."""
    unreadable = torch.as_tensor(unreadable, dtype=torch.bool)
    if not bool(unreadable.any()):
        return images
    readable = (~unreadable).nonzero().flatten()
    if readable.numel() == 0:
        raise ValueError(f"data: none of the {len(images)} images of a batch could be decoded; the set is "
                         f"damaged beyond use (data.max_bad_fraction bounds how much damage a run accepts)")
    position = torch.arange(len(images))
    source = torch.where(unreadable, torch.full_like(position, -1), position).cummax(0).values
    return images[torch.where(source < 0, readable[0], source)]
