"""MLflow, spoken in one place: run per training, sweep parent runs, the store that reports read.

This is the only package outside the tests that imports ``mlflow``, and it
never imports Ray.
"""

from mocolab.tracking.mlflow_log import MetricsLogger, RunTracker, TrackingUnreachable, recorded_manifest
from mocolab.tracking.source import DIRTY_TAG, ray_job_id, source_tags
from mocolab.tracking.store import (FAILURE_TAG, PARENT_ID_TAG, PARENT_TAG, RUN_NAME_TAG, STATUS_TAG, SWEEP_TAG,
                                    HistoryCache, Store, SweepRun, trials_frame)
from mocolab.tracking.uri import (COMPARE_MAX_RUNS, UI_URL, absolute_uri, check_tracking_uri, local_store_path,
                                  redact_text, redact_uri, resolve_tracking_uri, run_link, ui_advice, ui_links)

__all__ = ["COMPARE_MAX_RUNS", "HistoryCache", "UI_URL", "run_link", "ui_advice", "ui_links", "DIRTY_TAG",
           "FAILURE_TAG", "MetricsLogger", "PARENT_ID_TAG",
           "PARENT_TAG", "RUN_NAME_TAG", "RunTracker", "TrackingUnreachable", "STATUS_TAG",
           "SWEEP_TAG", "Store", "SweepRun", "absolute_uri", "check_tracking_uri", "local_store_path",
           "ray_job_id", "recorded_manifest", "redact_text", "redact_uri", "resolve_tracking_uri", "source_tags",
           "trials_frame"]
