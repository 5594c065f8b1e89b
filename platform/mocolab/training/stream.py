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
bounds how many run at once per worker. A task decodes whole batches, at least
``TASK_IMAGES`` images (several small batches to one task), since Ray Data
costs a few tens of CPU-milliseconds per task, as much as decoding a few dozen
images; with ordered output, what a worker holds at a time is a few tasks'
batches, whatever the dataset size.

One host copy per image on the trainer's thread: Ray hands back a block's
arrays as read-only views of the object store (zero-copy; the store keeps the
block while a view references it), and each batch is copied from that view
straight into memory of its own, page-locked when the trainer computes on a
CUDA device, so ``to_device`` (method/async_copy.py) queues the transfer
without staging it through a second host buffer. A fresh buffer per batch,
never one refilled in place: the trainer's transfer from pinned memory is
asynchronous and a consumer may keep a batch, so refilling would overwrite
images still in flight; torch's pinned allocator recycles a buffer only after
the transfers that read it have run.

A file that cannot be decoded is found when it is read: in a training batch
the batch's previous readable image stands in for it, as in memory
(data.fill_unreadable), evaluation leaves it out, and the names found are
gathered from every rank at each epoch's end, printed by rank 0 and kept for
MLflow (``unreadable``). A rank that has found more than
``data.max_bad_fraction`` of the split stops the run at once; the gathered
count is checked on every rank together.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Iterator

import numpy as np
import torch
import torch.distributed as tdist

from mocolab.config import Config
from mocolab.data.sets import DEFAULT_IMAGEFOLDER_SIZE, fill_unreadable, rank_positions
from mocolab.method.collectives import rank_and_world
from mocolab.data.augment import centre_views
from mocolab.data.canvas import StoreLayout
from mocolab.data.image_index import Decoder, ImageIndex, build_index, decode, decode_bytes
from mocolab.data.sources import (DEFAULT_MAX_BAD_FRACTION, EVAL_CHUNK, DatasetRecord, UnreadableFiles, eval_order,
                                  file_list_digest, subset_positions)

TASK_IMAGES = 256  # images a decode task aims for: batches smaller than this are decoded several to a task


def _decode_block(batch: dict[str, np.ndarray], layout: StoreLayout, decoder: Decoder,
                  centre: bool) -> dict[str, np.ndarray]:
    """Each block's canvases (data/canvas.py); ``centre``: the evaluation's centre crops of them instead."""
    torch.set_num_threads(1)  # decode tasks share the node with the trainers
    images, unreadable = [], []
    for refs in batch["refs"]:
        x, bad = decode(list(refs), layout, decoder)
        images.append((centre_views(x, layout.view) if centre else x).numpy())
        unreadable.append(bad.numpy())
    return {"images": np.stack(images), "unreadable": np.stack(unreadable)}


def pins_memory(device: torch.device | str | None) -> bool:
    """Whether batches are copied into page-locked memory: only a CUDA device reads it without a staging copy
    (and pinning needs a CUDA driver); on the CPU it would only cost."""
    return device is not None and torch.device(device).type == "cuda"


def batch_from_block(block: np.ndarray, source: np.ndarray, pin: bool = False) -> torch.Tensor:
    """Rows ``source`` of a block, in their order, copied once into a tensor of their own (pinned when ``pin``).

    ``block`` may be the object store's read-only view: it is only read, and the result shares no memory with
    it. Same dtype and shape per image as the block, C-contiguous."""
    if block.dtype != np.uint8:  # the decoder's canvases: a batch keeps their bytes as they are
        raise TypeError(f"a decoded block holds {block.dtype}, not uint8")
    shape = (len(source), *block.shape[1:])
    if pin:  # torch's pinned allocator: blocks reused once the transfers that read them have run
        out = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        dst = out.numpy()
    else:  # numpy's allocator: it asks for huge pages, so a fresh batch faults in far fewer pages than torch's
        dst = np.empty(shape, dtype=np.uint8)
        out = torch.from_numpy(dst)
    if len(source) == len(block) and np.array_equal(source, np.arange(len(block))):
        np.copyto(dst, block)  # the usual batch, every image readable: one memcpy
    else:
        np.take(block, source, axis=0, out=dst, mode="clip")  # clip: in range already, and unbuffered
    return out


def filled_positions(unreadable: np.ndarray) -> np.ndarray:
    """Which row of a training block each batch position reads: its own, or for an unreadable image the stand-in
    data.fill_unreadable chooses (the rule applied to the positions themselves, so both loaders still agree)."""
    rows = torch.arange(len(unreadable))
    return fill_unreadable(rows, torch.from_numpy(np.asarray(unreadable, dtype=bool))).numpy()


def _union_over_ranks(names: set[str]) -> set[str]:
    """Every rank's names, on every rank (a collective when there are several: all ranks call it together)."""
    _, world = rank_and_world()
    if world == 1:
        return names
    gathered: list[list[str] | None] = [None] * world
    tdist.all_gather_object(gathered, sorted(names))
    return set().union(*(g or [] for g in gathered))


class StreamSource:
    """A split streamed through Ray Data; the ``TrainSource`` the Trainer reads (data/sources.py).

    ``decoder``: bytes to a uint8 canvas, the shared ``decode_bytes`` unless a benchmark times another;
    ``task_images``: images a decode task aims for (1: one batch per task); ``layout``: how images are stored
    (data/canvas.py; default: derived from the index's image size); ``pin_memory``: batches in page-locked
    memory (``pins_memory(device)``: a CUDA trainer). Training batches and ``images_at`` are
    whole-image canvases, as in memory; evaluation reads the centre crops."""

    kind = "streamed"

    def __init__(self, train: ImageIndex, test: ImageIndex, *, tasks: int = 2,
                 max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION, decoder: Decoder = decode_bytes,
                 task_images: int = TASK_IMAGES, say: Callable[[str], None] = print,
                 layout: StoreLayout | None = None, pin_memory: bool = False) -> None:
        self.train, self.test, self.tasks, self.decoder, self.say = train, test, tasks, decoder, say
        self.pin_memory = pin_memory  # pins_memory(the trainer's device)
        self.layout = layout or StoreLayout.derived(train.image_size)
        self.task_images = task_images
        self.size, self.test_size, self.classes = len(train), len(test), train.classes
        self.channels, self.image_size = train.channels, train.image_size
        self.unreadable = UnreadableFiles({"train": len(train), "test": len(test)}, max_bad_fraction,
                                          complete=False)

    @classmethod
    def from_config(cls, cfg: Config, device: torch.device | str | None = None) -> "StreamSource":
        """``device``: the trainer's, which decides whether batches are pinned."""
        d = cfg.data
        size = d.image_size or DEFAULT_IMAGEFOLDER_SIZE
        train = build_index(d.name, d.root, "train", size)
        if d.subset is not None and d.subset < len(train):  # a fixed random subset, not the first classes
            keep = subset_positions(len(train), d.subset)
            train = dataclasses.replace(train, refs=tuple(train.refs[i] for i in keep), labels=train.labels[keep])
        return cls(train, build_index(d.name, d.root, "test", size), tasks=d.stream_tasks,
                   max_bad_fraction=d.max_bad_fraction,
                   layout=StoreLayout.derived(size, d.store_short_side, d.store_max_side),
                   pin_memory=pins_memory(device))

    def notes(self) -> list[str]:
        decoded = self.train.decoded_bytes(self.layout) / 2**20
        return [f"streamed through Ray Data: {self.size:,} training images ({decoded:,.0f} "
                f"MiB decoded, never held at once), {self.tasks} decode task(s) in flight per worker; unreadable "
                f"files are reported as they are found, and more than data.max_bad_fraction="
                f"{self.unreadable.max_fraction:g} of a split stops the run"]

    def _stream(self, blocks: list[list[str]], centre: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(images, unreadable mask) per block, in the order of ``blocks``: canvases, or their centre crops.

        ``images`` is the object store's read-only view, valid while referenced: copy it, never write to it."""
        import ray.data

        logging.getLogger("ray.data").setLevel(logging.WARNING)  # not one line per epoch's dataset
        if not blocks:
            return
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # batch i of the iterator is block i: the planned order
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        per_task = max(1, -(-self.task_images // max(1, len(blocks[0]))))  # equal blocks: a task's rows stack
        if any(len(b) != len(blocks[0]) for b in blocks):
            per_task = 1
        tasks = -(-len(blocks) // per_task)
        ds = ray.data.from_items([{"refs": b} for b in blocks], override_num_blocks=tasks)
        ds = ds.map_batches(_decode_block, batch_size=per_task, num_cpus=0,
                            compute=ray.data.TaskPoolStrategy(size=min(self.tasks, tasks)),
                            fn_kwargs={"layout": self.layout, "decoder": self.decoder, "centre": centre})
        for out in ds.iter_batches(batch_size=1, batch_format="numpy", prefetch_batches=1):
            yield out["images"][0], np.asarray(out["unreadable"][0], dtype=bool)

    def _found(self, split: str, positions: np.ndarray, unreadable: np.ndarray) -> bool:
        """Record a block's unreadable files; stop the run once this rank alone has found too many."""
        if not unreadable.any():
            return False
        index = self.train if split == "train" else self.test
        new = self.unreadable.add(split, (index.short_name(index.refs[i]) for i in positions[unreadable]))
        self.unreadable.check(split)
        return new

    def _epoch_end(self, rank: int, before: int) -> None:
        """All ranks together: the union of what each found, the bound on it, and one line from rank 0."""
        self.unreadable.names["train"] = _union_over_ranks(self.unreadable.names["train"])
        self.unreadable.check("train")
        if rank == 0 and self.unreadable.count("train") > before:
            self.say(f"  {self.unreadable.note('train')}")

    def epoch(self, generator, batch, rank, world_size, start_step):
        for images, _ in self.epoch_indexed(generator, batch, rank, world_size, start_step):
            yield images

    def epoch_indexed(self, generator, batch, rank, world_size, start_step):
        """As ``epoch``, with each image's position in the training index (memory bank, key drift)."""
        perm = torch.randperm(self.size, generator=generator)
        steps = self.size // (batch * world_size)
        positions = [rank_positions(perm, s, batch, rank, world_size) for s in range(start_step, steps)]
        blocks = [[self.train.refs[i] for i in pos.tolist()] for pos in positions]
        before = self.unreadable.count("train")
        for pos, (images, bad) in zip(positions, self._stream(blocks)):
            self._found("train", pos.numpy(), bad)
            yield batch_from_block(images, filled_positions(bad), self.pin_memory), pos
        self._epoch_end(rank, before)

    def images_at(self, index):
        """The training images at these positions, decoded (a few hundred at an epoch's end: key drift);
        an unreadable one replaced within its chunk, as in memory."""
        positions = index.cpu().numpy()
        chunks = [positions[j:j + EVAL_CHUNK] for j in range(0, len(positions), EVAL_CHUNK)]
        out = torch.empty(len(positions), self.channels, *self.layout.canvas_hw, dtype=torch.uint8,
                          pin_memory=self.pin_memory)
        start = 0
        for part, (images, bad) in zip(chunks, self._stream([[self.train.refs[i] for i in c] for c in chunks])):
            self._found("train", part, bad)
            np.take(images, filled_positions(bad), axis=0, out=out[start:start + len(part)].numpy(), mode="clip")
            start += len(part)
        return out

    def labels_at(self, index):
        """The training labels at these positions (an unreadable file's image is replaced by a readable
        one of its batch, its label kept: the online probe reads it once in a while)."""
        return torch.from_numpy(self.train.labels[index.cpu().numpy()])

    def eval_split(self, split, n):
        """Unreadable images are left out, as in memory."""
        index = self.train if split == "train" else self.test
        order = eval_order(len(index), n)
        chunks = [order[j:j + EVAL_CHUNK] for j in range(0, len(order), EVAL_CHUNK)]
        blocks = [[index.refs[i] for i in part] for part in chunks]
        grew = False
        for part, (images, bad) in zip(chunks, self._stream(blocks, centre=True)):
            grew |= self._found(split, part, bad)
            keep = ~bad
            yield (batch_from_block(images, np.flatnonzero(keep), self.pin_memory),
                   torch.from_numpy(index.labels[part][keep]))
        if grew:
            self.say(f"  {self.unreadable.note(split)}")

    def records(self) -> list[DatasetRecord]:
        return [DatasetRecord(ix.name, split, len(ix), file_list_digest(ix.refs, ix.labels, ix.image_size),
                              "file list and labels", ix.image_size, ix.channels)
                for split, ix in (("train", self.train), ("test", self.test))]

    def describe_eval(self, split, n):
        total = len(self.train if split == "train" else self.test)
        if n is None or n >= total:
            return f"all {total:,}"
        return f"a fixed random {n:,} of {total:,}"
