"""MLflow, spoken in one place: run per training, sweep parent runs, the store that reports read.

This is the only package outside the tests that imports ``mlflow``, and it
never imports Ray.
"""

from .mlflow_log import MetricsLogger, RunTracker
from .source import git_commit, ray_job_id
from .store import (FAILURE_TAG, PARENT_ID_TAG, PARENT_TAG, RUN_NAME_TAG, STATUS_TAG, SWEEP_TAG, Store, SweepRun,
                    trials_frame)
from .uri import (absolute_uri, check_tracking_uri, local_store_path, redact_text, redact_uri,
                  resolve_tracking_uri)

__all__ = ["FAILURE_TAG", "MetricsLogger", "PARENT_ID_TAG", "PARENT_TAG", "RUN_NAME_TAG", "RunTracker", "STATUS_TAG",
           "SWEEP_TAG", "Store", "SweepRun", "absolute_uri", "check_tracking_uri", "git_commit", "local_store_path",
           "ray_job_id", "redact_text", "redact_uri", "resolve_tracking_uri", "trials_frame"]
