"""A live report (``--watch``) rebuilt at every trial's end, on a real sqlite MLflow store: its history reads grow
with the trials, not with trials times rebuilds, and its curves' legend stays short at hundreds of trials."""

from __future__ import annotations

import pandas as pd
from mlflow.entities import Metric, Param, RunTag
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient

from conftest import mlflow_store
from mocolab.analysis.probe_curves import ONLINE_KEYS
from mocolab.analysis.report import CURVES, LEGEND_MAX, build_report, legend_groups
from mocolab.tracking.store import PARENT_ID_TAG, PARENT_TAG, STATUS_TAG, HistoryCache


def counted_history_reads(monkeypatch) -> dict[str, int]:
    """``{"reads": n}``: the requests for metric histories that MLflow's database store answers from here on,
    one run's or many runs' at once, each counted as it passes."""
    calls = {"reads": 0}
    for name in ("get_metric_history", "get_metric_history_bulk"):
        real = getattr(SqlAlchemyStore, name)

        def counted(self, *args, _real=real, **kwargs):
            calls["reads"] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(SqlAlchemyStore, name, counted)
    return calls


def _trial(client: MlflowClient, exp: str, parent: str, i: int) -> None:
    """A finished child run shaped as a trial logs one: params, three epochs of the curves' metrics, finals."""
    run_id = client.create_run(exp, run_name=f"t{i}").info.run_id
    m = (0.9, 0.99, 0.999)[i % 3]
    metrics = [Metric(key, 1.0 / (epoch + i), 0, epoch * 10) for epoch in (1, 2, 3) for key, _ in CURVES]
    metrics += [Metric("linear_top1", 0.5 + 0.01 * i, 0, 30), Metric("knn_top1", 0.4, 0, 30)]
    client.log_batch(run_id, metrics=metrics,
                     params=[Param("moco.m", str(m)), Param("run.seed", str(i // 3))],
                     tags=[RunTag(PARENT_ID_TAG, parent), RunTag("trial", f"m={m} seed={i // 3}"),
                           RunTag(STATUS_TAG, "finished")])
    client.set_terminated(run_id, "FINISHED")


def test_watch_rebuilds_read_each_ended_trial_once(tmp_path, monkeypatch):
    """A sweep of n trials with a rebuild at each trial's end: len(CURVES) reads per trial in all (today's
    rebuilds read every trial again: n(n+1)/2 times as many)."""
    uri = mlflow_store(tmp_path)
    client = MlflowClient(uri)
    exp = client.create_experiment("momentum-ablation")
    parent = client.create_run(exp, run_name="sweep", tags={PARENT_TAG: "sweep"}).info.run_id
    calls = counted_history_reads(monkeypatch)
    histories = HistoryCache()
    reads = []
    for i in range(6):
        _trial(client, exp, parent, i)
        calls["reads"] = 0
        rep = build_report("momentum-ablation", tmp_path / "live", parent_run=parent, tracking_uri=uri,
                           log_artifacts=False, refresh_s=5, histories=histories)
        assert rep.trials == i + 1
        reads.append(calls["reads"])
    # the new trial's curves (its epochs counted from its loss history) and its online-probe series, one read each
    assert reads == [len(CURVES) + len(ONLINE_KEYS)] * 6
    calls["reads"] = 0
    build_report("momentum-ablation", tmp_path / "live", parent_run=parent, tracking_uri=uri, log_artifacts=False,
                 refresh_s=5, histories=histories)
    assert calls["reads"] == 0  # nothing new: every curve kept
    assert "<td>3</td>" in rep.html.read_text()  # epochs done, from the kept histories


def test_the_curves_legend_stays_short_at_hundreds_of_trials():
    few = pd.DataFrame({"label": [f"t{i}" for i in range(4)], "params.moco.m": [0.9, 0.99] * 2})
    assert legend_groups(few, ["moco.m"]) == ([("t0", [0]), ("t1", [1]), ("t2", [2]), ("t3", [3])], [])
    many = pd.DataFrame({"label": [f"t{i}" for i in range(300)], "params.moco.m": [0.9, 0.99, 0.999] * 100,
                         "params.optim.lr": [0.001 * i for i in range(300)]})
    groups, rest = legend_groups(many, ["optim.lr", "moco.m"])  # lr has 300 values: grouped by m
    assert [label for label, _ in groups] == ["moco.m=0.9 (100 trials)", "moco.m=0.99 (100 trials)",
                                              "moco.m=0.999 (100 trials)"]
    assert sorted(i for _, rows in groups for i in rows) == list(range(300)) and rest == []
    groups, rest = legend_groups(many, ["optim.lr"])  # nothing with few values: the first ones, the rest counted
    assert len(groups) == LEGEND_MAX and rest == list(range(LEGEND_MAX, 300))
