"""``data.val_size``: a validation split held out of the training set, which the monitor and model selection
read, so that the test split gives only final numbers."""

from __future__ import annotations

import pytest
import torch

from mocolab.config import build_config
from mocolab.data.sets import load_dataset
from mocolab.data.splits import hold_out, load_data
from mocolab.training.trainer import Trainer, run_training
from mocolab.data.sources import validation_positions


def test_the_held_out_images_are_the_same_for_every_seed_and_never_trained_on():
    full = load_dataset("synthetic", "train", synthetic_size=512, seed=0)
    train, val = hold_out(full, 100)
    assert len(train) == 412 and len(val) == 100
    held = validation_positions(512, 100)
    assert torch.equal(val.images, full.images[torch.from_numpy(held)])
    kept = sorted(set(range(512)) - set(held.tolist()))
    assert torch.equal(train.images, full.images[kept])
    assert (validation_positions(512, 100) == held).all()  # no seed in it: every run selects on these
    cfg = build_config("smoke", {"data.name": "synthetic", "data.synthetic_size": 512, "data.val_size": 100,
                                 "data.subset": 300, "queue.size": 256})
    tr_set, _, v = load_data(cfg)
    assert torch.equal(v.images, val.images)  # held out of the whole set, then the subset from the rest:
    assert torch.equal(tr_set.images, train.images[:300])  # a subset never reaches into the validation split


@pytest.mark.parametrize("n, message", [(-1, r"data.val_size: -1 is out of range"),
                                        (10_000_001, r"data.val_size: 10000001 is out of range")])
def test_a_bad_size_is_refused_with_the_config(n, message):
    with pytest.raises(ValueError, match=message):
        build_config("smoke", {"data.val_size": n})


def test_all_of_the_training_set_cannot_be_held_out():
    with pytest.raises(ValueError, match=r"data.val_size: 60000 holds out every training image"):
        build_config("cpu-quick", {"data.val_size": 60_000})
    with pytest.raises(ValueError, match=r"data.val_size: 512 must be between 1 and the 512 training images"):
        validation_positions(512, 512)


def test_the_monitor_reads_the_validation_split_and_the_test_split_only_the_end():
    cfg = build_config("smoke", {"data.name": "synthetic", "data.synthetic_size": 1024, "data.val_size": 256,
                                 "queue.size": 64, "optim.batch_size": 64, "optim.epochs": 2,
                                 "eval.knn_bank": 512, "eval.linear_steps": 5, "run.threads": 1})
    said: list[str] = []
    result = run_training(cfg, progress=said.append)
    first, last = result.history
    assert first.knn_top1 is None and first.val_knn_top1 is not None  # no test number before the end
    assert "knn_top1" not in first.metrics() and "val_knn_top1" in first.metrics()
    assert last.knn_top1 == result.knn_top1 and last.val_knn_top1 == result.val_knn_top1
    assert 0.0 < result.val_linear_top1 <= 1.0 and 0.0 < result.linear_top1 <= 1.0
    assert any("768 train / 256 validation (held out)" in line for line in said)
    assert any("val kNN" in line for line in said if line.startswith("epoch   1"))


def test_without_a_validation_split_nothing_changes():
    cfg = build_config("smoke", {"data.name": "synthetic", "data.synthetic_size": 512, "queue.size": 64,
                                 "optim.batch_size": 64, "optim.epochs": 1, "eval.linear_steps": 5})
    tr = Trainer(cfg)
    assert tr.evaluation.monitor_split == "test" and tr.data.size == 512
    scores = tr.evaluation.final_scores()
    assert scores.val_knn is None and scores.val_linear is None
    with pytest.raises(ValueError, match="no 'val' split here: set data.val_size"):
        list(tr.data.eval_split("val", None))
