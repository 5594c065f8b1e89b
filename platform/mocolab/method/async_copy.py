"""Host-to-device copies that never make the host wait.

A step's small host tensors (crop boxes, a shuffle's permutation, the slots a queue writes, the loader's
image indices) reach the device here.  From pageable memory a CUDA copy blocks until the stream has run
everything queued before it (the previous step's optimizer included), so the host could never run ahead of
the GPU; from pinned memory with ``non_blocking`` it is queued like a kernel.  On the CPU (and on ``meta``,
where the tests simulate a GPU) the tensor is returned as the copy would be, without pinning: pinning needs
a CUDA driver.
"""

from __future__ import annotations

import torch

__all__ = ["to_device"]


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``, copied asynchronously where the copy crosses from the host to a GPU."""
    device = torch.device(device)
    if t.device == device or (device.type == "cpu" and t.device.type == "cpu"):
        return t
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
