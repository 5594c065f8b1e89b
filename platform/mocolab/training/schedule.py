"""Schedules over training steps: the learning rate (``optim.schedule``, ``optim.warmup_epochs``) and the
key encoder's momentum (``moco.m_schedule``)."""

from __future__ import annotations

import math

from mocolab.config.choices import (LR_SCHEDULES, M_SCHEDULES)  # noqa: F401  (optim.schedule, moco.m_schedule: config/choices.py)


def lr_at(schedule: str, base_lr: float, step: int, total_steps: int, warmup_steps: int = 0) -> float:
    """cosine: half a cosine from ``base_lr`` to 0 at ``total_steps`` (MoCo v2); constant: ``base_lr``.

    With ``warmup_steps`` the rate first rises linearly from 0 (MoCo v3's ViT recipe) and the cosine
    spans the remaining steps.
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"optim.schedule: unknown value {schedule!r}; choose one of {list(LR_SCHEDULES)}")
    if step < warmup_steps:
        return base_lr * step / warmup_steps
    if schedule == "constant":
        return base_lr
    span = max(1, total_steps - warmup_steps)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(step - warmup_steps, span) / span))


def momentum_at(schedule: str, base_m: float, step: int, total_steps: int) -> float:
    """The key encoder's momentum at ``step``: constant ``base_m``, or (cosine) rising from ``base_m`` at
    step 0 to 1 at ``total_steps``: m = 1 − (1 − m₀)·(1 + cos(π·t/T))/2, MoCo v3's (and BYOL's) schedule."""
    if schedule == "constant":
        return base_m
    if schedule == "cosine":
        t = min(step, total_steps) / max(1, total_steps)
        return 1.0 - (1.0 - base_m) * 0.5 * (1.0 + math.cos(math.pi * t))
    raise ValueError(f"moco.m_schedule: unknown value {schedule!r}; choose one of {list(M_SCHEDULES)}")
