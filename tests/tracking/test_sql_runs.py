"""A database store's runs read straight from MLflow's tables (``tracking/sql_runs.py``): the same answer as
MLflow's own search on a real sqlite store, and the report and the leaderboard of more trials build no more
MLflow ORM objects."""

from __future__ import annotations

import sqlite3

from mlflow.entities import Dataset, DatasetInput, InputTag, LoggedModelOutput, Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from conftest import mlflow_store
from mocolab.tracking import PARENT_ID_TAG, Store
from mocolab.tracking.store import STATUS_TAG

T0 = 1_700_000_000_000  # ms


def _store_of_every_kind(uri: str) -> tuple[str, str, str]:
    """(experiment, other experiment, sweep parent): runs finished, running and failed, deleted, nested under a
    parent, named only by their tag, with a NaN metric, with dataset inputs and a model output, in two
    experiments, some without a param or metric the others have, two sharing a start time."""
    client = MlflowClient(uri)
    exp, other = client.create_experiment("e"), client.create_experiment("other")
    parent = client.create_run(exp, start_time=T0, run_name="sweep").info.run_id
    data = Dataset("cifar", "abcdef0123", "local", '{"uri": "/data"}', schema='{"x": 1}')
    for i in range(6):
        run_id = client.create_run(exp, start_time=T0 + 1000 * (i % 4), run_name=f"t{i}",
                                   tags={PARENT_ID_TAG: parent} if i < 4 else {}).info.run_id
        params = [Param("moco.m", str(0.9 + i / 100))] + ([Param("queue.size", "4096")] if i % 2 else [])
        metrics = [Metric("loss", 1.0 / (s + 1), T0 + s, s) for s in range(3)]
        metrics += [Metric("linear_top1", float("nan") if i == 3 else 0.5 + i / 100, T0, 9)] if i != 2 else []
        client.log_batch(run_id, metrics=metrics, params=params, tags=[RunTag("trial", f"t{i}"),
                                                                       RunTag(STATUS_TAG, "finished")])
        if i in (1, 4):
            client.log_inputs(run_id, [DatasetInput(data, [InputTag("mlflow.data.context", "training")]),
                                       DatasetInput(Dataset("eval", "99", "local", "{}"), [])])
        if i == 1:
            client.log_outputs(run_id, [LoggedModelOutput("m-123", 7)])
        if i != 0:  # one left running
            client.set_terminated(run_id, "FAILED" if i == 5 else "FINISHED", end_time=T0 + 5000 + i)
    client.delete_run(client.create_run(exp, start_time=T0 + 2500, tags={PARENT_ID_TAG: parent}).info.run_id)
    client.create_run(other, start_time=T0 + 1500, run_name="elsewhere")
    by_tag = client.create_run(exp, start_time=T0 + 3500, tags={"mlflow.runName": "by-tag"}).info.run_id
    # a run whose name is in its tag alone, as stores MLflow wrote before it kept names in the runs table hold
    # some: MLflow's search names it from the tag
    with sqlite3.connect(uri.removeprefix("sqlite:///")) as db:
        db.execute("UPDATE runs SET name = '' WHERE run_uuid = ?", (by_tag,))
    return exp, other, parent


def _as_dicts(runs) -> list[dict]:
    """Runs as MLflow's dictionaries, a NaN metric as text (NaN equals nothing, itself included)."""
    out = [r.to_dictionary() for r in runs]
    for run in out:
        metrics = run["data"].get("metrics", {})
        run["data"]["metrics"] = {k: "nan" if v != v else v for k, v in metrics.items()}
    return out


def test_a_database_read_returns_what_mlflows_search_returns(tmp_path):
    uri = mlflow_store(tmp_path)
    exp, other, parent = _store_of_every_kind(uri)
    store = Store(uri)
    assert store._database() is not None  # the direct read is what is checked here
    search = store.search_all
    cases = [
        (store.find_runs([exp]), search([exp], order_by=["attributes.start_time ASC"])),
        (store.find_runs([exp, other], newest_first=True), search([exp, other])),
        (store.find_runs([exp], status="RUNNING"), search([exp], "attributes.status = 'RUNNING'",
                                                          order_by=["attributes.start_time ASC"])),
        (store.find_runs([exp, other], status="FINISHED", newest_first=True),
         search([exp, other], "attributes.status = 'FINISHED'")),
        (store.runs(exp, parent_run_id=parent), search([exp], f"tags.`{PARENT_ID_TAG}` = '{parent}'",
                                                       order_by=["attributes.start_time ASC"])),
    ]
    for mine, mlflows in cases:
        assert _as_dicts(mine) == _as_dicts(mlflows)
    every = store.find_runs([exp])
    assert len(every) == 8 and len(cases[4][0]) == 4  # the deleted run in neither
    by_name = {r.info.run_name: r for r in every}
    assert "by-tag" in by_name and by_name["t1"].outputs.model_outputs[0].model_id == "m-123"
    assert {d.dataset.name for d in by_name["t1"].inputs.dataset_inputs} == {"cifar", "eval"}
    assert "linear_top1" not in by_name["t2"].data.metrics and "queue.size" not in by_name["t0"].data.params


def _trials(uri: str, n: int) -> None:
    """``n`` finished trials of one sweep, each with params, a curve and a final score."""
    client = MlflowClient(uri)
    exp = client.create_experiment("many")
    parent = client.create_run(exp, run_name="sweep", tags={"mocolab.sweep_parent": "sweep"}).info.run_id
    for i in range(n):
        m = (0.9, 0.99)[i % 2]
        run_id = client.create_run(exp, run_name=f"t{i}", start_time=T0 + i).info.run_id
        client.log_batch(run_id, metrics=[*(Metric("loss", 1.0 / e, T0, e) for e in (1, 2)),
                                          Metric("linear_top1", 0.5 + i / 1000, T0, 2)],
                         params=[Param("moco.m", str(m)), Param("run.seed", str(i // 2)),
                                 *(Param(f"f{k}", str(k)) for k in range(20))],
                         tags=[RunTag(PARENT_ID_TAG, parent), RunTag("trial", f"m={m} seed={i // 2}"),
                               RunTag(STATUS_TAG, "finished")])
        client.set_terminated(run_id, "FINISHED")


def test_the_report_and_leaderboard_build_no_orm_row_per_trial(tmp_path):
    """The whole experiment's report and the leaderboard of 30 trials make as many MLflow ORM objects of
    params, tags and latest metrics as of 6: MLflow's search makes one per row of every run it returns
    (about a hundred a trial), the bulk of their time at a thousand trials."""
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlParam, SqlTag
    from sqlalchemy import event

    from mocolab.analysis.report import build_report
    from mocolab.evaluation.leaderboard import build_leaderboard

    made = {"rows": 0}

    def count(*_):
        made["rows"] += 1

    models = (SqlParam, SqlTag, SqlLatestMetric)
    for model in models:
        event.listen(model, "load", count)
    try:
        rows = {}
        for n in (6, 30):
            uri = mlflow_store(tmp_path / str(n))
            _trials(uri, n)
            made["rows"] = 0
            assert build_report("many", tmp_path / f"out{n}", tracking_uri=uri, log_artifacts=False).trials == n
            assert len(build_leaderboard(tracking_uri=uri).table) == min(n, 10)
            rows[n] = made["rows"]
    finally:
        for model in models:
            event.remove(model, "load", count)
    assert rows[6] == rows[30], rows
