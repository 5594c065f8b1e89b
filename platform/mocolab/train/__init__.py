"""Ray Train: one MoCo run on W workers (or in this process), with checkpoints and restarts."""

from .launch import TrainOutcome, fit

__all__ = ["TrainOutcome", "fit"]
