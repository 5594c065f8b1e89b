"""Ray Tune's search algorithms and schedulers, built from names a study script gives.

A study says ``search="optuna"``, ``scheduler="asha"``, the metric and the
budget; the Ray objects are built here, so no study imports Ray and every
choice is validated (with the allowed values named) before a trial starts.
"""

from __future__ import annotations

from typing import Any, Mapping

from mocolab.config.choices import MODES, SCHEDULERS, SEARCHERS  # noqa: F401  (re-exported: config/choices.py)


def check_search(search: str, scheduler: str, metric: str, mode: str) -> None:
    if search not in SEARCHERS:
        raise ValueError(f"search: unknown value {search!r}; choose one of {list(SEARCHERS)}")
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler: unknown value {scheduler!r}; choose one of {list(SCHEDULERS)}")
    if search == "grid" and scheduler != "fifo":  # a grid's trials are its points: none is stopped or chosen
        raise ValueError(f"--scheduler {scheduler}: stops a search's poor trials early, and --search grid runs "
                         f"every point to its end; use --search random or optuna with --scheduler {scheduler}, "
                         f"or drop --scheduler")
    if mode not in MODES:
        raise ValueError(f"mode: unknown value {mode!r}; choose one of {list(MODES)}")
    if not metric:
        raise ValueError("metric: a search needs the name of the metric it optimises, e.g. knn_top1")


def tune_space(space: Mapping[str, list[Any]]) -> dict[str, Any]:
    """``{"queue.size": [256, 512]}`` -> Tune's categorical domains (``tune.choice``)."""
    from ray import tune

    return {key: tune.choice(list(values)) for key, values in space.items()}


def build_searcher(search: str, metric: str, mode: str, seed: int) -> Any:
    """None for grid and random (Tune's own variant generator samples the space)."""
    if search == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(metric=metric, mode=mode, seed=seed)
    return None


def build_scheduler(scheduler: str, metric: str, mode: str, max_epochs: int) -> Any:
    """ASHA over epochs (a trial reports ``epoch`` with every result); None for fifo."""
    if scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        return ASHAScheduler(metric=metric, mode=mode, time_attr="epoch", max_t=max_epochs, grace_period=1)
    return None
