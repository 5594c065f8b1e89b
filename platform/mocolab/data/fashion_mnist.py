"""Fashion-MNIST, found on this machine without downloading (the Debian package, $MOCOLAB_DATA, a
torchvision download) and decoded from its IDX files; torchvision downloads it only when asked to."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import torch

from mocolab.data.idx import read_idx
from mocolab.data.image_dataset import ImageDataset
from mocolab.data.roots import default_data_root

__all__ = ["FASHION_MNIST_FILES", "SYSTEM_FASHION_MNIST_DIRS", "fashion_mnist_dir", "load_fashion_mnist"]

# Names of the official Fashion-MNIST release (each may also lie uncompressed).
FASHION_MNIST_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# Where the Debian package `dataset-fashion-mnist` installs the files. A module
# constant (not inlined) so a test can point it at an empty folder to exercise
# the "not found anywhere" message on a machine that has the package.
SYSTEM_FASHION_MNIST_DIRS: tuple[str, ...] = ("/usr/share/datasets/fashion-mnist",)


def _find_idx(folder: Path, stem: str) -> Path | None:
    # Prefer the uncompressed file: torchvision's raw/ folder holds both, and
    # reading it skips a decompression.
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _has_fashion_mnist(folder: Path) -> bool:
    try:
        if not folder.is_dir():
            return False
        return all(
            _find_idx(folder, stem) is not None for pair in FASHION_MNIST_FILES.values() for stem in pair
        )
    except OSError:
        return False


def _fashion_mnist_candidates(root: str | os.PathLike[str] | None) -> list[Path]:
    bases: list[Path] = []
    if root is not None:
        bases.append(Path(root).expanduser())
    else:
        env = os.environ.get("MOCOLAB_DATA", "").strip()
        if env:
            bases.append(Path(env).expanduser())
    bases.extend(Path(p) for p in SYSTEM_FASHION_MNIST_DIRS)
    # The default data root (when $MOCOLAB_DATA is unset): a set downloaded there once is found again.
    bases.append(default_data_root())

    candidates: list[Path] = []
    for base in bases:
        # The folder itself (Debian, $MOCOLAB_DATA), a named sub-folder of a
        # general data root, and torchvision's download layout.
        for folder in (base, base / "fashion-mnist", base / "FashionMNIST" / "raw"):
            if folder not in candidates:
                candidates.append(folder)
    return candidates


def fashion_mnist_dir(root: str | os.PathLike[str] | None = None) -> Path | None:
    """Find the four Fashion-MNIST IDX files without downloading.

    Order: ``root`` if given, else ``$MOCOLAB_DATA``; then the Debian package's
    folder; then the default data root (where a torchvision download goes).
    Each place may hold the files directly, in ``fashion-mnist/``, or in
    torchvision's ``FashionMNIST/raw/``. The explicit location comes first so
    a user can override a system copy.
    """
    for folder in _fashion_mnist_candidates(root):
        if _has_fashion_mnist(folder):
            return folder
    return None


def _stamp(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=None)
def _load_fashion_mnist_cached(
    images_stamp: tuple[str, int, int], labels_stamp: tuple[str, int, int], split: str
) -> ImageDataset:
    # Keyed on (path, mtime, size) of both files: repeated loads in one
    # process are free, and a replaced file is not served stale.
    images_path, labels_path = Path(images_stamp[0]), Path(labels_stamp[0])
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3:
        raise ValueError(f"corrupt Fashion-MNIST file {images_path}: expected N×H×W images, got shape {images.shape}")
    if labels.ndim != 1:
        raise ValueError(f"corrupt Fashion-MNIST file {labels_path}: expected N labels, got shape {labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"Fashion-MNIST {split}: {images_path.name} holds {images.shape[0]} images but "
            f"{labels_path.name} holds {labels.shape[0]} labels"
        )
    if images.dtype != np.uint8:
        raise ValueError(f"corrupt Fashion-MNIST file {images_path}: expected uint8 pixels, got {images.dtype}")
    if labels.size and (labels.min() < 0 or labels.max() >= 10):
        raise ValueError(f"corrupt Fashion-MNIST file {labels_path}: labels outside 0..9")
    image_t = torch.from_numpy(images).unsqueeze(1).contiguous()
    label_t = torch.from_numpy(labels.astype(np.int64))
    return ImageDataset(images=image_t, labels=label_t, classes=10, name="fashion-mnist")


def _fashion_mnist_missing_message(root: str | os.PathLike[str] | None, reason: str) -> str:
    searched = ", ".join(str(p) for p in _fashion_mnist_candidates(root))
    files = ", ".join(f"{stem}.gz" for pair in FASHION_MNIST_FILES.values() for stem in pair)
    return (
        f"Fashion-MNIST not found (searched: {searched}) and {reason}. Provide it in one of these ways: "
        f"`apt-get install dataset-fashion-mnist` (installs to {SYSTEM_FASHION_MNIST_DIRS[0]}); "
        f"or put the four IDX files {files} in $MOCOLAB_DATA (or the folder given as data.root); "
        "or run once where the internet is reachable so torchvision can download them."
    )


def load_fashion_mnist(split: str, root: str | os.PathLike[str] | None, download: bool) -> ImageDataset:
    folder = fashion_mnist_dir(root)
    if folder is None:
        if not download:
            raise RuntimeError(_fashion_mnist_missing_message(root, "downloading was disabled (download=False)"))
        target = Path(root).expanduser() if root is not None else default_data_root()
        try:
            from torchvision.datasets import FashionMNIST

            target.mkdir(parents=True, exist_ok=True)
            FashionMNIST(str(target), train=(split == "train"), download=True)
        except Exception as exc:  # noqa: BLE001 - any failure means "could not download"
            raise RuntimeError(
                _fashion_mnist_missing_message(root, f"this machine could not download it into {target} ({exc!r})")
            ) from exc
        folder = fashion_mnist_dir(target)
        if folder is None:
            raise RuntimeError(
                _fashion_mnist_missing_message(root, f"a download into {target} left no usable IDX files")
            )
    images_stem, labels_stem = FASHION_MNIST_FILES[split]
    images_path = _find_idx(folder, images_stem)
    labels_path = _find_idx(folder, labels_stem)
    assert images_path is not None and labels_path is not None  # guaranteed by fashion_mnist_dir
    return _load_fashion_mnist_cached(_stamp(images_path), _stamp(labels_path), split)
