"""How close the training step comes to what the CPU can do: achieved GFLOP/s against measured matmul peak.

    .venv/bin/python benchmarks/step/roofline.py [--threads 2] [--steps 20] [--preset cpu-quick]

Counts the floating-point operations of one real ``Trainer.train_step``
(query forward and backward, key forward, logits against the K negatives;
the matmuls and convolutions, as torch's FlopCounterMode counts them, one
multiply-add = 2 FLOPs), times the step, and divides. The peak is a dense
square matmul (torch.mm, n = 2048) on the same threads, in fp32 and in bf16.
Prints both fractions, for fp32 encoders and for bf16 encoders. Where the CPU
has no native bf16 (no AVX-512 BF16 or AMX: ``run.precision=auto`` trains in
fp32 there) bf16 is emulated: slower than fp32 (the smoke run of the suite took
276 s instead of 14 s) and a figure no run trains at, so it is left out, saying
so; ``--emulated-bf16`` measures it anyway.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch
from _steps import held_batches, timed_steps
from torch.utils.flop_counter import FlopCounterMode

from mocolab.config import build_config
from mocolab.config.hardware import resolve_precision
from mocolab.training.trainer import Trainer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def matmul_peak(dtype: torch.dtype, n: int = 2048, seconds: float = 3.0) -> float:
    """GFLOP/s of torch.mm on n×n matrices of ``dtype`` (the best of repeated timings)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    for _ in range(3):
        torch.mm(a, b)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0) / 1e9)
    return best


def step_figures(preset: str, precision: str, steps: int, warmup: int) -> tuple[float, float, str]:
    """(FLOPs of one step, steps/s, what ran) for the preset's real step at ``precision``."""
    tr = Trainer(build_config(preset, {"run.precision": precision}))
    data = held_batches(tr, warmup + steps + 1)
    with torch.random.fork_rng(devices=[]):
        for images, index in data[:warmup]:
            tr.train_step(images, index, tr.schedule.momentum(tr.step))
        counter = FlopCounterMode(display=False)
        with counter:
            tr.train_step(*data[warmup], tr.schedule.momentum(tr.step))
    flops = counter.get_total_flops()
    rate = timed_steps(tr, data[warmup + 1:], 0) / tr.batch
    return flops, rate, f"batch {tr.batch}, {'bf16' if tr.precision is not None else 'fp32'} encoders"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu-quick")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--emulated-bf16", action="store_true", help="measure bf16 where the CPU only emulates it")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; preset {args.preset}")
    precisions = ["fp32"]
    if args.emulated_bf16 or resolve_precision("auto", torch.device("cpu")) == torch.bfloat16:
        precisions.append("bf16")
    else:
        print("bf16: not measured, this CPU has no native bf16 (run.precision=auto trains in fp32 here); "
              "--emulated-bf16 measures it anyway")
    peaks = {name: matmul_peak(DTYPES[name]) for name in precisions}
    for name, gflops in peaks.items():
        print(f"dense matmul peak ({name}, n=2048): {gflops:7.1f} GFLOP/s")
    for precision in precisions:
        flops, rate, what = step_figures(args.preset, precision, args.steps, args.warmup)
        achieved = flops * rate / 1e9
        print(f"training step, {what}: {flops / 1e9:.2f} GFLOP per step, {rate:.2f} steps/s -> {achieved:6.1f} "
              f"GFLOP/s = {100 * achieved / peaks[precision]:.0f}% of the {precision} matmul peak")


if __name__ == "__main__":
    main()
