"""Encoders as MLflow models (tracking/logged_models.py) on a real sqlite store: log, load, export, register."""

from __future__ import annotations

import json

import pytest
import torch
from mlflow.tracking import MlflowClient

import mocolab
from mocolab.cli.commands import main
from mocolab.config import build_config
from mocolab.evaluation.probe import ProbeResult
from mocolab.evaluation.scoring import extract_features
from mocolab.models.exported import FeatureExtractor, ProbeClassifier
from mocolab.models.backbones import build_backbone, build_encoder
from mocolab.config.manifest import RunManifest
from mocolab.tracking import MetricsLogger, RunTracker
from mocolab.tracking.logged_models import export_run, log_models, register_model
from conftest import mlflow_store


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A run made by mocolab's own tracker, with a (random) encoder and probe logged as models."""
    uri = mlflow_store(tmp_path_factory.mktemp('models'))
    cfg = build_config("smoke", {"model.width": 8})
    tracker = RunTracker(uri, "models-test")
    run_id, _ = tracker.start(RunManifest.of(cfg.replace(**{"run.name": "enc-run"})))
    MetricsLogger(uri, run_id).log_final({"linear_top1": 0.71, "knn_top1": 0.65}, 30)
    encoder = build_encoder("convnet", 1, width=8, bn_groups=4)  # split BN, as the smoke preset trains
    probe = ProbeResult(0.8, 0.71, torch.randn(encoder.backbone.out_dim, 10, dtype=torch.float64),
                        torch.randn(10, dtype=torch.float64), torch.randn(encoder.backbone.out_dim).double(),
                        torch.rand(encoder.backbone.out_dim).double() + 0.5)
    features = FeatureExtractor(encoder.backbone, 1)
    images = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    uris = log_models(uri, run_id, {"encoder": features, "classifier": ProbeClassifier(features, probe)},
                      images[:2].float() / 255, step=30, say=pytest.fail)
    tracker.finish()
    return uri, run_id, encoder, probe, images, uris


def test_logged_encoder_loads_and_gives_the_evaluation_features(logged):
    uri, run_id, encoder, probe, images, uris = logged
    assert set(uris) == {"encoder", "classifier"} and all(u.startswith("models:/") for u in uris.values())
    loaded = mocolab.load_encoder(run_id, tracking_uri=uri)
    with torch.no_grad():
        got = loaded(images.float() / 255)  # a batch of 6: the exported program keeps the batch dynamic
    assert torch.allclose(got, extract_features(encoder.backbone, images), atol=1e-5)
    clf = mocolab.load_encoder(run_id, tracking_uri=uri, name="classifier")
    feats = extract_features(encoder.backbone, images).double()
    logits = ((feats - probe.mean) / probe.std) @ probe.weight + probe.bias
    with torch.no_grad():
        assert torch.allclose(clf(images.float() / 255).double(), logits, atol=1e-3)
    # the model records the run's metrics at the final step, and the run lists it as an output
    client = MlflowClient(uri)
    model = client.get_logged_model(uris["encoder"].split("/")[-1])
    assert model.source_run_id == run_id and {m.key for m in model.metrics} >= {"linear_top1", "knn_top1"}


def test_export_writes_weights_that_load_without_mocolab_code(logged, tmp_path):
    uri, run_id, encoder, _, images, _ = logged
    out = export_run(run_id, tmp_path / "export", tracking_uri=uri)
    names = {p.name for p in out.iterdir()}
    assert names == {"README.md", "backbone.pt", "encoder.pt2", "classifier.pt2", "config.yaml", "metrics.json"}
    state = torch.load(out / "backbone.pt", weights_only=True)  # a plain state dict: no pickled code
    backbone = build_backbone("convnet", 1, 8)
    backbone.load_state_dict(state)
    assert torch.allclose(extract_features(backbone, images), extract_features(encoder.backbone, images), atol=1e-6)
    program = torch.export.load(str(out / "encoder.pt2")).module()  # torch alone
    assert torch.allclose(program(images.float() / 255), extract_features(encoder.backbone, images), atol=1e-5)
    assert json.loads((out / "metrics.json").read_text()) == {"linear_top1": 0.71, "knn_top1": 0.65}
    readme = (out / "README.md").read_text()
    assert run_id in readme and "linear top-1 71.00%" in readme and "m = 0.99" in readme
    with pytest.raises(ValueError, match="exists and is not empty"):
        export_run(run_id, out, tracking_uri=uri)


def test_register_adds_versions_and_refuses_what_it_cannot_do(logged, tmp_path, capsys):
    uri, run_id, *_ = logged
    assert register_model(run_id, "moco-fmnist", uri) == ("moco-fmnist", 1)
    assert main(["export", run_id, "--out", str(tmp_path / "e"), "--register", "moco-fmnist",
                 "--tracking-uri", uri]) == 0
    assert "registered as model 'moco-fmnist' version 2" in capsys.readouterr().out
    versions = MlflowClient(uri).search_model_versions("name = 'moco-fmnist'")
    assert sorted(int(v.version) for v in versions) == [1, 2] and {v.run_id for v in versions} == {run_id}
    # bad input: one line, exit 2, nothing written
    assert main(["export", run_id, "--out", str(tmp_path / "bad"), "--register", "a/b", "--tracking-uri", uri]) == 2
    assert "--register: 'a/b' is not a valid name" in capsys.readouterr().err
    assert main(["export", "no-such-run", "--out", str(tmp_path / "bad"), "--tracking-uri", uri]) == 2
    assert "RUN_ID: 'no-such-run' is not a run" in capsys.readouterr().err
    tracker = RunTracker(uri, "models-test")  # a run that never finished has no model: say where its files are
    other, _ = tracker.start(RunManifest("unfinished", {}, ""),
                             tags={"mocolab.checkpoint_dir": "/data/runs/unfinished"})
    assert main(["export", other, "--out", str(tmp_path / "bad"), "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert "has no 'encoder' model" in err and "/data/runs/unfinished" in err
    assert not (tmp_path / "bad").exists()


def test_logging_again_keeps_one_model_per_name(logged):
    uri, run_id, encoder, probe, images, uris = logged
    again = log_models(uri, run_id, {"encoder": FeatureExtractor(encoder.backbone, 1)}, images[:2].float() / 255,
                       step=30, say=pytest.fail)
    assert again == {"encoder": uris["encoder"]}
    outputs = MlflowClient(uri).get_run(run_id).outputs.model_outputs
    assert len(outputs) == 2  # encoder and classifier, once each


@pytest.mark.slow
def test_a_run_with_log_models_false_keeps_its_checkpoint_and_logs_no_model(tmp_path):
    """``run.log_models=false``: a sweep of many trials leaves the Models list empty; a study that would
    register its best trial's model is refused before any work."""
    from mocolab.training import fit
    from mocolab.tune.spec import Launch, Sweep, Trial, check_sweep

    uri = mlflow_store(tmp_path)
    cfg = build_config("smoke", {"data.name": "synthetic", "data.subset": 256, "queue.size": 128,
                                 "optim.batch_size": 32, "optim.max_steps": 2, "eval.knn_bank": 128,
                                 "eval.knn_test": 64, "eval.linear_train": 128, "eval.linear_steps": 2,
                                 "run.log_models": False, "run.output_dir": str(tmp_path / "runs")})
    out = fit(cfg, tracking_uri=uri)
    run = MlflowClient(uri).get_run(out.mlflow_run_id)
    assert out.status == "finished" and "linear_top1" in run.data.metrics
    assert not run.outputs.model_outputs and list((tmp_path / "runs").rglob("*.pt"))
    sweep = Sweep(study="e", name="s", preset="smoke", description="", base_overrides={"run.log_models": "false"},
                  trials=[Trial("a", {})], register="best", register_metric="linear_top1")
    with pytest.raises(ValueError, match=r"^--register: run.log_models=false leaves no trial a model"):
        check_sweep(sweep, Launch(tracking_uri=uri))
    sweep.base_overrides["run.log_models"] = "true"
    check_sweep(sweep, Launch(tracking_uri=uri))
