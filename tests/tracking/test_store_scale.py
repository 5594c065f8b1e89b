"""What a store of many runs costs its readers: every run is read (a search page by page), a curve of every
trial in a few bulk reads and an ended run's once, a report asks no more of the store for more trials, and the
addresses printed for the UI stay short at any number of trials. A real sqlite MLflow store; the
page size is lowered so that a few dozen runs span several pages."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import mlflow_store
from mocolab.tracking import PARENT_ID_TAG, Store, ui_links
from mocolab.tracking import store as store_module
from mocolab.tracking.store import HistoryCache
from mocolab.tracking.uri import COMPARE_MAX_RUNS

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000  # ms: runs are created with start times a second apart, in a shuffled order


class CountingClient(MlflowClient):
    """The real client, counting the searches it sends and the histories it reads."""

    searches = 0
    history_reads = 0

    def search_runs(self, *args, **kwargs):
        type(self).searches += 1
        return super().search_runs(*args, **kwargs)

    def get_metric_history(self, *args, **kwargs):
        type(self).history_reads += 1
        return super().get_metric_history(*args, **kwargs)


def test_runs_reads_every_run_oldest_first_and_a_search_every_page(tmp_path, monkeypatch):
    uri = mlflow_store(tmp_path)
    client = MlflowClient(uri)
    exp = client.create_experiment("many")
    parent = client.create_run(exp, start_time=T0 - 1000, run_name="sweep").info.run_id
    order = [(i * 7) % 30 for i in range(30)]  # created out of start-time order: the store must sort them
    ids = {}
    for i in order:
        ids[i] = client.create_run(exp, start_time=T0 + 1000 * i, run_name=f"t{i}",
                                   tags={PARENT_ID_TAG: parent}).info.run_id
    client.create_run(exp, start_time=T0 + 500, run_name="other")  # not the sweep's
    monkeypatch.setattr(store_module, "RUNS_PAGE_SIZE", 7)
    monkeypatch.setattr(store_module, "MlflowClient", CountingClient)
    CountingClient.searches = 0
    store = Store(uri)

    children = store.runs(exp, parent_run_id=parent)
    assert [r.info.run_id for r in children] == [ids[i] for i in range(30)]  # all 30, oldest first
    assert CountingClient.searches == 0  # a database store: read from its tables (tests/tracking/test_sql_runs.py)
    searched = store.search_all([exp], f"tags.`{PARENT_ID_TAG}` = '{parent}'", order_by=["attributes.start_time ASC"])
    assert [r.info.run_id for r in searched] == [ids[i] for i in range(30)]
    assert CountingClient.searches == 5  # ceil(30 / 7) pages: a server's store is searched to its last page
    everything = store.runs(exp)
    assert len(everything) == 32 and everything[0].info.run_id == parent
    assert [r.info.run_name for r in everything[1:4]] == ["t0", "other", "t1"]
    assert [r.info.run_id for r in store.trial_runs(exp)] == [r.info.run_id for r in everything[1:]]


def test_history_cache_reads_an_ended_run_once_and_a_running_one_each_time(tmp_path, monkeypatch):
    uri = mlflow_store(tmp_path)
    monkeypatch.setattr(store_module, "MlflowClient", CountingClient)
    store = Store(uri)
    exp = store.experiment_id("h", create=True)
    run_id = store.client.create_run(exp).info.run_id
    cache = HistoryCache()
    CountingClient.history_reads = 0
    for step in (1, 2):  # running: every read sees the new point
        store.client.log_metric(run_id, "loss", 1.0 / step, step=step)
        assert len(cache.history(store, store.client.get_run(run_id), "loss")) == step
    assert CountingClient.history_reads == 2
    store.client.set_terminated(run_id, "FINISHED", end_time=T0)
    ended = store.client.get_run(run_id)
    assert [cache.history(store, ended, "loss") for _ in range(3)][-1] == [(1, 1.0), (2, 0.5)]
    assert CountingClient.history_reads == 3  # once for the ended run
    # resumed and ended again (another end time): read afresh
    store.client.update_run(run_id, status="RUNNING")
    store.client.log_metric(run_id, "loss", 0.25, step=3)
    store.client.set_terminated(run_id, "FINISHED", end_time=T0 + 1)
    assert cache.history(store, store.client.get_run(run_id), "loss")[-1] == (3, 0.25)


def test_ui_links_stay_short_at_any_number_of_trials():
    ids = [f"{i:032x}" for i in range(300)]
    links = ui_links("7", ids, "http://127.0.0.1:5000", parent_run_id="f" * 32)
    assert all(len(link) < 1000 for link in links.values()), {k: len(v) for k, v in links.items()}
    query = urllib.parse.parse_qs(links["compare"].split("?", 1)[1])
    assert json.loads(query["runs"][0]) == ids[:COMPARE_MAX_RUNS]  # the first ones given (the caller's best)
    sweep = urllib.parse.parse_qs(links["sweep"].split("?", 1)[1])
    assert sweep == {"workflowType": ["machine_learning"],
                     "searchFilter": [f"tags.`mlflow.parentRunId` = '{'f' * 32}'"]}
    assert links["sweep"].startswith("http://127.0.0.1:5000/#/experiments/7/runs?")  # the bare address drops it
    assert len(ui_links("7", ids[:3], parent_run_id="f" * 32)["sweep"]) == len(links["sweep"])
    assert "sweep" not in ui_links("7", ids)


def _sweep_of(uri: str, trials: int) -> tuple[str, str]:
    """(experiment id, parent run id) of a sweep of ``trials`` ended trials over two momenta, three epochs each,
    that logged the curves a report draws and no feature maps."""
    from mlflow.entities import Metric, Param, RunTag

    from mocolab.tracking.store import STATUS_TAG

    client = MlflowClient(uri)
    exp = client.create_experiment("many")
    parent = client.create_run(exp, run_name="sweep").info.run_id
    for i in range(trials):
        m = (0.9, 0.99)[i % 2]
        run_id = client.create_run(exp, run_name=f"t{i}", start_time=T0 + i).info.run_id
        curves = [Metric(k, 1.0 / e + 0.01 * i, T0, 10 * e) for e in (1, 2, 3)
                  for k in ("loss", "knn_top1", "pretext_acc", "staleness_mean", "online_linear_top1")]
        client.log_batch(run_id, metrics=[*curves, Metric("linear_top1", 0.5 + m / 10, T0, 30)],
                         params=[Param("moco.m", str(m)), Param("run.seed", str(i // 2))],
                         tags=[RunTag(PARENT_ID_TAG, parent), RunTag("trial", f"m={m} seed={i // 2}"),
                               RunTag(STATUS_TAG, "finished")])
        client.set_terminated(run_id, "FINISHED")
    return exp, parent


def test_a_reports_reads_do_not_grow_with_its_trials(tmp_path, monkeypatch):
    """A report of 30 trials asks the store as often as one of 6: each curve in one bulk read for all trials,
    and a feature map looked for in at most ``MAP_TRIES`` runs of an arm, however many seeds it has. Counted on
    the store behind the client (MLflow's own database store, its requests counted as they pass): a feature map
tried costs get_run calls."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from mocolab.analysis.report import build_report

    calls: dict[str, int] = {}
    for name in ("get_metric_history", "get_metric_history_bulk", "get_run"):
        real = getattr(SqlAlchemyStore, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(SqlAlchemyStore, name, counted)
    reads = {}
    for trials in (6, 30):
        uri = mlflow_store(tmp_path / str(trials))
        _, parent = _sweep_of(uri, trials)
        calls.clear()
        rep = build_report("many", tmp_path / f"out{trials}", parent_run=parent, tracking_uri=uri,
                           log_artifacts=False)
        assert rep.trials == trials and (tmp_path / f"out{trials}" / "curves.png").exists()
        reads[trials] = dict(calls)
    assert reads[6] == reads[30], reads
    assert reads[30].get("get_metric_history", 0) == 0, reads  # no trial's curve read on its own


def test_metric_histories_are_the_runs_own_in_any_number_of_bulk_reads(tmp_path, monkeypatch):
    uri = mlflow_store(tmp_path)
    exp, parent = _sweep_of(uri, 9)
    store = Store(uri)
    ids = [r.info.run_id for r in store.trial_runs(exp, parent)]
    empty = store.client.create_run(exp).info.run_id  # logged nothing: an empty curve, not a missing one
    monkeypatch.setattr(store_module, "HISTORY_BULK_RUNS", 4)
    bulk = store.metric_histories([*ids, empty], "loss")
    assert bulk == {**{r: store.metric_history(r, "loss") for r in ids}, empty: []}
    assert all(len(pairs) == 3 for r, pairs in bulk.items() if r != empty)
    # kept across rebuilds: ended runs are read once
    cache = HistoryCache()
    runs = store.trial_runs(exp, parent)
    assert cache.histories(store, runs, "loss") == {r: bulk[r] for r in ids}
    monkeypatch.setattr(store_module.Store, "metric_histories", lambda *a: pytest.fail("read again"))
    assert cache.histories(store, runs, "loss") == {r: bulk[r] for r in ids}


def test_metric_histories_over_an_mlflow_server_are_the_runs_own(tmp_path, monkeypatch):
    from conftest import _free_port, start_mlflow_server, stop_mlflow_server

    port = _free_port()
    proc = start_mlflow_server(tmp_path, port)
    try:
        uri = f"http://127.0.0.1:{port}"
        exp, parent = _sweep_of(uri, 5)
        store = Store(uri)
        ids = [r.info.run_id for r in store.trial_runs(exp, parent)]
        monkeypatch.setattr(store_module, "HISTORY_BULK_RUNS", 2)
        assert store.metric_histories(ids, "knn_top1") == {r: store.metric_history(r, "knn_top1") for r in ids}
    finally:
        stop_mlflow_server(proc)


def test_the_store_benchmark_logs_the_keys_a_smoke_trial_logs(tmp_path):
    """benchmarks/tracking/trial_shape.py: a made-up trial carries the metric keys a real smoke run logs
    (tests/training/test_train.py's list, checked there against a trained run), its constants as tags."""
    import sys

    from mocolab.tracking.mlflow_log import RunTracker
    from mocolab.tracking.run_keys import CONSTANTS, SYSTEM_PREFIX, constant_tag
    from mocolab.tracking.store import SweepRun
    from mocolab.training.code_fingerprint import CodeFingerprint
    from training.test_train import MODEL_METRICS

    sys.path.insert(0, str(REPO / "benchmarks" / "tracking"))
    try:
        from trial_shape import log_trial, trial_shape
    finally:
        sys.path.remove(str(REPO / "benchmarks" / "tracking"))
    uri = mlflow_store(tmp_path)
    store = Store(uri)
    sweep = SweepRun.open(store, "shape", "s", description="", params={}, tags={})
    run_id = log_trial(RunTracker(uri, "shape"), uri, "s", sweep.run_id, "moco.m=0.9 seed=0",
                       {"moco.m": 0.9}, trial_shape(), CodeFingerprint("0" * 16), 0)
    run = store.client.get_run(run_id)
    assert sorted(k for k in run.data.metrics if not k.startswith(SYSTEM_PREFIX)) == MODEL_METRICS
    assert {constant_tag(k) for k in CONSTANTS} <= set(run.data.tags)
    assert run.data.params["moco.m"] == "0.9" and run.info.status == "FINISHED"
    assert run.data.tags[PARENT_ID_TAG] == sweep.run_id
