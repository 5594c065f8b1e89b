"""Two-view augmentation alone: mocolab's batched views against torchvision's transforms applied image by image.

    .venv/bin/python benchmarks/step/augment_vs_torchvision.py [--threads 2] [--batches 10] [--batch 256]

The same recipe on every side: cpu-quick's MoCo v2 views of 28×28
Fashion-MNIST images (random resized crop with scale 0.5 to 1, a horizontal
flip, colour jitter 0.4 with p 0.8, a Gaussian blur with σ from 0.1 to 2 and
p 0.5, then normalisation), two views per image. These are the sides:

- mocolab's ``TwoViews`` on a uint8 batch;
- the same with kornia's own RandomResizedCrop, which crops image by image
  (the per-image crop that the batched crop replaces);
- torchvision ``transforms.v2`` on each image's uint8 tensor;
- torchvision on each PIL image, the classic ``Dataset.__getitem__``
  pipeline.

Each prints images/s (pairs of views), measured in one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch
from _steps import with_kornia_crop


def rate(fn, batches: list[torch.Tensor], warmup: int = 1) -> float:
    for x in batches[:warmup]:
        fn(x)
    t0 = time.perf_counter()
    for x in batches[warmup:]:
        fn(x)
    return sum(x.shape[0] for x in batches[warmup:]) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from PIL import Image
    from torchvision.transforms import v2

    from mocolab.data.augment import NORMALISATION, build_augmentation
    from mocolab.config import build_config
    from mocolab.data.sets import load_dataset
    from mocolab.config.hardware import keep_freed_memory

    keep_freed_memory()
    cfg = build_config("cpu-quick")
    images = load_dataset(cfg.data.name, "train", cfg.data.root).images[: args.batch * (args.batches + 1)]
    batches = list(images.split(args.batch))
    ours = build_augmentation(cfg.augment, 28, 1)
    before = with_kornia_crop(build_augmentation(cfg.augment, 28, 1))

    mean, std = NORMALISATION[1]
    a = cfg.augment
    view = v2.Compose([
        v2.RandomResizedCrop(28, scale=(a.crop_min, 1.0), antialias=False),
        v2.RandomHorizontalFlip(),
        v2.RandomApply([v2.ColorJitter(brightness=a.jitter, contrast=a.jitter)], p=0.8),
        v2.RandomApply([v2.GaussianBlur(3, sigma=(0.1, a.blur_sigma_max))], p=0.5),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean, std),
    ])

    def per_tensor(x: torch.Tensor) -> None:
        for img in x:
            view(img), view(img)

    def per_pil(x: torch.Tensor) -> None:
        for img in x:
            pil = Image.fromarray(img[0].numpy(), mode="L")
            view(v2.functional.to_image(pil)), view(v2.functional.to_image(pil))

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch}, {args.batches} timed batches")
    figures = {
        "mocolab TwoViews (batched)": rate(ours, batches),
        "mocolab with kornia's per-image crop": rate(before, batches),
        "torchvision v2, per image tensor": rate(per_tensor, batches),
        "torchvision v2, per PIL image": rate(per_pil, batches),
    }
    base = figures["torchvision v2, per image tensor"]
    for name, value in figures.items():
        print(f"{name:<52} {value:9.0f} images/s  x{value / base:.2f} torchvision per tensor")


if __name__ == "__main__":
    main()
