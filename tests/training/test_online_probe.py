"""The online linear probe (training/online_probe.py): a curve of linear accuracy during training that never
changes what the encoder learns, resumes with its run, and costs a step little."""

from __future__ import annotations

import torch
from conftest import assert_same_method_state, checkpoint_mid_epoch

from mocolab.config import build_config
from mocolab.training.trainer import Trainer, run_training

SMALL = {"data.name": "synthetic", "data.subset": 512, "optim.batch_size": 32, "queue.size": 256,
         "optim.max_steps": 12, "eval.knn_every": 0, "eval.drift_probes": 16}


def _trained(online: bool) -> Trainer:
    tr = Trainer(build_config("smoke", {**SMALL, "eval.online_probe": online}))
    tr.train_epoch()
    return tr


def test_the_online_probe_leaves_the_encoder_bit_for_bit_as_it_was_and_learns():
    """The same seed with the probe on and off: every weight and buffer of the method equal to the bit (the
    probe draws from no random stream and sends no gradient into the encoder), and the probe's head moved."""
    on, off = _trained(True), _trained(False)
    assert on.step == off.step == 12
    assert_same_method_state(on, off)
    assert torch.equal(on.rng_state, off.rng_state)
    assert off.online is None and on.online is not None
    assert on.online.head.weight.abs().sum() > 0  # it trained, from its zero start
    assert not any(h for h in on.encoder.backbone._forward_hooks.values())  # no hook left on the backbone


def test_the_online_probe_resumes_from_a_mid_epoch_checkpoint_as_if_never_stopped():
    cfg = build_config("smoke", SMALL)
    full = Trainer(cfg)
    full.train_epoch()

    state = checkpoint_mid_epoch(cfg, 5)
    assert state["online_probe"]["head"]["weight"].abs().sum() > 0
    resumed = Trainer(cfg)
    resumed.load_state_dict(state)
    resumed.train_epoch()
    assert torch.equal(full.online.head.weight, resumed.online.head.weight)
    assert torch.equal(full.online.head.bias, resumed.online.head.bias)


def test_the_online_probe_draws_a_curve_per_epoch_and_ends_beside_the_offline_probe():
    """Scored with each epoch's kNN monitor on its split (here the test images: cpu-quick's case, where no
    validation split is held out) and at the end on the offline probe's test images."""
    cfg = build_config("smoke", {**SMALL, "optim.max_steps": None, "optim.epochs": 3, "data.subset": 192,
                                 "queue.size": 64,
                                 "eval.knn_every": 1, "eval.knn_bank": 128, "eval.knn_test": 64,
                                 "eval.linear_train": 128, "eval.linear_test": 64, "eval.low_label_fractions": "",
                                 "eval.knn_k_small": 0})
    lines: list[str] = []
    res = run_training(cfg, progress=lines.append)
    curve = [h.online_linear_top1 for h in res.history]
    assert len(curve) == 3 and all(v is not None and 0.0 <= v <= 1.0 for v in curve), curve
    assert all(h.val_online_linear_top1 is None for h in res.history)
    assert any("online probe" in line for line in lines if line.startswith("epoch"))
    assert "online probe" in lines[-1] and "linear top-1" in lines[-1]
