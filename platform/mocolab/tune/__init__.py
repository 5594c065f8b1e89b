"""Ray Tune sweeps: one trial = one Ray Train run; the sweep is an MLflow parent run.

What a sweep is (``Sweep``, ``Trial``, ``Launch``) and the search names load without Ray or
MLflow, so a study refuses bad input before either starts; the rest loads
from ``sweep.py`` on first use.
"""

from mocolab.tune.search import SCHEDULERS, SEARCHERS
from mocolab.tune.spec import Launch, Sweep, Trial

_FROM_SWEEP = ("open_parent", "resolve_sweep", "run_sweep", "validate_sweep")

__all__ = ["SCHEDULERS", "SEARCHERS", "Launch", "Sweep", "Trial", *_FROM_SWEEP]


def __getattr__(name: str):
    if name in _FROM_SWEEP:
        from mocolab.tune import sweep

        return getattr(sweep, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
