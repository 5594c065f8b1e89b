"""Learning-rate schedules over training steps (``optim.schedule``)."""

from __future__ import annotations

import math

LR_SCHEDULES = ("cosine", "constant")


def lr_at(schedule: str, base_lr: float, step: int, total_steps: int) -> float:
    """cosine: half a cosine from ``base_lr`` at step 0 to 0 at ``total_steps`` (MoCo v2); constant: ``base_lr``."""
    if schedule == "constant":
        return base_lr
    if schedule == "cosine":
        return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(1, total_steps)))
    raise ValueError(f"optim.schedule: unknown value {schedule!r}; choose one of {list(LR_SCHEDULES)}")
