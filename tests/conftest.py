"""Shared fixtures.  Tests use real components: real data files, real torch, no mocks."""

from __future__ import annotations

import os

import pytest
import torch

# Two cores here: keep each test process to them, and never let a test attach to a user's cluster.
os.environ.pop("RAY_ADDRESS", None)
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
