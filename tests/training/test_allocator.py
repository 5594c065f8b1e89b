"""keep_freed_memory: a tuned training process never page-faults its tensors back in every step.

Measured in fresh interpreters (the setting is process-wide), with the loop
``benchmarks/step/allocator.py`` times: steps that allocate, touch and free 96 MiB
of 24 MiB tensors. Whether an *untuned* interpreter faults depends on where
glibc's small blocks happen to lie (half of them did on dev-2c), a fact about
the machine rather than mocolab, so that side is the benchmark's, not a test's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from mocolab.config.hardware import keep_freed_memory

_spec = importlib.util.spec_from_file_location(
    "allocator_benchmark", Path(__file__).resolve().parents[2] / "benchmarks" / "step" / "allocator.py")
allocator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(allocator)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_a_tuned_interpreter_reuses_freed_tensors_instead_of_faulting_them_in():
    # untuned, half of dev-2c's interpreters fault every step (over allocator.FAULTING faults in the loop);
    # tuned, none may: two fresh interpreters, each under a fiftieth of that
    for run in allocator.faults(["tuned", "tuned"]):
        assert run["tuned"] is True
        assert run["faults"] * 50 < allocator.FAULTING, run


def test_it_is_idempotent():
    first = keep_freed_memory()
    assert keep_freed_memory() is first
