"""Where the MLflow store is: one resolution rule for the CLI, the studies and the workers.

Ray runs trials and workers in other working folders, so every store path
is made absolute here, on the caller's side, before any process moves: a
relative ``sqlite:///x.db``, ``file:./mlruns`` or plain ``./mlruns`` means the
caller's folder, wherever the writer later runs.  Credentials in a URI
(``user:password@``) are never printed: ``redact_uri`` is what output shows.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

from mocolab.config.addresses import check_tracking_url

_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:?#]*):(?P<secret>[^/@?#]*)@")


def redact_uri(uri: str) -> str:
    """``postgresql://alice:s3cret@db/mlflow`` -> ``postgresql://alice:***@db/mlflow`` (for output and logs)."""
    return _CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", uri)


def redact_text(text: str, uri: str | None) -> str:
    """``text`` with every occurrence of the secret in ``uri`` replaced (error messages quote URIs)."""
    m = _CREDENTIALS.search(uri or "")
    out = _CREDENTIALS.sub(lambda mm: f"{mm['scheme']}{mm['user']}:***@", text)
    if m and m["secret"]:
        out = out.replace(m["secret"], "***")
    return out


def absolute_uri(uri: str, cwd: str | os.PathLike[str] | None = None) -> str:
    """A store URI whose local path (if any) is absolute, resolved against ``cwd`` (default: this folder)."""
    base = Path(cwd) if cwd is not None else Path.cwd()

    def absolute(path: str) -> str:
        p = Path(path).expanduser()
        return str(p if p.is_absolute() else (base / p).resolve())

    if uri.startswith("sqlite:///"):
        path, sep, query = uri[len("sqlite:///"):].partition("?")
        if path and path != ":memory:":
            path = absolute(path)
        return f"sqlite:///{path}{sep}{query}"
    if uri.startswith("file:"):
        rest = uri[len("file:"):]
        if rest.startswith("//"):  # file://host/path or file:///path: already absolute
            return uri
        return f"file:{absolute(rest)}"
    if uri.startswith("databricks") or (re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", uri)
                                        and not re.match(r"^[A-Za-z]:[\\/]", uri)):
        return uri  # a server, database or hosted URI: nothing local to resolve
    return absolute(uri)  # a bare path is MLflow's file store


def local_store_path(uri: str) -> str | None:
    """The local file or folder an (absolute) store URI writes to, or None for a server or database."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):].partition("?")[0]
        return path if path and path != ":memory:" else None
    if uri.startswith("file:"):
        rest = uri[len("file:"):]
        return rest[2:] if rest.startswith("///") else (None if rest.startswith("//") else rest)
    if uri.startswith("databricks") or (re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", uri)
                                        and not re.match(r"^[A-Za-z]:[\\/]", uri)):
        return None
    return uri


def resolve_tracking_uri(explicit: str | None = None, default: str | os.PathLike[str] = "mlflow.db") -> str:
    """``explicit``, else $MLFLOW_TRACKING_URI, else a sqlite file at ``default`` (relative to this folder);
    local paths made absolute."""
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return absolute_uri(uri)
    return f"sqlite:///{os.path.abspath(Path.cwd() / default)}"  # ".." folded, symlinks left as they are


def check_tracking_uri(uri: str, timeout: float = 5.0) -> None:
    """Fail before any work when a tracking server does not answer (a clear error, not a hang)."""
    shown = redact_uri(uri)
    check_tracking_url(uri)
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"tracking URI {shown}: /health answered {resp.status}")
        except (urllib.error.URLError, OSError) as err:
            raise ValueError(f"tracking URI {shown}: the MLflow server does not answer "
                             f"({redact_text(str(err), uri)}); start it or set MLFLOW_TRACKING_URI to a "
                             f"reachable one") from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///"):].partition("?")[0]).expanduser().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise ValueError(f"tracking URI {shown}: folder {folder} is not writable")


UI_URL = "http://127.0.0.1:5000"  # where `mlflow ui` listens by default
# Runs a compare link names: every id is ~40 characters of the address, and MLflow's compare page slows
# down with many runs; the sweep link lists all of a sweep's trials by a filter instead.
COMPARE_MAX_RUNS = 10


def ui_links(experiment_id: str, run_ids: list[str] | None = None, base: str = UI_URL,
             parent_run_id: str | None = None) -> dict[str, str]:
    """Addresses in the MLflow UI (3.x) that open on what a researcher wants, with no clicks of setup,
    and stay short whatever the number of runs.

    A bare experiment address opens MLflow 3.17's GenAI overview in a new browser (its workflow switch
    defaults to GenAI, and no experiment tag changes that); ``?workflowType=machine_learning`` opens the
    runs list. ``sweep``: the runs list filtered to the children of ``parent_run_id``: the runs page reads
    its search box from ``searchFilter`` in its own address (``#/experiments/<id>/runs``; the bare
    experiment address redirects there without it) and shows the parent row, the trials under its [+].
    ``compare``: the compare page, which takes run and experiment ids as JSON lists, on the first
    ``COMPARE_MAX_RUNS`` of ``run_ids`` (give them best first).
    """
    base = base.rstrip("/")
    links = {"runs": f"{base}/#/experiments/{experiment_id}?workflowType=machine_learning"}
    if parent_run_id:
        query = urlencode({"workflowType": "machine_learning",
                           "searchFilter": f"tags.`mlflow.parentRunId` = '{parent_run_id}'"}, quote_via=quote)
        links["sweep"] = f"{base}/#/experiments/{experiment_id}/runs?{query}"
    if run_ids:
        query = urlencode({"runs": json.dumps(list(run_ids)[:COMPARE_MAX_RUNS]),
                           "experiments": json.dumps([experiment_id])}, quote_via=quote)
        links["compare"] = f"{base}/#/compare-runs?{query}"
    return links


def ui_server(uri: str) -> str | None:
    """The address of a tracking server's own UI (an ``http(s)://`` store: the server serves it), without
    credentials; None for a local store, which ``mlflow ui --backend-store-uri`` opens."""
    if not uri.startswith(("http://", "https://")):
        return None

    u = urlsplit(uri)
    netloc = u.netloc.rpartition("@")[2]
    return f"{u.scheme}://{netloc}{u.path.rstrip('/')}"


def ui_advice(uri: str) -> tuple[str | None, str]:
    """(the ``mlflow ui`` command that serves a local store, or None for a server, which serves its own UI;
    the base address the UI's links start with)."""
    server = ui_server(uri)
    if server is not None:
        return None, server
    return f"mlflow ui --backend-store-uri {redact_uri(uri)}", UI_URL


def run_link(experiment_id: str, run_id: str, base: str = UI_URL) -> str:
    """A run's page, in the UI's model-training mode (else a new browser shows it among GenAI pages)."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"
