"""Reading and annotating an MLflow store: what sweeps and reports need, in one place.

``Store`` wraps one tracking URI; ``SweepRun`` is a sweep's parent run, found
again by the sweep's name so a resumed sweep keeps one parent.  Everything
above this package (tune, report, the studies) speaks MLflow through these
functions only, so the store's quirks (filter-string quoting, status names,
artifact temp files) live here and nowhere else.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
from mlflow.entities import Param, Run
from mlflow.tracking import MlflowClient
from mlflow.utils.rest_utils import http_request, verify_rest_response

from mocolab.config import check_same_config
from mocolab.tracking.run_keys import run_value
from mocolab.tracking.source import source_tags
from mocolab.tracking.uri import resolve_tracking_uri

RUN_NAME_TAG = "mocolab.run_name"  # a training run's name: how a resumed run finds its MLflow run
# a training run's manifest (config/manifest.py) beside its params: the run format, the mocolab that wrote it, the
# fingerprint of its config; a run without the format tag reads as run format 1
FORMAT_TAG = "mocolab.run_format"
VERSION_TAG = "mocolab.version"
FINGERPRINT_TAG = "mocolab.config_fingerprint"
CODE_TAG = "mocolab.code_fingerprint"  # the code that trained the run (training/code_fingerprint.py); absent: unknown
CODE_PARAM = "mocolab.code_fingerprint"  # ... also a param, beside the config's: the compare page's column
SEGMENTS_TAG = "mocolab.code_segments"  # a run continued across code changes: "digest@step,digest@step"
BASELINES_EXPERIMENT = "baselines"  # mocolab baselines: the random-init encoder and raw pixels, per seed and set
BASELINE_SET_TAG = "mocolab.baseline_set"
BASELINE_KIND_TAG = "mocolab.baseline"
STATUS_TAG = "mocolab.status"  # finished / diverged / failed / stopped / interrupted: beside MLflow's status
SWEEP_TAG = "mocolab.sweep_name"  # on the parent and on every child
PARENT_TAG = "mocolab.sweep_parent"  # on the parent only: how a resumed sweep finds it
PARENT_ID_TAG = "mlflow.parentRunId"
FAILURE_TAG = "mocolab.failure_reason"
STOPPED_AT_TAG = "mocolab.stopped_at_epoch"  # a trial a scheduler stopped early: the epochs it completed
RUNS_PAGE_SIZE = 1000  # runs per search request (``Store.search_all`` reads every page)
# runs per bulk history request: MLflow's server takes at most 100, and its response at most HISTORY_POINTS
# points per run (sampled evenly, first and last kept, beyond); a database store is read whole, in as many runs
HISTORY_BULK_RUNS = 100
HISTORY_POINTS = 2500
# The final numbers a trials table carries (besides label, status, run id and params), wherever a run holds
# them (tracking/run_keys.py: the config's constants are tags)
TRIAL_METRICS = ("linear_top1", "knn_top1", "knn20_top1", "linear_top1_1pct", "linear_top1_10pct", "final_loss",
                 "ema_half_life", "max_staleness_bound", "pretext_acc",
                 "staleness_mean", "staleness_max", "drift_cos", "stored_cos")


def trials_frame(runs: Iterable[Run]) -> pd.DataFrame:
    """One row per run: label, status, run id, every param (``params.*``), the final metrics."""
    rows = []
    for run in runs:
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        status = tags.get(STATUS_TAG) or run.info.status.lower()
        if run.info.status == "RUNNING":
            status = "running"
        row = {"label": tags.get("trial") or run.info.run_name, "status": status, "run_id": run.info.run_id,
               "stopped_at_epoch": _num(tags.get(STOPPED_AT_TAG, "nan")),
               "failure_reason": tags.get(FAILURE_TAG, "")}
        row["data"] = training_data(run)
        # what a number depends on beyond its config: pooled trials that differ here are not comparable
        row["commit"] = tags.get("mlflow.source.git.commit", "")[:12]
        row["precision"] = tags.get("mocolab.precision", "")
        row["torch"] = tags.get("mocolab.torch", "")
        row["code"] = tags.get(CODE_TAG, "")[:8] or "unknown"  # the code that made it (unknown: none recorded)
        row["code_segments"] = tags.get(SEGMENTS_TAG, "")  # a run continued across code changes
        row.update({f"params.{k}": _num(v) for k, v in params.items() if k != CODE_PARAM})
        row.update({k: run_value(tags, metrics, k) for k in TRIAL_METRICS})
        rows.append(row)
    return pd.DataFrame(rows)


def latest_trial_runs(runs: Iterable[Run]) -> list[Run]:
    """Each trial's latest run, of a sweep's runs oldest first: a trial run again (by other code) supersedes
    its earlier run, which stays in MLflow.  A run without a trial label stands for itself."""
    return list({r.data.tags.get("trial") or r.info.run_id: r for r in runs}.values())


def training_data(run: Run) -> str:
    """``name@digest`` of the data a run trained on (its MLflow dataset inputs of context training), or ''."""
    inputs = run.inputs.dataset_inputs if run.inputs is not None else []
    return ", ".join(f"{i.dataset.name}@{i.dataset.digest[:8]}" for i in inputs
                     if any(t.key == "mlflow.data.context" and t.value == "training" for t in i.tags))


def _num(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except (TypeError, ValueError):
            pass
    return text


def _quote(value: str) -> str:
    """A value inside an MLflow filter string's single quotes."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


class Store:
    """One MLflow tracking store (``uri``, else $MLFLOW_TRACKING_URI, else ./mlflow.db made absolute)."""

    def __init__(self, uri: str | None = None) -> None:
        self.uri = resolve_tracking_uri(uri)
        self.client = MlflowClient(tracking_uri=self.uri)

    # ------------------------------------------------------------ reading
    def experiment_id(self, name: str, *, create: bool = False) -> str | None:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        return self.client.create_experiment(name) if create else None

    def experiment_names(self) -> list[str]:
        return sorted(e.name for e in self.client.search_experiments())

    def run_exists(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
        except Exception:  # noqa: BLE001 - MLflow raises its own exception types for a missing run
            return False
        return True

    def runs(self, experiment_id: str, *, parent_run_id: str | None = None, running_only: bool = False) -> list[Run]:
        """Runs of an experiment (oldest first), every one of them; with ``parent_run_id`` only that sweep's
        children."""
        return self.find_runs([experiment_id], status="RUNNING" if running_only else None,
                              parent_run_id=parent_run_id)

    def find_runs(self, experiment_ids: list[str], *, status: str | None = None, parent_run_id: str | None = None,
                  newest_first: bool = False) -> list[Run]:
        """Every run of ``experiment_ids`` (deleted ones left out), oldest first (or newest), as MLflow's search
        returns them; ``status``: of that MLflow status only; ``parent_run_id``: that sweep's children only.

        A database store is read straight from MLflow's tables (``tracking/sql_runs.py``): MLflow's search
        spends seconds per thousand trials building an ORM object for each of their ~100 params, tags and
        metrics.  A server is searched through MLflow, page by page."""
        engine = self._database()
        if engine is not None:
            from mocolab.tracking.sql_runs import read_runs

            return read_runs(engine, experiment_ids, status=status or None, parent_run_id=parent_run_id or None,
                             newest_first=newest_first)
        clauses = []
        if parent_run_id:
            clauses.append(f"tags.`{PARENT_ID_TAG}` = '{_quote(parent_run_id)}'")
        if status:
            clauses.append(f"attributes.status = '{_quote(status)}'")
        return self.search_all(experiment_ids, " and ".join(clauses),
                               order_by=[f"attributes.start_time {'DESC' if newest_first else 'ASC'}"])

    def _database(self) -> Any:
        """The SQLAlchemy engine of MLflow's database store behind the client (sqlite, PostgreSQL, MySQL), or
        None where the store is a server's (REST) or a folder."""
        return getattr(self.client._tracking_client.store, "engine", None)

    def search_all(self, experiment_ids: list[str], filter_string: str = "", *,
                   order_by: list[str] | None = None) -> list[Run]:
        """Every run a search matches, read page by page: one request of any size is capped by the server
        (and by MLflow's own limit), and a report that silently lost the newest runs would mislead."""
        runs: list[Run] = []
        token = None
        while True:
            page = self.client.search_runs(experiment_ids, filter_string, max_results=RUNS_PAGE_SIZE,
                                           order_by=order_by, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def trial_runs(self, experiment_id: str, parent_run_id: str | None = None) -> list[Run]:
        """A sweep's children, or every trial of an experiment (its sweeps' parent runs left out)."""
        runs = self.runs(experiment_id, parent_run_id=parent_run_id)
        if parent_run_id is None:
            parents = {r.data.tags.get(PARENT_ID_TAG) for r in runs}
            runs = [r for r in runs if r.info.run_id not in parents]
        return runs

    def is_running(self, run_id: str) -> bool:
        return self.client.get_run(run_id).info.status == "RUNNING"

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """(step, value) pairs of one metric, by step."""
        return sorted((m.step, m.value) for m in self.client.get_metric_history(run_id, key))

    def metric_histories(self, run_ids: Iterable[str], key: str) -> dict[str, list[tuple[int, float]]]:
        """(step, value) pairs of ``key`` in each of ``run_ids``, by step, in one request per
        ``HISTORY_BULK_RUNS`` runs: a report of a thousand trials reading each curve of each trial on its own
        waits on thousands of requests. Over HTTP a run's curve beyond ``HISTORY_POINTS`` points comes
        sampled (what a chart draws anyway); a store without MLflow's bulk reads is read run by run."""
        ids = list(dict.fromkeys(run_ids))
        out: dict[str, list[tuple[int, float]]] = {run_id: [] for run_id in ids}
        backend = self.client._tracking_client.store  # MLflow's store behind the client: database or REST
        for i in range(0, len(ids), HISTORY_BULK_RUNS):
            chunk = ids[i:i + HISTORY_BULK_RUNS]
            if hasattr(backend, "get_metric_history_bulk"):  # a database: every point, one query
                points = [(m.run_id, m.step, m.value) for m in
                          backend.get_metric_history_bulk(chunk, key, max_results=None)]
            elif hasattr(backend, "get_host_creds"):  # an MLflow server: its bulk endpoint
                points = _bulk_over_http(backend.get_host_creds(), chunk, key)
            else:
                points = [(run_id, *pair) for run_id in chunk for pair in self.metric_history(run_id, key)]
            for run_id, step, value in points:
                out[run_id].append((step, value))
        return {run_id: sorted(pairs) for run_id, pairs in out.items()}

    # ------------------------------------------------------------ writing
    def set_status(self, run_id: str, status: str, *, mlflow_status: str = "FINISHED",
                   reason: str | None = None) -> None:
        """End a run: ``status`` is what the science says (finished, diverged, failed, stopped,
        interrupted), ``mlflow_status`` what the MLflow UI shows (FINISHED, FAILED, KILLED)."""
        self.client.set_tag(run_id, STATUS_TAG, status)
        if reason:
            self.client.set_tag(run_id, FAILURE_TAG, reason[:5000])
        self.client.set_terminated(run_id, mlflow_status)

    def log_artifacts(self, run_id: str, paths: Iterable[Path | str], artifact_path: str | None = None) -> None:
        for p in paths:
            self.client.log_artifact(run_id, str(p), artifact_path=artifact_path)

    def json_artifacts(self, run_id: str, folder: str) -> list[str]:
        """The JSON artifacts under ``folder`` of a run, by name ([] if it has none)."""
        try:
            return sorted(f.path for f in self.client.list_artifacts(run_id, folder) if f.path.endswith(".json"))
        except Exception:  # noqa: BLE001 - a run without artifacts (or a store without them) has none
            return []

    def read_json(self, run_id: str, path: str) -> dict:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per small file is noise
        with tempfile.TemporaryDirectory() as tmp:
            return json.loads(Path(self.client.download_artifacts(run_id, path, tmp)).read_text())

    def log_texts(self, run_id: str, files: Mapping[str, str]) -> None:
        """Small text artifacts (tables, summaries) from memory: ``{file name: content}``."""
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in files.items():
                path = Path(tmp) / name
                path.write_text(text)
                self.client.log_artifact(run_id, str(path))

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i:i + 100])


def _bulk_over_http(creds: Any, run_ids: list[str], key: str) -> list[tuple[str, int, float]]:
    """(run id, step, value) of ``key`` in ``run_ids`` from an MLflow server's bulk-interval endpoint."""
    endpoint = "/api/2.0/mlflow/metrics/get-history-bulk-interval"
    res = http_request(creds, endpoint, "GET",
                       params={"run_ids": run_ids, "metric_key": key, "max_results": HISTORY_POINTS})
    verify_rest_response(res, endpoint)
    return [(m["run_id"], int(m.get("step", 0)), float(m["value"])) for m in res.json().get("metrics", [])]


class HistoryCache:
    """Metric histories of runs that have ended, kept across the rebuilds of a live report (``--watch``).

    An ended run's history no longer changes (a run resumed later ends again at another time, and is then
    read afresh), so a report rebuilt at every trial's end reads each trial's curves once in all rather
    than once per rebuild: reads grow with the trials, not with trials times rebuilds.  Runs still
    running are read every time.
    """

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str, str, int], list[tuple[int, float]]] = {}

    @staticmethod
    def _slot(store: Store, run: Run, key: str) -> tuple[str, str, str, int] | None:
        """Where an ended run's curve is kept (its end time included: a resumed run ends again at another);
        None for a run still running, which is read every time."""
        if run.info.status == "RUNNING" or run.info.end_time is None:
            return None
        return store.uri, run.info.run_id, key, int(run.info.end_time)

    def history(self, store: Store, run: Run, key: str) -> list[tuple[int, float]]:
        """(step, value) pairs of ``key`` in ``run``, by step (``Store.metric_history``)."""
        slot = self._slot(store, run, key)
        if slot is None:
            return store.metric_history(run.info.run_id, key)
        if slot not in self._kept:
            self._kept[slot] = store.metric_history(run.info.run_id, key)
        return self._kept[slot]

    def histories(self, store: Store, runs: Iterable[Run], key: str) -> dict[str, list[tuple[int, float]]]:
        """``history`` of every run of ``runs``: those not kept read together (``Store.metric_histories``)."""
        runs = list(runs)
        slots = {run.info.run_id: self._slot(store, run, key) for run in runs}
        wanted = [run_id for run_id, slot in slots.items() if slot is None or slot not in self._kept]
        read = store.metric_histories(wanted, key) if wanted else {}
        for run_id, pairs in read.items():
            if slots[run_id] is not None:
                self._kept[slots[run_id]] = pairs
        return {r.info.run_id: read[r.info.run_id] if r.info.run_id in read else self._kept[slots[r.info.run_id]]
                for r in runs}


class SweepRun:
    """A sweep's parent run, found again by the sweep's name: a resumed sweep keeps one parent."""

    def __init__(self, store: Store, experiment_id: str, run_id: str, resumed: bool) -> None:
        self.store, self.experiment_id, self.run_id, self.resumed = store, experiment_id, run_id, resumed

    @classmethod
    def open(cls, store: Store, experiment: str, name: str, *, description: str,
             params: Mapping[str, Any], tags: Mapping[str, str]) -> "SweepRun":
        """Find the parent of sweep ``name`` (and mark it RUNNING again), or create it."""
        exp_id = store.experiment_id(experiment, create=True)
        assert exp_id is not None
        found = store.client.search_runs([exp_id], f"tags.`{PARENT_TAG}` = '{_quote(name)}'", max_results=1)
        if found:
            run_id = found[0].info.run_id
            check_same_config(f"sweep '{name}' (MLflow parent run {run_id})", found[0].data.params, params,
                              "use another --name, or delete that parent run and its folder",
                              new_field=lambda key: not key.startswith("sweep.set."))  # overrides always count
            store.client.update_run(run_id, status="RUNNING")
            return cls(store, exp_id, run_id, True)
        all_tags = {SWEEP_TAG: name, PARENT_TAG: name, "mlflow.note.content": description,
                    **({} if "mlflow.source.name" in tags else source_tags(tracking_uri=store.uri)), **tags}
        run = store.client.create_run(exp_id, tags=all_tags, run_name=name)
        store.log_params(run.info.run_id, params)
        return cls(store, exp_id, run.info.run_id, False)

    @property
    def uri(self) -> str:
        return self.store.uri

    def children(self) -> list[Run]:
        """The trial runs of this sweep, oldest first."""
        return self.store.runs(self.experiment_id, parent_run_id=self.run_id)

    def trials(self) -> pd.DataFrame:
        """One row per trial: its latest run (a trial run again by other code supersedes its earlier run,
        which stays in MLflow)."""
        return trials_frame(latest_trial_runs(self.children()))

    def done_labels(self, statuses: Iterable[str] = ("finished", "diverged"), code: str | None = None) -> set[str]:
        """Labels of the trials whose outcome is settled: a resumed sweep does not run them again.  With
        ``code`` (this checkout's code fingerprint) a trial is settled only if its latest run was made by that
        code, or records no code (code unknown: kept, not retrained for lacking one)."""
        wanted = set(statuses)
        return {r.data.tags.get("trial") for r in latest_trial_runs(self.children())
                if r.data.tags.get(STATUS_TAG) in wanted
                and (code is None or r.data.tags.get(CODE_TAG, "") in ("", code))}

    def close_running_children(self, status: str, *, mlflow_status: str = "KILLED",
                               reason: str | None = None) -> list[str]:
        """Close the trials left RUNNING (stopped early by a scheduler, killed, interrupted); their ids."""
        runs = self.store.runs(self.experiment_id, parent_run_id=self.run_id, running_only=True)
        for run in runs:
            self.store.set_status(run.info.run_id, status, mlflow_status=mlflow_status, reason=reason)
        return [r.info.run_id for r in runs]

    def set_status(self, status: str, *, mlflow_status: str = "FINISHED", reason: str | None = None) -> None:
        self.store.set_status(self.run_id, status, mlflow_status=mlflow_status, reason=reason)

    def record_stopped_epoch(self, run_id: str) -> None:
        """Tag a trial stopped early with the epochs it completed (one ``loss`` point per epoch)."""
        self.store.client.set_tag(run_id, STOPPED_AT_TAG, str(len(self.store.metric_history(run_id, "loss"))))

    def log_summary(self, table: pd.DataFrame, trials: pd.DataFrame, figure: Path | None, text: str) -> None:
        """CSV and JSON tables, the printed summary and the plot, as artifacts of the parent run."""
        self.store.log_texts(self.run_id, {
            "summary.csv": table.to_csv(index=False), "trials.csv": trials.to_csv(index=False),
            "summary.json": table.to_json(orient="split", index=False), "summary.txt": text})
        if figure is not None and Path(figure).exists():
            self.store.log_artifacts(self.run_id, [figure])
