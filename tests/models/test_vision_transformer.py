"""The ViT backbones (vit.py): shapes, sin-cos positions, the frozen patch projection, its gradient monitor."""

from __future__ import annotations

import pytest
import torch

from mocolab.config import build_config
from mocolab.training.trainer import Trainer
from mocolab.training.monitors import GRAD_NORM_FIRST
from mocolab.models.vision_transformer import PatchGradNorm, build_vit, default_patch_size, sincos_position_embedding


def test_sizes_and_patching_follow_the_data():
    assert [default_patch_size(s) for s in (28, 32, 64, 96, 224)] == [4, 4, 8, 8, 16]
    net = build_vit("vit_tiny", 28, 1, depth=2)
    assert net.grid == 7 and net.out_dim == 192 and len(net.blocks) == 2
    assert net(torch.rand(3, 1, 28, 28)).shape == (3, 192)
    small = build_vit("vit_small", 32, 3, patch_size=8, depth=1)
    assert small.out_dim == 384 and small.blocks[0].attn.heads == 12 and small.grid == 4
    with pytest.raises(ValueError, match="vit.patch_size: 5 must divide the image size 28"):
        build_vit("vit_tiny", 28, 1, patch_size=5)


def test_sincos_positions_are_fixed_distinct_and_zero_for_the_class_token():
    pe = sincos_position_embedding(7, 192)
    assert pe.shape == (50, 192)
    assert torch.count_nonzero(pe[0]) == 0
    assert torch.cdist(pe[1:], pe[1:]).add(torch.eye(49)).min() > 0.1  # every patch position differs
    net = build_vit("vit_tiny", 28, 1, depth=1)
    assert "pos_embed" not in dict(net.named_parameters()) and "pos_embed" not in net.state_dict()


def test_patch_grad_norm_equals_the_weight_gradient_of_a_trained_projection():
    torch.manual_seed(0)
    net = build_vit("vit_tiny", 28, 1, depth=1)
    mon = PatchGradNorm(net.patch_embed)
    x1, x2 = torch.rand(4, 1, 28, 28), torch.rand(4, 1, 28, 28)
    (net(x1).square().sum() + net(x2).sum()).backward()  # two forwards before one backward, as v3 does
    assert mon.pop() == pytest.approx(float(net.patch_embed.weight.grad.norm()), rel=1e-4)
    assert mon.pop() is None
    with torch.no_grad():
        net(x1)
    assert mon.pop() is None  # nothing measured without autograd


def test_frozen_projection_has_no_gradient_but_is_still_measured():
    torch.manual_seed(0)
    trained = build_vit("vit_tiny", 28, 1, depth=1)
    torch.manual_seed(0)
    frozen = build_vit("vit_tiny", 28, 1, depth=1, freeze_patch_embed=True)
    mons = PatchGradNorm(trained.patch_embed), PatchGradNorm(frozen.patch_embed)
    x = torch.rand(4, 1, 28, 28)
    for net in (trained, frozen):
        net(x).square().sum().backward()
    assert frozen.patch_embed.weight.grad is None and not frozen.patch_embed.weight.requires_grad
    a, b = (m.pop() for m in mons)
    assert a == pytest.approx(b, rel=1e-5) and a > 0  # the same gradient, applied or not


def _vit_trainer(freeze: bool, **extra) -> Trainer:
    cfg = build_config("smoke", {"model.backbone": "vit_tiny", "vit.depth": 1, "vit.patch_size": 7,
                                 "vit.freeze_patch_embed": freeze, "moco.version": "v3", "model.head": "mlp3-bn",
                                 "model.dim": 32, "model.hidden": 64, "moco.bn": "plain",
                                 "optim.name": "adamw", "optim.lr": 1e-3, "optim.weight_decay": 0.1,
                                 "optim.batch_size": 32, "data.subset": 256, "run.precision": "fp32", **extra})
    return Trainer(cfg)


def test_frozen_patch_projection_is_bit_identical_after_optimisation_steps():
    tr = _vit_trainer(True)
    before = {k: v.clone() for k, v in tr.encoder.backbone.patch_embed.state_dict().items()}
    blocks_before = tr.encoder.backbone.blocks[0].mlp[0].weight.clone()
    images = next(iter(tr.data.epoch(tr.epoch_order(0), tr.batch, 0, 1, start_step=0)))
    with torch.random.fork_rng(devices=[]):
        results = [tr.train_step(images, None, tr.schedule.momentum(tr.step)) for _ in range(3)]
    for k, v in tr.encoder.backbone.patch_embed.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not torch.equal(tr.encoder.backbone.blocks[0].mlp[0].weight, blocks_before)  # the rest trains
    # AdamW's weight decay would move a parameter it was given: the frozen one is not among them
    given = {id(p) for g in tr.optimizer.param_groups for p in g["params"]}
    assert id(tr.encoder.backbone.patch_embed.weight) not in given
    grads = [r.monitored[GRAD_NORM_FIRST] for r in results]
    assert all(g is not None and g > 0 for g in grads)


def test_trained_patch_projection_moves():
    tr = _vit_trainer(False)
    before = tr.encoder.backbone.patch_embed.weight.clone()
    images = next(iter(tr.data.epoch(tr.epoch_order(0), tr.batch, 0, 1, start_step=0)))
    with torch.random.fork_rng(devices=[]):
        res = tr.train_step(images, None, tr.schedule.momentum(tr.step))
    assert not torch.equal(tr.encoder.backbone.patch_embed.weight, before)
    weight_grad = float(tr.encoder.backbone.patch_embed.weight.grad.norm())
    assert res.monitored[GRAD_NORM_FIRST] == pytest.approx(weight_grad, rel=1e-4)


def test_per_step_metrics_are_kept_every_nth_step():
    """run.step_metrics_every: the series hold every N-th step only, and the gradient is measured only then."""
    tr = _vit_trainer(False, **{"run.step_metrics_every": 2, "optim.max_steps": 4})
    with torch.random.fork_rng(devices=[]):
        tr.train_epoch()
    series = tr.last_epoch_series or tr.epoch_stats.per_step
    assert [s for s, _ in series["m"]] == [2.0, 4.0]
    assert [s for s, _ in series[GRAD_NORM_FIRST]] == [2.0, 4.0]
