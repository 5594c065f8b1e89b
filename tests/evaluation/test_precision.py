"""Evaluation in full float32 (evaluation/precision.py): TF32, which training may turn on, is off inside every
evaluation entry point and the caller's settings come back after. The flags are process-wide, so this runs on
a CPU: what is checked is what the kNN and the probe would run under on a GPU."""

from __future__ import annotations

import pytest
import torch

from mocolab.evaluation.precision import full_fp32, precision_flags

from test_evaluation import _run_evaluation

TRAINING = ("high", True, True)  # what config/hardware.configure_device leaves on a GPU run
FULL = ("highest", False, False)


@pytest.fixture
def training_flags():
    """The process set for training as a GPU run is (TF32 on), and set back to what it was after the test."""
    saved = precision_flags()
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    yield
    torch.set_float32_matmul_precision(saved[0])
    if torch.backends.cuda.matmul.allow_tf32 != saved[1]:
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
    if torch.backends.cudnn.allow_tf32 != saved[2]:
        torch.backends.cudnn.allow_tf32 = saved[2]


def test_full_fp32_sets_and_restores_the_flags_also_on_an_error(training_flags):
    assert precision_flags() == TRAINING
    with full_fp32():
        assert precision_flags() == FULL
    assert precision_flags() == TRAINING
    with pytest.raises(RuntimeError, match="inside"):
        with full_fp32():
            raise RuntimeError("inside")
    assert precision_flags() == TRAINING
    # other settings come back as they were too, whatever they were (medium: bf16 on oneDNN, a state that
    # torch 2.14 cannot read back once a legacy TF32 setter has run over it)
    for precision, cudnn_tf32 in (("medium", False), ("medium", True), ("highest", True), ("high", False)):
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        before = precision_flags()
        with full_fp32():
            assert precision_flags() == FULL
        assert precision_flags() == before and before[0] == precision


def test_the_evaluation_entry_points_extract_and_score_in_full_fp32(training_flags):
    """The flags seen inside feature extraction, the kNN monitor and the final evaluation are full float32 while
    training's are TF32; training's come back after each."""
    seen: list[tuple[str, bool, bool]] = []
    ev = _run_evaluation(False)
    features = ev.features

    def observed(images: torch.Tensor) -> torch.Tensor:
        seen.append(precision_flags())
        return features(images)

    ev.features = observed  # what split_features embeds with, in knn() and final_scores()
    ev.knn()
    assert seen and set(seen) == {FULL} and precision_flags() == TRAINING
    seen.clear()
    ev.final_scores()
    assert seen and set(seen) == {FULL} and precision_flags() == TRAINING
    seen.clear()
    ev.final_eval()  # the random-init and raw-pixel baselines go through here
    assert seen and set(seen) == {FULL} and precision_flags() == TRAINING


def test_the_knn_and_the_probe_run_in_full_fp32_on_their_own(training_flags, monkeypatch):
    """knn.py and probe.py work on any features (mocolab eval, a user's loop): each call is scoped itself. The
    real neighbour search and loss run; a wrapper notes the flags they ran under."""
    from mocolab.evaluation import knn, probe

    seen = []
    real_topk, real_ce = torch.Tensor.topk, torch.nn.functional.cross_entropy
    monkeypatch.setattr(torch.Tensor, "topk", lambda *a, **k: (seen.append(precision_flags()), real_topk(*a, **k))[1])
    monkeypatch.setattr(torch.nn.functional, "cross_entropy",
                        lambda *a, **k: (seen.append(precision_flags()), real_ce(*a, **k))[1])
    feats, labels = torch.randn(40, 8), torch.arange(40) % 4
    knn.knn_accuracy(feats, labels, feats, labels, 4, k=5)
    assert seen == [FULL] and precision_flags() == TRAINING
    seen.clear()
    probe.linear_probe(feats, labels, feats, labels, 4, steps=3)
    assert seen and set(seen) == {FULL} and precision_flags() == TRAINING
