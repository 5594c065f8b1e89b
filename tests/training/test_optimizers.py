"""optim.name (training/optimizers.py) and the schedules of lr and momentum (training/schedule.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mocolab.training.optimizers import LARS, build_optimizer
from mocolab.training.schedule import lr_at, momentum_at


def test_lr_warmup_then_cosine():
    total, warm = 100, 10
    assert lr_at("cosine", 1.0, 0, total, warm) == 0.0
    assert lr_at("cosine", 1.0, 5, total, warm) == pytest.approx(0.5)
    assert lr_at("cosine", 1.0, warm, total, warm) == pytest.approx(1.0)
    assert lr_at("cosine", 1.0, 55, total, warm) == pytest.approx(0.5)  # halfway through the cosine part
    assert lr_at("cosine", 1.0, total, total, warm) == pytest.approx(0.0, abs=1e-12)
    assert lr_at("constant", 2.0, 3, total, warm) == pytest.approx(0.6)
    # without warm-up: the v2 schedule as before
    assert lr_at("cosine", 1.0, 25, 100) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


def test_momentum_cosine_rises_from_base_to_one():
    assert momentum_at("constant", 0.99, 50, 100) == 0.99
    ms = [momentum_at("cosine", 0.99, t, 100) for t in range(101)]
    assert ms[0] == pytest.approx(0.99) and ms[-1] == pytest.approx(1.0) and ms[50] == pytest.approx(0.995)
    assert all(a <= b for a, b in zip(ms, ms[1:]))
    with pytest.raises(ValueError, match="moco.m_schedule"):
        momentum_at("linear", 0.99, 0, 10)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def test_lars_step_by_hand():
    """Matrices: momentum on (g + λw)·η‖w‖/‖g + λw‖; vectors (bias, BN): plain momentum, no decay."""
    net = _model()
    opt = LARS(net.parameters(), lr=0.1, weight_decay=0.01, momentum=0.9, trust_coefficient=0.001)
    net(torch.randn(8, 4)).square().sum().backward()
    w, b = net[0].weight, net[0].bias
    w0, gw, b0, gb = w.detach().clone(), w.grad.clone(), b.detach().clone(), b.grad.clone()
    opt.step()
    u = gw + 0.01 * w0
    expected_w = w0 - 0.1 * (0.001 * w0.norm() / u.norm()) * u
    assert torch.allclose(w, expected_w, atol=1e-7)
    assert torch.allclose(b, b0 - 0.1 * gb, atol=1e-7)


def test_build_optimizer_skips_frozen_parameters_and_names_bad_values():
    net = _model()
    net[0].weight.requires_grad_(False)
    for name, cls in (("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW), ("lars", LARS)):
        opt = build_optimizer(name, net, 0.1, weight_decay=0.1)
        assert isinstance(opt, cls)
        params = [p for g in opt.param_groups for p in g["params"]]
        assert all(p is not net[0].weight for p in params) and len(params) == 5
    with pytest.raises(ValueError, match="optim.name: unknown value 'adam'"):
        build_optimizer("adam", net, 0.1)
