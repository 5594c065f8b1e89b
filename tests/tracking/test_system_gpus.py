"""Each run's MLflow system metrics cover the GPUs Ray gave it, read from CUDA_VISIBLE_DEVICES as CUDA reads it
(the monitor itself needs NVML and a GPU; which devices it keeps is decided here, on any machine)."""

from __future__ import annotations

import pytest

from mocolab.tracking.system import given_gpus


@pytest.mark.parametrize("visible, count, expected", [
    (None, 4, None),  # outside Ray, nothing set: the node's every GPU (a run that owns the machine)
    ("", 4, []),  # Ray gave this process no GPU: log none
    ("2", 4, [2]),  # a trial on the node's third GPU logs it alone, as its gpu_0
    ("3,1", 4, [3, 1]),  # in CUDA's order: gpu_0 is the process's cuda:0
    ("1, 1", 4, [1]),
    ("0,7,1", 4, [0]),  # CUDA stops at the first device that does not exist
    ("-1,0", 4, []),
    ("GPU-8f6c1a2e-0000-0000-0000-000000000000,2", 4, ["GPU-8f6c1a2e-0000-0000-0000-000000000000", 2]),
    ("MIG-1b2c3d4e-0000-0000-0000-000000000000", 1, ["MIG-1b2c3d4e-0000-0000-0000-000000000000"]),
])
def test_a_run_logs_only_the_gpus_it_was_given(visible, count, expected):
    assert given_gpus(visible, count) == expected
