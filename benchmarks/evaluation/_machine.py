"""The line the evaluation benchmarks print first: the machine and torch build their figures come from, since
an evaluation's time depends on the CPU's vector extensions and the thread count as much as on the code."""

from __future__ import annotations

import os
import platform

import torch


def machine(preset: str) -> str:
    """``machine: <cpu>, <n> cores, torch <version> (<capability>), <threads> threads; preset <preset>``."""
    return (f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads; preset {preset}")
