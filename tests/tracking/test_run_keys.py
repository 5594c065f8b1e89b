"""Where a run's numbers go in MLflow (tracking/run_keys.py), and that a trials table reads them the same from
either place: as tags and ``system/`` metrics, or as the plain metrics a store such as results/runs.db holds."""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from conftest import mlflow_store
from mocolab.tracking import trials_frame
from mocolab.tracking.run_keys import constant_tags, for_mlflow, run_value
from mocolab.tracking.store import TRIAL_METRICS

EPOCH = {"loss": 7.1, "lr": 0.06, "pretext_acc": 0.4, "knn_top1": 0.62, "staleness_mean": 8.0,
         "staleness_max": 16.0, "images_per_s": 812.5, "seconds": 2.5}
CONSTANTS = {"ema_half_life": 68.96756393652844, "max_staleness_bound": 64.0}
FINAL = {"linear_top1": 0.7, "knn_top1": 0.65, "final_loss": 6.9, "worker_rss_growth_mb": 41.25,
         "worker_rss_growth_after_warmup_mb": math.nan}


def test_the_constants_are_tags_and_the_process_measures_system_metrics():
    logged = for_mlflow({**EPOCH, **CONSTANTS})
    assert sorted(logged) == ["knn_top1", "loss", "lr", "pretext_acc", "staleness_max", "staleness_mean",
                              "system/images_per_s", "system/seconds"]
    tags = constant_tags(CONSTANTS)
    assert tags == {"mocolab.ema_half_life": "68.96756393652844", "mocolab.max_staleness_bound": "64.0"}
    assert run_value(tags, logged, "ema_half_life") == CONSTANTS["ema_half_life"]  # the same float back
    assert run_value(tags, logged, "images_per_s") == 812.5 and math.isnan(run_value(tags, logged, "drift_cos"))


def test_a_trials_table_reads_the_same_from_tags_and_system_metrics_as_from_plain_metrics(tmp_path):
    client = MlflowClient(mlflow_store(tmp_path))
    exp = client.create_experiment("keys")
    plain = client.create_run(exp, run_name="plain").info.run_id  # every number a metric
    for key, value in {**EPOCH, **CONSTANTS, **FINAL}.items():
        client.log_metric(plain, key, value, step=16)
    placed = client.create_run(exp, run_name="placed").info.run_id  # as the worker logs a run
    for key, value in constant_tags(CONSTANTS).items():
        client.set_tag(placed, key, value)
    for key, value in {**for_mlflow({**EPOCH, **CONSTANTS}), **for_mlflow(FINAL)}.items():
        client.log_metric(placed, key, value, step=16)
    assert not any(k in CONSTANTS for k in client.get_run(placed).data.metrics)
    rows = trials_frame([client.get_run(plain), client.get_run(placed)]).set_index("label")
    for key in TRIAL_METRICS:
        a, b = rows.loc["plain", key], rows.loc["placed", key]
        assert (math.isnan(a) and math.isnan(b)) or a == b, key
    assert rows.loc["placed", "ema_half_life"] == CONSTANTS["ema_half_life"]
    assert rows.loc["placed", "max_staleness_bound"] == pytest.approx(64.0)
