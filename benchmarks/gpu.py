"""GPU figures for the cifar10-resnet18 preset: images/s and time per epoch, fp32, bf16, bf16 + channels_last.

    .venv/bin/python benchmarks/gpu.py                          # on a GPU machine: about 2 minutes
    # a dry run:
    .venv/bin/python benchmarks/gpu.py --device cpu --steps 1 --warmup 1 --batch 64 --train-images 2048 --queue 1024

Nothing can be downloaded on the GPU machines, so the data is made here: the
generated 10-class images (data/sets.py's ``synthetic``) at 32×32, repeated over
three channels, 50,000 training images as CIFAR-10 has. Each variant trains
``--steps`` whole MoCo steps of the real Trainer (augmentation, query
forward/backward, key forward on the shuffled batch, the queue) after
``--warmup`` steps; then the fastest variant trains one whole epoch, timed end
to end. Prints the GPU's name, the figures and their ratios to fp32.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from _steps import held_batches, timed_steps

from mocolab.config import build_config
from mocolab.data.sets import ImageDataset, _synthetic
from mocolab.training.trainer import Trainer


def _data(n: int, seed: int) -> ImageDataset:
    ds = _synthetic(n, 32, seed)
    return ImageDataset(ds.images.expand(-1, 3, -1, -1).contiguous(), ds.labels, ds.classes, "synthetic-rgb32")


def _channels_last(tr: Trainer) -> None:
    """Both encoders' weights and inputs in NHWC, the layout cuDNN's tensor-core convolutions prefer."""
    for enc in (tr.encoder, tr.model.encoder_k):
        enc.to(memory_format=torch.channels_last)
        enc.register_forward_pre_hook(lambda _m, args: (args[0].contiguous(memory_format=torch.channels_last),
                                                        *args[1:]))


def _config(args, precision: str, device: torch.device):
    """The preset, on the generated set of its shape, at a precision."""
    return build_config("cifar10-resnet18", {"data.name": "synthetic", "data.synthetic_size": args.train_images,
                                             "data.image_size": 32, "run.precision": precision,
                                             "optim.batch_size": args.batch, "queue.size": args.queue,
                                             "run.device": device.type})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(args, precision: str, channels_last: bool, train: ImageDataset, test: ImageDataset,
            device: torch.device) -> tuple[float, Trainer]:
    tr = Trainer(_config(args, precision, device), train=train, test=test, device=device)
    if channels_last:
        _channels_last(tr)
    tr.model.train()
    rate = timed_steps(tr, held_batches(tr, args.warmup + args.steps), args.warmup, lambda: _sync(device))
    return rate, tr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=512, help="global batch (the preset's 512)")
    ap.add_argument("--train-images", type=int, default=50_000)
    ap.add_argument("--queue", type=int, default=4096, help="K (the preset's 4096)")
    ap.add_argument("--no-epoch", action="store_true", help="skip the timed whole epoch")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no GPU here (torch.cuda.is_available() is False); "
                         "use --device cpu for a dry run")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    print(f"device: {name}; torch {torch.__version__}; cifar10-resnet18 preset (ResNet-18, 3x3 stem, K {args.queue}, "
          f"batch {args.batch}) on {args.train_images:,} generated 3x32x32 images")
    train, test = _data(args.train_images, 0), _data(1000, 1)
    results: dict[str, float] = {}
    best: tuple[float, str, bool] | None = None
    for label, precision, cl in (("fp32", "fp32", False), ("bf16", "bf16", False),
                                 ("bf16 + channels_last", "bf16", True)):
        rate, _ = measure(args, precision, cl, train, test, device)
        results[label] = rate
        steps_per_epoch = args.train_images // args.batch
        print(f"{label:>22}: {rate:9.0f} images/s  ({args.batch / rate * 1000:6.1f} ms/step, "
              f"{steps_per_epoch * args.batch / rate:6.1f} s per epoch of {steps_per_epoch} steps)  "
              f"x{rate / results['fp32']:.2f} of fp32")
        if best is None or rate > best[0]:
            best = (rate, precision, cl)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.no_epoch or best is None:
        return
    _, precision, cl = best
    tr = Trainer(_config(args, precision, device), train=train, test=test, device=device)
    if cl:
        _channels_last(tr)
    _sync(device)
    t0 = time.perf_counter()
    tr.train_epoch()
    _sync(device)
    seconds = time.perf_counter() - t0
    print(f"one whole epoch ({precision}{' + channels_last' if cl else ''}, {tr.step} steps, data order, "
          f"augmentation and queue included): {seconds:.1f} s, {tr.step * tr.batch / seconds:.0f} images/s")
    if device.type == "cuda":
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
