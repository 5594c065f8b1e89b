"""Whole images of different shapes in one uint8 batch: each on a canvas of one shape, its size in a header row.

ImageNet-style sets (imagefolder, parquet) are stored whole, so that the training crop is drawn from the
whole image at its own aspect ratio, as the reference's ``RandomResizedCrop(224, scale=(0.2, 1))`` draws it.
An image is resized once, at store time, so its shorter side is ``short`` (``data.store_short_side``)
unless its longer side would then pass ``longest`` (``data.store_max_side``, FFCV's cap): then the longer
side is ``longest``. Aspect is kept either way.

One canvas is C × (short + 1) × max(longest, HEADER_BYTES) uint8:

- rows 0 .. short-1: the stored image, top-left, zeros around it. A portrait image is stored transposed,
  so every stored image is landscape and one short × longest canvas holds any of them: half the bytes of
  a longest × longest square.
- row ``short``, channel 0, first ``HEADER_BYTES`` bytes: the stored image's height and width on the canvas
  (two big-endian bytes each) and whether it is transposed (one byte). An unreadable file's canvas is
  zeros, header included (its batch's stand-in replaces it: data.batching.fill_unreadable).

Why in the pixels: the batch is the one thing that travels from the loader to the augmentation (through
Ray Data's blocks, the epoch's permutation, a stand-in's copy, the copy to the device), so the size goes
with it; and it is read on the device as tensors, so a step reads nothing back to the host. A batch is a
canvas batch when its side is not the training size (``is_canvas``): square sets at their size (Fashion-MNIST,
CIFAR, synthetic) never are, and take the augmentation's path unchanged.

The boxes drawn here are (top, left, height, width) in the original orientation; ``canvas_boxes`` turns
them into the canvas's (x1, y1, x2, y2) for ``augment.resized_crops``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mocolab.config.schema import DataConfig

HEADER_BYTES = 5  # height (2), width (2), transposed (1)
ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 boxes before its centre-crop fallback
RATIO = (3 / 4, 4 / 3)  # the crop's aspect range, torchvision's and kornia's default


@dataclass(frozen=True)
class StoreLayout:
    """How an indexed set's images are stored for crops of ``view`` px (config: ``DataConfig.store_sides``)."""

    view: int  # the training size: the side of every crop and of the evaluation's centre crop
    short: int  # the stored shorter side
    longest: int  # the cap on the stored longer side

    def __post_init__(self) -> None:
        if not 1 <= self.view <= self.short <= self.longest:
            raise ValueError(f"data.store_short_side / store_max_side: need image_size {self.view} <= short side "
                             f"{self.short} <= cap {self.longest}")

    @classmethod
    def derived(cls, view: int, short: int = 0, longest: int = 0) -> StoreLayout:
        """The layout for ``view`` px crops; 0 derives a side as ``DataConfig.store_sides`` does."""
        return cls(view, *DataConfig(store_short_side=short, store_max_side=longest).store_sides(view))

    @property
    def canvas_hw(self) -> tuple[int, int]:
        return self.short + 1, max(self.longest, HEADER_BYTES)

    def image_bytes(self, channels: int = 3) -> int:
        """Bytes one stored image takes (its canvas): what a split in memory costs per image."""
        h, w = self.canvas_hw
        return channels * h * w

    def stored_size(self, h: int, w: int) -> tuple[int, int]:
        """(height, width) an h×w image is stored at, in its own orientation."""
        scale = min(self.short / min(h, w), self.longest / max(h, w))
        return max(1, round(h * scale)), max(1, round(w * scale))


def as_layout(layout: StoreLayout | int) -> StoreLayout:
    """A layout, or a training size standing for its derived layout."""
    return layout if isinstance(layout, StoreLayout) else StoreLayout.derived(layout)


def place(img: torch.Tensor, layout: StoreLayout, stored: tuple[int, int] | None = None) -> torch.Tensor:
    """uint8 C×H×W -> its canvas: resized to ``stored`` (default ``layout.stored_size`` of its own size;
    a decoder that read a file at reduced scale passes the full file's) with bilinear antialiased
    interpolation on uint8, transposed when portrait, the header written."""
    c, h, w = img.shape
    sh, sw = stored or layout.stored_size(h, w)
    if (sh, sw) != (h, w):
        img = torch.nn.functional.interpolate(img.unsqueeze(0), size=(sh, sw), mode="bilinear",
                                              align_corners=False, antialias=True)[0]
    flip = sh > sw
    if flip:
        img, sh, sw = img.transpose(1, 2), sw, sh
    out = torch.zeros((c, *layout.canvas_hw), dtype=torch.uint8)
    out[:, :sh, :sw] = img
    out[0, layout.short, :HEADER_BYTES] = torch.tensor([sh >> 8, sh & 255, sw >> 8, sw & 255, int(flip)],
                                                       dtype=torch.uint8)
    return out


def is_canvas(images: torch.Tensor, view: int) -> bool:
    """Whether a batch holds canvases rather than images at the training size (read from its shape alone)."""
    return tuple(images.shape[-2:]) != (view, view)


def stored_sizes(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(height, width, transposed) of each canvas's stored image, on the canvas, as long tensors on the
    batch's device (no host read). A zero header (an unreadable file) reads as 1×1."""
    head = images[:, 0, -1, :HEADER_BYTES].long()
    h = (head[:, 0] * 256 + head[:, 1]).clamp(1, images.shape[-2] - 1)
    w = (head[:, 2] * 256 + head[:, 3]).clamp(1, images.shape[-1])
    return h, w, head[:, 4].bool()


def random_boxes(h: torch.Tensor, w: torch.Tensor, u: torch.Tensor, scale: tuple[float, float],
                 ratio: tuple[float, float] = RATIO) -> torch.Tensor:
    """torchvision's ``RandomResizedCrop.get_params`` for every image at once, from uniforms ``u``
    (N × (2·ATTEMPTS + 2), in [0, 1), drawn by the caller): up to ten tries of an area in scale × area and a
    log-uniform aspect, the first that fits taken at a uniform position, else the centre crop clipped to
    the ratio range. ``h``, ``w``: the images' sizes (N each, in the orientation the crop is drawn in).
    Returns N×4 long (top, left, height, width)."""
    hf, wf = h.to(u.dtype), w.to(u.dtype)
    area = (hf * wf)[:, None]
    target = area * (scale[0] + (scale[1] - scale[0]) * u[:, :ATTEMPTS])
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(lo + (hi - lo) * u[:, ATTEMPTS:2 * ATTEMPTS])
    cw = torch.sqrt(target * aspect).round().long()
    ch = torch.sqrt(target / aspect).round().long()
    fits = (cw > 0) & (cw <= w[:, None]) & (ch > 0) & (ch <= h[:, None])
    first = fits.long().argmax(1, keepdim=True)  # the first try that fits (0 when none does)
    ch, cw = ch.gather(1, first)[:, 0], cw.gather(1, first)[:, 0]
    top = (u[:, -2] * (h - ch + 1).to(u.dtype)).long().clamp(max=h - ch)
    left = (u[:, -1] * (w - cw + 1).to(u.dtype)).long().clamp(max=w - cw)
    # the fallback: the whole image, clipped to the ratio range, centred
    in_ratio = wf / hf
    fh = torch.where(in_ratio < ratio[0], (wf / ratio[0]).round().long(), h)
    fw = torch.where(in_ratio > ratio[1], (hf * ratio[1]).round().long(), w)
    found = fits.any(1)
    ch, cw = torch.where(found, ch, fh), torch.where(found, cw, fw)
    top = torch.where(found, top, torch.div(h - fh, 2, rounding_mode="floor"))
    left = torch.where(found, left, torch.div(w - fw, 2, rounding_mode="floor"))
    return torch.stack([top, left, ch, cw], dim=1)


def centre_boxes(h: torch.Tensor, w: torch.Tensor, short: int, view: int) -> torch.Tensor:
    """The evaluation's box: the stored image resized to ``short`` on its shorter side (itself, unless its
    longer side was capped) and centre-cropped to ``view``, as the reference's Resize(256) + CenterCrop(224).
    N×4 long (top, left, side, side), in the images' own orientation as ``h``, ``w`` are."""
    side = torch.div(torch.minimum(h, w) * view + short // 2, short, rounding_mode="floor").clamp(min=1)
    side = torch.minimum(side, torch.minimum(h, w))
    return torch.stack([torch.div(h - side, 2, rounding_mode="floor"),
                        torch.div(w - side, 2, rounding_mode="floor"), side, side], dim=1)


def oriented(h: torch.Tensor, w: torch.Tensor, flip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A stored image's (height, width) in its own orientation (a transposed one's canvas size swapped)."""
    return torch.where(flip, w, h), torch.where(flip, h, w)


def canvas_boxes(boxes: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """(top, left, height, width) in each image's own orientation -> inclusive (x1, y1, x2, y2) on its canvas,
    where a transposed image's rows are its columns."""
    top, left, bh, bw = boxes.unbind(1)
    x1, y1 = torch.where(flip, top, left), torch.where(flip, left, top)
    x2, y2 = x1 + torch.where(flip, bh, bw) - 1, y1 + torch.where(flip, bw, bh) - 1
    return torch.stack([x1, y1, x2, y2], dim=1)
