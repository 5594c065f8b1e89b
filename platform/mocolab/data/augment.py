"""Two augmented views per image, computed in batches with per-sample random parameters.

Images stay uint8 until here; a batch is converted to float on the training
device and every transform draws its parameters per sample (kornia), so the
data path costs a few batched tensor ops per step instead of one Python call
per image.  Randomness comes from torch's global generator, which the
training loop seeds (and checkpoints), so the same seed gives the same views.
"""

from __future__ import annotations

import torch
from torch import nn

from mocolab.config.choices import AUGMENT_PRESETS as PRESETS  # noqa: F401  (the list lives in config/choices.py, torch-free)

# Per-dataset normalisation (channel means/stds of the training sets).
NORMALISATION = {
    1: ((0.2860,), (0.3530,)),  # Fashion-MNIST
    3: ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),  # CIFAR-10, good enough for RGB in general
}


def _blur_kernel(size: int) -> int:
    """About a tenth of the image side, odd, at least 3 (the MoCo v2 rule of thumb)."""
    k = max(3, int(round(size * 0.1)))
    return k if k % 2 else k + 1


def _jitter(channels: int, strength: float, p: float) -> list[nn.Module]:
    import kornia.augmentation as K  # at use, not at import: config reads PRESETS without loading kornia

    if strength <= 0:
        return []
    if channels == 1:  # no colour: jitter reduces to brightness and contrast
        return [K.ColorJitter(brightness=strength, contrast=strength, p=p)]
    return [K.ColorJitter(strength, strength, strength, min(0.1, strength / 4), p=p), K.RandomGrayscale(p=0.2)]


def _axis(start: torch.Tensor, end: torch.Tensor, out: int) -> tuple[torch.Tensor, ...]:
    """Bilinear sampling along one axis of crops [start, end] (inclusive, N each) resized to ``out`` with
    aligned corners: both source positions and both weights per output pixel (N×out each), computed as
    ``F.interpolate`` computes them (float32 scale (n-1)/(out-1), floor clamped to the crop, lambda in [0, 1])."""
    n = end - start + 1
    scale = (n - 1).float() / (out - 1) if out > 1 else torch.zeros(n.shape, device=start.device)
    src = scale[:, None] * torch.arange(out, dtype=torch.float32, device=start.device)
    i0 = torch.minimum(src.floor().long(), (n - 1)[:, None])
    lam = (src - i0).clamp_(0, 1)
    i1 = i0 + (i0 < (n - 1)[:, None]).long()
    return start[:, None] + i0, start[:, None] + i1, 1 - lam, lam


def resized_crops(x: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Crop box i of image i and resize it to ``size`` (bilinear, aligned corners), for the whole batch at once.

    ``boxes``: N×4 integer (x1, y1, x2, y2), inclusive, inside the image.  Equal to
    slicing each crop and ``F.interpolate``-ing it, to float rounding: rows are
    interpolated first, then columns, by gathers over the batch.
    """
    n, c, _, w = x.shape
    x1, y1, x2, y2 = boxes.to(x.device).unbind(1)
    r0, r1, h0, h1 = _axis(y1, y2, size[0])
    c0, c1, w0, w1 = _axis(x1, x2, size[1])

    def rows(i: torch.Tensor) -> torch.Tensor:
        return x.gather(2, i[:, None, :, None].expand(n, c, size[0], w))

    t = rows(r0) * h0[:, None, :, None].to(x.dtype) + rows(r1) * h1[:, None, :, None].to(x.dtype)

    def cols(i: torch.Tensor) -> torch.Tensor:
        return t.gather(3, i[:, None, None, :].expand(n, c, size[0], size[1]))

    return cols(c0) * w0[:, None, None, :].to(x.dtype) + cols(c1) * w1[:, None, None, :].to(x.dtype)


def _random_resized_crop(size: int, crop_min: float):
    """kornia's RandomResizedCrop (its parameters, from the same random draws), cropping the batch in one go:
    kornia slices and resizes image by image, which was most of the augmentation's time on CPU."""
    import kornia.augmentation as K

    class BatchedRandomResizedCrop(K.RandomResizedCrop):
        def apply_transform(self, input, params, flags, transform=None):
            if (flags["cropping_mode"] != "slice" or flags["resample"].name != "BILINEAR"
                    or not flags["align_corners"] or input.dim() != 4):
                return super().apply_transform(input, params, flags, transform)
            src = torch.as_tensor(params["src"], dtype=torch.long)  # N×4×2 corners (x, y), truncated as kornia does
            boxes = torch.stack([src[:, 0, 0], src[:, 0, 1], src[:, 1, 0], src[:, 3, 1]], dim=1)
            return resized_crops(input, boxes, tuple(flags["size"]))

    return BatchedRandomResizedCrop((size, size), scale=(crop_min, 1.0))


def _view(preset: str, size: int, channels: int, crop_min: float, jitter: float, sigma_max: float,
          blur_p: float, solarize_p: float) -> nn.Module:
    import kornia.augmentation as K

    ops: list[nn.Module] = []
    if preset != "none":
        ops += [_random_resized_crop(size, crop_min), K.RandomHorizontalFlip()]
    if preset in ("mocov1",):
        ops += _jitter(channels, jitter, p=1.0)
    if preset in ("mocov2", "mocov3"):
        ops += _jitter(channels, jitter, p=0.8)
    if preset in ("mocov2", "mocov3") and blur_p > 0:
        k = _blur_kernel(size)
        ops.append(K.RandomGaussianBlur((k, k), (0.1, sigma_max), p=blur_p))
    if solarize_p > 0:
        ops.append(K.RandomSolarize(thresholds=0.0, additions=0.0, p=solarize_p))
    return K.AugmentationSequential(*ops) if ops else nn.Identity()


class TwoViews(nn.Module):
    """uint8 N×C×H×W -> two normalised float views (query view, key view).

    ``mocov3`` is asymmetric (blur 1.0 / 0.1, solarize 0 / 0.2); the others
    draw both views from the same distribution.
    """

    def __init__(self, preset: str, size: int, channels: int, *, crop_min: float = 0.2, jitter: float = 0.4,
                 blur_sigma_max: float = 2.0) -> None:
        super().__init__()
        if preset not in PRESETS:
            raise ValueError(f"augment.preset: unknown value {preset!r}; choose one of {list(PRESETS)}")
        common = dict(preset=preset, size=size, channels=channels, crop_min=crop_min, jitter=jitter,
                      sigma_max=blur_sigma_max)
        if preset == "mocov3":
            self.view_q = _view(**common, blur_p=1.0, solarize_p=0.0)
            self.view_k = _view(**common, blur_p=0.1, solarize_p=0.2)
        else:
            blur = 0.5 if preset == "mocov2" else 0.0
            self.view_q = _view(**common, blur_p=blur, solarize_p=0.0)
            self.view_k = _view(**common, blur_p=blur, solarize_p=0.0)
        self.normalise = Normalise(channels)

    def _apply(self, fn, *args, **kwargs):
        """Moves the normalisation's buffers only.  kornia rebuilds an augmentation's samplers on the device it
        is moved to, where they would draw from that device's generator, which no checkpoint holds; kept on
        the CPU they draw from the augment stream the trainer owns and checkpoints (method/rng.py), so a resumed run
        draws alike and a seed gives the same views on any device.  The parameters they draw are a few
        numbers per image, moved with the batch."""
        self.normalise._apply(fn, *args, **kwargs)
        return self

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = to_float(images)
        return self.normalise(self.view_q(x)), self.normalise(self.view_k(x))


class Normalise(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        mean, std = NORMALISATION.get(channels, ((0.5,) * channels, (0.25,) * channels))
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float [0, 1]; float input is passed through."""
    return images.float().div_(255.0) if images.dtype == torch.uint8 else images


def build_augmentation(cfg, size: int, channels: int) -> TwoViews:
    """From an ``AugmentConfig``."""
    return TwoViews(cfg.preset, size, channels, crop_min=cfg.crop_min, jitter=cfg.jitter,
                    blur_sigma_max=cfg.blur_sigma_max)
