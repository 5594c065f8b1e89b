"""Runs read straight from MLflow's own database tables, where the tracking URI is a database.

MLflow's search builds an ORM object for every param, tag and latest metric of every run it returns (about
a hundred for a trial) before it makes the entities a caller reads: at a thousand trials that is seconds of
object bookkeeping for rows a plain query returns in a fraction of one.  These reads ask the same tables
(``runs``, ``params``, ``tags``, ``latest_metrics``, ``inputs``, ``datasets``, ``input_tags``) through
SQLAlchemy Core, with MLflow's table definitions, and build the same ``Run`` entities MLflow's search
returns.  A store behind an MLflow server has no such path: ``tracking/store.py`` searches it through MLflow.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from mlflow.entities import (Dataset, DatasetInput, InputTag, LoggedModelOutput, Metric, Param, Run, RunData,
                             RunInfo, RunInputs, RunOutputs, RunTag)
from mlflow.store.tracking.dbmodels.models import (SqlDataset, SqlInput, SqlInputTag, SqlLatestMetric, SqlParam,
                                                   SqlRun, SqlTag)
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME
from sqlalchemy import case, select
from sqlalchemy.engine import Connection, Engine

RUNS, PARAMS, TAGS = SqlRun.__table__, SqlParam.__table__, SqlTag.__table__
LATEST, INPUTS, DATASETS, INPUT_TAGS = (SqlLatestMetric.__table__, SqlInput.__table__, SqlDataset.__table__,
                                        SqlInputTag.__table__)
ACTIVE = "active"  # MLflow's lifecycle stage of a run not deleted: its search's default view


def read_runs(engine: Engine, experiment_ids: Iterable[str], *, status: str | None = None,
              parent_run_id: str | None = None, newest_first: bool = False) -> list[Run]:
    """The active runs of ``experiment_ids`` as MLflow's search returns them (info, params, tags, latest
    metrics, dataset inputs, model outputs), in its order for ``attributes.start_time ASC`` (or ``DESC``),
    a run without a start time last, ties broken by run id; ``status``: only runs of that MLflow status;
    ``parent_run_id``: only that run's children.  A run's dataset inputs come in the database's order, which
    MLflow's search leaves unspecified as well (PostgreSQL may return them in another order than either).
    The experiment ids are taken as given: MLflow's workspaces, which would filter them, are not used by
    mocolab."""
    where = [RUNS.c.experiment_id.in_([int(e) for e in experiment_ids]), RUNS.c.lifecycle_stage == ACTIVE]
    if status is not None:
        where.append(RUNS.c.status == status)
    if parent_run_id is not None:
        where.append(RUNS.c.run_uuid.in_(select(TAGS.c.run_uuid).where(TAGS.c.key == MLFLOW_PARENT_RUN_ID,
                                                                        TAGS.c.value == parent_run_id)))
    chosen = select(RUNS.c.run_uuid).where(*where)
    start = RUNS.c.start_time.desc() if newest_first else RUNS.c.start_time
    order = (case((RUNS.c.start_time.is_(None), 1), else_=0), start, RUNS.c.run_uuid)  # MLflow's: no time last
    with engine.connect() as con:
        infos = con.execute(select(RUNS.c.run_uuid, RUNS.c.name, RUNS.c.experiment_id, RUNS.c.user_id,
                                   RUNS.c.status, RUNS.c.start_time, RUNS.c.end_time, RUNS.c.lifecycle_stage,
                                   RUNS.c.artifact_uri).where(*where).order_by(*order)).all()
        params = _grouped(con, select(PARAMS.c.run_uuid, PARAMS.c.key, PARAMS.c.value)
                          .where(PARAMS.c.run_uuid.in_(chosen)), lambda r: Param(r.key, r.value))
        tags = _grouped(con, select(TAGS.c.run_uuid, TAGS.c.key, TAGS.c.value)
                        .where(TAGS.c.run_uuid.in_(chosen)), lambda r: RunTag(r.key, r.value))
        metrics = _grouped(con, select(LATEST.c.run_uuid, LATEST.c.key, LATEST.c.value, LATEST.c.timestamp,
                                       LATEST.c.step, LATEST.c.is_nan).where(LATEST.c.run_uuid.in_(chosen)),
                           lambda r: Metric(r.key, float("nan") if r.is_nan else r.value, r.timestamp, r.step))
        inputs = _dataset_inputs(con, chosen)
        outputs = _grouped(con, select(INPUTS.c.source_id.label("run_uuid"), INPUTS.c.destination_id, INPUTS.c.step)
                           .where(INPUTS.c.source_type == "RUN_OUTPUT", INPUTS.c.destination_type == "MODEL_OUTPUT",
                                  INPUTS.c.source_id.in_(chosen)),
                           lambda r: LoggedModelOutput(model_id=r.destination_id, step=r.step))
    runs = []
    for r in infos:
        info = RunInfo(run_id=r.run_uuid, run_name=r.name, experiment_id=str(r.experiment_id), user_id=r.user_id,
                       status=r.status, start_time=r.start_time, end_time=r.end_time,
                       lifecycle_stage=r.lifecycle_stage, artifact_uri=r.artifact_uri)
        run_tags = tags.get(r.run_uuid, [])
        if not info.run_name:  # as MLflow names a run stored without one: from its tag
            named = next((t.value for t in run_tags if t.key == MLFLOW_RUN_NAME), None)
            if named:
                info._set_run_name(named)
        data = RunData(metrics=metrics.get(r.run_uuid, []), params=params.get(r.run_uuid, []), tags=run_tags)
        runs.append(Run(info, data, RunInputs(dataset_inputs=inputs.get(r.run_uuid, [])),
                        RunOutputs(outputs.get(r.run_uuid, []))))
    return runs


def _grouped(con: Connection, query, make) -> dict[str, list]:
    """``make(row)`` of every row of ``query``, by the row's run id."""
    out: dict[str, list] = defaultdict(list)
    for row in con.execute(query):
        out[row.run_uuid].append(make(row))
    return out


def _dataset_inputs(con: Connection, chosen) -> dict[str, list[DatasetInput]]:
    """Each run's dataset inputs with their tags (MLflow's ``mlflow.data.context`` among them), by run id."""
    rows = con.execute(
        select(INPUTS.c.destination_id.label("run_uuid"), DATASETS.c.dataset_uuid, DATASETS.c.name,
               DATASETS.c.digest, DATASETS.c.dataset_source_type, DATASETS.c.dataset_source,
               DATASETS.c.dataset_schema, DATASETS.c.dataset_profile, INPUT_TAGS.c.name.label("tag"),
               INPUT_TAGS.c.value.label("tag_value"))
        .select_from(INPUTS)
        .join(DATASETS, INPUTS.c.source_id == DATASETS.c.dataset_uuid)
        .outerjoin(INPUT_TAGS, INPUT_TAGS.c.input_uuid == INPUTS.c.input_uuid)
        .where(INPUTS.c.destination_type == "RUN", INPUTS.c.destination_id.in_(chosen)))
    per_run: dict[str, dict[str, DatasetInput]] = defaultdict(dict)
    for r in rows:
        found = per_run[r.run_uuid].get(r.dataset_uuid)
        if found is None:
            found = per_run[r.run_uuid][r.dataset_uuid] = DatasetInput(
                dataset=Dataset(name=r.name, digest=r.digest, source_type=r.dataset_source_type,
                                source=r.dataset_source, schema=r.dataset_schema, profile=r.dataset_profile), tags=[])
        if r.tag is not None:
            found.tags.append(InputTag(key=r.tag, value=r.tag_value))
    return {run_id: list(found.values()) for run_id, found in per_run.items()}
