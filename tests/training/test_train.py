"""Ray Train runs: checkpoints, resume, a worker that dies, MLflow per run (real Ray, real MLflow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from mocolab.config import build_config
from mocolab.data.sets import fashion_mnist_dir
from mocolab.tracking.run_keys import SYSTEM
from mocolab.training.trainer import Trainer
from mocolab.config.manifest import RunManifest
from mocolab.training import fit
from mocolab.training.checkpoint import load_rank_state, save_rank_state
from conftest import mlflow_store

pytestmark = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")

TINY = {"data.subset": 2048, "eval.knn_bank": 2048, "eval.knn_test": 1000, "eval.linear_train": 2048,
        "eval.linear_steps": 30, "optim.max_steps": 24}  # 16 steps per epoch: 24 steps cross an epoch end


def _cfg(tmp_path: Path, **over):
    return build_config("smoke", {**TINY, "run.output_dir": str(tmp_path / "runs"), **over})


def _train_to(tr: Trainer, until: int, hook=None) -> None:
    while tr.step < min(until, tr.schedule.total_steps):
        tr.train_epoch(on_step=hook) if hook else tr.train_epoch()


@pytest.mark.slow
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path):
    cfg = _cfg(tmp_path, **{"eval.knn_every": 0})
    full = Trainer(cfg)
    _train_to(full, 24)

    class Interrupt(Exception):
        pass

    def stop_at_19(tr: Trainer) -> None:  # mid second epoch
        if tr.step == 19:
            save_rank_state(tr.state_dict(), RunManifest.of(cfg), tmp_path, 0, 1)
            raise Interrupt

    first = Trainer(cfg)
    with pytest.raises(Interrupt):
        _train_to(first, 24, stop_at_19)
    state, saved = load_rank_state(tmp_path, 0, 1)  # torch.load(weights_only=True) inside
    assert saved == RunManifest.of(cfg) and saved.to_config() == cfg
    resumed = Trainer(cfg)
    resumed.load_state_dict(state)
    assert resumed.step == 19 and resumed.epoch == 1
    _train_to(resumed, 24)
    for name in ("encoder_q", "encoder_k", "queue"):
        a, b = full.state_dict()[name], resumed.state_dict()[name]
        for key in a:
            if key != "_extra_state":  # the queue's generator state: {} under FIFO
                assert torch.allclose(a[key].float(), b[key].float(), atol=1e-6, rtol=0), (name, key)
    assert torch.equal(full.model.queue.write_step, resumed.model.queue.write_step)
    assert torch.equal(full.model.queue.source, resumed.model.queue.source)
    assert int(full.model.queue.ptr) == int(resumed.model.queue.ptr)


def test_checkpoint_from_other_world_size_is_refused(tmp_path):
    save_rank_state({"x": torch.zeros(1)}, RunManifest.of(build_config("smoke")), tmp_path, 0, 2)
    with pytest.raises(ValueError, match="written by 2 workers; this run has 1"):
        load_rank_state(tmp_path, 0, 1)


def test_the_manifest_round_trips_through_its_folder_a_checkpoint_and_the_worker_argument(tmp_path):
    """One manifest, written once in the run's folder, carried in every checkpoint file and handed to every
    Ray Train worker (pickled, inside the typed WorkerArgs): the same value everywhere, and the same config."""
    import json
    import pickle
    from functools import partial

    from mocolab.config.manifest import FORMAT_VERSION, MANIFEST, read_manifest, write_manifest
    from mocolab.training.storage import Location
    from mocolab.training.launch import _loop
    from mocolab.training.session import WorkerArgs

    cfg = _cfg(tmp_path, **{"run.name": "round-trip", "moco.m": 0.9})
    manifest = RunManifest.of(cfg)
    assert (manifest.name, manifest.format, manifest.config["moco.m"]) == ("round-trip", FORMAT_VERSION, 0.9)
    folder = Location(str(tmp_path / "runs" / "round-trip"))
    assert read_manifest(folder, "round-trip") is None  # no run started here yet
    write_manifest(folder, manifest)
    assert read_manifest(folder, "round-trip") == manifest
    assert json.loads((tmp_path / "runs" / "round-trip" / MANIFEST).read_text())["config"] == cfg.flatten()
    save_rank_state({"step": torch.tensor(3)}, manifest, tmp_path / "ckpt", 0, 1)
    state, saved = load_rank_state(tmp_path / "ckpt", 0, 1)
    assert saved == manifest and int(state["step"]) == 3
    args = WorkerArgs(manifest, folder.location, "sqlite:///x.db", "run-id", ray_train_info=False)
    again = pickle.loads(pickle.dumps(partial(_loop, args)))  # what Ray ships to each worker
    assert again.args == (args,) and again.args[0].config() == cfg


def test_one_rule_decides_whether_an_attempt_continues_a_run(tmp_path):
    """check_resume: fields a resume ignores may change; a field the record lacks is read at its default (a
    field added since the run started), so it resumes there and nowhere else; another run format is refused
    in one line whatever its config."""
    from mocolab.config import ConfigMismatchError
    from mocolab.config.manifest import OldRunFormat, check_resume

    cfg = _cfg(tmp_path, **{"run.name": "rule"})
    started = RunManifest.of(cfg)
    check_resume(started, RunManifest.of(cfg.replace(**{"run.threads": 1, "run.max_failures": 5})), "run 'rule'", "-")
    with pytest.raises(ConfigMismatchError, match=r"^run 'rule' was started with other settings.* moco.m: 0.99 -> 0.9"):
        check_resume(started, RunManifest.of(cfg.replace(**{"moco.m": 0.9})), "run 'rule'", "-")
    before_val_size = RunManifest("rule", {k: v for k, v in cfg.flatten().items() if k != "data.val_size"}, "")
    check_resume(before_val_size, started, "run 'rule'", "-")
    with pytest.raises(ConfigMismatchError, match=r"data.val_size: 0 -> 100"):
        check_resume(before_val_size, RunManifest.of(cfg.replace(**{"data.val_size": 100})), "run 'rule'", "-")
    for old, version in ((RunManifest("rule", {}, "", format=1, mocolab=""), "0.1.0"),
                         (RunManifest("rule", started.config, "", format=3, mocolab="0.9.0"), "0.9.0")):
        with pytest.raises(OldRunFormat) as info:
            check_resume(old, started, "run 'rule' (runs/rule)", "--set run.name=<a new name>")
        msg = str(info.value)
        assert "\n" not in msg and msg.startswith(f"run 'rule' (runs/rule) was started by mocolab {version} "
                                                  f"(run format {old.format}); ")
        assert msg.endswith(f"finish it with mocolab {version}, or start fresh: --set run.name=<a new name>")


# every non-system metric key of a smoke run on labelled data: curves per epoch, per step, and the final scores
MODEL_METRICS = sorted(["loss", "lr", "pretext_acc", "knn_top1", "online_linear_top1", "staleness_mean",
                        "staleness_max", "drift_cos", "stored_cos",  # per epoch
                        "m", "step_loss", "step_pretext_acc", "grad_norm_first_layer",  # per step
                        "linear_top1", "final_loss", "knn20_top1", "linear_top1_1pct", "linear_top1_10pct",
                        "best_knn_top1", "best_online_linear_top1", "final_knn_top1", "final_online_linear_top1"])


def _metric_steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_dead_worker_restarts_from_checkpoint_and_completes(tmp_path, ray_session):
    uri = mlflow_store(tmp_path)
    cfg = _cfg(tmp_path, **{"run.num_workers": 2, "moco.bn": "shuffle", "queue.layout": "sharded",
                            "run.checkpoint_every": 4, "run.fault_step": 10, "run.max_failures": 1,
                            "run.name": "fault-w2", "run.experiment": "test-train", "run.system_metrics_s": 1})
    out = fit(cfg, tracking_uri=uri, progress=lambda _m: None)
    marker = tmp_path / "runs" / "fault-w2" / ".fault-injected"
    assert marker.is_file(), "the fault was never injected"
    assert out.status == "finished" and out.steps == 24 and out.linear_top1 > 0.5
    client = MlflowClient(uri)
    run = client.get_run(out.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert _metric_steps(client, out.mlflow_run_id, "loss") == [16, 24]  # each epoch once: no duplicate, no gap
    assert run.data.params["moco.m"] == "0.99" and run.data.params["queue.layout"] == "sharded"
    assert run.data.tags["preset"] == "smoke"
    # the keys a researcher charts and no more (docs/tracking.md, "What to chart"): a key added to the model's
    # charts fails here; the config's constants are tags, the process's measures system metrics
    assert sorted(k for k in run.data.metrics if not k.startswith("system/")) == MODEL_METRICS
    assert {f"system/{k}" for k in SYSTEM} <= set(run.data.metrics)
    assert float(run.data.tags["mocolab.ema_half_life"]) == cfg.ema_half_life
    assert float(run.data.tags["mocolab.max_staleness_bound"]) == cfg.max_staleness
    assert [f.path for f in client.list_artifacts(out.mlflow_run_id)] == ["config.yaml", "feature_map", "negatives"]
    # the queue's diagnostics, one file per epoch, and the plot
    assert [f.path for f in client.list_artifacts(out.mlflow_run_id, "negatives")] == [
        "negatives/dictionary.png", "negatives/epoch_0001.json", "negatives/epoch_0002.json"]
    _check_hub_records(client, run, out, cfg, tmp_path)


def _check_hub_records(client: MlflowClient, run, out, cfg, tmp_path: Path) -> None:
    """What issue 12 puts on a run: source tags, data digests, machine metrics, checkpoint location, models."""
    import subprocess

    import mocolab
    from mocolab.data.sets import load_dataset
    from mocolab.data.sources import tensor_digest

    tags = run.data.tags
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()
    assert tags["mlflow.source.git.commit"] == head and tags["mocolab.source.git.dirty"] in ("true", "false")
    assert tags["mlflow.user"] and tags["mlflow.source.name"] and tags["mlflow.source.type"] == "LOCAL"
    # the data, by content: the digest of the 2,048 training images the run used
    train = load_dataset("fashion-mnist", "train")
    inputs = {i.dataset.name: i for i in run.inputs.dataset_inputs}
    assert inputs["fashion-mnist-train"].dataset.digest == tensor_digest(train.images[:2048], train.labels[:2048])
    assert [t.value for t in inputs["fashion-mnist-train"].tags] == ["training"]
    assert "fashion-mnist-test" in inputs
    # machine metrics sampled on the worker node, every second (run.system_metrics_s=1)
    cpu = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert len(cpu) >= 2 and all(0 <= m.value <= 100 for m in cpu), cpu
    assert "system/system_memory_usage_megabytes" in run.data.metrics
    # from the UI to the files: the run's folder and its last checkpoint
    assert tags["mocolab.checkpoint_dir"] == str(tmp_path / "runs" / "fault-w2")
    assert tags["mocolab.checkpoint"] == out.checkpoint_path and Path(out.checkpoint_path, "rank0.pt").is_file()
    # the encoder as an MLflow model: the same features as the checkpoint's encoder
    trainer = Trainer(cfg)
    state, _ = load_rank_state(out.checkpoint_path, 0, 2)
    trainer.encoder.load_state_dict(state["encoder_q"])  # the weights alone (a W = 1 trainer has a whole queue)
    images = load_dataset("fashion-mnist", "test").images[:64]
    encoder = mocolab.load_encoder(run.info.run_id, tracking_uri=client.tracking_uri)
    with torch.no_grad():
        got = encoder(images.float() / 255)
    features = trainer.evaluation.features(images)
    assert torch.allclose(got, features, atol=1e-5), float((got - features).abs().max())
    classifier = mocolab.load_encoder(run.info.run_id, tracking_uri=client.tracking_uri, name="classifier")
    with torch.no_grad():
        assert classifier(images.float() / 255).shape == (64, 10)


@pytest.mark.slow
def test_failed_run_is_marked_then_resumed_into_the_same_mlflow_run(tmp_path, ray_session):
    uri = mlflow_store(tmp_path)
    cfg = _cfg(tmp_path, **{"run.num_workers": 1, "run.fault_step": 20, "run.max_failures": 0,
                            "run.name": "fail-then-resume", "run.experiment": "test-train"})
    with pytest.raises(Exception):
        fit(cfg, tracking_uri=uri, progress=lambda _m: None)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("test-train").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    assert runs[0].data.tags["mocolab.failure_reason"]
    assert _metric_steps(client, runs[0].info.run_id, "loss") == [16]
    out = fit(cfg, tracking_uri=uri, progress=lambda _m: None)  # same name: resume, the fault marker stays
    assert out.resumed and out.mlflow_run_id == runs[0].info.run_id and out.status == "finished"
    assert len(client.search_runs([runs[0].info.experiment_id])) == 1
    assert client.get_run(out.mlflow_run_id).info.status == "FINISHED"
    assert _metric_steps(client, out.mlflow_run_id, "loss") == [16, 24]


def test_unreachable_tracking_server_fails_before_work(tmp_path):
    cfg = _cfg(tmp_path, **{"run.name": "never"})
    with pytest.raises(ValueError, match="does not answer"):
        fit(cfg, tracking_uri="http://127.0.0.1:9", progress=lambda _m: None)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_v3_vit_on_two_ranks_logs_m_and_the_first_layer_gradient_per_step(tmp_path, ray_session):
    """MoCo v3 through Ray Train on two gloo ranks: DDP over two forwards per step, the projector's BN over
    the global batch (bn=sync, norm.GlobalBatchNorm), m rising on its cosine and the patch projection's
    gradient logged at every step, and the ViT encoder back out of MLflow with the checkpoint's features."""
    import mocolab
    from mocolab.data.sets import load_dataset
    from mocolab.training.schedule import momentum_at

    uri = mlflow_store(tmp_path)
    cfg = _cfg(tmp_path, **{"run.num_workers": 2, "moco.version": "v3", "moco.bn": "sync", "moco.m_schedule": "cosine",
                            "model.backbone": "vit_tiny", "vit.depth": 1, "vit.patch_size": 7,
                            "vit.freeze_patch_embed": True, "model.head": "mlp3-bn", "model.dim": 32,
                            "model.hidden": 64, "optim.name": "adamw", "optim.lr": 1e-3, "optim.warmup_epochs": 1,
                            "optim.batch_size": 128, "optim.max_steps": None, "optim.epochs": 2,
                            "run.name": "v3-w2", "run.experiment": "test-train", "run.system_metrics_s": 0})
    out = fit(cfg, tracking_uri=uri, progress=lambda _m: None)
    assert out.status == "finished" and out.steps == 32 and out.linear_top1 > 0.3
    client = MlflowClient(uri)
    run_id = out.mlflow_run_id
    m = client.get_metric_history(run_id, "m")
    assert sorted(p.step for p in m) == list(range(1, 33))  # every step once, the epoch's value not twice
    for p in m:
        assert p.value == pytest.approx(momentum_at("cosine", 0.99, p.step - 1, 32))
    grads = client.get_metric_history(run_id, "grad_norm_first_layer")
    assert sorted(p.step for p in grads) == list(range(1, 33)) and all(p.value > 0 for p in grads)
    assert _metric_steps(client, run_id, "loss") == [16, 32]
    assert client.get_run(run_id).data.tags["mocolab.run_name"] == "v3-w2"
    # the patch projection never moved, on either rank, and the exported ViT gives the checkpoint's features
    state, _ = load_rank_state(out.checkpoint_path, 1, 2)
    init = Trainer(cfg)
    assert torch.equal(state["encoder_q"]["backbone.patch_embed.weight"], init.encoder.backbone.patch_embed.weight)
    init.encoder.load_state_dict(state["encoder_q"])
    images = load_dataset("fashion-mnist", "test").images[:32]
    encoder = mocolab.load_encoder(run_id, tracking_uri=uri)
    with torch.no_grad():
        assert torch.allclose(encoder(images.float() / 255), init.evaluation.features(images), atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("over", [{"moco.negatives": "memory_bank"}, {"queue.policy": "random", "queue.size": 512}],
                         ids=["memory_bank", "random_queue"])
def test_a_bank_or_random_queue_resumes_bit_for_bit(tmp_path, over):
    """The memory bank (entries, write steps, its negative draws) and the random queue (its slot draws) are in
    the checkpoint with the drift probes: a run stopped mid-epoch and resumed equals one never stopped."""
    cfg = _cfg(tmp_path, **{"eval.knn_every": 0, "eval.drift_probes": 32, **over})
    full = Trainer(cfg)
    _train_to(full, 24)

    class Interrupt(Exception):
        pass

    def stop_at_19(tr: Trainer) -> None:
        if tr.step == 19:
            save_rank_state(tr.state_dict(), RunManifest.of(cfg), tmp_path, 0, 1)
            raise Interrupt

    with pytest.raises(Interrupt):
        _train_to(Trainer(cfg), 24, stop_at_19)
    resumed = Trainer(cfg)
    resumed.load_state_dict(load_rank_state(tmp_path, 0, 1)[0])
    _train_to(resumed, 24)
    store = "bank" if "moco.negatives" in over else "queue"
    for name in ("encoder_q", store, "probes"):
        a, b = full.state_dict()[name], resumed.state_dict()[name]
        for key in a:
            if key != "_extra_state":
                assert torch.allclose(a[key].float(), b[key].float(), atol=1e-6, rtol=0), (name, key)
    assert int((full.drift.probes.write_step >= 0).sum()) > 0  # the probes saw writes, and resumed with them
