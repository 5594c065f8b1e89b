"""What a training loop is handed (``WorkerArgs``), and where its rank, device, checkpoint and reports come
from: Ray Train's session, or Tune's.

A sweep trial with W >= 1 starts Ray Train workers, and their reports reach Tune through
``TuneReportCallback``.  With W = 0 the loop runs in the trial's own process (Ray Train's local mode),
where Ray refuses ``ray.train.*`` ("deprecated when running in a function passed to Ray Tune"): there the
loop is rank 0 of 1, reports go to ``ray.tune.report`` directly (filtered as the callback filters them),
and its checkpoints are the run folder's own (``checkpoint.save_local``), as for ``mocolab train`` with W = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from mocolab.config import Config
from mocolab.config.hardware import resolve_device
from mocolab.config.manifest import RunManifest


@dataclass(frozen=True)
class WorkerArgs:
    """What the driver hands the training loop of every rank: plain data, pickled to each Ray Train worker.

    ``manifest`` is this attempt's (its config may differ from the run's first attempt in the fields a
    resume ignores); the loop compares it with the checkpoint's."""

    manifest: RunManifest
    run_dir: str  # the run's folder or URI (storage.Location): its checkpoints in local mode, unsent metrics
    tracking_uri: str
    mlflow_run_id: str | None = None  # None: the loop logs nothing
    ray_train_info: bool = True  # False: Ray Train's INFO lines per report are dropped (no --verbose)
    tune_local: bool = False  # a Tune trial's W = 0 loop: it reports to Tune itself (TuneLocalSession)
    tune_metric: str | None = None  # that search's metric (reports without it are not sent); None for a grid
    gpus_per_worker: float = 0.0  # what each Ray Train worker was given (resources.worker_gpus)

    def config(self) -> Config:
        return self.manifest.to_config()


class Session(Protocol):
    def world_rank(self) -> int: ...

    def device(self, run_device: str, gpus_per_worker: float, local: bool) -> torch.device:
        """Where this rank computes: ``run.device`` as the driver resolved it into the workers' GPUs, or, where
        the loop runs in the calling process (``local``: W = 0, or a Tune trial's own process, which Ray
        shows only the GPUs it gave the trial), ``run.device`` resolved here."""

    def checkpoint(self):
        """Ray's checkpoint to resume from, or None (in local mode the run folder's latest, if any, is read)."""

    def report(self, metrics: dict, checkpoint_dir: str | None) -> None: ...


class TrainSession:
    """A Ray Train worker, or Ray Train's local mode outside Tune."""

    def world_rank(self) -> int:
        import ray.train

        return ray.train.get_context().get_world_rank()

    def device(self, run_device: str, gpus_per_worker: float, local: bool) -> torch.device:
        import ray.train.torch

        if local:
            return resolve_device(run_device)
        return ray.train.torch.get_device() if gpus_per_worker > 0 else torch.device("cpu")

    def checkpoint(self):
        import ray.train

        return ray.train.get_checkpoint()

    def report(self, metrics: dict, checkpoint_dir: str | None) -> None:
        import ray.train

        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(checkpoint_dir)
                         if checkpoint_dir else None)


_LAST_METRICS: dict[str, dict] = {}  # run folder -> what its W = 0 loop in a Tune trial reported last


class TuneLocalSession:
    """A trial that trains in its own process: Tune's session, and only the reports a search can read.

    Ray Train's local-mode result holds none of these reports, so the driver code in the same process
    reads the last one with ``last_metrics``."""

    def __init__(self, metric: str | None, key: str) -> None:
        self.metric = metric  # a search's metric: reports without it are not sent (Optuna reads the last)
        self.key = key
        _LAST_METRICS[key] = {}

    def world_rank(self) -> int:
        return 0

    def device(self, run_device: str, gpus_per_worker: float, local: bool) -> torch.device:
        return resolve_device(run_device)  # Tune made the trial's GPUs, and only those, visible

    def checkpoint(self):
        return None  # Tune's trial restarts read the run folder's latest

    def report(self, metrics: dict, checkpoint_dir: str | None) -> None:
        from ray import tune

        _LAST_METRICS[self.key] = dict(metrics)
        if self.metric is None or self.metric in metrics:
            tune.report(metrics)


def session_for(args: WorkerArgs) -> Session:
    """The session a loop started by ``launch.fit`` runs in (the driver says which in ``args``)."""
    if args.tune_local:
        return TuneLocalSession(args.tune_metric, args.run_dir)
    return TrainSession()


def last_metrics(run_dir: str) -> dict:
    """The last report of the W = 0 loop of a Tune trial that ran in this process (empty if none)."""
    return _LAST_METRICS.pop(run_dir, {})


__all__ = ["Session", "TrainSession", "TuneLocalSession", "WorkerArgs", "last_metrics", "session_for"]
