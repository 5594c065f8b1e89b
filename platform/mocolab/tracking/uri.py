"""Where the MLflow store is: one resolution rule for the CLI, the studies and the workers."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path


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
