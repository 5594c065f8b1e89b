"""What the online linear probe costs a cpu-quick step: the time spent in its hooks (the features kept, the
head's forward, backward and Adam step) as a share of the steps that carry it, measured inside one process
so that the machine's load hits both alike.  Its epoch-end score reads features the kNN monitor embeds anyway.

    .venv/bin/python benchmarks/step/online_probe_cost.py [--steps 20] [--set run.precision=fp32]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from _steps import held_batches

from mocolab.config import build_config
from mocolab.config.hardware import cpu_description, keep_freed_memory
from mocolab.training.trainer import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    tr = Trainer(build_config("cpu-quick", args.set))
    probe = tr.online
    spent = [0.0]

    def timed(fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0
        return wrapper

    probe.before_step, probe.after_forward, probe._keep = (timed(probe.before_step), timed(probe.after_forward),
                                                           timed(probe._keep))
    batches = held_batches(tr, args.warmup + args.steps)
    for i, (images, index) in enumerate(batches):
        if i == args.warmup:
            spent[0], t0 = 0.0, time.perf_counter()
        tr.train_step(images, index, tr.schedule.momentum(tr.step))
    total = time.perf_counter() - t0
    print(f"{cpu_description()}, torch {torch.__version__}, Python {platform.python_version()}")
    print(f"cpu-quick step ({'bf16' if tr.precision else 'fp32'} encoders, batch {tr.batch}): "
          f"{1000 * total / args.steps:.0f} ms; the online probe's hooks {1000 * spent[0] / args.steps:.2f} ms "
          f"= {100 * spent[0] / total:.2f} % of it")


if __name__ == "__main__":
    main()
