"""Two augmented views per image, computed in batches with per-sample random parameters.

Images stay uint8 until here; a batch is converted to float on the training
device and every transform draws its parameters per sample (kornia), so the
data path costs a few batched tensor ops per step instead of one Python call
per image.  Randomness comes from torch's global generator, which the
training loop seeds (and checkpoints), so the same seed gives the same views.
"""

from __future__ import annotations

import torch
from mocolab.method.async_copy import to_device
from torch import nn

from mocolab.data import canvas

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
    interpolated first, then columns, by gathers over the batch.  A uint8 ``x`` (whole-image canvases,
    data/canvas.py) is gathered as uint8 and weighted in float32, so only the crops' rows become float.
    """
    n, c, _, w = x.shape
    dtype = x.dtype if x.is_floating_point() else torch.float32
    x1, y1, x2, y2 = to_device(boxes, x.device).unbind(1)
    r0, r1, h0, h1 = _axis(y1, y2, size[0])
    c0, c1, w0, w1 = _axis(x1, x2, size[1])

    def rows(i: torch.Tensor) -> torch.Tensor:
        return x.gather(2, i[:, None, :, None].expand(n, c, size[0], w))

    t = rows(r0) * h0[:, None, :, None].to(dtype) + rows(r1) * h1[:, None, :, None].to(dtype)

    def cols(i: torch.Tensor) -> torch.Tensor:
        return t.gather(3, i[:, None, None, :].expand(n, c, size[0], size[1]))

    return cols(c0) * w0[:, None, None, :].to(dtype) + cols(c1) * w1[:, None, None, :].to(dtype)


def canvas_crops(images: torch.Tensor, boxes: torch.Tensor, flip: torch.Tensor, size: int) -> torch.Tensor:
    """Box i of canvas i (``boxes``: (top, left, height, width) in each image's own orientation, on the
    batch's device) resized to size×size, float in [0, 255]; a transposed image's crop is turned back."""
    out = resized_crops(images, canvas.canvas_boxes(boxes, flip), (size, size))
    return torch.where(flip[:, None, None, None], out.transpose(2, 3), out)


def whole_image_crops(images: torch.Tensor, size: int, crop_min: float) -> torch.Tensor:
    """The training crop of each canvas (data/canvas.py): torchvision's RandomResizedCrop(size, (crop_min, 1))
    over the whole stored image, float in [0, 1].  Its uniforms come from torch's global generator on the
    CPU (the augment stream, as kornia's samplers draw) and the boxes are computed on the batch's device
    from the canvases' headers: no host read."""
    h, w, flip = canvas.stored_sizes(images)
    u = to_device(torch.rand(images.shape[0], 2 * canvas.ATTEMPTS + 2), images.device)
    boxes = canvas.random_boxes(*canvas.oriented(h, w, flip), u, (crop_min, 1.0))
    return canvas_crops(images, boxes, flip, size).div_(255.0)


def centre_views(images: torch.Tensor, size: int, chunk: int = 256) -> torch.Tensor:
    """The evaluation's uint8 view of each canvas: its stored image resized to the stored short side and
    centre-cropped to size×size (data/canvas.py ``centre_boxes``), in chunks (the crops' rows are float).
    A batch at the training size is returned as it is."""
    if not canvas.is_canvas(images, size):
        return images
    short = images.shape[-2] - 1
    out = torch.empty((images.shape[0], images.shape[1], size, size), dtype=torch.uint8, device=images.device)
    for start in range(0, images.shape[0], chunk):
        part = images[start:start + chunk]
        h, w, flip = canvas.stored_sizes(part)
        crops = canvas_crops(part, canvas.centre_boxes(*canvas.oriented(h, w, flip), short, size), flip, size)
        out[start:start + chunk] = crops.round_().clamp_(0, 255).to(torch.uint8)
    return out


def _random_resized_crop(size: int, crop_min: float):
    """kornia's RandomResizedCrop (its parameters, from the same random draws), cropping the batch in one go:
    kornia slices and resizes image by image, which dominates the augmentation's time on CPU
    (benchmarks/RESULTS.md, "Performance: the faster step")."""
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
          blur_p: float, solarize_p: float) -> tuple[nn.Module, nn.Module]:
    """(the view of a batch at the training size, what follows the crop on a canvas batch's whole-image
    crops): the same modules after the first."""
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
    if not ops:
        return nn.Identity(), nn.Identity()
    return K.AugmentationSequential(*ops), K.AugmentationSequential(*ops[1:])


class TwoViews(nn.Module):
    """uint8 N×C×H×W -> two normalised float views (query view, key view).  A batch of whole-image
    canvases (data/canvas.py) is cropped from each whole stored image, at the reference's rate.

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
            self.view_q, self.after_crop_q = _view(**common, blur_p=1.0, solarize_p=0.0)
            self.view_k, self.after_crop_k = _view(**common, blur_p=0.1, solarize_p=0.2)
        else:
            blur = 0.5 if preset == "mocov2" else 0.0
            self.view_q, self.after_crop_q = _view(**common, blur_p=blur, solarize_p=0.0)
            self.view_k, self.after_crop_k = _view(**common, blur_p=blur, solarize_p=0.0)
        self.preset, self.size, self.crop_min = preset, size, crop_min
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
        if canvas.is_canvas(images, self.size):  # whole stored images (imagefolder, parquet): data/canvas.py
            return (self.normalise(self._from_canvas(images, self.after_crop_q)),
                    self.normalise(self._from_canvas(images, self.after_crop_k)))
        x = to_float(images)
        return self.normalise(self.view_q(x)), self.normalise(self.view_k(x))

    def _from_canvas(self, images: torch.Tensor, after_crop: nn.Module) -> torch.Tensor:
        """One view of a canvas batch: the crop drawn over each whole image, then the rest of the view;
        ``none`` (no crop) takes the evaluation's centre crop."""
        if self.preset == "none":
            return to_float(centre_views(images, self.size))
        return after_crop(whole_image_crops(images, self.size, self.crop_min))


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
