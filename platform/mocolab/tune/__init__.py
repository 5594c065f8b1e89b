"""Ray Tune sweeps: one trial = one Ray Train run; the sweep is an MLflow parent run."""

from .sweep import ParentRun, Sweep, Trial, run_sweep, validate_sweep

__all__ = ["ParentRun", "Sweep", "Trial", "run_sweep", "validate_sweep"]
