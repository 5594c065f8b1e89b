"""Images/s of the streaming loader (Ray Data) against the in-memory one, on the same generated ImageFolder.

    .venv/bin/python benchmarks/data/data_loading.py [--images 10000] [--size 64] [--tasks 2] [--epochs 2]

Both loaders hand one rank (W = 1) the same batches in the same order. The
in-memory loader pays its decoding once, up front (reported separately); the
streaming loader decodes every epoch in Ray Data tasks. Loader throughput only,
no training step: what the loader can feed. One process, one run, so compare
the ratio, not the absolute figures, across machines.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import ray
import torch

from mocolab.method import rng
from mocolab.data.sets import _synthetic, load_dataset
from mocolab.data.image_index import build_index, write_imagefolder
from mocolab.data.sources import MemorySource
from mocolab.training.stream import StreamSource


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--size", type=int, default=64, help="image side, on disk and decoded")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--tasks", type=int, default=2, help="decode tasks in flight (data.stream_tasks)")
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "folder"
        t0 = time.perf_counter()
        train, test = _synthetic(args.images, args.size, 0), _synthetic(256, args.size, 1)
        write_imagefolder(train.images, train.labels, root, "train")
        write_imagefolder(test.images, test.labels, root, "val")
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, ray {ray.__version__}")
        print(f"{args.images:,} JPEGs of {args.size}x{args.size} written in {time.perf_counter() - t0:.1f} s; "
              f"batch {args.batch}, {args.tasks} decode task(s)")

        t0 = time.perf_counter()
        memory = MemorySource(load_dataset("imagefolder", "train", root, image_size=args.size),
                              load_dataset("imagefolder", "test", root, image_size=args.size))
        decode_s = time.perf_counter() - t0
        stream = StreamSource(build_index("imagefolder", str(root), "train", args.size),
                              build_index("imagefolder", str(root), "test", args.size), tasks=args.tasks)
        rates = {}
        for name, source in (("memory", memory), ("stream", stream)):
            seen, t0 = 0, time.perf_counter()
            for epoch in range(args.epochs):
                for batch in source.epoch(rng.generator("data", 0, epoch=epoch), args.batch, 0, 1, 0):
                    seen += batch.shape[0]
            rates[name] = seen / (time.perf_counter() - t0)
        print(f"in memory: decode once {args.images / decode_s:,.0f} img/s ({decode_s:.1f} s), "
              f"then {rates['memory']:,.0f} img/s per epoch")
        print(f"streamed:  {rates['stream']:,.0f} img/s per epoch (decoding every epoch)")
        print(f"ratio streamed / in-memory decode: {rates['stream'] / (args.images / decode_s):.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
