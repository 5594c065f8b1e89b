"""keep_freed_memory: a training process stops page-faulting its tensors back in every step.

Measured in fresh interpreters (the setting is process-wide): the same loop
of "steps" that allocate, touch and free 96 MiB of 24 MiB tensors, with and
without it. One tensor at a time would not show it: glibc's dynamic threshold
then keeps a single block.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mocolab.hardware import keep_freed_memory

LOOP = """
import json, resource, sys, torch
from mocolab.hardware import keep_freed_memory
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


def _faults(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", LOOP, mode], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_freed_tensors_are_reused_instead_of_faulted_in_again():
    default, tuned = _faults("default"), _faults("tuned")
    assert tuned["tuned"] is True
    # glibc as it is: fresh mappings each time, at least one fault per 64 KiB touched (the kernel may map
    # several pages a fault); with the setting: the same heap memory again, nearly no faults
    assert default["faults"] > 20 * (96 << 20) // (64 << 10)
    assert tuned["faults"] * 50 < default["faults"]


def test_it_is_idempotent():
    first = keep_freed_memory()
    assert keep_freed_memory() is first
