"""Imagefolder and parquet sets decoded whole, through the file index and the decoder the streaming
loader uses: every file in its place, an unreadable one kept as a zero row and named."""

from __future__ import annotations

import functools
import warnings

import torch

from mocolab.data.canvas import StoreLayout
from mocolab.data.image_dataset import ImageDataset, unreadable_label
from mocolab.data.image_folders import IMAGE_EXTENSIONS
from mocolab.data.image_index import build_index, decode

__all__ = ["load_indexed_set", "skipped_message"]


@functools.lru_cache(maxsize=8)
def load_indexed_set(name: str, root: str, split: str, layout: StoreLayout) -> ImageDataset:
    """An imagefolder or parquet split decoded whole, each image on its canvas (data/canvas.py): the file
    index and the decoder the streaming loader uses (data/image_index.py), every file in its place; an
    unreadable one is a zero row with a negative label (``unreadable_label``), reported here and by the run
    (data/sources.py), never silently dropped."""
    index = build_index(name, root, split, layout.view)
    images, bad = decode(index.refs, layout, threads=torch.get_num_threads())
    skipped = [index.short_name(index.refs[i]) for i in bad.nonzero().flatten().tolist()]
    labels = torch.from_numpy(index.labels.copy())
    labels[bad] = torch.tensor([unreadable_label(k) for k in range(len(skipped))], dtype=torch.int64)
    if len(skipped) == len(index):
        what = f"readable images ({', '.join(IMAGE_EXTENSIONS)})" if name == "imagefolder" else "readable images"
        raise ValueError(f"data.root: {name} {root!r} holds no {what} under {index.folder}/: "
                         f"{skipped_message(skipped)}")
    if skipped:
        warnings.warn(f"data.root: {name} {root!r} ({index.folder}/): {skipped_message(skipped)}", stacklevel=2)
    return ImageDataset(images=images, labels=labels, classes=index.classes, name=name, skipped=tuple(skipped),
                        view_size=layout.view)


def skipped_message(skipped: list[str] | tuple[str, ...], show: int = 3) -> str:
    """'12 unreadable file(s) (a.jpg, b.png, c.jpg, ...)': what a run prints about its data."""
    more = ", ..." if len(skipped) > show else ""
    return f"{len(skipped)} unreadable file(s) ({', '.join(skipped[:show])}{more})"
