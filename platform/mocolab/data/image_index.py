"""Where every image of a large split is, and its label, without decoding any: what streaming reads from.

Two sources hold large sets:

- ``imagefolder``: ImageNet-style ``root/train/<class>/*.jpg`` and
  ``root/val/<class>/*`` (``test/`` when present). A reference is the file's path.
- ``parquet``: ``root/train/*.parquet`` and ``root/val/*.parquet`` (or
  ``test/``), one row per image with columns ``image`` (the encoded file's
  bytes: JPEG, PNG, ...) and ``label`` (int); the class names, when known, in
  the file's metadata under ``mocolab.classes``. A reference is
  ``<file>#<row group>#<row in group>``. Building the index reads the label
  column and the footers only.

``decode`` turns a list of references into one uint8 batch of whole-image
canvases (data/canvas.py: each image at the stated shorter side, aspect kept,
its size in a header row) and says which could not be decoded; both loaders
decode through it, so they give the same pixels. A JPEG much larger than the
stored size is decoded at reduced scale (``dct_scale``). Pure Python and
torch: no Ray here.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import os
import warnings
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from mocolab.data.image_folders import IMAGE_EXTENSIONS, class_dirs, image_files
from mocolab.data.canvas import StoreLayout, as_layout, place
from mocolab.data.decode import to_uint8

PARQUET_COLUMNS = ("image", "label")
CLASSES_KEY = b"mocolab.classes"


@dataclass(frozen=True)
class ImageIndex:
    name: str  # imagefolder | parquet
    split: str
    folder: str  # the split's folder name under root: train, test or val
    refs: tuple[str, ...]
    labels: np.ndarray  # int64, one per reference
    classes: int
    image_size: int
    channels: int = 3
    root: str = ""  # data.root: names in reports are relative to it

    def __len__(self) -> int:
        return len(self.refs)

    def short_name(self, ref: str) -> str:
        """``training/n01440764/x.jpg``, ``training/part-0.parquet#0#3``: a reference as a report names it."""
        return os.path.relpath(ref, self.root) if self.root else ref

    def decoded_bytes(self, layout: StoreLayout | None = None) -> int:
        """What holding the whole split decoded as uint8 would take: a canvas per image (data/canvas.py)."""
        return len(self) * (layout or StoreLayout.derived(self.image_size)).image_bytes(self.channels)


def split_folder(root: Path, split: str) -> Path:
    """``test`` reads ``val/`` when there is no ``test/`` (ImageNet ships training/ and val/)."""
    if split == "test" and not (root / "test").is_dir():
        return root / "val"
    return root / split


@functools.lru_cache(maxsize=8)
def build_index(name: str, root: str, split: str, image_size: int) -> ImageIndex:
    """The index of one split (cached per process). Errors name ``data.root`` and what was expected."""
    base = Path(root)
    folder = split_folder(base, split)
    if not folder.is_dir():
        expected = "train/" if split == "train" else "test/ or val/"
        layout = ("ImageNet-style root/train/<class>/*.jpg and root/val/<class>/*.jpg" if name == "imagefolder"
                  else "root/train/*.parquet and root/val/*.parquet")
        raise ValueError(f"data.root: {name} {root!r} has no {expected} folder for split {split!r} "
                         f"(expected {layout})")
    if name == "imagefolder":
        # Labels come from training/'s class list when it exists, so that train and
        # val agree on the index of every class even if val lacks one.
        class_source = base / "train" if (base / "train").is_dir() else folder
        classes = class_dirs(class_source)
        if not classes:
            raise ValueError(f"data.root: imagefolder {root!r} has no class folders in {class_source.name}/ "
                             "(expected root/train/<class>/*.jpg)")
        index = {c: i for i, c in enumerate(classes)}
        refs: list[str] = []
        labels: list[int] = []
        for cls in class_dirs(folder):
            if cls not in index:
                raise ValueError(f"data.root: class folder {folder.name}/{cls} of {root!r} is not among the "
                                 f"{class_source.name}/ classes {classes}")
            try:
                files = image_files(folder / cls)
            except OSError as exc:
                raise ValueError(f"data.root: cannot list {str(folder / cls)!r}: {exc}") from exc
            refs += [str(f) for f in files]
            labels += [index[cls]] * len(files)
        n_classes = len(classes)
    elif name == "parquet":
        import pyarrow.parquet as pq

        files = sorted(folder.glob("*.parquet"))
        refs, labels, n_classes = [], [], 0
        for file in files:
            pf = pq.ParquetFile(file)
            missing = [c for c in PARQUET_COLUMNS if c not in pf.schema_arrow.names]
            if missing:
                raise ValueError(f"data.root: {file} has no column(s) {missing}; parquet sets need columns "
                                 f"'image' (encoded bytes) and 'label' (int)")
            meta = pf.schema_arrow.metadata or {}
            if CLASSES_KEY in meta:
                n_classes = max(n_classes, len(json.loads(meta[CLASSES_KEY])))
            for g in range(pf.num_row_groups):
                group_labels = pf.read_row_group(g, columns=["label"]).column("label").to_numpy()
                refs += [f"{file}#{g}#{r}" for r in range(len(group_labels))]
                labels += group_labels.tolist()
        n_classes = max(n_classes, (max(labels) + 1) if labels else 0)
    else:
        raise ValueError(f"data.name: {name!r} has no file index (imagefolder and parquet do)")
    if not refs:
        what = f"readable images ({', '.join(IMAGE_EXTENSIONS)})" if name == "imagefolder" else "images"
        where = f"{folder.name}/<class>/" if name == "imagefolder" else f"{folder.name}/"
        raise ValueError(f"data.root: {name} {root!r} holds no {what} under {where}")
    return ImageIndex(name, split, folder.name, tuple(refs), np.asarray(labels, dtype=np.int64), n_classes,
                      image_size, root=root)


JPEG_MAGIC = b"\xff\xd8\xff"
DCT_SCALES = (8, 4, 2)  # the reductions libjpeg decodes to directly, from the coefficients
Decoder = Callable[[bytes, StoreLayout], torch.Tensor]


def _buffer(data: bytes | np.ndarray | torch.Tensor) -> torch.Tensor:
    return data if isinstance(data, torch.Tensor) else torch.frombuffer(bytearray(data), dtype=torch.uint8)


def dct_scale(w: int, h: int, need_w: int, need_h: int) -> int:
    """How much smaller than stored a JPEG of w×h may be decoded and still cover need_w×need_h: 8, 4, 2 or 1.

    libjpeg then skips most of the inverse DCT and the colour conversion of the pixels the resize
    would throw away (a 500×375 file stored at 85×64 decodes to 125×94), and the decoded image still
    covers the target, so the resize that follows only shrinks it."""
    fits = min(w // need_w, h // need_h)
    return next((s for s in DCT_SCALES if s <= fits), 1)


def _decode_jpeg(data: bytes, layout: StoreLayout) -> tuple[torch.Tensor, tuple[int, int]]:
    """A JPEG at the smallest DCT scale that still covers its stored size, and that size (from the file's
    own); at full size through torchvision's decoder (the faster of the two there) when no reduction fits."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:  # reads the header only
        w, h = im.size
        stored = layout.stored_size(h, w)
        scale = dct_scale(w, h, stored[1], stored[0])
        if scale > 1:
            im.draft("RGB", (-(-w // scale), -(-h // scale)))
            arr = np.array(im.convert("RGB"))  # a writable copy, as torch.from_numpy wants
            return torch.from_numpy(arr).permute(2, 0, 1), stored  # 3×H×W over H×W×3: the uint8 resize's fast case
    return _decode_full(data), stored


def _decode_full(data: bytes | np.ndarray | torch.Tensor) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torchvision 0.29's codecs still work
        img = decode_image(_buffer(data), mode=ImageReadMode.RGB)
    if img.ndim == 4:  # animated GIF: first frame
        img = img[0]
    return to_uint8(img)


def decode_bytes(data: bytes | np.ndarray | torch.Tensor, layout: StoreLayout | int) -> torch.Tensor:
    """One encoded image as its uint8 canvas (data/canvas.py: the whole image at the layout's stored size):
    the decoder both loaders use. ``layout``: a training size stands for its derived layout.

    A JPEG at least twice its stored size is decoded at reduced scale (``dct_scale``); the rest at full
    size. The resize runs on uint8 (torch's vectorised kernel), not on a float copy.
    Raises what the codec raises for bytes it cannot read (truncated, empty, not an image)."""
    layout = as_layout(layout)
    raw = bytes(data.numpy()) if isinstance(data, torch.Tensor) else bytes(data)
    if raw[:3] == JPEG_MAGIC:
        img, stored = _decode_jpeg(raw, layout)
        return place(img, layout, stored)
    return place(_decode_full(raw), layout)


def decode_bytes_full(data: bytes | np.ndarray | torch.Tensor, layout: StoreLayout | int) -> torch.Tensor:
    """As ``decode_bytes``, every image decoded at full size and resized in float: slower, and the
    reference the fast decoder is held to (tests) and timed against (benchmarks/data/stream_decode.py)."""
    layout = as_layout(layout)
    img = _decode_full(data)
    stored = layout.stored_size(*img.shape[-2:])
    if stored != tuple(img.shape[-2:]):
        img = torch.nn.functional.interpolate(img.unsqueeze(0).float(), size=stored, mode="bilinear",
                                              align_corners=False, antialias=True)[0]
        img = img.round_().clamp_(0, 255).to(torch.uint8)
    return place(img, layout)


def decode_file(path: str, layout: StoreLayout | int, decoder: Decoder = decode_bytes) -> torch.Tensor:
    """One image file as its uint8 canvas; raises what reading or the codec raises for a file it cannot read."""
    with open(path, "rb") as fh:
        return decoder(fh.read(), as_layout(layout))


def _encoded(refs: Sequence[str]) -> Iterator[tuple[int, bytes | None]]:
    """(position, encoded bytes) of every reference, parquet rows grouped so each row group is read once;
    None where a file cannot be read."""
    by_group: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for i, ref in enumerate(refs):
        if "#" in ref:
            file, group, row = ref.rsplit("#", 2)
            by_group[(file, int(group))].append((i, int(row)))
            continue
        try:
            with open(ref, "rb") as fh:
                yield i, fh.read()
        except OSError:
            yield i, None
    if by_group:
        import pyarrow.parquet as pq

        files: dict[str, pq.ParquetFile] = {}
        for (file, group), rows in by_group.items():
            pf = files.setdefault(file, pq.ParquetFile(file))
            column = pf.read_row_group(group, columns=["image"]).column("image")
            for i, row in rows:
                yield i, column[row].as_py()


def decode(refs: Sequence[str], layout: StoreLayout | int, decoder: Decoder = decode_bytes,
           threads: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The canvases of ``refs`` (uint8 len(refs)×3×H×W, data/canvas.py; ``layout``: a training size stands for
    its derived layout) in their order, and a bool mask of those that could not be read or decoded (zeros
    there, header included): the caller decides what stands in for them (data.fill_unreadable).

    ``threads`` > 1 decodes on a thread pool (the codecs and the resize release the GIL): the in-memory
    loader, which decodes a whole split in one process."""
    layout = as_layout(layout)
    out = torch.zeros(len(refs), 3, *layout.canvas_hw, dtype=torch.uint8)
    bad = torch.zeros(len(refs), dtype=torch.bool)

    def one(item: tuple[int, bytes | None]) -> None:
        i, data = item
        try:
            if data is None:
                raise OSError("unreadable file")
            out[i] = decoder(data, layout)
        except Exception:  # noqa: BLE001 - a damaged file is counted and reported by the caller, not fatal here
            bad[i] = True

    items = _encoded(refs)
    if threads <= 1:
        for item in items:
            one(item)
        return out, bad

    with ThreadPoolExecutor(threads) as pool:
        while chunk := list(itertools.islice(items, 64 * threads)):  # a few encoded files in memory at a time
            list(pool.map(one, chunk))
    return out, bad


def write_parquet(images: torch.Tensor, labels: torch.Tensor | np.ndarray, out_file: str | Path, *,
                  classes: Sequence[str] | None = None, rows_per_group: int = 64, quality: int = 90) -> Path:
    """Encode uint8 N×C×H×W images as JPEG rows of one parquet file (how large sets are shipped).

    Small row groups keep a shuffled read cheap: each image read costs at most one group's bytes.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    blobs = []
    for img in images:
        arr = img.permute(1, 2, 0).numpy()
        buf = io.BytesIO()
        Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr).save(buf, format="JPEG", quality=quality)
        blobs.append(buf.getvalue())
    table = pa.table({"image": pa.array(blobs, type=pa.binary()),
                      "label": pa.array(np.asarray(labels, dtype=np.int64))})
    if classes is not None:
        table = table.replace_schema_metadata({CLASSES_KEY: json.dumps(list(classes)).encode()})
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out_file, row_group_size=rows_per_group)
    return out_file


def write_imagefolder(images: torch.Tensor, labels: torch.Tensor | np.ndarray, root: str | Path, split: str, *,
                      classes: Sequence[str] | None = None, quality: int = 90) -> Path:
    """Encode uint8 N×C×H×W images as ``root/<split>/<class>/<i>.jpg`` (an ImageNet-style folder)."""
    from PIL import Image

    labels = np.asarray(labels)
    names = list(classes) if classes is not None else [f"c{k:03d}" for k in range(int(labels.max()) + 1)]
    folder = Path(root) / split
    for name in names:
        (folder / name).mkdir(parents=True, exist_ok=True)
    for i, (img, label) in enumerate(zip(images, labels)):
        arr = img.permute(1, 2, 0).numpy()
        Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr).save(
            folder / names[int(label)] / f"{i:07d}.jpg", quality=quality)
    return folder
