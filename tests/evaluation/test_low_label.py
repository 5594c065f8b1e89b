"""The final evaluation's low-label probes and k = 20 kNN (evaluation/low_label.py, scoring.FinalScores), and the
table `make run` prints with them."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from mocolab.evaluation.knn import knn_accuracy
from mocolab.evaluation.low_label import class_balanced_draw, low_label_metric, low_label_probes

from test_evaluation import _run_evaluation


def _imbalanced_labels() -> torch.Tensor:
    """1,800 labels of 3 classes in proportions 1:2:3, shuffled."""
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate((300, 600, 900))])
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(5))]


def test_a_draw_is_class_balanced_fixed_nested_and_blind_to_the_global_seed():
    labels = _imbalanced_labels()
    torch.manual_seed(0)
    ten = class_balanced_draw(labels, 0.1, 3, draw=0)
    torch.manual_seed(123)  # a run's seed (or a training's use of the global generator) changes nothing
    assert torch.equal(class_balanced_draw(labels, 0.1, 3, draw=0), ten)
    # equal counts per class (60 = 10 % of 1,800 / 3 classes), whatever the classes' shares of the set
    assert torch.bincount(labels[ten], minlength=3).tolist() == [60, 60, 60]
    assert len(set(ten.tolist())) == len(ten)
    one = class_balanced_draw(labels, 0.01, 3, draw=0)
    assert torch.bincount(labels[one], minlength=3).tolist() == [6, 6, 6]
    assert set(one.tolist()) <= set(ten.tolist())  # the 1 % subset of a draw lies inside its 10 % subset
    other = class_balanced_draw(labels, 0.1, 3, draw=1)
    assert not torch.equal(other, ten) and torch.bincount(labels[other], minlength=3).tolist() == [60, 60, 60]
    # unreadable images (label -1) are never drawn; a class smaller than its share gives what it has
    few = torch.tensor([0] * 50 + [1] * 2 + [-1] * 10)
    picked = class_balanced_draw(few, 0.5, 2, draw=0)
    assert torch.bincount(few[picked], minlength=2).tolist() == [13, 2]  # half of 52 labelled, over 2


def test_metric_names():
    assert [low_label_metric(f) for f in (0.01, 0.1, 0.005)] == ["linear_top1_1pct", "linear_top1_10pct",
                                                                 "linear_top1_0.5pct"]


@pytest.mark.parametrize("encoder_seed", [0, 1])
def test_final_scores_hold_the_low_label_probes_and_the_k20_knn_on_the_training_split_only(encoder_seed):
    """With a validation split held out, the low-label probes are fitted on fixed draws of the probe's training
    images (never the held-out ones, never drawn by the encoder's seed) and scored on its test images; the
    k = 20 kNN is the kNN of the same bank at k = 20."""
    from dataclasses import replace

    torch.manual_seed(encoder_seed)
    ev = _run_evaluation(True)
    ev.cfg = replace(ev.cfg, knn_k=200, knn_k_small=20, low_label_fractions="0.05,0.25", low_label_draws=3,
                     low_label_steps=20)
    torch.manual_seed(99 + encoder_seed)  # the draws must not read the global generator
    scores = ev.final_scores()
    assert ev.last_final is scores
    assert set(scores.extra_metrics()) == {"knn20_top1", "linear_top1_5pct", "linear_top1_25pct"}
    f_train, l_train = ev.split_features("train", None)
    f_test, l_test = ev.split_features("test", None)
    assert scores.knn_small == {20: knn_accuracy(f_train, l_train, f_test, l_test, ev.source.classes, 20, 0.1)}
    assert scores.knn == knn_accuracy(f_train, l_train, f_test, l_test, ev.source.classes, 200, 0.1)
    expected = low_label_probes(f_train, l_train, f_test, l_test, ev.source.classes, (0.05, 0.25), 3,
                                weight_decay=ev.cfg.low_label_wd, steps=20)
    assert scores.low_label == expected and all(len(v) == 3 for v in expected.values())
    assert scores.extra_metrics()["linear_top1_25pct"] == pytest.approx(sum(expected[0.25]) / 3)
    # the drawn images are training images: none of them is a validation image
    train_images = next(iter(ev.source.eval_split("train", None)))[0]
    val_images = next(iter(ev.source.eval_split("val", None)))[0]
    held_out = {bytes(im.flatten().tolist()) for im in val_images}
    for d in range(3):
        idx = class_balanced_draw(l_train, 0.25, ev.source.classes, d)
        assert not {bytes(im.flatten().tolist()) for im in train_images[idx]} & held_out


def test_no_low_label_probe_and_no_second_knn_when_turned_off():
    from dataclasses import replace

    ev = _run_evaluation(False)
    ev.cfg = replace(ev.cfg, knn_k_small=0, low_label_fractions="none")
    scores = ev.final_scores()
    assert scores.extra_metrics() == {} and scores.low_label == {} and scores.knn_small == {}


def test_low_label_settings_out_of_range_are_refused_naming_the_field():
    from mocolab.config import build_config

    for key, value in (("eval.low_label_fractions", "0.01,1"), ("eval.low_label_fractions", "0.01,x"),
                       ("eval.low_label_draws", 0), ("eval.low_label_steps", 0), ("eval.low_label_wd", -1.0),
                       ("eval.knn_k_small", -1)):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            build_config("smoke", {key: value})
    assert build_config("smoke", {"eval.low_label_fractions": "[0.02, 0.2]"}).eval.low_label == (0.02, 0.2)


def _trial(m: float, seed: int, linear: float, one_pct: float) -> dict:
    return {"status": "finished", "params.moco.m": m, "params.run.seed": seed, "linear_top1": linear,
            "knn_top1": linear - 0.1, "linear_top1_1pct": one_pct, "linear_top1_10pct": one_pct + 0.05,
            "knn20_top1": linear - 0.08, "final_loss": 7.0, "ema_half_life": 6.6, "max_staleness_bound": 64.0}


def test_make_runs_table_shows_the_one_percent_probe_beside_the_full_one():
    from mocolab.analysis.momentum_plots import momentum_table

    trials = pd.DataFrame([_trial(0.9, 0, 0.8253, 0.6121), _trial(0.999, 0, 0.8664, 0.7012),
                           _trial(0.999, 1, 0.8670, 0.7030)])
    text, table = momentum_table(trials)
    header, row_09, row_0999 = text.splitlines()[:3]
    assert header.index("linear top-1 %") < header.index("1 % labels %") < header.index("kNN top-1 %")
    assert row_09.split()[2:4] == ["82.53", "61.21"]
    assert "70.21 ± 0.13" in row_0999
    assert table["linear_top1_1pct_mean"].tolist() == pytest.approx([61.21, 70.21])
    assert table["knn20_top1_mean"].tolist() == pytest.approx([74.53, 78.67])
    # trials that logged no low-label probe show a dash, not a number
    old = trials.drop(columns=["linear_top1_1pct", "linear_top1_10pct", "knn20_top1"])
    text, table = momentum_table(old)
    assert text.splitlines()[1].split()[2:4] == ["82.53", "—"] and math.isnan(table["linear_top1_1pct_mean"][0])
