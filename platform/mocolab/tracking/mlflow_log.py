"""MLflow bookkeeping for one training run.

The driver owns the run's life (create or find it by name, params, tags,
config artifact, FINISHED/FAILED); rank 0 of the workers logs metrics into it
by id.  A resumed run finds its MLflow run by the tag ``mocolab.run_name``
and skips metric steps it already logged, so a restart leaves no duplicate
and no gap.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import yaml
from mlflow.entities import Metric, Run

from .source import git_commit, ray_job_id
from .store import PARENT_ID_TAG, RUN_NAME_TAG, Store, _quote


class RunTracker:
    """Driver side: one MLflow run per training run name."""

    def __init__(self, uri: str, experiment: str) -> None:
        self.store = Store(uri)
        self.uri = self.store.uri
        self.client = self.store.client
        exp_id = self.store.experiment_id(experiment, create=True)
        assert exp_id is not None
        self.experiment_id = exp_id
        self.run_id: str | None = None

    def find(self, run_name: str, parent_run_id: str | None = None) -> Run | None:
        query = f"tags.`{RUN_NAME_TAG}` = '{_quote(run_name)}'"
        if parent_run_id:
            query += f" and tags.`{PARENT_ID_TAG}` = '{_quote(parent_run_id)}'"
        runs = self.client.search_runs([self.experiment_id], query, max_results=1,
                                       order_by=["attributes.start_time DESC"])
        return runs[0] if runs else None

    def start(self, run_name: str, params: Mapping[str, Any], config: dict, tags: Mapping[str, str] | None = None,
              parent_run_id: str | None = None, display_name: str | None = None) -> tuple[str, bool]:
        """(run id, resumed?): an unfinished run of this name is continued, never duplicated."""
        existing = self.find(run_name, parent_run_id)
        if existing is not None:
            self.run_id = existing.info.run_id
            if existing.info.status != "RUNNING":
                self.client.update_run(self.run_id, status="RUNNING")
            return self.run_id, True
        all_tags = {RUN_NAME_TAG: run_name, "git_commit": git_commit(), **(tags or {})}
        job = ray_job_id()
        if job:
            all_tags["ray_job_id"] = job
        if parent_run_id:
            all_tags[PARENT_ID_TAG] = parent_run_id
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=display_name or run_name)
        self.run_id = run.info.run_id
        self.store.log_params(self.run_id, params)
        self.store.log_texts(self.run_id, {"config.yaml": yaml.safe_dump(config, sort_keys=False)})
        return self.run_id, False

    def finish(self, status_tag: str = "finished") -> None:
        assert self.run_id is not None
        self.store.set_status(self.run_id, status_tag)

    def fail(self, reason: str) -> None:
        if self.run_id is None:
            return
        self.store.set_status(self.run_id, "failed", mlflow_status="FAILED", reason=reason)


class MetricsLogger:
    """Worker side (rank 0): metrics by step into an existing run; steps already logged are skipped."""

    def __init__(self, uri: str, run_id: str) -> None:
        self.store = Store(uri)
        self.client = self.store.client
        self.run_id = run_id
        history = self.client.get_metric_history(run_id, "loss")
        self.last_step = max((m.step for m in history), default=-1)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Per-epoch metrics; a step at or below the last one logged (a restart's replay) is skipped."""
        if step <= self.last_step:
            return
        self._send(metrics, step)
        self.last_step = step

    def log_final(self, metrics: Mapping[str, float], step: int) -> None:
        self._send(metrics, step)

    def _send(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)
