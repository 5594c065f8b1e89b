"""MLflow bookkeeping for one training run.

The driver owns the run's life (create or find it by name, params, tags,
config artifact, FINISHED/FAILED); rank 0 of the workers logs metrics into it
by id.  A resumed run finds its MLflow run by the tag ``mocolab.run_name``
and skips metric steps it already logged, so a restart leaves no duplicate
and no gap.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping

import yaml

RUN_NAME_TAG = "mocolab.run_name"
STATUS_TAG = "mocolab.status"  # finished / diverged / failed: what the science says, beside MLflow's status


def resolve_tracking_uri(explicit: str | None = None) -> str:
    """``explicit``, else $MLFLOW_TRACKING_URI, else ``sqlite:///<cwd>/mlflow.db`` (absolute: Ray workers
    run in other folders)."""
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def check_tracking_uri(uri: str, timeout: float = 5.0) -> None:
    """Fail before any work when a tracking server does not answer (a clear error, not a hang)."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"tracking URI {uri}: /health answered {resp.status}")
        except (urllib.error.URLError, OSError) as err:
            raise ValueError(f"tracking URI {uri}: the MLflow server does not answer ({err}); start it or "
                             f"set MLFLOW_TRACKING_URI to a reachable one") from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///"):]).expanduser().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise ValueError(f"tracking URI {uri}: folder {folder} is not writable")


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def ray_job_id() -> str | None:
    sub = os.environ.get("RAY_JOB_SUBMISSION_ID") or os.environ.get("RAY_JOB_ID")
    if sub:
        return sub
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - a tag is not worth failing a run for
        pass
    return None


class RunTracker:
    """Driver side: one MLflow run per training run name."""

    def __init__(self, uri: str, experiment: str) -> None:
        self.uri = uri
        self.client = _client(uri)
        exp = self.client.get_experiment_by_name(experiment)
        self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(experiment)
        self.run_id: str | None = None

    def find(self, run_name: str, parent_run_id: str | None = None):
        query = f"tags.`{RUN_NAME_TAG}` = '{run_name}'"
        if parent_run_id:
            query += f" and tags.`mlflow.parentRunId` = '{parent_run_id}'"
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
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=display_name or run_name)
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            self.client.log_artifact(self.run_id, str(path))
        return self.run_id, False

    def finished(self, run_name: str) -> Any | None:
        run = self.find(run_name)
        return run if run is not None and run.info.status == "FINISHED" else None

    def finish(self, status_tag: str = "finished") -> None:
        assert self.run_id is not None
        self.client.set_tag(self.run_id, STATUS_TAG, status_tag)
        self.client.set_terminated(self.run_id, "FINISHED")

    def fail(self, reason: str) -> None:
        if self.run_id is None:
            return
        self.client.set_tag(self.run_id, STATUS_TAG, "failed")
        self.client.set_tag(self.run_id, "mocolab.failure_reason", reason[:5000])
        self.client.set_terminated(self.run_id, "FAILED")


class MetricsLogger:
    """Worker side (rank 0): metrics by step into an existing run; steps already logged are skipped."""

    def __init__(self, uri: str, run_id: str) -> None:
        self.client = _client(uri)
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
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)
