"""Page faults per training-like step with and without ``hardware.keep_freed_memory``.

Whether glibc hands the freed top of the heap back to the kernel (and a step
then faults its activations in again) depends on where the interpreter's own
small blocks happen to lie: on dev-2c, 7 of 14 fresh interpreters faulted
every step and 7 never did. That is a fact about the machine's allocator, not
something mocolab can break, so it is measured here rather than asserted in a
test; ``tests/training/test_allocator.py`` asserts only mocolab's side (a tuned
interpreter never faults).

The same loop of steps that allocate, touch and free 96 MiB of 24 MiB
tensors runs in fresh interpreters, as many at once as there are cores.

    .venv/bin/python benchmarks/step/allocator.py [--interpreters 14]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

LOOP = """
import json, resource, sys, torch
from mocolab.config.hardware import keep_freed_memory
tuned = keep_freed_memory() if sys.argv[1] == "tuned" else False
def step():  # as a training step does: several activations alive at once (4 x 24 MiB), then all freed
    alive = [torch.ones(6 << 20) for _ in range(4)]
    del alive
for _ in range(10):  # warm: the heap grows to its working size once
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(json.dumps({"tuned": tuned, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""
STEPS = 20
# glibc trimming the freed top every step: at least one fault per 64 KiB touched
FAULTING = STEPS * (96 << 20) // (64 << 10)


def faults(modes: list[str]) -> list[dict]:
    """The loop in one fresh interpreter per mode (faults are per process), as many at once as there are cores."""
    def one(mode: str) -> dict:
        run = subprocess.run([sys.executable, "-c", LOOP, mode], capture_output=True, text=True, timeout=300,
                             check=True)
        return json.loads(run.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(one, modes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interpreters", type=int, default=14, help="fresh interpreters per side (default 14)")
    args = parser.parse_args()
    if args.interpreters < 1:
        parser.error(f"--interpreters: {args.interpreters} must be >= 1")
    for mode in ("default", "tuned"):
        runs = [r["faults"] / STEPS for r in faults([mode] * args.interpreters)]
        faulting = sum(f * STEPS > FAULTING for f in runs)
        print(f"{mode:8s} {faulting:2d} of {len(runs)} interpreters fault every step; minor faults per step: "
              f"min {min(runs):.0f}, median {statistics.median(runs):.0f}, max {max(runs):.0f}")


if __name__ == "__main__":
    main()
