"""MLflow: a run per training (child of a sweep's parent run), logged by rank 0 only."""

from .mlflow_log import MetricsLogger, RunTracker, check_tracking_uri, resolve_tracking_uri

__all__ = ["MetricsLogger", "RunTracker", "check_tracking_uri", "resolve_tracking_uri"]
