"""Shared fixtures.  Tests use real components: real data files, real torch, no mocks."""

from __future__ import annotations

import os
import socket

import pytest
import torch

# Two cores here: keep each test process to them, and never let a test attach to a user's cluster.
os.environ.pop("RAY_ADDRESS", None)
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session (never a user's cluster), shut down at the end."""
    import ray

    os.environ.pop("RAY_ADDRESS", None)
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "60")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port():
    """A function returning a free TCP port on 127.0.0.1 (for servers a test starts)."""
    return _free_port
