"""Decoded images as 8 bits at a preset's side: one copy for data/sets.py (whole data sets resized) and
data/image_index.py (files decoded), so both paths give the same pixels."""

from __future__ import annotations

import torch


def to_uint8(img: torch.Tensor) -> torch.Tensor:
    """16-bit images (PNG) scaled to 8 bits with rounding; uint8 passes through."""
    if img.dtype == torch.uint8:
        return img
    if img.dtype == torch.uint16:
        return ((img.to(torch.int32) * 255 + 32767) // 65535).to(torch.uint8)
    raise ValueError(f"unsupported image dtype {img.dtype}")


def resize_uint8(images: torch.Tensor, size: int, chunk: int = 1024) -> torch.Tensor:
    """Shorter side to ``size`` then a centre crop, so the aspect ratio is kept and every image is size×size.

    Done in chunks because the float copy interpolate needs is 4× the uint8 data.
    """
    n, c, h, w = images.shape
    if h == size and w == size:
        return images
    scale = size / min(h, w)
    new_h, new_w = max(size, round(h * scale)), max(size, round(w * scale))
    top, left = (new_h - size) // 2, (new_w - size) // 2
    out = torch.empty((n, c, size, size), dtype=torch.uint8)
    for start in range(0, n, chunk):
        block = images[start : start + chunk].float()
        if (new_h, new_w) != (h, w):
            block = torch.nn.functional.interpolate(
                block, size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True
            )
        block = block[:, :, top : top + size, left : left + size]
        out[start : start + chunk] = block.round_().clamp_(0, 255).to(torch.uint8)
    return out
