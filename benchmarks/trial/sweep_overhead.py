"""A study of N trials against the same N trainings run one after another by a shell loop.

    .venv/bin/python benchmarks/trial/sweep_overhead.py [--trials 4] [--preset smoke] [--set key=value ...]

What a researcher would otherwise write is a loop over ``mocolab train``; a
study adds Tune, a parent run, a report and (with ``--workers-per-trial 1``,
the default) Ray Train workers in every trial. Each arm runs in a fresh
folder, one trial at a time, on the same momenta, and its wall time is
taken from outside (interpreter start to exit):

- loop: ``mocolab train --set moco.m=…`` once per momentum (local mode, as a
  user types it);
- study, W = 1: ``experiments/momentum_ablation.py --max-concurrent 1``;
- study, W = 0: the same with ``--workers-per-trial 0``.

Printed: each arm's wall time, per trial, and the study's wall over the loop's.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MOMENTA = ["0", "0.9", "0.99", "0.999", "0.9999", "0.5", "0.8", "0.95"]


def timed(argv: list[str], cwd: str) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=4, help=f"1..{len(MOMENTA)} (default 4)")
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    if not 1 <= args.trials <= len(MOMENTA):
        ap.error(f"--trials: {args.trials} must be in 1..{len(MOMENTA)}")
    momenta = MOMENTA[:args.trials]
    sets = [w for kv in args.set for w in ("--set", kv)]
    bindir = Path(sys.executable).parent
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; preset {args.preset}, "
          f"{args.trials} trials one at a time ({' '.join(args.set) or 'no --set'})")
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        loop = Path(tmp, "loop")
        loop.mkdir()
        walls["loop of mocolab train"] = sum(
            timed([str(bindir / "mocolab"), "train", "--preset", args.preset, "--set", f"moco.m={m}", *sets], str(loop))
            for m in momenta)
        for workers in (1, 0):
            folder = Path(tmp, f"w{workers}")
            folder.mkdir()
            walls[f"study, --workers-per-trial {workers}"] = timed(
                [sys.executable, str(REPO / "experiments" / "momentum_ablation.py"), "--preset", args.preset,
                 "--momenta", ",".join(momenta), "--max-concurrent", "1", "--workers-per-trial", str(workers),
                 *sets], str(folder))
    base = walls["loop of mocolab train"]
    print(f"{'arm':34s} {'wall s':>8s} {'per trial s':>12s} {'over the loop':>14s}")
    for name, wall in walls.items():
        print(f"{name:34s} {wall:8.1f} {wall / args.trials:12.1f} {wall / base:13.2f}x")


if __name__ == "__main__":
    main()
