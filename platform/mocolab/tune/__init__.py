"""Ray Tune sweeps: one trial = one Ray Train run; the sweep is an MLflow parent run."""

from .search import SCHEDULERS, SEARCHERS
from .sweep import Sweep, Trial, open_parent, resolve_sweep, run_sweep, sweep_dir, validate_sweep

__all__ = ["SCHEDULERS", "SEARCHERS", "Sweep", "Trial", "open_parent", "resolve_sweep", "run_sweep", "sweep_dir",
           "validate_sweep"]
