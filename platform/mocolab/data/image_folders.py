"""An ImageFolder's classes and image files, by a directory walk: the one listing the in-memory loader,
the file index streaming reads (data/image_index.py) and the data checks' count (data/roots.py) all agree on.
No torch here: the config counts a folder's training images (``Config.train_size``) without loading it."""

from __future__ import annotations

import os
from pathlib import Path

# The files an imagefolder holds: what its loader decodes and what validation counts.
IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".webp", ".gif")


def class_dirs(folder: Path) -> list[str]:
    try:
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError as exc:
        raise ValueError(f"data.root: cannot list {str(folder)!r}: {exc}") from exc


def image_files(folder: Path) -> list[Path]:
    """The images of one class folder, sorted: the files the loader decodes and ``count_images`` counts."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)


def count_images(root: str | os.PathLike[str] | None, split: str = "train", name: str = "imagefolder") -> int | None:
    """Images under root/<split>/<class>/ by a directory walk, or the rows of root/<split>/*.parquet from
    their footers (no decoding); None where there is no such folder."""
    if not root:
        return None
    folder = Path(root).expanduser() / split
    if not folder.is_dir():
        return None
    if name == "parquet":
        import pyarrow.parquet as pq  # pyarrow for a parquet set only: the config loads none of it

        try:
            return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(folder.glob("*.parquet")))
        except (OSError, ValueError):
            return None
    try:
        return sum(len(image_files(folder / cls)) for cls in class_dirs(folder))
    except (OSError, ValueError):
        return None
