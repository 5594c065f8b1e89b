"""MLflow bookkeeping for one training run.

The driver owns the run's life (create or find it by name, params, tags,
config artifact, FINISHED/FAILED); rank 0 of the workers logs metrics into it
by id.  A resumed run finds its MLflow run by the tag ``mocolab.run_name``
and skips metric steps it already logged, so a restart leaves no duplicate
and no gap.  The run's manifest is its params (the config) and three tags;
read back (``recorded_manifest``), it meets the attempt's manifest in
``manifest.check_resume``, the rule the run's folder and checkpoints obey too.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import json

import yaml
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Run

from mocolab.config.manifest import RunManifest, check_resume
from mocolab.tracking.source import source_tags
from mocolab.tracking.store import (CODE_PARAM, CODE_TAG, FINGERPRINT_TAG, FORMAT_TAG, PARENT_ID_TAG, RUN_NAME_TAG,
                                    SEGMENTS_TAG, STATUS_TAG, VERSION_TAG, Store, _quote)

if TYPE_CHECKING:  # a type only: a report or leaderboard, which reads runs, loads no torch for it
    from mocolab.data.sources import DatasetRecord

MAX_BATCH = 1000  # metrics per log_batch call: MLflow's limit


class TrackingUnreachable(RuntimeError):
    """The store did not answer where a run needed it; the message says what is kept and how to finish."""


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

    def start(self, manifest: RunManifest, tags: Mapping[str, str] | None = None,
              parent_run_id: str | None = None, display_name: str | None = None) -> tuple[str, bool]:
        """(run id, resumed?): an unfinished run of this name is continued, never duplicated."""
        run_name = manifest.name
        existing = self.find(run_name, parent_run_id)
        if existing is not None:
            check_resume(recorded_manifest(existing), manifest, f"run '{run_name}' (MLflow run {existing.info.run_id})",
                         "--set run.name=<a new name>, or delete that MLflow run")
            self.run_id = existing.info.run_id
            if existing.info.status != "RUNNING":
                self.client.update_run(self.run_id, status="RUNNING")
            code = manifest.code_fingerprint.digest
            if code and existing.data.tags.get(CODE_TAG) != code:  # continued across a code change (fit allowed it)
                self.client.set_tag(self.run_id, CODE_TAG, code)
                self.client.set_tag(self.run_id, SEGMENTS_TAG, segments_text(manifest))
            return self.run_id, True
        given = dict(tags or {})
        # MLflow's source/user tags: computed here unless the driver passed its own (a trial process's
        # argv and working folder are Ray's, not the user's)
        all_tags = {RUN_NAME_TAG: run_name, FORMAT_TAG: str(manifest.format), VERSION_TAG: manifest.mocolab,
                    FINGERPRINT_TAG: manifest.fingerprint, CODE_TAG: manifest.code_fingerprint.digest,
                    **({} if "mlflow.source.name" in given else source_tags(tracking_uri=self.store.uri)), **given}
        if parent_run_id:
            all_tags[PARENT_ID_TAG] = parent_run_id
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=display_name or run_name)
        # params: the config less its run's name, which MLflow holds as the run's own name: as a param it
        # differs in every trial and becomes an axis of the compare page's parallel-coordinates plot
        params = {k: v for k, v in manifest.config.items() if k != "run.name"}
        if manifest.code_fingerprint.digest:
            params[CODE_PARAM] = manifest.code_fingerprint.digest
        try:
            self.store.log_params(run.info.run_id, params)
            self.store.log_texts(run.info.run_id, {"config.yaml": yaml.safe_dump(_sections(manifest.config),
                                                                                 sort_keys=False)})
        except BaseException:
            # a run without all its params would be found again by name and refused as another config:
            # it goes (MLflow's delete keeps it in the trash), and the same command creates it whole
            try:
                self.client.delete_run(run.info.run_id)
            except Exception:  # noqa: BLE001 - the store that failed the params may refuse this too
                pass
            raise
        self.run_id = run.info.run_id
        return self.run_id, False

    def finished(self, run_name: str, parent_run_id: str | None = None) -> Run | None:
        """The run of this name if it has ended (finished or diverged): what the same command reports."""
        run = self.find(run_name, parent_run_id)
        return run if run is not None and run.data.tags.get(STATUS_TAG) in ("finished", "diverged") else None

    def tag(self, key: str, value: str) -> None:
        assert self.run_id is not None
        self.client.set_tag(self.run_id, key, value)

    def finish(self, status_tag: str = "finished") -> None:
        assert self.run_id is not None
        self.store.set_status(self.run_id, status_tag)

    def fail(self, reason: str, *, killed: bool = False) -> None:
        """FAILED with ``reason``; ``killed``: the user stopped it (Ctrl-C, SIGTERM), so KILLED/interrupted."""
        if self.run_id is None:
            return
        self.store.set_status(self.run_id, "interrupted" if killed else "failed",
                              mlflow_status="KILLED" if killed else "FAILED", reason=reason)


def recorded_manifest(run: Run) -> RunManifest:
    """The manifest an MLflow run holds: its params (the config; the code's digest apart), and its tags."""
    tags = run.data.tags
    config = {k: v for k, v in run.data.params.items() if k != CODE_PARAM}
    code = {"digest": tags[CODE_TAG]} if tags.get(CODE_TAG) else {}
    return RunManifest(tags.get(RUN_NAME_TAG, run.info.run_name), config, tags.get(FINGERPRINT_TAG, ""),
                       int(tags.get(FORMAT_TAG, "1")), tags.get(VERSION_TAG, ""), code)


def segments_text(manifest: RunManifest) -> str:
    """``digest@step,...``: the code of each segment of a run continued across code changes, first to last."""
    return ",".join(f"{s.get('code') or 'unknown'}@{s.get('from_step', '?')}" for s in manifest.segments)


def _sections(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"moco.m": 0.99}`` -> ``{"moco": {"m": 0.99}}``: the config as its YAML form reads (a plugin's
    ``method.<plugin>.<field>`` under ``method.options``, as ``--config`` takes it back)."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        section, _, name = key.partition(".")
        if section == "method" and name != "name":
            out.setdefault(section, {}).setdefault("options", {})[name] = value
        else:
            out.setdefault(section, {})[name] = value
    return out


class MetricsLogger:
    """Worker side (rank 0): metrics by step into an existing run; steps already logged are skipped.

    Best-effort: a tracking store that goes away mid-run must not kill training (nor use up
    ``run.max_failures``).  Batches that cannot be sent are kept, in order, and sent with the next
    batch that gets through; ``close`` tries once more, and what it still cannot send the worker keeps
    beside the checkpoint (``unsent``) for the next command to send (``take_back``).
    """

    def __init__(self, uri: str, run_id: str, say=print) -> None:
        self.store = Store(uri)
        self.client = self.store.client
        self.run_id = run_id
        self.say = say
        self.pending: list[list[Metric]] = []
        self.lost = 0
        self._down_since: float | None = None
        try:
            history = self.client.get_metric_history(run_id, "loss")
            self.last_step = max((m.step for m in history), default=-1)
        except Exception as err:  # noqa: BLE001 - the store is down: nothing known, nothing skipped
            self._went_down(err)
            self.last_step = -1

    def log(self, metrics: Mapping[str, float], step: int,
            series: Mapping[str, list[list[float]]] | None = None) -> None:
        """Per-epoch metrics, and the epoch's per-step ``series`` ({name: [[step, value], ...]}); an epoch
        at or below the last step logged (a restart's replay) is skipped whole."""
        if step <= self.last_step:
            return
        self._send(metrics, step, series)
        self.last_step = step

    def log_final(self, metrics: Mapping[str, float], step: int) -> None:
        self._send(metrics, step)

    def _send(self, metrics: Mapping[str, float], step: int,
              series: Mapping[str, list[list[float]]] | None = None) -> None:
        now = int(time.time() * 1000)
        points = [Metric(name, float(v), now, int(s)) for name, pairs in (series or {}).items() for s, v in pairs]
        points += [Metric(k, float(v), now, step) for k, v in metrics.items()]
        # the epoch's own metrics last, so "loss" (what a restart reads as logged) arrives with the final batch
        for i in range(0, len(points), MAX_BATCH):
            self.pending.append(points[i:i + MAX_BATCH])
        self.flush()

    def best_of(self, seen: Mapping[str, float]) -> dict[str, float]:
        """``best_<key>``: the largest value of each key of ``seen`` over the run's epochs: this attempt's
        (``seen``, which a store that is down has not taken) and the store's history (a resumed run's earlier
        attempts). Keys no epoch logged are left out."""
        out = {}
        for key, value in seen.items():
            try:
                logged = [m.value for m in self.client.get_metric_history(self.run_id, key)]
            except Exception as err:  # noqa: BLE001 - the store is down: this attempt's epochs only
                self._went_down(err)
                logged = []
            values = [v for v in (*logged, value) if v == v]  # NaN (no monitor that epoch) never wins
            if values:
                out[f"best_{key}"] = max(values)
        return out

    def flush(self) -> bool:
        """Send what is pending, oldest first; False (and kept) if the store does not answer."""
        while self.pending:
            try:
                self.client.log_batch(self.run_id, metrics=self.pending[0])
            except Exception as err:  # noqa: BLE001 - any failure of the store: keep the batch, go on training
                self._went_down(err)
                return False
            self.pending.pop(0)
        if self._down_since is not None:
            self.say(f"MLflow: the tracking store answers again after {time.time() - self._down_since:.0f} s; "
                     f"buffered metrics sent")
            self._down_since = None
        return True

    def _went_down(self, err: Exception) -> None:
        if self._down_since is None:
            self._down_since = time.time()
            self.say(f"MLflow: cannot log to the tracking store ({type(err).__name__}); training goes on and "
                     f"the metrics are kept until it answers")

    def log_datasets(self, records: list[DatasetRecord]) -> None:
        """The run's data as MLflow dataset inputs (the UI's Dataset column); logging the same again is a no-op."""
        try:
            self.client.log_inputs(self.run_id, datasets=[dataset_input(r) for r in records])
        except Exception as err:  # noqa: BLE001
            self._went_down(err)

    def set_tag(self, key: str, value: str) -> None:
        try:
            self.client.set_tag(self.run_id, key, value)
        except Exception as err:  # noqa: BLE001
            self._went_down(err)

    def log_dict(self, data: Mapping, artifact_file: str) -> bool:
        """A JSON artifact of the run (best-effort, like the metrics; a lost one is said, not retried)."""
        try:
            self.client.log_dict(self.run_id, dict(data), artifact_file)
            return True
        except Exception as err:  # noqa: BLE001
            self._went_down(err)
            return False

    def log_figure(self, path: Path | str, artifact_path: str | None = None) -> bool:
        try:
            self.client.log_artifact(self.run_id, str(path), artifact_path)
            return True
        except Exception as err:  # noqa: BLE001
            self._went_down(err)
            return False

    def close(self) -> int:
        """Last try for what is pending; the number of metric batches still unsent (``unsent`` holds them)."""
        if not self.flush():
            self.lost = len(self.pending)
        return self.lost

    def unsent(self) -> str:
        """What the store has not taken, as JSON: [[[key, value, timestamp, step], ...], ...] by batch."""
        return json.dumps([[[m.key, m.value, m.timestamp, m.step] for m in batch] for batch in self.pending])

    def take_back(self, unsent: str) -> bool:
        """Send what an earlier process could not (``unsent``'s JSON) before anything else; True once sent.

        Its steps count as logged: a restart's replay of those epochs is skipped, as for any logged epoch.
        """
        batches = [[Metric(k, float(v), int(t), int(s)) for k, v, t, s in batch] for batch in json.loads(unsent)]
        self.pending = batches + self.pending
        losses = [m.step for batch in batches for m in batch if m.key == "loss"]
        self.last_step = max([self.last_step, *losses])
        return self.flush()


DATASET_CONTEXT = {"train": "training", "test": "evaluation", "val": "validation"}


def dataset_input(record: DatasetRecord) -> DatasetInput:
    """One split as MLflow's ``DatasetInput``: named ``<set>-<split>``, our digest, size and shape as profile."""
    profile = {"num_images": record.size, "split": record.split, "image_shape": [record.channels,
               record.image_size, record.image_size], "digest_covers": record.hashed}
    ds = Dataset(name=f"{record.name}-{record.split}", digest=record.digest, source_type="mocolab",
                 source=json.dumps({"data.name": record.name, "split": record.split}),
                 profile=json.dumps(profile))
    return DatasetInput(ds, tags=[InputTag("mlflow.data.context", DATASET_CONTEXT.get(record.split, record.split))])
