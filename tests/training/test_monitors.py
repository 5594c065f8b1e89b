"""The monitors (training/monitors.py) on real encoders and a real trainer: the first layer's gradient with its hooks
present only for a kept step's forward, the drift monitor's fields and checkpoint, the console lines, and
the hooks in the order the trainer calls them."""

from __future__ import annotations

import copy

import pytest
import torch

from mocolab.config import build_config
from mocolab.training.trainer import ConsoleProgress, EpochRecord, Trainer, fmt_time
from mocolab.method.protocol import MethodOutput
from mocolab.models.backbones import build_encoder
from mocolab.training.monitors import GRAD_NORM_FIRST, FirstLayerGradNorm, Monitor, mean_cosines

SYN = {"data.name": "synthetic", "data.synthetic_size": 128, "data.subset": None, "optim.batch_size": 32,
       "queue.size": 64, "model.width": 8, "run.precision": "fp32", "run.device": "cpu", "optim.epochs": 1,
       "eval.drift_probes": 8}


def _one_step(net: torch.nn.Module, monitor: FirstLayerGradNorm, x: torch.Tensor, record: bool) -> dict:
    """A step as train_step runs one, the method being the backbone and a squared-sum loss."""
    monitor.before_step(record)
    loss = net(x).square().sum()
    monitor.after_forward(0, MethodOutput(loss, torch.ones(1, dtype=torch.bool), torch.zeros(1, 1)), x, None)
    loss.backward()
    return monitor.after_backward(record)


def test_the_first_layer_gradient_of_a_convnet_is_its_weights_gradient_on_kept_steps_only():
    torch.manual_seed(0)
    net = build_encoder("convnet", 1, width=8, head="linear", dim=16).backbone
    monitor = FirstLayerGradNorm(net)
    x = torch.rand(4, 1, 28, 28)
    got = _one_step(net, monitor, x, record=True)
    assert got == {GRAD_NORM_FIRST: pytest.approx(float(monitor.layer.weight.grad.norm()))}
    assert isinstance(monitor.layer, torch.nn.Conv2d) and got[GRAD_NORM_FIRST] > 0
    assert _one_step(net, monitor, x, record=False) == {}


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen"])
def test_a_vits_patch_projection_is_measured_from_hooks_that_live_only_through_a_kept_steps_forward(frozen):
    torch.manual_seed(0)
    net = build_encoder("vit_tiny", 1, head="linear", dim=16, patch_size=7, depth=1, freeze_patch_embed=frozen).backbone
    monitor = FirstLayerGradNorm(net)
    assert monitor.layer is net.patch_embed and not net.patch_embed._forward_hooks
    x = torch.rand(4, 1, 28, 28)
    got = _one_step(net, monitor, x, record=True)[GRAD_NORM_FIRST]
    assert got > 0 and not net.patch_embed._forward_hooks  # measured, and the hook is gone again
    if frozen:
        assert net.patch_embed.weight.grad is None
    else:
        assert got == pytest.approx(float(net.patch_embed.weight.grad.norm()), rel=1e-4)
    assert _one_step(net, monitor, x, record=False) == {} and monitor.patch.grad is None
    exported = copy.deepcopy(net)  # what evaluation copies and export traces: a plain module
    assert not any(m._forward_hooks for m in exported.modules())


def test_drift_monitor_fields_are_the_epoch_records_and_its_probes_round_trip_a_checkpoint():
    cfg = build_config("smoke", SYN)
    tr = Trainer(cfg)
    tr.train_epoch()
    fields = tr.measure_epoch()
    assert set(fields) == {"staleness_mean", "staleness_max", "drift_cos", "stored_cos", "diagnostics"}
    assert fields["staleness_max"] == 64 / 32  # a FIFO queue's oldest key: K / B steps
    assert 0.0 < fields["drift_cos"] <= 1.0 + 1e-6 and fields["diagnostics"]["step"] == tr.step == 4
    other_rank = tr.drift.end_epoch(tr.step, main=False)  # staleness everywhere; diagnostics on rank 0
    assert other_rank["diagnostics"] == {} and other_rank["drift_cos"] is None
    assert other_rank["staleness_max"] == fields["staleness_max"]
    resumed = Trainer(cfg)
    resumed.load_state_dict(tr.state_dict())
    assert resumed.drift.diagnostics(resumed.step) == tr.drift.diagnostics(tr.step)
    without = Trainer(build_config("smoke", {**SYN, "eval.drift_probes": 0}))
    assert without.drift.probes is None and without.state_dict()["probes"] == {}
    without.load_state_dict(tr.state_dict())  # a checkpoint with probes loads into a run without them


def test_mean_cosines_are_one_for_fresh_negatives_and_none_before_any_probe_is_written():
    assert mean_cosines({"step": 3}, fresh_negatives=True) == (1.0, 1.0)
    assert mean_cosines({}, fresh_negatives=True) == (None, None)  # another rank: nothing measured
    assert mean_cosines({"step": 3}, fresh_negatives=False) == (None, None)
    probes = {"age": [1.0, 2.0], "drift_cos": [0.5, 1.0], "stored_cos": [0.25, 0.75]}
    assert mean_cosines({"probes": probes}, fresh_negatives=False) == (0.75, 0.5)


def test_console_prints_every_quarter_epoch_but_its_end_and_one_line_per_epoch():
    tr = Trainer(build_config("smoke", {**SYN, "data.synthetic_size": 256, "optim.epochs": 2}))
    lines: list[str] = []
    console = ConsoleProgress(lines.append)
    for step in range(1, 9):  # 8 steps an epoch: a line after steps 2, 4 and 6
        tr.step = step
        console.on_step(tr)
    assert lines == [f"  epoch 1 step {s}/16 loss nan 0 img/s" for s in (2, 4, 6)]
    tr.epoch = 1
    rec = EpochRecord(1, 8, 1.23456, 0.06, 0.99, 0.5, 0.75, 1234.4, 1.5, 2.0, 100.0, 2.0, 1.0, drift_cos=0.9)
    console.on_epoch(tr, rec)
    assert lines[-1].startswith("epoch   1  step      8/16  loss 1.2346  pretext 50.0%  kNN 75.00%  1234 img/s"
                                "  key drift cos 0.900 (age ≤ 2)  ETA ")
    console.on_epoch(tr, EpochRecord(2, 16, 1.0, 0.0, 0.99, 0.5, None, 10.0, 1.0, 2.0, 100.0, 2.0, 1.0))
    assert "kNN at the end  10 img/s  ETA " in lines[-1]
    assert [fmt_time(s) for s in (5.4, 59.6, 61, 3600)] == ["5s", "1m00s", "1m01s", "60m00s"]


class Recorder(Monitor):
    """A monitor that notes each hook it is called with and keeps a per-step value of its own."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def before_step(self, record: bool) -> None:
        self.calls.append(("before_step", record))

    def after_forward(self, step, out, images, index) -> None:
        self.calls.append(("after_forward", step, out.written is not None, index is not None))

    def after_backward(self, record: bool) -> dict[str, float | None]:
        self.calls.append(("after_backward", record))
        return {"recorded": 1.0} if record else {}

    def end_epoch(self, step: int, main: bool) -> dict:
        self.calls.append(("end_epoch", step, main))
        return {}


def test_the_trainer_calls_each_monitors_hooks_in_step_order_and_keeps_their_series():
    tr = Trainer(build_config("smoke", {**SYN, "run.step_metrics_every": 2}))
    recorder = Recorder()
    tr.monitors.append(recorder)
    tr.train_epoch()
    tr.measure_epoch()
    def step(s: int, kept: bool) -> list[tuple]:
        return [("before_step", kept), ("after_forward", s, True, True), ("after_backward", kept)]

    assert recorder.calls == [*step(0, False), *step(1, True), *step(2, False), *step(3, True), ("end_epoch", 4, True)]
    series = tr.last_epoch_series
    # the step's own momentum, loss and pretext accuracy first, then each monitor's
    assert list(series) == ["m", "step_loss", "step_pretext_acc", GRAD_NORM_FIRST, "recorded"]
    assert all(0.0 <= acc <= 1.0 for _, acc in series["step_pretext_acc"]) and series["step_loss"][0][1] > 0
    assert series["recorded"] == [[2.0, 1.0], [4.0, 1.0]] and [s for s, _ in series["m"]] == [2.0, 4.0]
