"""Two training processes on the cores at once: what torch's thread count and CPU affinity do to each.

A laptop sweep runs trials side by side, and a parallel test suite runs tests side by side; each process
sizes its torch (OpenMP) thread pool by the cores it sees.  This measures the same short training run
alone, then two at once with every thread setting a user would meet:

    python benchmarks/trial/oversubscription.py [--steps 60]

Rows: one process alone (all cores); two at once, each with all cores' threads (what unpinned processes do);
two at once with OMP_WAIT_POLICY=PASSIVE; two at once with threads = cores / 2; two at once, each pinned to its
own cores (taskset), which mocolab's thread count follows (config/hardware.usable_cores).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from mocolab.config.hardware import cpu_description

CHILD = """
import time, torch
from mocolab.config import build_config
from mocolab.training.trainer import Trainer
tr = Trainer(build_config("smoke", {{"optim.max_steps": {steps}, "eval.knn_every": 0}}))
t = time.perf_counter(); tr.train_epoch(); print(time.perf_counter() - t)
"""


# every row states its own thread settings: none inherited from the shell (or a test worker's cap)
BASE_ENV = {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", "MOCOLAB_MAX_THREADS", "OMP_WAIT_POLICY")}


def _run(n: int, steps: int, env: dict[str, str] | None = None, cores: list[list[int]] | None = None) -> list[float]:
    procs = []
    for i in range(n):
        pre = ["taskset", "-c", ",".join(map(str, cores[i]))] if cores else []
        procs.append(subprocess.Popen([*pre, sys.executable, "-c", CHILD.format(steps=steps)],
                                      env={**BASE_ENV, **(env or {})}, stdout=subprocess.PIPE, text=True))
    return [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="training steps per process (smoke preset)")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    print(f"machine: {cpu_description()}; smoke preset, "
          f"{args.steps} steps per process; seconds per process, best of {args.repeats}")
    rows = [("1 process, default threads", 1, None, None),
            ("2 at once, default threads", 2, None, None),
            ("2 at once, OMP_WAIT_POLICY=PASSIVE", 2, {"OMP_WAIT_POLICY": "PASSIVE"}, None),
            (f"2 at once, OMP_NUM_THREADS={half}", 2, {"OMP_NUM_THREADS": str(half)}, None),
            ("2 at once, each pinned to its cores", 2, None, [cores[:half], cores[half:2 * half]])]
    alone = None
    for label, n, env, pin in rows:
        best = min((max(_run(n, args.steps, env, pin)) for _ in range(args.repeats)))
        alone = alone or best
        work = n * args.steps / best
        print(f"  {label:<40} {best:6.2f} s   {work / (args.steps / alone):4.2f}x the work of one alone per second")


if __name__ == "__main__":
    main()
