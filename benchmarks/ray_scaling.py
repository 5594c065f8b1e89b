"""W = 1 against W = 2 Ray Train workers on this machine, for the cpu-quick step.

    .venv/bin/python benchmarks/ray_scaling.py [--steps 60] [--preset cpu-quick]

Each configuration trains ``--steps`` steps through ``mocolab.training.fit``
(real Ray workers, gloo) without MLflow, and prints the training images/s
that the loop measured (kNN and the probe are not timed) and the ratio.
Ray start-up is excluded from images/s but printed as wall time.
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile
import time

import torch

from mocolab.config import build_config
from mocolab.training import fit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu-quick")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores; preset {args.preset}; {args.steps} steps per run")
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers, bn in ((1, "split"), (2, "shuffle"), (2, "split")):
            cfg = build_config(args.preset, {
                "run.num_workers": workers, "moco.bn": bn, "optim.max_steps": args.steps,
                "eval.knn_every": 0, "eval.knn_bank": 1000, "eval.knn_test": 1000,
                "eval.linear_train": 1000, "eval.linear_steps": 5,
                "run.output_dir": tmp, "run.name": f"scale-w{workers}-{bn}"})
            t0 = time.perf_counter()
            fit(cfg, log_to_mlflow=False, progress=lambda _m: None)
            wall = time.perf_counter() - t0
            # the last epoch record's images/s is in the checkpoint; read it back
            path = sorted(glob.glob(f"{tmp}/scale-w{workers}-{bn}/checkpoint_*/rank0.pt"))[-1]
            hist = torch.load(path, weights_only=True)["state"]["history"]
            rec = hist[-1]["images_per_s"]
            rates[(workers, bn)] = rec
            print(f"W={workers} bn={bn:8s} {rec:8.0f} images/s   (wall {wall:.0f} s incl. Ray start and eval)")
    base = rates[(1, "split")]
    for key, r in rates.items():
        print(f"ratio W={key[0]} bn={key[1]} / W=1: {r / base:.2f}")


if __name__ == "__main__":
    main()
