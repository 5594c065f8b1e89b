"""The data sets by name: ``load_dataset`` decodes a split once into uint8 tensors, ``check_readable``
refuses a ``data.root`` that cannot be used before any work.

Every data set is held as one uint8 N×C×H×W tensor (``image_dataset``) so that augmentation can run on the
training device in batches, with per-sample random parameters, instead of per image in Python. Decoding
happens once per process: loaders cache their results. Each set has its loader (``fashion_mnist`` with
``idx``, ``torchvision_sets``, ``indexed_sets`` for imagefolder and parquet, ``synthetic``); the per-rank
batch order is ``batching``. This module also names what its readers import from it.

Nothing here downloads unless asked to, and nothing here imports Ray or MLflow:
the method layer and its tests run in a plain Python process, offline.
"""

from __future__ import annotations

import os
from pathlib import Path

from mocolab.config.choices import (DATASETS, DEFAULT_IMAGEFOLDER_SIZE, IMAGE_SIZES,  # noqa: F401
                                    SYNTHETIC_SIZE, TRAIN_SIZES, native_image_size)
from mocolab.data.batching import batches_per_epoch, fill_unreadable, iterate_batches, rank_positions
from mocolab.data.canvas import StoreLayout
from mocolab.data.decode import resize_uint8
from mocolab.data.fashion_mnist import FASHION_MNIST_FILES, fashion_mnist_dir, load_fashion_mnist
from mocolab.data.idx import read_idx
from mocolab.data.image_dataset import ImageDataset, unreadable_label
from mocolab.data.indexed_sets import load_indexed_set, skipped_message
from mocolab.data.roots import default_data_root
from mocolab.data.synthetic import synthetic_set
from mocolab.data.torchvision_sets import load_torchvision_set

__all__ = [
    "DATASETS",
    "FASHION_MNIST_FILES",
    "TRAIN_SIZES",
    "ImageDataset",
    "batches_per_epoch",
    "check_readable",
    "default_data_root",
    "fashion_mnist_dir",
    "fill_unreadable",
    "iterate_batches",
    "rank_positions",
    "load_dataset",
    "read_idx",
    "skipped_message",
    "unreadable_label",
]

SPLITS: tuple[str, ...] = ("train", "test")
_synthetic = synthetic_set  # the name benchmarks/data_loading.py imports


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"data.name: unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")


def load_dataset(
    name: str,
    split: str,
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
    synthetic_size: int = 2048,
    image_size: int | None = None,
    seed: int = 0,
    store_short_side: int = 0,
    store_max_side: int = 0,
) -> ImageDataset:
    """Decode a whole split into one uint8 tensor, once per process.

    - ``fashion-mnist``: IDX files found by :func:`fashion_mnist_dir`, else
      downloaded by torchvision into ``root`` / the default data root.
    - ``cifar10``, ``stl10``: torchvision, stored in ``root`` / the default data
      root (``stl10`` ``train`` is the labelled 5,000-image split).
    - ``imagefolder``: ``root`` is ImageNet-style (``training/<class>/*``,
      ``val/<class>/*``; split ``test`` reads ``val/`` when there is no
      ``test/``). Images are decoded to RGB and stored whole on canvases
      (data/canvas.py) for crops of ``image_size`` (default 64): shorter side
      at ``store_short_side``, longer side at most ``store_max_side`` (0: derived,
      ``DataConfig.store_sides``). ``parquet``: the same from rows of
      ``root/<split>/*.parquet``. A file that cannot be decoded keeps its row,
      zeros with a negative label (``unreadable_label``), and is named in
      ``skipped``.
    - ``synthetic``: generated from ``seed`` (the test split uses a different
      stream and a quarter of ``synthetic_size``), for tests and smoke runs.

    ``image_size``, when given, also resizes the other data sets (the result
    is then a fresh tensor, not the cached one). Loads are cached, so the
    returned tensors are shared: do not modify them in place.
    """
    _check_name(name)
    _check_split(split)
    if image_size is not None and (isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1):
        raise ValueError(f"data.image_size must be a positive integer or None, got {image_size!r}")

    if (store_short_side or store_max_side) and name not in ("imagefolder", "parquet"):
        raise ValueError(f"data.store_short_side / store_max_side: apply to imagefolder and parquet sets; "
                         f"{name!r} is stored at data.image_size: leave them 0")
    if name == "synthetic":
        if isinstance(synthetic_size, bool) or not isinstance(synthetic_size, int) or synthetic_size < 4:
            raise ValueError(f"data.synthetic_size must be >= 4, got {synthetic_size!r}")
        n = synthetic_size if split == "train" else max(1, synthetic_size // 4)
        # 2·seed and 2·seed+1 never collide across seeds, so no seed's test
        # split is another seed's train split.
        return synthetic_set(n, image_size or SYNTHETIC_SIZE, 2 * seed + (split == "test"))

    if name in ("imagefolder", "parquet"):
        check_readable(name, None if root is None else str(root))
        assert root is not None  # check_readable raised otherwise
        layout = StoreLayout.derived(image_size or DEFAULT_IMAGEFOLDER_SIZE, store_short_side, store_max_side)
        return load_indexed_set(name, str(Path(root).expanduser().resolve()), split, layout)

    if root is not None:
        check_readable(name, str(root))

    if name == "fashion-mnist":
        ds = load_fashion_mnist(split, root, download)
    else:
        target = Path(root).expanduser() if root is not None else default_data_root()
        ds = load_torchvision_set(name, split, str(target.resolve()), download)

    if image_size is not None and tuple(ds.images.shape[-2:]) != (image_size, image_size):
        ds = ImageDataset(
            images=resize_uint8(ds.images, image_size), labels=ds.labels, classes=ds.classes, name=ds.name
        )
    return ds


def check_readable(name: str, root: str | os.PathLike[str] | None) -> None:
    """Fail config validation before any work when ``data.root`` cannot be used.

    Never downloads and never decodes, so it is cheap enough to run on the
    driver before a cluster job starts. For the downloadable sets a root that
    does not exist yet is fine (the download creates it); one that exists but
    is a file or unreadable is not.
    """
    _check_name(name)
    if name in ("imagefolder", "parquet"):
        if root is None:
            raise ValueError(f"data.root: required for data.name={name!r} (a folder with train/ and val/)")
        _require_dir(Path(root).expanduser(), f"{name} root")
        return
    if root is None:
        return
    path = Path(root).expanduser()
    if path.exists() and (not path.is_dir() or not os.access(path, os.R_OK | os.X_OK)):
        raise ValueError(f"data.root: {str(path)!r} exists but is not a readable directory")


def _require_dir(path: Path, what: str) -> None:
    if not path.exists():
        raise ValueError(f"data.root: {what} {str(path)!r} does not exist")
    if not path.is_dir():
        raise ValueError(f"data.root: {what} {str(path)!r} is not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ValueError(f"data.root: {what} {str(path)!r} is not readable")
