"""The supervised bound (method/supervised.py): the labels it reads are those of the images the trainer feeds it,
a validation split held out and a subset taken; the loss falls where the labels are learnable; a set that may
stream is refused at the door; ``mocolab train --set method.name=supervised`` trains and scores it as any run,
and its module keys the code of its runs only.

Training is a few steps of a 4-wide convnet on synthetic 16-px images (ten classes a raw-pixel kNN tells apart).
"""

from __future__ import annotations

import math
import shlex

import pytest
import torch
from conftest import mlflow_store
from mlflow.tracking import MlflowClient
from readme_blocks import commands

from mocolab.cli.commands import main
from mocolab.config import build_config
from mocolab.training.code_fingerprint import ENTRY, _closure, code_fingerprint
from mocolab.data import sets as datasets
from mocolab.method import plugins
from mocolab.method.plugins import method_modules
from mocolab.method.protocol import MethodParts
from mocolab.method.supervised import Supervised
from mocolab.models.backbones import Encoder, build_backbone
from mocolab.training.build import build_run, training_source
from mocolab.training.trainer import Trainer

TINY = {"data.name": "synthetic", "data.synthetic_size": 256, "data.image_size": 16, "model.width": 4,
        "optim.batch_size": 32, "optim.max_steps": 3, "eval.knn_bank": 256, "eval.knn_test": 64,
        "eval.linear_train": 256, "eval.linear_test": 64, "eval.linear_steps": 3, "eval.drift_probes": 0,
        "run.log_models": False, "run.system_metrics_s": 0, "method.name": "supervised"}
TINY_ARGS = [a for k, v in TINY.items() for a in ("--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}")]


def _cfg(**over):
    return build_config("smoke", {**TINY, **over})


def test_the_labels_read_are_those_of_the_images_fed_with_a_validation_split_held_out_and_a_subset_taken():
    cfg = _cfg(**{"data.synthetic_size": 600, "data.val_size": 100, "data.subset": 300})
    source = training_source(cfg)
    model = build_run(cfg, source, torch.device("cpu"), 1).model
    assert source.size == 300 and len(source.val) == 100 and model.classes == 10
    # each image of the whole generated set, by its bytes, with its label: what the trainer's index must find
    full = datasets.load_dataset("synthetic", "train", synthetic_size=600, image_size=16, seed=cfg.run.seed)
    label_of = {bytes(img.numpy()): int(y) for img, y in zip(full.images, full.labels)}
    assert len(label_of) == 600
    naive_wrong = 0
    for images, index in source.epoch_indexed(torch.Generator().manual_seed(0), 32, 0, 1, 0):
        truth = torch.tensor([label_of[bytes(img.numpy())] for img in images])
        assert torch.equal(model.targets(index), truth)
        naive_wrong += int((full.labels[index] != truth).sum())  # the index counts the held-in subset, not the set
    assert naive_wrong > 0


def test_an_unreadable_row_takes_the_label_of_the_image_standing_in_for_it():
    backbone = build_backbone("convnet", 1, 4, image_size=16)
    labels = torch.tensor([0, 1, -1, 2, -2, 1])  # rows 2 and 4: unreadable files
    method = Supervised(Encoder(backbone, torch.nn.Linear(backbone.out_dim, 3)), labels)
    # fill_unreadable puts the batch's previous readable image in an unreadable row (the next one before the first)
    assert method.targets(torch.tensor([2, 3, 4, 5])).tolist() == [2, 2, 2, 1]
    assert method.targets(torch.tensor([0, 1, 3])).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="below 3"):
        Supervised(Encoder(backbone, torch.nn.Linear(backbone.out_dim, 3)), torch.tensor([0, 3]))


def test_the_loss_falls_where_the_labels_are_learnable():
    """Two epochs (32 steps) of the trainer's own step on the raw images (augment.preset=none: a crop of a 16-px
    synthetic image moves the blob that marks its class), on one thread (two would fight the machine's others)."""
    tiny = {k: v for k, v in TINY.items() if k != "optim.max_steps"}  # the cosine over the two epochs
    cfg = build_config("smoke", {**tiny, "optim.epochs": 2, "optim.lr": 0.2, "data.synthetic_size": 512,
                                 "model.width": 8, "augment.preset": "none"})
    trainer = Trainer(cfg)
    assert trainer.schedule.total_steps == 32 and trainer.model.uniform_loss(32) == pytest.approx(math.log(10))
    losses, accs = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for epoch in range(2):
            for images, index in trainer.data.epoch_indexed(trainer.epoch_order(epoch), 32, 0, 1, 0):
                res = trainer.train_step(images, index, 0.0)
                assert not res.diverged
                losses.append(res.loss)
                accs.append(res.pretext_acc)
    finally:
        torch.set_num_threads(threads)
    assert len(losses) == 32 and int(trainer.model.step) == 32
    assert abs(losses[0] - math.log(10)) < 0.3, losses  # a guess at first
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.6 * first, losses
    assert sum(accs[-4:]) / 4 > 0.5 > sum(accs[:4]) / 4, accs  # pretext accuracy: the classifier's top-1


def test_a_set_that_may_stream_is_refused_at_the_door(tmp_path):
    folder = {"data.name": "imagefolder", "data.root": str(tmp_path)}
    with pytest.raises(ValueError, match=r"^data.loader: 'stream' streams, and method.name=supervised reads the "
                                         r"training labels .*; use data.loader=memory"):
        _cfg(**folder, **{"data.loader": "stream"})
    with pytest.raises(ValueError, match=r"^data.loader: 'auto' may stream imagefolder sets"):
        _cfg(**folder)
    assert _cfg(**folder, **{"data.loader": "memory"}).method.name == "supervised"
    with pytest.raises(ValueError, match=r"^moco.bn: 'shuffle' .* no key encoder"):
        _cfg(**{"moco.bn": "shuffle", "run.num_workers": 2})
    # a source that holds no labels, given where the door could not know (data.loader=auto resolved to stream)
    cfg = _cfg()
    with pytest.raises(ValueError, match=r"^data.loader: method.name=supervised reads the training labels"):
        plugins.load("supervised").build(cfg, MethodParts(lambda predictor=False: None, 256, 32))


def test_its_module_keys_the_code_of_its_runs_only():
    cfg = _cfg()
    assert method_modules(cfg) == ("mocolab.method.supervised",)
    assert "mocolab.method.supervised" not in _closure([ENTRY])  # a MoCo run's code is not the bound's
    base, bound = code_fingerprint(), code_fingerprint(extra=method_modules(cfg))
    assert set(bound.modules) - set(base.modules) == {"mocolab.method.supervised"} and bound.digest != base.digest
    assert plugins.load("supervised").ship == ()  # in the package: every worker has it


@pytest.mark.slow
def test_mocolab_train_trains_the_bound_and_logs_the_scores_every_run_logs(tmp_path, capsys):
    """docs/methods.md's line (the cpu-full preset, its validation split held out), at a size for a test."""
    [line] = commands("supervised-quickstart")
    argv = shlex.split(line)
    assert argv[0].endswith("/mocolab") and "method.name=supervised" in argv
    uri = mlflow_store(tmp_path)
    argv = [*argv[1:], *TINY_ARGS, "--set", "data.val_size=64", "--tracking-uri", uri, "--storage",
            str(tmp_path / "runs")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert ", method supervised, " in out and "supervised bound: cross-entropy over 10 classes" in out
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("mocolab").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mocolab.status"] == "finished"
    metrics = run.data.metrics
    for key in ("linear_top1", "knn_top1", "val_linear_top1", "val_knn_top1", "loss", "pretext_acc"):
        assert 0.0 <= metrics[key] < math.inf, key
    assert run.data.params["method.name"] == "supervised"
    assert run.data.tags["mocolab.code_fingerprint"] == code_fingerprint(extra=("mocolab.method.supervised",)).digest


@pytest.mark.slow
def test_ray_workers_train_the_bound(tmp_path, ray_session):
    """W = 1: a Ray Train worker finds it in the package, as it finds the built-ins (nothing installed, nothing
    shipped)."""
    from mocolab.training import fit

    uri = mlflow_store(tmp_path)
    cfg = _cfg(**{"run.num_workers": 1, "run.output_dir": str(tmp_path / "runs"), "run.experiment": "test-supervised"})
    out = fit(cfg, tracking_uri=uri, progress=lambda _m: None, ray_train_info=False)
    assert out.status == "finished" and out.steps == 3
    run = MlflowClient(uri).get_run(out.mlflow_run_id)
    assert run.data.params["method.name"] == "supervised" and run.data.params["run.num_workers"] == "1"
    assert {"linear_top1", "knn_top1", "pretext_acc"} <= set(run.data.metrics)
