"""The pictures a study's arms add to its report: the features' t-SNE maps side by side
(analysis/feature_maps.py) and the online probe's curves (analysis/probe_curves.py), on a real MLflow store."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from conftest import mlflow_store
from mocolab.analysis.feature_maps import (FEATURES_NAME, MAP_DIR, MAP_FILE, MAP_NAME, balanced_sample, embed_2d,
                                           feature_map_panels, load_map, map_panels, save_features, save_map)
from mocolab.analysis.probe_curves import arms, probe_curves
from mocolab.analysis.report import build_report, png_size
from mocolab.tracking import Store


def test_the_balanced_set_is_the_first_images_of_each_class_in_the_splits_order():
    labels = torch.tensor([2, 0, 0, 1, 2, 0, 1, 1, 2, 2, -1, 0])
    images = torch.arange(len(labels))
    batches = [(images[i:i + 5], labels[i:i + 5]) for i in range(0, len(labels), 5)]
    picked, lab = balanced_sample(batches, 6, 3)
    assert picked.tolist() == [0, 1, 2, 3, 4, 6]
    assert sorted(lab.tolist()) == [0, 0, 1, 1, 2, 2]
    # a class with fewer images than its share: what it has; an unlabelled image (-1) never
    picked, lab = balanced_sample(batches, 12, 3)
    assert 10 not in picked.tolist() and np.bincount(lab).tolist() == [4, 3, 4]
    assert balanced_sample([(images[:2], torch.tensor([-1, -1]))], 4, 2) is None


def test_the_map_is_two_dimensional_and_the_same_for_the_same_features():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 16)) * 5
    y = np.repeat(np.arange(3), 30)
    x = centres[y] + rng.normal(size=(90, 16))
    a, b = embed_2d(x), embed_2d(x)
    assert a.shape == (90, 2) and a.dtype == np.float32
    assert np.array_equal(a, b)
    # the classes stay apart: each point's nearest neighbour in the map is of its class
    d = ((a[:, None] - a[None]) ** 2).sum(-1) + np.eye(90) * 1e9
    assert (y[d.argmin(1)] == y).mean() > 0.95
    with pytest.raises(ValueError, match="at least 50 rows"):
        embed_2d(x[:10])
    with pytest.raises(ValueError, match="allowed tsne, umap"):
        embed_2d(x, method="pca")


def _log_trial(client, exp, parent, m, seed, curve, with_map=True, tmp=None):
    run = client.create_run(exp, run_name=f"m={m} seed={seed}", tags={"mlflow.parentRunId": parent,
                                                                       "mocolab.status": "finished"}).info.run_id
    now = int(time.time() * 1000)
    client.log_batch(run, metrics=[Metric("online_linear_top1", v, now, 10 * (i + 1)) for i, v in enumerate(curve)]
                     + [Metric("loss", 5.0, now, 10), Metric("linear_top1", curve[-1], now, 30),
                        Metric("knn_top1", curve[-1], now, 30)],
                     params=[Param("moco.m", m), Param("run.seed", str(seed))])
    if with_map:  # the features, as a worker logs them; one arm's run mapped already, as a report leaves it
        rng, labels = np.random.default_rng(seed), np.repeat(np.arange(3), 20)
        (tmp / run).mkdir()
        path = (save_map(tmp / run / MAP_NAME, rng.normal(size=(60, 2)), labels, ["a", "b", "c"]) if m == "0.99"
                else save_features(tmp / run / FEATURES_NAME, rng.normal(size=(3, 8))[labels] * 4
                                   + rng.normal(size=(60, 8)), labels, ["a", "b", "c"]))
        client.log_artifact(run, str(path), MAP_DIR)
    client.set_terminated(run)
    return run


def test_the_report_draws_one_map_per_arm_and_the_probe_curves(tmp_path):
    uri = mlflow_store(tmp_path)
    client = MlflowClient(uri)
    exp = client.create_experiment("momentum-ablation")
    parent = client.create_run(exp, run_name="sweep").info.run_id
    maps = tmp_path / "maps"
    maps.mkdir()
    for m in ("0.99", "0", "0.9"):
        for seed in (0, 1):
            # the second seed of m = 0.9 has no map: the arm's first seed with one is drawn
            _log_trial(client, exp, parent, m, seed, [0.3, 0.4 + float(m) / 10, 0.5 + float(m) / 10],
                       with_map=not (m == "0" and seed == 0), tmp=maps)
    df = pd.DataFrame([{"run_id": r.info.run_id, "label": r.info.run_name, "status": "finished",
                        "params.moco.m": r.data.params["moco.m"], "params.run.seed": r.data.params["run.seed"]}
                       for r in client.search_runs([exp], "tags.`mlflow.parentRunId` != ''")])
    assert [label for label, _ in arms(df, ["moco.m"])] == ["m = 0", "m = 0.9", "m = 0.99"]

    caption, path = feature_map_panels(Store(uri), df, ["moco.m"], tmp_path / "maps.png")
    assert "do not compare across panels" in caption
    width, height = png_size(path)
    assert width > 2 * height  # three panels side by side
    # the runs mapped from their features now hold their map (coordinates and picture): a later report reads it
    pictures = [r.data.params["moco.m"] for r in client.search_runs([exp], "tags.`mlflow.parentRunId` != ''")
                if f"{MAP_DIR}/tsne.png" in {a.path for a in client.list_artifacts(r.info.run_id, MAP_DIR)}]
    assert sorted(pictures) == ["0", "0.9"]  # m = 0.99's first seed was mapped already: read, not made again

    history = {(r, "online_linear_top1"): [(10 * (i + 1), v) for i, v in enumerate(c)] for r, c in
               ((row.run_id, [0.3, 0.4, 0.5]) for row in df.itertuples())}
    caption, path = probe_curves(lambda r, k: history.get((r, k), []), df, ["moco.m"], tmp_path / "probe.png")
    assert "mean over seeds" in caption and "test split" in caption
    assert probe_curves(lambda r, k: [], df, ["moco.m"], tmp_path / "none.png") is None

    rep = build_report("momentum-ablation", tmp_path / "report", parent_run=parent, tracking_uri=uri)
    assert {p.name for p in rep.figures} >= {"feature_maps.png", "online_probe.png"}
    page = rep.html.read_text()
    assert "do not compare across panels" in page and "Online linear probe" in page


def test_a_map_round_trips_and_draws(tmp_path):
    coords, labels = np.random.default_rng(0).normal(size=(60, 2)), np.repeat(np.arange(3), 20)
    path = save_map(tmp_path / "m.npz", coords, labels, ["x", "y", "z"])
    c, lab, names = load_map(path)
    assert np.allclose(c, coords, atol=1e-6) and lab.tolist() == labels.tolist() and names == ["x", "y", "z"]
    assert png_size(map_panels([("a", c, lab)] * 5, tmp_path / "p.png", names))[1] > 0
    assert MAP_FILE.startswith(MAP_DIR + "/")
