"""Trials whose process was lost under them, told apart from trials that failed.

A grid trial runs in a Tune actor (its driver) that starts the trial's Ray
Train run. When the node holding that actor dies, or the process is killed,
Ray Train's own restarts cannot help: they restart workers, and it is their
controller that is gone. Tune then records the trial as errored with Ray's
error for a lost actor, not with an exception the training raised. Such a
trial is what running the same command again is for, and the sweep does that
itself: the trial's checkpoint and MLflow run are where it left them.
"""

from __future__ import annotations

from typing import Any

from ray.exceptions import (LocalRayletDiedError, NodeDiedError, OwnerDiedError, RayActorError, RayTaskError,
                            WorkerCrashedError)

LOST = (RayActorError, NodeDiedError, WorkerCrashedError, OwnerDiedError, LocalRayletDiedError)


def is_lost_process(err: BaseException | None) -> bool:
    """Whether ``err`` says the trial's process (or the Train controller it waited on) died, rather than
    that the training raised: Ray's error itself, or one the trial's function got and passed on. A run
    whose Ray Train restarts were used up fails with Ray Train's error and is not run again."""
    return isinstance(_cause(err), LOST)


def _cause(err: BaseException | None) -> BaseException | None:
    """What a trial's function raised, without Ray's RayTaskError around it."""
    return err.cause if isinstance(err, RayTaskError) and err.cause is not None else err


def _grid_label(result: Any) -> str | None:
    """The label of a grid's trial (a Tune Result); None for a search's, which Tune's config does not hold."""
    return ((result.config or {}).get("trial") or {}).get("label")


def lost_trials(grid: Any) -> list[str]:
    """Labels of a grid's trials (a Tune ResultGrid) that ended because their process was lost."""
    if grid is None:
        return []
    return [label for r in grid if (label := _grid_label(r)) and r.error is not None and is_lost_process(r.error)]


def unrecorded_errors(grid: Any, recorded: set[str]) -> list[str]:
    """``label: error`` for each grid trial Tune records as errored whose MLflow run does not exist (in
    ``recorded``, the labels of the sweep's child runs): it failed before its run was created (its
    process could not start, its name was in use), so MLflow alone cannot tell the sweep it did not run.
    A search's trials are labelled by Tune's trial id inside the trial: the sweep counts those instead."""
    if grid is None:
        return []
    out = []
    for r in grid:
        label = _grid_label(r)
        if r.error is None or label is None or label in recorded:
            continue
        err = _cause(r.error)
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        out.append(f"{label}: {type(err).__name__}: {lines[-1].strip() if lines else ''}".rstrip(": "))
    return out
