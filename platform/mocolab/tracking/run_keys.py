"""Where each number of a training run goes in MLflow: the model's charts, a tag, or the system metrics.

MLflow's chart view draws every metric key of a run; a researcher reads the curves and the final scores.
So the config's constants (true by construction, not measured) are tags, set once, and the process's own
measures (throughput, memory) carry MLflow's ``system/`` prefix, which the UI charts in its separate System
metrics section. ``run_value`` reads a number wherever it is, and also where a store's runs hold these as
plain metrics (results/runs.db), so every reader sees the same value either way.

These ``system/`` keys are logged at the training step. MLflow's monitor, resumed, continues after the largest
step of any ``system/`` key, so after a restart its samples may skip ahead: a gap in its steps, never an overlap.
"""

from __future__ import annotations

import math
from typing import Mapping

# the config's constants: tags ``mocolab.<key>``, one value a run
CONSTANTS = ("ema_half_life", "max_staleness_bound")
# measures of the process, not of the model: ``system/<key>``
SYSTEM = ("images_per_s", "seconds", "worker_rss_growth_mb", "worker_rss_growth_after_warmup_mb")
SYSTEM_PREFIX = "system/"


def constant_tag(key: str) -> str:
    return f"mocolab.{key}"


def system_key(key: str) -> str:
    return SYSTEM_PREFIX + key


def constant_tags(values: Mapping[str, float]) -> dict[str, str]:
    """The constants as tags; ``repr`` of a float reads back as the same float."""
    return {constant_tag(k): repr(float(v)) for k, v in values.items()}


def for_mlflow(metrics: Mapping[str, float]) -> dict[str, float]:
    """Metrics under their MLflow keys: the constants left out (they are tags), process measures under ``system/``."""
    return {(system_key(k) if k in SYSTEM else k): v for k, v in metrics.items() if k not in CONSTANTS}


def run_value(tags: Mapping[str, str], metrics: Mapping[str, float], key: str) -> float:
    """A run's ``key`` (NaN where it has none): a constant's tag, then the metric under its MLflow key, then
    the plain metric (how a store may hold either)."""
    if key in CONSTANTS and constant_tag(key) in tags:
        try:
            return float(tags[constant_tag(key)])
        except ValueError:
            pass
    if key in SYSTEM and system_key(key) in metrics:
        return metrics[system_key(key)]
    return metrics.get(key, math.nan)
