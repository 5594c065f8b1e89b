"""Training and augmentation throughput of the cpu-quick step, on this machine.

    .venv/bin/python benchmarks/step/throughput.py [--steps 30] [--threads 0] [--set key=value ...]

Prints images/s for (a) the two-view augmentation alone and (b) whole MoCo
training steps (augmentation + query forward/backward + key forward + queue;
with ``--preset vit-quick``, MoCo v3's step: both views through both encoders),
with the core and thread counts, so figures from different machines can be
compared as ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from mocolab.config import build_config
from mocolab.training.trainer import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu-quick")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = build_config(args.preset, args.set)
    tr = Trainer(cfg)
    b = tr.batch
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads, device {tr.device}")
    if cfg.is_vit:
        net = tr.encoder.backbone
        model = (f"{cfg.model.backbone} ({len(net.blocks)} blocks, width {net.out_dim}, "
                 f"{net.patch_size}x{net.patch_size} patches, {net.grid ** 2 + 1} tokens)")
    else:
        model = f"{cfg.model.backbone} width {cfg.model.width}"
    dictionary = ("no queue (v3: both views through both encoders)" if cfg.moco.version == "v3"
                  else f"K {cfg.queue.size}")
    print(f"preset {args.preset}: MoCo {cfg.moco.version}, {model}, batch {b}, {dictionary}, "
          f"augment {cfg.augment.preset}, {'bf16' if tr.precision else 'fp32'} encoders")

    batches = tr.data.epoch(torch.Generator().manual_seed(0), b, rank=0, world_size=1, start_step=0)
    images = [next(batches) for _ in range(args.warmup + args.steps)]

    for x in images[:args.warmup]:
        tr.augment(x)
    t0 = time.perf_counter()
    for x in images[args.warmup:]:
        tr.augment(x)
    aug = args.steps * b / (time.perf_counter() - t0)
    print(f"augmentation (two views): {aug:8.0f} images/s")

    tr.schedule.total_steps = 10**9  # no schedule end inside the benchmark
    tr.model.train()
    for x in images[:args.warmup]:
        tr.train_step(x, None, tr.schedule.momentum(tr.step))  # the trainer's own step: what a run does, nothing else
    t0 = time.perf_counter()
    for x in images[args.warmup:]:
        tr.train_step(x, None, tr.schedule.momentum(tr.step))
    dt = time.perf_counter() - t0
    print(f"training step:            {args.steps * b / dt:8.0f} images/s  ({1000 * dt / args.steps:.0f} ms/step)")
    print(f"augmentation share of a step: {100 * (args.steps * b / aug) / dt:.0f}%")


if __name__ == "__main__":
    main()
