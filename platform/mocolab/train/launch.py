"""Driver side of a training run: validate, open the MLflow run, start Ray Train, close the run.

``fit`` is what ``mocolab train`` and every sweep trial call.  W = 0 is Ray
Train's local mode (the loop runs in this process); W >= 1 are Ray workers
with a gloo (CPU) or NCCL (GPU) process group.  The run's name fixes its
storage folder, so running the same name again resumes from its latest
checkpoint and continues the same MLflow run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import Config, validate
from ..tracking import RunTracker, check_tracking_uri, resolve_tracking_uri


@dataclass
class TrainOutcome:
    run_name: str
    mlflow_run_id: str | None
    status: str  # finished | diverged
    linear_top1: float | None
    knn_top1: float | None
    final_loss: float | None
    steps: int
    resumed: bool
    checkpoint_path: str | None


def ensure_ray(num_cpus: int | None = None) -> None:
    """Join $RAY_ADDRESS when set, else start a local Ray (no dashboard: nothing listens for strangers)."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False)


def fit(cfg: Config, *, tracking_uri: str | None = None, parent_run_id: str | None = None,
        tags: dict[str, str] | None = None, display_name: str | None = None, log_to_mlflow: bool = True,
        progress: Callable[[str], None] = print, callbacks: list | None = None) -> TrainOutcome:
    """Train one model to the end (or resume it) and return its outcome.

    ``callbacks`` go to Ray Train's RunConfig: a sweep passes Tune's
    ``TuneReportCallback`` so each epoch's metrics reach the scheduler.
    """
    validate(cfg)
    uri = resolve_tracking_uri(tracking_uri)
    if log_to_mlflow:
        check_tracking_uri(uri)
    name = cfg.run_name
    storage = Path(cfg.run.output_dir).expanduser().resolve()
    storage.mkdir(parents=True, exist_ok=True)

    import ray.train
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    tracker: RunTracker | None = None
    run_id, resumed = None, False
    if log_to_mlflow:
        tracker = RunTracker(uri, cfg.run.experiment)
        run_id, resumed = tracker.start(
            name, cfg.flatten(), cfg.to_dict(), tags={"preset": cfg.run.preset, **(tags or {})},
            parent_run_id=parent_run_id, display_name=display_name)
        progress(f"MLflow: {'resuming' if resumed else 'created'} run {run_id} in experiment "
                 f"'{cfg.run.experiment}' at {uri}")
    workers = cfg.run.num_workers
    if workers > 0:
        ensure_ray()
    resources = {"CPU": cfg.run.cpus_per_worker}
    if cfg.run.gpus_per_worker:
        resources["GPU"] = cfg.run.gpus_per_worker
    trainer = TorchTrainer(
        _loop,
        train_loop_config={"config": cfg.to_dict(), "mlflow_run_id": run_id, "tracking_uri": uri,
                           "run_dir": str(storage / name)},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=cfg.run.gpus_per_worker > 0,
                                     resources_per_worker=resources if workers else None),
        run_config=RunConfig(name=name, storage_path=str(storage),
                             failure_config=FailureConfig(max_failures=cfg.run.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.run.keep_checkpoints),
                             callbacks=callbacks or None),
    )
    try:
        result = trainer.fit()
    except BaseException as err:  # noqa: BLE001 - the run is marked FAILED with the reason, then re-raised
        if tracker is not None:
            tracker.fail(f"{type(err).__name__}: {err}")
        raise
    m = result.metrics or {}
    diverged = bool(m.get("diverged", 0.0))
    status = "diverged" if diverged else "finished"
    if tracker is not None:
        tracker.finish(status)
    loss = m.get("final_loss")
    return TrainOutcome(name, run_id, status, m.get("linear_top1"), m.get("knn_top1"),
                        None if loss is None or (isinstance(loss, float) and math.isnan(loss)) else loss,
                        int(m.get("steps", 0)), resumed,
                        result.checkpoint.path if result.checkpoint is not None else None)


def _loop(config: dict) -> None:
    from .worker import train_loop_per_worker  # imported in the worker process

    train_loop_per_worker(config)
