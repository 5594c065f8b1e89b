"""An ImageFolder's classes and image files, by a directory walk: the one listing the in-memory loader,
the file index streaming reads (image_index.py) and validation's count all agree on."""

from __future__ import annotations

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
