"""Where a trial's wall time goes: training against everything else (start-up, monitors, evaluation, logging).

    .venv/bin/python benchmarks/trial/trial_overhead.py [--preset cpu-quick] [--steps 40] [--set key=value ...]

A researcher waits for the whole trial; only its training steps are the
experiment. Each part is timed on its own, in this process, with the trial's
own configuration:

- start-up: a fresh interpreter importing what a trial imports, Ray's start
  and the MLflow run, from ``fit()`` of the same configuration cut to one step
  with a one-image evaluation (its wall time less that step);
- data: building the Trainer (decoding the data set, the models);
- training: ``--steps`` steps after a warm-up, times the preset's steps;
- kNN monitor: one ``Evaluation.knn()`` times the epochs that run one;
- final evaluation: feature extraction, kNN and the linear probe, each timed.

The training time is extrapolated from the timed steps (said in the output);
everything else is measured once, as a trial runs it.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch

from mocolab.config import build_config, parse_overrides
from mocolab.evaluation.knn import knn_accuracy
from mocolab.evaluation.probe import linear_probe
from mocolab.config.hardware import keep_freed_memory
from mocolab.training.trainer import Trainer


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def startup_seconds(preset: str, overrides: dict) -> tuple[float, float]:
    """(fresh interpreter import, fit() of one step less that step) for the trial's configuration."""
    t_import = float(subprocess.run([sys.executable, "-c", "import time; t = time.perf_counter(); "
                                     "import mocolab.training, mocolab.tracking; print(time.perf_counter() - t)"],
                                    capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    from mocolab.training import fit

    with tempfile.TemporaryDirectory() as tmp:
        cfg = build_config(preset, {**overrides, "optim.max_steps": 1, "eval.knn_every": 0, "eval.knn_bank": 64,
                                    "eval.knn_test": 64, "eval.linear_train": 64, "eval.linear_steps": 1,
                                    "eval.drift_probes": 0, "run.output_dir": f"{tmp}/runs",
                                    "run.name": "overhead-startup", "run.experiment": "overhead"})
        seconds, _ = timed(lambda: fit(cfg, tracking_uri=f"sqlite:///{tmp}/mlflow.db", progress=lambda _m: None))
    return t_import, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu-quick")
    ap.add_argument("--steps", type=int, default=40, help="training steps timed (after --warmup)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    overrides = parse_overrides(args.set)
    cfg = build_config(args.preset, overrides)
    keep_freed_memory()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads; preset {args.preset}")
    parts: dict[str, float] = {}
    parts["start-up: imports"], parts["start-up: Ray, MLflow, one-step fit"] = startup_seconds(args.preset, overrides)
    parts["data and models"], tr = timed(lambda: Trainer(cfg))
    total = tr.schedule.total_steps
    for _ in range(args.warmup):
        images = next(iter(tr.data.epoch(tr.epoch_order(0), tr.batch, tr.rank, tr.world_size, 0)))
        tr.train_step(images, None, tr.schedule.momentum(tr.step))
    batches = tr.data.epoch(tr.epoch_order(1), tr.batch, tr.rank, tr.world_size, 0)
    t0 = time.perf_counter()
    done = 0
    for images in batches:
        tr.train_step(images, None, tr.schedule.momentum(tr.step))
        done += 1
        if done == args.steps:
            break
    per_step = (time.perf_counter() - t0) / done
    parts["training"] = per_step * total
    e = cfg.eval
    monitors = (cfg.optim.epochs - 1) // e.knn_every if e.knn_every else 0  # the last epoch's comes with the probe
    knn_s, _ = timed(tr.evaluation.knn)
    parts[f"kNN monitor ({monitors}x)"] = knn_s * monitors
    n_bank = min(e.knn_bank or tr.data.size, tr.data.size)
    n_lin = min(e.linear_train or tr.data.size, tr.data.size)
    feat_s, (f_train, l_train) = timed(lambda: tr.evaluation.split_features("train", max(n_bank, n_lin)))
    test_s, (f_test, l_test) = timed(lambda: tr.evaluation.split_features("test", None))
    parts["final: features"] = feat_s + test_s
    n_test = min(e.knn_test or len(l_test), len(l_test))
    parts["final: kNN"], _ = timed(lambda: knn_accuracy(f_train[:n_bank], l_train[:n_bank], f_test[:n_test],
                                                        l_test[:n_test], tr.data.classes, e.knn_k, e.knn_t))
    parts["final: linear probe"], probe = timed(lambda: linear_probe(
        f_train[:n_lin], l_train[:n_lin], f_test, l_test, tr.data.classes, weight_decay=e.linear_wd,
        steps=e.linear_steps))
    wall = sum(parts.values())
    print(f"training: {per_step * 1000:.0f} ms a step over {done} steps, times {total} steps (extrapolated)")
    print(f"{'part':40s} {'seconds':>8s} {'share':>6s}")
    for name, seconds in parts.items():
        print(f"{name:40s} {seconds:8.1f} {100 * seconds / wall:5.1f}%")
    print(f"{'trial':40s} {wall:8.1f}  not training: {100 * (1 - parts['training'] / wall):.1f}%  "
          f"(probe test top-1 {100 * probe.test_top1:.2f}% on features of {done + args.warmup} steps)")


if __name__ == "__main__":
    main()
