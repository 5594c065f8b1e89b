"""How often a run keeps its per-step metrics (m, step loss, pretext accuracy, first-layer gradient norm).

Each kept step is a row per series in the MLflow store, and a chart draws a few hundred points per series
anyway: a default of every step would put a million-step run's million points per series into the store
(and, for the reproduction's committed store, into git). ``run.step_metrics_every = 0``, the default, keeps
at most ``STEP_POINTS`` points per series over the run; N >= 1, given, is every N-th step, as given.
"""

from __future__ import annotations

STEP_POINTS = 250  # per-step points per series a run keeps at most by default: what a chart draws


def step_metrics_interval(every: int, total_steps: int, points: int = STEP_POINTS) -> int:
    """The interval in steps at which the trainer keeps per-step metrics: ``every`` when given (>= 1), else
    the smallest one that keeps ``total_steps`` within ``points`` points (every step for a short run)."""
    if every < 0 or total_steps < 0 or points < 1:
        raise ValueError(f"run.step_metrics_every: {every} over {total_steps} steps; allowed: an integer >= 0 "
                         f"(0: at most {points} points a run)")
    if every:
        return every
    return total_steps // (points + 1) + 1  # steps kept: total // interval, the first interval within points
