"""The papers' presets train for a few steps on generated data of the shape they expect."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mocolab.config import build_config, list_presets
from mocolab.data.sets import _synthetic
from mocolab.data.image_index import write_imagefolder
from mocolab.training.trainer import run_training
from mocolab.training import fit


def _rgb_folder(root, n, size, classes=10, seed=0):
    for split, count, s in (("train", n, seed), ("val", max(n // 4, classes), seed + 1)):
        ds = _synthetic(count, size, s)
        write_imagefolder(ds.images.expand(-1, 3, -1, -1), ds.labels % classes, root, split)
    return root


def test_the_papers_presets_are_listed_and_say_what_they_need():
    assert {"cifar10-resnet18", "imagenet-resnet50"} <= set(list_presets())
    c = build_config("cifar10-resnet18")
    assert (c.model.backbone, c.queue.size, c.moco.m, c.optim.batch_size, c.moco.tau, c.optim.epochs) == \
        ("resnet18", 4096, 0.99, 512, 0.1, 200)
    with pytest.raises(ValueError, match=r"^data.root: imagefolder needs a folder path"):
        build_config("imagenet-resnet50")


def test_the_v3_presets_hold_the_papers_settings():
    # validated on generated 224×224 images of the preset's shape (an ImageNet folder is the user's)
    shape = {"data.name": "synthetic", "data.synthetic_size": 8192, "data.loader": "auto"}
    c = build_config("imagenet-vit-small", shape)
    assert c.image_size == 224 and c.image_size // c.vit.patch_size == 14
    assert (c.moco.version, c.model.backbone, c.vit.patch_size, c.vit.freeze_patch_embed, c.optim.name,
            c.optim.batch_size, c.effective_lr, c.optim.warmup_epochs, c.moco.bn) == \
        ("v3", "vit_small", 16, True, "adamw", 4096, pytest.approx(2.4e-3), 40, "sync")
    q = build_config("vit-quick")
    assert (q.moco.version, q.model.backbone, q.image_size // q.vit.patch_size, q.vit.depth) == ("v3", "vit_tiny", 4, 6)
    with pytest.raises(ValueError, match="moco.bn: 'sync'"):  # sync needs ranks: the preset names 32
        build_config("imagenet-vit-small", {**shape, "run.num_workers": 0})


@pytest.mark.slow
def test_cifar10_resnet18_trains_on_cifar_shaped_images(tmp_path):
    root = _rgb_folder(tmp_path / "c10", 4608, 32)
    cfg = build_config("cifar10-resnet18", {
        "data.name": "imagefolder", "data.root": str(root), "data.image_size": 32, "optim.batch_size": 64,
        "optim.max_steps": 2, "eval.knn_bank": 256, "eval.knn_test": 200, "eval.linear_train": 256,
        "eval.linear_steps": 5})
    assert cfg.queue.size == 4096 and cfg.model.backbone == "resnet18"
    result = run_training(cfg)
    assert result.steps == 2 and not result.diverged
    # the preset's own settings trained: its momentum, its K over the batch as the queue's age bound
    [epoch] = result.history
    assert (epoch.step, epoch.m, epoch.max_staleness_bound) == (2, 0.99, 4096 / 64), epoch
    assert math.isfinite(result.final_loss) and result.final_loss == epoch.loss and 0 < epoch.pretext_acc <= 1
    assert 0 < result.final_loss < math.log(1 + 4096) + 1  # InfoNCE over at most K + 1 logits, two steps in
    assert 0.1 < result.linear_top1 <= 1.0  # ten classes the features tell apart, untrained or not: above chance


@pytest.mark.slow
def test_imagenet_resnet50_streams_imagenet_shaped_images(tmp_path, ray_session):
    root = _rgb_folder(tmp_path / "in", 160, 224)
    cfg = build_config("imagenet-resnet50", {
        "data.root": str(root), "optim.batch_size": 16, "queue.size": 64, "optim.max_steps": 2,
        "eval.knn_bank": 32, "eval.knn_test": 16, "eval.linear_train": 32, "eval.linear_steps": 5,
        "run.output_dir": str(tmp_path / "runs"), "run.name": "in-r50"})
    assert (cfg.data.loader, cfg.data.image_size, cfg.model.backbone, cfg.model.head) == \
        ("stream", 224, "resnet50", "mlp")
    out = fit(cfg, log_to_mlflow=False)
    assert out.status == "finished" and out.steps == 2 and not out.resumed
    assert out.final_loss is not None and 0 < out.final_loss < math.log(1 + 64) + 1  # InfoNCE over K + 1 = 65
    assert 0.1 < out.linear_top1 <= 1.0 and 0.0 <= out.knn_top1 <= 1.0  # ten classes: the probe above chance
    assert out.checkpoint_path and Path(out.checkpoint_path).parent == tmp_path / "runs" / "in-r50"


@pytest.mark.slow
def test_cifar10_without_the_files_and_without_a_network_is_a_clear_error(tmp_path):
    env = {**os.environ, "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}  # no network: a dead proxy
    code = ("from mocolab.data.sets import load_dataset\n"
            f"load_dataset('cifar10', 'train', {str(tmp_path / 'c10')!r})")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode != 0
    assert "cifar10 train split not found under" in res.stderr and "could not download it" in res.stderr
    assert "cifar-10-batches-py/" in res.stderr  # where to put the files
