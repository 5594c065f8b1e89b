"""What a store of many runs costs its readers: every run is read (page by page), ended runs' histories are read
once, and the addresses printed for the UI stay short at any number of trials. A real sqlite MLflow store; the
page size is lowered so that a few dozen runs span several pages."""

from __future__ import annotations

import json
import urllib.parse

from mlflow.tracking import MlflowClient

from conftest import mlflow_store
from mocolab.tracking import PARENT_ID_TAG, Store, ui_links
from mocolab.tracking import store as store_module
from mocolab.tracking.store import HistoryCache
from mocolab.tracking.uri import COMPARE_MAX_RUNS

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


def test_runs_reads_every_page_oldest_first(tmp_path, monkeypatch):
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
    assert CountingClient.searches == 5  # ceil(30 / 7) pages
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
