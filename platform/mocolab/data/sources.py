"""Where a run's images come from: decoded once into memory, or streamed (training/stream.py).

Both loaders give a rank the same thing: per epoch, its slice of every global
batch of one permutation of the training set, drawn from (seed, epoch) alone
(``Trainer.epoch_order``), as uint8 B×C×H×W batches; and, for evaluation, a
split's images in a fixed order. The in-memory loader permutes decoded
tensors; the streaming loader permutes the index of files (data/image_index.py)
and decodes only what a rank needs, so both see the same images in the same
order, and a resumed run starts at the step where it stopped.

A file that cannot be decoded is treated alike by both: in a training batch
the batch's previous readable image stands in for it (``data.fill_unreadable``),
evaluation leaves it out, and the run names it (``UnreadableFiles``). A split
with more than ``data.max_bad_fraction`` of its images unreadable is refused:
before training in memory, where every file is decoded up front; as soon as
the damage found passes the bound while streaming.

``data.loader=auto`` picks memory when the decoded training set fits
``data.memory_budget_mb`` per worker (default 4096 MiB: a laptop's worker
holds Fashion-MNIST, 47 MB, or CIFAR-10, 154 MB, with room to spare; ImageNet
stored whole for 224 px crops, 471 GiB of canvases, streams), else streams. Only ``imagefolder`` and
``parquet`` can stream: the other sets are small and arrive as one file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol

import numpy as np
import torch

from mocolab.data import sets as datasets
from mocolab.data.augment import centre_views
from mocolab.data.canvas import StoreLayout
from mocolab.config.choices import LOADERS, STREAMABLE  # noqa: F401  (data.loader: config/choices.py)
from mocolab.config import DataConfig

EVAL_SUBSET_SEED = 0  # streamed evaluation subsets: one fixed draw, the same for every run, so runs compare
VALIDATION_SEED = 1  # data.val_size: which training images are held out, fixed for every run
EVAL_CHUNK = 256  # images per decode task of an evaluation pass; ``images_at`` fills stand-ins per chunk too
DEFAULT_MAX_BAD_FRACTION: float = DataConfig.max_bad_fraction
SPLIT_WORDS = {"train": "training", "test": "test", "val": "validation"}


class DamagedDataError(ValueError):
    """More of a split cannot be decoded than ``data.max_bad_fraction`` allows: the run stops."""


# a user's errors a worker may find late: the same on every attempt, so they end the run, never retried
FINAL_ERRORS = (DamagedDataError,)


class UnreadableFiles:
    """The files of each split that could not be decoded, as far as the loader has read: what a run prints,
    logs (``metrics``, ``tags``) and refuses beyond (``check``).

    In memory every file is known before the first step; streamed, a file is known once read, so the
    counts grow over the first epoch (and over the first evaluation for the test split)."""

    def __init__(self, sizes: dict[str, int], max_fraction: float = DEFAULT_MAX_BAD_FRACTION,
                 complete: bool = True) -> None:
        self.sizes, self.max_fraction, self.complete = sizes, max_fraction, complete
        self.names: dict[str, set[str]] = {split: set() for split in sizes}

    def add(self, split: str, names: Iterable[str]) -> bool:
        """Record names; True if any was new."""
        before = len(self.names[split])
        self.names[split].update(names)
        return len(self.names[split]) > before

    def count(self, split: str) -> int:
        return len(self.names[split])

    def state_dict(self) -> dict[str, list[str]]:
        """The names found so far, per split: part of a checkpoint, since a stream resumed mid-epoch does not
        read again what it read before (its count would restart from the files after the checkpoint)."""
        return {split: sorted(names) for split, names in self.names.items()}

    def load_state_dict(self, state: dict[str, list[str]]) -> None:
        for split, names in state.items():
            if split in self.names:
                self.names[split].update(names)

    def first(self, split: str, show: int = 3) -> list[str]:
        return sorted(self.names[split])[:show]

    def describe(self, split: str, show: int = 3) -> str:
        """'3 of 300 training images unreadable: training/a/x.jpg, training/a/y.jpg, training/b/z.jpg'."""
        n, total = self.count(split), self.sizes[split]
        more = ", ..." if n > show else ""
        so_far = "" if self.complete else " so far"
        return (f"{n:,} of {total:,} {SPLIT_WORDS.get(split, split)} images unreadable{so_far}: "
                f"{', '.join(self.first(split, show))}{more}")

    def note(self, split: str) -> str:
        """What the run prints: the damage, what stands in for it, and the bound."""
        return (f"{split} data: {self.describe(split)}; in training each is replaced by its batch's previous "
                f"readable image, evaluation leaves it out (data.max_bad_fraction={self.max_fraction:g} "
                f"allows {self.allowed(split):,})")

    def allowed(self, split: str) -> int:
        """The most unreadable images the split may hold: ``max_fraction`` of it, rounded down."""
        return int(self.max_fraction * self.sizes[split] + 1e-9)

    def check(self, split: str) -> None:
        """Raise ``DamagedDataError`` once a split's unreadable files are more than the bound allows."""
        n, total = self.count(split), self.sizes[split]
        if total and n > self.allowed(split):
            raise DamagedDataError(
                f"data.max_bad_fraction: {self.describe(split)} ({100 * n / total:.3g}% of the split, more than "
                f"the {100 * self.max_fraction:g}% allowed); repair or remove those files, or raise "
                f"data.max_bad_fraction (0 to 1) to train with stand-ins for them")

    def metrics(self) -> dict[str, float]:
        """``data_unreadable_<split>``: the counts as MLflow metrics, of the splits with any (as ``tags``): a clean
        set adds no series to the run's charts, and a missing key reads as none."""
        return {f"data_unreadable_{split}": float(self.count(split)) for split in self.sizes if self.count(split)}

    def tags(self) -> dict[str, str]:
        """``mocolab.data_unreadable``: the counts and the first names, for the run's page (only when any)."""
        damaged = [self.describe(split) for split in self.sizes if self.count(split)]
        return {"mocolab.data_unreadable": "; ".join(damaged)} if damaged else {}


class TrainSource(Protocol):
    """What the Trainer reads: sizes, one epoch of this rank's batches, a split for evaluation."""
    size: int
    test_size: int
    classes: int
    channels: int
    image_size: int
    kind: str  # "in memory" | "streamed"

    def notes(self) -> list[str]: ...

    def epoch(self, generator: torch.Generator, batch: int, rank: int, world_size: int,
              start_step: int) -> Iterator[torch.Tensor]: ...

    def epoch_indexed(self, generator: torch.Generator, batch: int, rank: int, world_size: int,
                      start_step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def images_at(self, index: torch.Tensor) -> torch.Tensor: ...

    def labels_at(self, index: torch.Tensor) -> torch.Tensor: ...

    def eval_split(self, split: str, n: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def describe_eval(self, split: str, n: int | None) -> str: ...

    def records(self) -> list["DatasetRecord"]: ...

    unreadable: UnreadableFiles  # files that could not be decoded, per split


@dataclass(frozen=True)
class DatasetRecord:
    """What a run trained or was evaluated on, so that runs on different data are never compared by accident.

    ``digest``: 16 hex digits of a SHA-256. In memory, over the decoded images and labels the run uses
    (Fashion-MNIST's 47 MB hash in well under a second); streamed, over the file list (the last two
    path components of every image, in order) and the labels, since reading a million files twice to
    hash them is not cheap: a file changed in place keeps the digest, a file added, removed,
    renamed or relabelled changes it.
    """
    name: str  # the data set: fashion-mnist, imagefolder, ...
    split: str  # train | test | val
    size: int  # images in the split as the run uses it (after data.subset)
    digest: str
    hashed: str  # what the digest covers: "decoded images and labels" | "file list and labels"
    image_size: int
    channels: int


def tensor_digest(images: torch.Tensor, labels: torch.Tensor) -> str:
    h = hashlib.sha256()
    h.update(str((tuple(images.shape), str(images.dtype))).encode())
    h.update(images.contiguous().numpy().tobytes())
    h.update(labels.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def file_list_digest(refs: Iterable[str], labels: np.ndarray, image_size: int) -> str:
    h = hashlib.sha256(f"size={image_size}\n".encode())
    for ref in refs:
        h.update("/".join(ref.split("/")[-2:]).encode())
        h.update(b"\n")
    h.update(np.asarray(labels, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


@dataclass
class LoaderChoice:
    loader: str  # memory | stream
    reason: str


def choose_loader(name: str, loader: str, images: int | None, image_size: int, channels: int,
                  budget_mb: int, layout: StoreLayout | None = None) -> LoaderChoice:
    """``data.loader`` resolved: an explicit choice is checked, ``auto`` compares the decoded size to the budget.
    A streamable set is held as whole-image canvases (data/canvas.py: ``layout``, else the one derived from
    ``image_size``), and that is what is counted."""
    if loader == "stream" and name not in STREAMABLE:
        raise ValueError(f"data.loader: 'stream' reads {' or '.join(STREAMABLE)} sets; {name!r} is decoded "
                         f"into memory (use data.loader=memory or auto)")
    if loader in ("memory", "stream"):
        return LoaderChoice(loader, f"data.loader={loader}")
    if name not in STREAMABLE or images is None:
        return LoaderChoice("memory", f"data.loader=auto: {name} is held in memory")
    layout = layout or StoreLayout.derived(image_size)
    need = images * layout.image_bytes(channels) / 2 ** 20
    pick = "memory" if need <= budget_mb else "stream"
    sign = "<=" if pick == "memory" else ">"
    h, w = layout.canvas_hw
    return LoaderChoice(pick, f"data.loader=auto: {images:,} images x {channels}x{h}x{w} (stored whole: "
                              f"data.store_short_side={layout.short}, store_max_side={layout.longest}) = "
                              f"{need:,.0f} MiB decoded {sign} data.memory_budget_mb={budget_mb:,} -> {pick}")


def eval_order(n_total: int, n: int | None) -> np.ndarray:
    """Positions an evaluation of a set stored in class order reads: the first n of one fixed permutation,
    all of it when n is None. Every prefix of what is read is itself a random subset, as the kNN bank and the
    probe need when they take the first ``knn_bank`` / ``linear_train`` of one read (a read of the whole
    split in stored order would hand them its first classes)."""
    order = np.random.default_rng(EVAL_SUBSET_SEED).permutation(n_total)
    return order if n is None or n >= n_total else order[:n]


def validation_positions(n_total: int, n: int) -> np.ndarray:
    """``data.val_size``: the n training positions held out as the validation split, in stored order.

    The last n of one fixed permutation, the same for every ``run.seed`` and arm, so that every run of a
    search is selected on the same images and none of them was trained on."""
    if not 0 < n < n_total:
        raise ValueError(f"data.val_size: {n} must be between 1 and the {n_total:,} training images less one")
    return np.sort(np.random.default_rng(VALIDATION_SEED).permutation(n_total)[n_total - n:])


def subset_positions(n_total: int, n: int) -> np.ndarray:
    """``data.subset`` of a set stored in class order: a fixed random n, kept in stored order
    (the first n would be the first classes only). Both loaders take it."""
    return np.sort(eval_order(n_total, n))


class MemorySource:
    """Decoded tensors: the embedded default and every set that fits the budget."""

    def __init__(self, train: datasets.ImageDataset, test: datasets.ImageDataset, *,
                 max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION, val: datasets.ImageDataset | None = None) -> None:
        self.train, self.test, self.val = train, test, val
        self.splits = {"train": train, "test": test, **({"val": val} if val is not None else {})}
        # sets stored in class order take a fixed random subset (a prefix would hold the first classes only);
        # the others are stored shuffled, so a prefix is already a random subset, and the same for every run
        self.random_subsets = train.name in STREAMABLE
        self.size, self.test_size, self.classes = len(train), len(test), train.classes
        # an indexed set's images are whole-image canvases: its views are cut at view_size (data/canvas.py)
        self.channels, self.image_size = train.images.shape[1], train.view_size or train.images.shape[-1]
        self.kind = "in memory"
        self.unreadable = UnreadableFiles({split: len(ds) for split, ds in self.splits.items()}, max_bad_fraction)
        for split, ds in self.splits.items():
            self.unreadable.add(split, ds.unreadable_names())
            self.unreadable.check(split)  # every file is decoded: a damaged set is refused before any step

    def notes(self) -> list[str]:
        return [self.unreadable.note(split) for split in self.splits if self.unreadable.count(split)]

    def epoch(self, generator, batch, rank, world_size, start_step):
        for images, _ in self.epoch_indexed(generator, batch, rank, world_size, start_step):
            yield images

    def epoch_indexed(self, generator, batch, rank, world_size, start_step):
        """As ``epoch``, with each image's position in the training set (memory bank, key drift)."""
        for images, _, idx in datasets.iterate_batches(self.train, batch, generator, rank=rank,
                                                       world_size=world_size, start=start_step):
            yield images, idx

    def images_at(self, index):
        """The training images at these positions (uint8), as the epochs index them; an unreadable one replaced
        within its chunk of ``EVAL_CHUNK``, as the streaming loader decodes them."""
        index = index.cpu()
        parts = [datasets.fill_unreadable(self.train.images[part], self.train.labels[part] < 0)
                 for part in index.split(EVAL_CHUNK)]
        return torch.cat(parts) if parts else self.train.images[index]

    def labels_at(self, index):
        """The training labels at these positions (below 0: an unreadable image), as the epochs index them."""
        return self.train.labels[index.cpu()]

    def eval_split(self, split, n):
        """Unreadable images are left out: a stand-in would be scored under the label of a file never seen."""
        ds = self._split(split)
        if self.random_subsets:
            idx = torch.from_numpy(eval_order(len(ds), n))
            idx = idx[ds.labels[idx] >= 0]
            yield centre_views(ds.images[idx], self.image_size), ds.labels[idx]  # canvases: the centre crop
            return
        n = len(ds) if n is None else min(n, len(ds))
        yield ds.images[:n], ds.labels[:n]

    def records(self) -> list[DatasetRecord]:
        return [DatasetRecord(ds.name, split, len(ds), tensor_digest(ds.images, ds.labels),
                              "decoded images and labels", self.image_size, self.channels)
                for split, ds in self.splits.items()]

    def _split(self, split: str) -> datasets.ImageDataset:
        if split not in self.splits:
            raise ValueError(f"no {split!r} split here: set data.val_size to hold one out of the training set")
        return self.splits[split]

    def describe_eval(self, split, n):
        ds = self._split(split)
        if n is None or n >= len(ds):
            return f"all {len(ds):,}"
        return f"{'a fixed random' if self.random_subsets else 'the first'} {n:,} of {len(ds):,}"
