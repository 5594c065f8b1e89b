"""Evaluation features at several batch sizes, alternated in one process: what ``extract_features`` batches by.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/evaluation/feature_batch.py [--preset cpu-quick]
        [--images 10000] [--repeats 4]

The encoder at initialisation, the test split's first ``--images`` images, at the run's precision, one
pass per batch size in turn, ``--repeats`` times; the median seconds per pass. A batch whose activations
outgrow the caches is slower per image, whatever the arithmetic says.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _machine import machine

from mocolab.config import build_config, parse_overrides
from mocolab.evaluation.scoring import extract_features
from mocolab.training.trainer import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu-quick")
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--batches", default="1024,256,128")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.images < 1 or args.repeats < 1 or min(batches) < 1:
        ap.error("--images, --repeats and every batch size must be >= 1")
    tr = Trainer(build_config(args.preset, parse_overrides(args.set)))
    images = next(iter(tr.data.eval_split("test", args.images)))[0][:args.images]
    print(machine(args.preset) + f", {len(images):,} images, {'bf16' if tr.precision else 'fp32'}")
    seconds: dict[int, list[float]] = {b: [] for b in batches}
    for _ in range(args.repeats):
        for b in batches:
            t0 = time.perf_counter()
            extract_features(tr.encoder.backbone, images, tr.device, batch_size=b, dtype=tr.precision)
            seconds[b].append(time.perf_counter() - t0)
    base = statistics.median(seconds[batches[0]])
    print(f"{'batch':>6s} {'median s':>9s} {'images/s':>9s} {f'vs {batches[0]}':>8s}")
    for b, s in seconds.items():
        m = statistics.median(s)
        print(f"{b:6d} {m:9.2f} {len(images) / m:9.0f} {base / m:7.2f}x")


if __name__ == "__main__":
    main()
