"""What a GPU user sets, run here on the CPU: fp16 with a loss scale that resumes, channels_last, torch.compile.
(Whether they are faster is the GPU script's question: benchmarks/gpu/gpu.py.)"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_method_state, checkpoint_mid_epoch

from mocolab.config import build_config
from mocolab.training.trainer import Trainer

SMALL = {"data.name": "synthetic", "data.subset": 512, "optim.batch_size": 32, "queue.size": 256,
         "optim.max_steps": 6, "eval.knn_every": 0, "eval.drift_probes": 16}


def _first_losses(steps: int = 2, **sets) -> tuple[Trainer, list[float]]:
    tr = Trainer(build_config("smoke", {**SMALL, **sets}))
    losses: list[float] = []
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(tr.rng_state)
        for images, index in tr.data.epoch_indexed(tr.epoch_order(0), tr.batch, 0, 1, start_step=0):
            losses.append(tr.train_step(images, index, tr.schedule.momentum(tr.step)).loss)
            if len(losses) == steps:
                break
    return tr, losses


@pytest.mark.slow
def test_fp16_scales_the_loss_and_resumes_its_scale_and_weights_equal():
    """run.precision=fp16: a GradScaler steps the optimizer, and a mid-epoch checkpoint holds its state, so a
    resumed run's weights and scale equal the uninterrupted run's to the bit."""
    cfg = build_config("smoke", {**SMALL, "run.precision": "fp16"})
    full = Trainer(cfg)
    assert full.precision == torch.float16 and full.scaler is not None
    full.train_epoch()
    state = checkpoint_mid_epoch(cfg, 3)
    assert state["grad_scaler"]["scale"] > 0
    resumed = Trainer(cfg)
    resumed.load_state_dict(state)
    resumed.train_epoch()
    assert resumed.scaler.state_dict() == full.scaler.state_dict()
    assert_same_method_state(full, resumed)
    assert Trainer(build_config("smoke", SMALL)).scaler is None  # fp32: no scale


def test_channels_last_trains_in_that_layout_to_the_same_losses():
    tr, nhwc = _first_losses(**{"run.channels_last": True})
    conv = next(m for m in tr.encoder.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    _, nchw = _first_losses()
    assert nhwc == pytest.approx(nchw, rel=1e-4)


@pytest.mark.slow
def test_compile_builds_a_graph_of_both_encoders_and_gives_the_eager_loss(monkeypatch):
    """run.compile: dynamo traced the encoders (graphs counted), and the losses equal eager ones to float
    rounding.  The graphs run through AOT autograd without inductor's code generation, which takes minutes
    of C++ compilation on two cores (the GPU script times inductor itself: benchmarks/gpu/gpu.py)."""
    from torch._dynamo.utils import counters

    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self: compile_module(self, backend="aot_eager"))
    torch._dynamo.reset()
    counters.clear()
    _, compiled = _first_losses(**{"run.compile": True, "eval.online_probe": False})
    assert counters["stats"]["unique_graphs"] >= 2, dict(counters["stats"])
    _, eager = _first_losses(**{"eval.online_probe": False})
    assert compiled == pytest.approx(eager, rel=1e-4, abs=1e-4)
    torch._dynamo.reset()


def test_compile_with_the_online_probe_is_refused_before_any_work():
    with pytest.raises(ValueError, match=r"run.compile: true with eval.online_probe: true.*eval.online_probe=false"):
        build_config("smoke", {**SMALL, "run.compile": True})
