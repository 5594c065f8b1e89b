"""A data set decoded once: one uint8 N×C×H×W tensor and its labels, what every loader returns.

Held whole so that augmentation runs on the training device in batches, with per-sample random parameters,
instead of per image in Python (Fashion-MNIST train: 47 MB).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ImageDataset", "unreadable_label"]


@dataclass(frozen=True, eq=False)
class ImageDataset:
    """Decoded images kept as uint8 so 60k Fashion-MNIST images cost 47 MB, augmented later in batches.

    Frozen so that a cached instance cannot be rebound by one caller under
    another; the tensors themselves are shared with the loader cache, so treat
    them as read-only (index or clone before modifying). ``eq=False`` because
    element-wise tensor comparison has no single truth value: identity is the
    only meaningful equality for a data set this size.
    """

    images: torch.Tensor  # uint8, N×C×H×W, contiguous
    labels: torch.Tensor  # int64, N; negative for a file that could not be decoded (``unreadable_label``)
    classes: int
    name: str
    skipped: tuple[str, ...] = ()  # files the loader could not decode (imagefolder, parquet), in file order
    # imagefolder and parquet: the images are whole-image canvases (data/canvas.py) and this is the side of the
    # views cut from them (training crops, the evaluation's centre crop); 0: the images are the views
    view_size: int = 0

    def __post_init__(self) -> None:
        # Checked here once so every consumer (augmentation, all_gather, kNN
        # evaluation) can rely on the layout without re-checking.
        if self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise ValueError(
                f"ImageDataset {self.name!r}: images must be uint8 N×C×H×W, "
                f"got {self.images.dtype} with shape {tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.ndim != 1:
            raise ValueError(
                f"ImageDataset {self.name!r}: labels must be a 1-d int64 tensor, "
                f"got {self.labels.dtype} with shape {tuple(self.labels.shape)}"
            )
        if self.labels.shape[0] != self.images.shape[0]:
            raise ValueError(
                f"ImageDataset {self.name!r}: {self.images.shape[0]} images but "
                f"{self.labels.shape[0]} labels"
            )
        if self.classes < 1:
            raise ValueError(f"ImageDataset {self.name!r}: classes must be >= 1, got {self.classes}")
        if not self.images.is_contiguous():
            object.__setattr__(self, "images", self.images.contiguous())

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def unreadable_rows(self) -> torch.Tensor:
        """Bool mask of the rows whose file could not be decoded (their pixels are zeros)."""
        return self.labels < 0

    def unreadable_names(self) -> list[str]:
        """The names of this set's unreadable rows, in file order (a subset's own, not the whole split's)."""
        codes = sorted({int(c) for c in self.labels[self.unreadable_rows].tolist()}, reverse=True)
        return [self.skipped[-1 - c] for c in codes]


def unreadable_label(k: int) -> int:
    """The label of the row of ``skipped[k]``: negative, so it is never a class, and it names its file.

    An unreadable file keeps its row, so that positions (and with them every epoch's order, a subset,
    a memory bank) agree with the streaming loader's file index, which cannot know in advance which
    files are damaged; its name travels in the label because a row subset keeps only images and labels.
    """
    return -1 - k
