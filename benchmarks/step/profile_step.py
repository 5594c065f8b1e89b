"""Where a cpu-quick training step spends its time: torch.profiler over real steps, the top ops by self time.

    .venv/bin/python benchmarks/step/profile_step.py [--steps 5] [--set run.precision=fp32]
"""

from __future__ import annotations

import argparse

import torch
from _steps import held_batches
from torch.profiler import ProfilerActivity, profile

from mocolab.config import build_config
from mocolab.training.trainer import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tr = Trainer(build_config("cpu-quick", args.set))
    data = held_batches(tr, args.warmup + args.steps)
    with torch.random.fork_rng(devices=[]):
        for images, index in data[:args.warmup]:
            tr.train_step(images, index, tr.schedule.momentum(tr.step))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for images, index in data[args.warmup:]:
                tr.train_step(images, index, tr.schedule.momentum(tr.step))
    print(f"{args.steps} steps, batch {tr.batch}, {'bf16' if tr.precision is not None else 'fp32'} encoders, "
          f"{torch.get_num_threads()} threads")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
