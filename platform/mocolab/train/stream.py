"""The streaming loader: Ray Data reads and decodes, each Train worker receives only its own batches.

Order: per epoch one permutation of the whole index (a full shuffle, drawn
from (seed, epoch) exactly as the in-memory loader draws it), cut into global
batches, of which each rank takes its own slice (data.rank_positions). A
full shuffle of the index costs 8 bytes per image, not the image: so the
papers' i.i.d. order is kept, instead of the weaker order of a shuffle buffer
over file order, and every rank's epoch has the same length by construction.

Why not ``ray.train.get_dataset_shard``: Train's ``streaming_split`` hands
blocks to whichever worker asks first, so which images a rank sees depends on
timing; then neither a run nor a resumed run could reproduce its order.
Here every rank builds its own Ray Dataset of the steps it has left (a
resumed run starts at the step it stopped, decoding nothing it skips). The
decode tasks run on any node (CPU-only nodes included) and reserve no CPU:
the Train workers hold their CPUs for the whole run, and decode tasks that
waited for a free CPU would wait forever on a full laptop. ``data.stream_tasks``
bounds how many run at once per worker, and with one batch per block and
ordered output, what a worker holds at a time is a few batches, whatever
the dataset size.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import torch

from ..config import Config
from ..image_index import ImageIndex, build_index, decode
from ..data import rank_positions
from ..sources import DatasetRecord, eval_order, file_list_digest, subset_positions

EVAL_CHUNK = 256  # images per decode task in an evaluation pass


def _decode_block(batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    torch.set_num_threads(1)  # decode tasks share the node with the trainers
    images, bad = [], []
    for refs in batch["refs"]:
        x, skipped = decode(list(refs), size)
        images.append(x.numpy())
        bad.append(len(skipped))
    return {"images": np.stack(images), "skipped": np.asarray(bad, dtype=np.int64)}


class StreamSource:
    """A split streamed through Ray Data; the ``TrainSource`` the Trainer reads (sources.py)."""

    kind = "streamed"

    def __init__(self, train: ImageIndex, test: ImageIndex, *, tasks: int = 2) -> None:
        self.train, self.test, self.tasks = train, test, tasks
        self.size, self.test_size, self.classes = len(train), len(test), train.classes
        self.channels, self.image_size = train.channels, train.image_size
        self.skipped = 0

    @classmethod
    def from_config(cls, cfg: Config) -> "StreamSource":
        from ..data import DEFAULT_IMAGEFOLDER_SIZE

        d = cfg.data
        size = d.image_size or DEFAULT_IMAGEFOLDER_SIZE
        train = build_index(d.name, d.root, "train", size)
        if d.subset is not None and d.subset < len(train):  # a fixed random subset, not the first classes
            keep = subset_positions(len(train), d.subset)
            train = dataclasses.replace(train, refs=tuple(train.refs[i] for i in keep), labels=train.labels[keep])
        return cls(train, build_index(d.name, d.root, "test", size), tasks=d.stream_tasks)

    def notes(self) -> list[str]:
        return [f"streamed through Ray Data: {self.size:,} training images ({self.train.decoded_bytes() / 2**20:,.0f} "
                f"MiB decoded, never held at once), {self.tasks} decode task(s) in flight per worker"]

    def _stream(self, blocks: list[list[str]]) -> Iterator[np.ndarray]:
        import logging

        import ray.data

        logging.getLogger("ray.data").setLevel(logging.WARNING)  # not one line per epoch's dataset
        if not blocks:
            return
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # batch i of the iterator is block i: the planned order
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        ds = ray.data.from_items([{"refs": b} for b in blocks], override_num_blocks=len(blocks))
        ds = ds.map_batches(_decode_block, batch_size=1, num_cpus=0,
                            compute=ray.data.TaskPoolStrategy(size=min(self.tasks, len(blocks))),
                            fn_kwargs={"size": self.image_size})
        for out in ds.iter_batches(batch_size=1, batch_format="numpy", prefetch_batches=1):
            self.skipped += int(out["skipped"][0])
            yield np.array(out["images"][0])  # a copy: the block in the object store is read-only and is freed

    def epoch(self, generator, batch, rank, world_size, start_step):
        for images, _ in self.epoch_indexed(generator, batch, rank, world_size, start_step):
            yield images

    def epoch_indexed(self, generator, batch, rank, world_size, start_step):
        """As ``epoch``, with each image's position in the training index (memory bank, key drift)."""
        perm = torch.randperm(self.size, generator=generator)
        steps = self.size // (batch * world_size)
        positions = [rank_positions(perm, s, batch, rank, world_size) for s in range(start_step, steps)]
        blocks = [[self.train.refs[i] for i in pos.tolist()] for pos in positions]
        for pos, images in zip(positions, self._stream(blocks)):
            yield torch.from_numpy(images), pos

    def images_at(self, index):
        """The training images at these positions, decoded (a few hundred at an epoch's end: key drift)."""
        refs = [self.train.refs[i] for i in index.cpu().tolist()]
        chunks = [refs[j:j + EVAL_CHUNK] for j in range(0, len(refs), EVAL_CHUNK)]
        parts = [torch.from_numpy(images) for images in self._stream(chunks)]
        return torch.cat(parts) if parts else torch.empty(0, self.channels, self.image_size, self.image_size,
                                                          dtype=torch.uint8)

    def eval_split(self, split, n):
        index = self.train if split == "train" else self.test
        order = eval_order(len(index), n)
        chunks = [order[j:j + EVAL_CHUNK] for j in range(0, len(order), EVAL_CHUNK)]
        blocks = [[index.refs[i] for i in part] for part in chunks]
        for part, images in zip(chunks, self._stream(blocks)):
            yield torch.from_numpy(images), torch.from_numpy(index.labels[part])

    def records(self) -> list[DatasetRecord]:
        return [DatasetRecord(ix.name, split, len(ix), file_list_digest(ix.refs, ix.labels, ix.image_size),
                              "file list and labels", ix.image_size, ix.channels)
                for split, ix in (("train", self.train), ("test", self.test))]

    def describe_eval(self, split, n):
        total = len(self.train if split == "train" else self.test)
        if n is None or n >= total:
            return f"all {total:,}"
        return f"a fixed random {n:,} of {total:,}"
