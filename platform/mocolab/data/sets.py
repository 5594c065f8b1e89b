"""Datasets decoded once into uint8 tensors, and the per-rank batch order.

Every data set is held as one uint8 N×C×H×W tensor (Fashion-MNIST train: 47 MB)
so that augmentation can run on the training device in batches, with
per-sample random parameters, instead of per image in Python. Decoding happens
once per process: loaders cache their results.

Nothing here downloads unless asked to, and nothing here imports Ray or MLflow:
the method layer and its tests run in a plain Python process, offline.
"""

from __future__ import annotations

import functools
import gzip
import math
import os
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mocolab.config.image_folders import IMAGE_EXTENSIONS
from mocolab.data.canvas import StoreLayout
from mocolab.data.image_index import build_index, decode
from mocolab.data.decode import resize_uint8

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

# The data sets, their training-set sizes and native image sides: in config/choices.py (read without torch).
from mocolab.config.choices import (DATASETS, DEFAULT_IMAGEFOLDER_SIZE, IMAGE_SIZES,  # noqa: E402,F401
                                    SYNTHETIC_SIZE, TRAIN_SIZES, native_image_size)

SPLITS: tuple[str, ...] = ("train", "test")

# Names of the official Fashion-MNIST release (each may also lie uncompressed).
FASHION_MNIST_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# Where the Debian package `dataset-fashion-mnist` installs the files. A module
# constant (not inlined) so a test can point it at an empty folder to exercise
# the "not found anywhere" message on a machine that has the package.
SYSTEM_FASHION_MNIST_DIRS: tuple[str, ...] = ("/usr/share/datasets/fashion-mnist",)

SYNTHETIC_CLASSES = 10


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


# --------------------------------------------------------------------------- paths


def default_data_root() -> Path:
    """One place for every downloaded or user-provided data set, overridable per machine.

    ``$MOCOLAB_DATA`` lets a cluster point all workers at shared storage and a
    laptop at wherever the files already are, without touching configs.
    """
    env = os.environ.get("MOCOLAB_DATA", "").strip()
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/mocolab").expanduser()


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


# --------------------------------------------------------------------------- IDX


# IDX type codes (third byte of the magic number) -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Parse an IDX file (gzip-compressed or raw) into a numpy array.

    Parsed here rather than through torchvision so that Fashion-MNIST loads
    from the Debian package's ``.gz`` files with no download machinery and no
    extracted copies on disk. Compression is recognised by content, not by the
    file name. A corrupt or truncated file raises ValueError naming it.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read IDX file {path}: {exc}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(
                f"corrupt IDX file {path}: gzip data is damaged ({exc}); "
                "re-download it or reinstall `dataset-fashion-mnist`"
            ) from exc
    buf = bytearray(raw)  # writable, so torch.from_numpy does not warn
    if len(buf) < 4 or buf[0] != 0 or buf[1] != 0 or buf[2] not in _IDX_DTYPES or buf[3] == 0:
        magic = buf[:4].hex() if len(buf) >= 4 else buf.hex()
        raise ValueError(
            f"corrupt IDX file {path}: bad magic number 0x{magic} (expected 0x0000TTDD with "
            f"type TT in {sorted(hex(t) for t in _IDX_DTYPES)} and DD >= 1 dimensions); "
            "re-download it or reinstall `dataset-fashion-mnist`"
        )
    dtype = np.dtype(_IDX_DTYPES[buf[2]])
    ndim = buf[3]
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise ValueError(f"corrupt IDX file {path}: truncated header ({len(buf)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(bytes(buf[4:header]), dtype=">u4"))
    expected = math.prod(shape) * dtype.itemsize
    if len(buf) - header != expected:
        raise ValueError(
            f"corrupt IDX file {path}: header declares shape {shape} ({expected} bytes of data) "
            f"but the file holds {len(buf) - header}; re-download it"
        )
    arr = np.frombuffer(buf, dtype=dtype, offset=header).reshape(shape)
    if dtype.byteorder == ">":
        arr = arr.astype(dtype.newbyteorder("="))
    return arr


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


def _load_fashion_mnist(split: str, root: str | os.PathLike[str] | None, download: bool) -> ImageDataset:
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


# --------------------------------------------------------------------------- torchvision sets


_TORCHVISION_HOWTO: dict[str, str] = {
    "cifar10": (
        "put the extracted `cifar-10-batches-py/` folder (from cifar-10-python.tar.gz, "
        "https://www.cs.toronto.edu/~kriz/cifar.html) in {root}"
    ),
    "stl10": (
        "put the extracted `stl10_binary/` folder (from stl10_binary.tar.gz, "
        "https://cs.stanford.edu/~acoates/stl10/) in {root}"
    ),
}


@functools.lru_cache(maxsize=None)
def _load_torchvision_cached(name: str, split: str, root: str, download: bool) -> ImageDataset:
    import torchvision.datasets as tvd

    try:
        if name == "cifar10":
            ds = tvd.CIFAR10(root, train=(split == "train"), download=download)
            images = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2).contiguous()
            labels = torch.as_tensor(np.asarray(ds.targets, dtype=np.int64))
            classes = 10
        else:  # stl10: "train" is the labelled 5k split; "unlabeled" is never used here
            ds = tvd.STL10(root, split=split, download=download)
            images = torch.from_numpy(np.ascontiguousarray(ds.data)).contiguous()
            labels = torch.as_tensor(np.asarray(ds.labels, dtype=np.int64))
            classes = 10
    except Exception as exc:  # noqa: BLE001 - missing files and failed downloads alike
        reason = (
            "downloading was disabled (download=False)"
            if not download
            else "this machine could not download it"
        )
        raise RuntimeError(
            f"{name} {split} split not found under {root} and {reason} ({exc!r}). Provide it: "
            + _TORCHVISION_HOWTO[name].format(root=root)
            + ", or set $MOCOLAB_DATA / data.root to a folder that holds it, or run once with "
            "download enabled where the internet is reachable and copy the folder here."
        ) from exc
    return ImageDataset(images=images, labels=labels, classes=classes, name=name)


# --------------------------------------------------------------------------- imagefolder


def _require_dir(path: Path, what: str) -> None:
    if not path.exists():
        raise ValueError(f"data.root: {what} {str(path)!r} does not exist")
    if not path.is_dir():
        raise ValueError(f"data.root: {what} {str(path)!r} is not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ValueError(f"data.root: {what} {str(path)!r} is not readable")


@functools.lru_cache(maxsize=8)
def _load_indexed_cached(name: str, root: str, split: str, layout: StoreLayout) -> ImageDataset:
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


# --------------------------------------------------------------------------- synthetic


def _synthetic(n: int, size: int, seed: int) -> ImageDataset:
    """Ten classes a raw-pixel kNN can tell apart, so tests can check learning, not just shapes.

    Class k draws stripes at angle k·18° and a bright blob at a position of its
    own; each sample gets a random stripe phase, a jittered blob and strong
    pixel noise. Tuned so raw-pixel 1-NN reaches about 0.9 (chance 0.1) at
    2,048 training images: learnable, but not saturated, so a better encoder
    can still show up in kNN accuracy.
    """
    g = torch.Generator().manual_seed(seed)
    k = SYNTHETIC_CLASSES
    labels = torch.arange(n, dtype=torch.int64) % k
    labels = labels[torch.randperm(n, generator=g)]

    coords = torch.linspace(0.0, 1.0, size)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")  # size×size
    angles = labels.float() * (math.pi / k)
    phase = torch.rand(n, generator=g) * 2 * math.pi
    freq = 3.0
    proj = xx[None] * torch.cos(angles)[:, None, None] + yy[None] * torch.sin(angles)[:, None, None]
    stripes = 0.5 + 0.25 * torch.sin(2 * math.pi * freq * proj + phase[:, None, None])

    # Blob centres on a ring, one per class, jittered per sample.
    ring = torch.arange(k, dtype=torch.float32) * (2 * math.pi / k)
    cx = 0.5 + 0.3 * torch.cos(ring)[labels] + 0.05 * torch.randn(n, generator=g)
    cy = 0.5 + 0.3 * torch.sin(ring)[labels] + 0.05 * torch.randn(n, generator=g)
    d2 = (xx[None] - cx[:, None, None]) ** 2 + (yy[None] - cy[:, None, None]) ** 2
    blob = 0.6 * torch.exp(-d2 / (2 * 0.08**2))

    noise = 0.35 * torch.randn((n, size, size), generator=g)
    img = (0.5 * stripes + blob + noise).clamp_(0.0, 1.0)
    images = (img * 255).round_().to(torch.uint8).unsqueeze(1).contiguous()
    return ImageDataset(images=images, labels=labels, classes=k, name="synthetic")


# --------------------------------------------------------------------------- public loading


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
        return _synthetic(n, image_size or SYNTHETIC_SIZE, 2 * seed + (split == "test"))

    if name in ("imagefolder", "parquet"):
        check_readable(name, None if root is None else str(root))
        assert root is not None  # check_readable raised otherwise
        layout = StoreLayout.derived(image_size or DEFAULT_IMAGEFOLDER_SIZE, store_short_side, store_max_side)
        return _load_indexed_cached(name, str(Path(root).expanduser().resolve()), split, layout)

    if root is not None:
        check_readable(name, str(root))

    if name == "fashion-mnist":
        ds = _load_fashion_mnist(split, root, download)
    else:
        target = Path(root).expanduser() if root is not None else default_data_root()
        ds = _load_torchvision_cached(name, split, str(target.resolve()), download)

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


# --------------------------------------------------------------------------- batching


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
