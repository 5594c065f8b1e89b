"""Images per CPU-second of the stream path on ImageNet-shaped JPEGs, two decoders, against a DataLoader.

    .venv/bin/python benchmarks/data/stream_decode.py [--images 2000] [--sizes 224,64] [--repeats 2]

Generates ``--images`` JPEGs of 500x375 (quality 90, about 105 KiB each:
ImageNet's 150 GB over 1.33 M files is about 110 KB) in a temporary
ImageFolder, then reads one epoch of them, at each size, through:

- the stream path (training/stream.py: Ray Data decode tasks, ordered batches)
  as it was: one batch per task and the full-size decoder
  (``decode_bytes_full``: every pixel decoded, the resize in float);
- the same with batched tasks (``task_images``), the full-size decoder;
- the stream path as it is: batched tasks and the decoder both loaders use
  (``decode_bytes``: JPEG DCT scaling when the target is at most half the
  file, the resize on uint8);
- the same decode tasks submitted as plain Ray tasks, a window of them in
  flight, without Ray Data (not a path mocolab runs): what Ray Data's
  executor costs on top of the tasks;
- ``torchvision.datasets.ImageFolder`` with ``Resize``, ``CenterCrop`` and
  ``PILToTensor`` in a ``DataLoader(num_workers=..., shuffle=True)``, as a
  user would write it;
- each decoder alone, in this process, on 300 of the files: the ceiling.

Figures: images/s of wall time, and images per CPU-second: the CPU time every
process of the path used (this one, Ray's processes, the DataLoader's workers)
over the epoch. The second is what sizes a machine (cores per GPU), and it
holds up better than wall time on a machine shared with other work; compare
the ratios, which one run measures side by side, rather than absolute figures
across machines. Each path is measured ``--repeats`` times, interleaved; the
best is kept.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import platform
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import psutil
import ray
import torch

from mocolab.method import rng
from mocolab.data.sets import rank_positions
from mocolab.data.image_index import build_index, decode_bytes, decode_bytes_full
from mocolab.data.canvas import StoreLayout
from mocolab.training.stream import TASK_IMAGES, StreamSource, _decode_block

WIDTH, HEIGHT = 500, 375  # ImageNet's most common shape
CLASSES = 10


def _texture(gen: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A photo-like canvas: smooth colour fields, edges and grain, so a JPEG of it weighs what a photo does."""
    from PIL import Image, ImageFilter

    coarse = gen.integers(0, 256, (h // 24 + 1, w // 24 + 1, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.int16)
    edges = np.asarray(Image.fromarray(gen.integers(0, 256, (h // 4, w // 4, 3), dtype=np.uint8))
                       .resize((w, h), Image.NEAREST).filter(ImageFilter.GaussianBlur(1.5)), dtype=np.int16)
    grain = gen.normal(0, 20, (h, w, 3))
    return np.clip(0.7 * smooth + 0.3 * edges + grain, 0, 255).astype(np.uint8)


def write_jpegs(root: Path, n: int, seed: int = 0) -> float:
    """n JPEGs of 500x375 under root/train/<class>/, each a different crop of a few large canvases;
    returns the mean file size in bytes."""
    from PIL import Image

    gen = np.random.default_rng(seed)
    canvases = [_texture(gen, 2 * HEIGHT, 2 * WIDTH) for _ in range(4)]
    total = 0
    for i in range(n):
        canvas = canvases[i % len(canvases)]
        top, left = gen.integers(0, HEIGHT), gen.integers(0, WIDTH)
        img = canvas[top:top + HEIGHT, left:left + WIDTH]
        if i % 2:
            img = img[:, ::-1]
        folder = root / "train" / f"c{i % CLASSES:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(img)).save(buf, "JPEG", quality=90)
        (folder / f"{i:06d}.jpg").write_bytes(buf.getvalue())
        total += buf.tell()
    return total / n


def cpu_seconds() -> float:
    """User + system CPU time of this process and every descendant, live or reaped (Ray's workers and the
    DataLoader's workers included)."""
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # gone between the listing and the read: its parent's children_* hold it
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def measure(batches: Callable[[], Iterable[torch.Tensor]],
            cpu_clock: Callable[[], float] = cpu_seconds) -> tuple[float, float, int]:
    """(images/s of wall time, images per CPU-second, images) over one pass."""
    c0, t0, seen = cpu_clock(), time.perf_counter(), 0
    for batch in batches():
        seen += batch.shape[0]
    wall, cpu = time.perf_counter() - t0, cpu_clock() - c0
    return seen / wall, seen / max(cpu, 1e-9), seen


def stream_pass(root: Path, size: int, batch: int, tasks: int, decoder,
                task_images: int) -> Callable[[], Iterable[torch.Tensor]]:
    index = build_index("imagefolder", str(root), "train", size)
    source = StreamSource(index, index, tasks=tasks, decoder=decoder, task_images=task_images,
                          say=lambda _msg: None)
    return lambda: source.epoch(rng.generator("data", 0, epoch=0), batch, 0, 1, 0)


def ray_tasks_pass(root: Path, size: int, batch: int, tasks: int, decoder,
                   task_images: int) -> Callable[[], Iterable[torch.Tensor]]:
    """The stream's batches and decode function on plain Ray tasks, ``tasks`` in flight, results in order."""
    index = build_index("imagefolder", str(root), "train", size)
    decode_task = ray.remote(num_cpus=0)(_decode_block)
    layout = StoreLayout.derived(size)  # the training stream's canvases (data/canvas.py)
    per_task = max(1, -(-task_images // batch))

    def run() -> Iterable[torch.Tensor]:
        perm = torch.randperm(len(index), generator=rng.generator("data", 0, epoch=0))
        blocks = [[index.refs[i] for i in rank_positions(perm, s, batch, 0, 1).tolist()]
                  for s in range(len(index) // batch)]
        todo = iter([{"refs": blocks[i:i + per_task]} for i in range(0, len(blocks), per_task)])
        window = deque(decode_task.remote(group, layout, decoder, False) for group in itertools.islice(todo, tasks))
        while window:
            out = ray.get(window.popleft())
            group = next(todo, None)
            if group is not None:
                window.append(decode_task.remote(group, layout, decoder, False))
            for images in out["images"]:
                yield torch.from_numpy(np.array(images))
    return run


def dataloader_pass(root: Path, size: int, batch: int, workers: int) -> Callable[[], Iterable[torch.Tensor]]:
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    dataset = datasets.ImageFolder(str(root / "train"), transform=transforms.Compose([
        transforms.Resize(size), transforms.CenterCrop(size), transforms.PILToTensor()]))

    def run() -> Iterable[torch.Tensor]:
        for images, _ in DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True):
            yield images
    return run


def decoder_alone(root: Path, size: int, decoder, limit: int = 300) -> Callable[[], Iterable[torch.Tensor]]:
    files = sorted((root / "train").rglob("*.jpg"))[:limit]
    blobs = [f.read_bytes() for f in files]
    return lambda: (decoder(b, size).unsqueeze(0) for b in blobs)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=2000, help="JPEGs to generate and read per pass")
    ap.add_argument("--sizes", default="224,64", help="decoded sides, comma-separated")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tasks", type=int, default=2, help="stream decode tasks in flight (data.stream_tasks)")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                    help="DataLoader num_workers (default: the cores this process may use)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.images < args.batch or min(sizes) < 1 or args.repeats < 1:
        raise SystemExit("--images must be at least --batch, --sizes positive, --repeats at least 1")
    torch.set_num_threads(1)
    cores = len(os.sched_getaffinity(0))
    ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        mean_bytes = write_jpegs(root, args.images)
        print(f"machine: {cpu_model()}, {cores} cores; torch {torch.__version__}, ray {ray.__version__}")
        print(f"{args.images:,} JPEGs of {WIDTH}x{HEIGHT} (mean {mean_bytes / 1024:.0f} KiB) written in "
              f"{time.perf_counter() - t0:.1f} s; batch {args.batch}, {args.tasks} stream decode task(s), "
              f"DataLoader num_workers={args.workers}; best of {args.repeats}")
        before = "stream as it was: full-size, 1 batch/task"
        for size in sizes:
            paths = {
                before: stream_pass(root, size, args.batch, args.tasks, decode_bytes_full, 1),
                "stream, full-size, batched tasks": stream_pass(root, size, args.batch, args.tasks,
                                                                decode_bytes_full, TASK_IMAGES),
                "stream as it is: reduced-scale, batched": stream_pass(root, size, args.batch, args.tasks,
                                                                       decode_bytes, TASK_IMAGES),
                "the same on plain Ray tasks, no Ray Data": ray_tasks_pass(root, size, args.batch, args.tasks,
                                                                           decode_bytes, TASK_IMAGES),
                f"ImageFolder + DataLoader({args.workers} workers)": dataloader_pass(root, size, args.batch,
                                                                                    args.workers),
                "decoder alone, full-size (1 core)": decoder_alone(root, size, decode_bytes_full),
                "decoder alone, reduced-scale (1 core)": decoder_alone(root, size, decode_bytes),
            }
            if size == sizes[0]:
                measure(paths[before])  # Ray's worker processes start: not part of any pass
            best: dict[str, tuple[float, float]] = {}
            for _ in range(args.repeats):
                for name, batches in paths.items():  # the decoder alone: this process's CPU time only
                    wall, per_cpu, _seen = measure(batches, time.process_time if "alone" in name else cpu_seconds)
                    old = best.get(name, (0.0, 0.0))
                    best[name] = (max(old[0], wall), max(old[1], per_cpu))
            base = best[before][1]
            print(f"\ndecoded to {size}x{size}:")
            print(f"{'path':<44} {'img/s':>8} {'img/CPU-s':>10} {'per core vs as it was':>22}")
            for name, (wall, per_cpu) in best.items():
                print(f"{name:<44} {wall:>8.0f} {per_cpu:>10.0f} {per_cpu / base:>21.2f}x")
    ray.shutdown()


if __name__ == "__main__":
    main()
