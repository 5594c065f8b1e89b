"""MoCo v3 (moco.MoCoV3): the loss by hand, on two real gloo ranks against one process, and its parts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gloo_launch import launch

from mocolab.models.backbones import build_encoder
from mocolab.method.moco import MoCoV3
from mocolab.method.batchnorm import convert_global_bn

B, C = 8, 16


def _encoder(seed: int = 0):
    torch.manual_seed(seed)
    return build_encoder("convnet", 1, width=4, head="mlp-bn", dim=C, hidden=32, predictor=True)


def _views(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 12, 12, generator=g), torch.randn(n, 1, 12, 12, generator=g)


def test_symmetric_loss_is_the_two_directions_by_hand():
    """loss = 2τ·CE(q1 vs k2) + 2τ·CE(q2 vs k1), i.e. 4τ × the mean of the two directions' cross-entropies."""
    tau = 0.2
    model = MoCoV3(_encoder(), m=0.99, tau=tau).eval()  # eval: BN uses running statistics, so calls compose
    x1, x2 = _views(B)
    out = model(x1, x2)
    with torch.no_grad():
        q1 = F.normalize(model.encoder_q(x1), dim=1)
        q2 = F.normalize(model.encoder_q(x2), dim=1)
        k1 = F.normalize(model.encoder_k(x1), dim=1)  # already updated by the forward above
        k2 = F.normalize(model.encoder_k(x2), dim=1)
    labels = torch.arange(B)
    ce12 = F.cross_entropy(q1 @ k2.T / tau, labels)
    ce21 = F.cross_entropy(q2 @ k1.T / tau, labels)
    assert float(out.loss.detach()) == pytest.approx(float(4 * tau * (ce12 + ce21) / 2), rel=1e-5)
    assert out.correct.shape == (2 * B,)
    # the query encoder gets the gradient, the momentum encoder none (and has no predictor)
    out.loss.backward()
    assert model.encoder_q.predictor[0].weight.grad is not None
    assert model.encoder_k.predictor is None
    assert all(p.grad is None for p in model.encoder_k.parameters())


def test_momentum_update_pairs_parameters_by_name_and_skips_the_predictor():
    model = MoCoV3(_encoder(), m=0.5, tau=0.2)
    with torch.no_grad():
        for p in model.encoder_q.parameters():
            p.add_(1.0)
    before = {n: p.clone() for n, p in model.encoder_k.named_parameters()}
    model.momentum_update()
    q = dict(model.encoder_q.named_parameters())
    for name, p_k in model.encoder_k.named_parameters():
        assert torch.allclose(p_k, 0.5 * before[name] + 0.5 * q[name])
    assert len(model.ema_pairs()) == len(before) < len(q)


def _v3_rank(rank: int, world: int, tau: float) -> dict:
    enc = convert_global_bn(_encoder())  # the same initial weights on every rank; BN over the global batch
    model = MoCoV3(enc, m=0.9, tau=tau)
    x1, x2 = _views(B * world)
    mine = slice(rank * B, (rank + 1) * B)
    out = model(x1[mine], x2[mine])
    out.loss.backward()
    return {"loss": float(out.loss), "correct": out.correct,
            "grads": [p.grad.clone() for p in model.encoder_q.parameters()],
            "key": {n: p.detach().clone() for n, p in model.encoder_k.named_parameters()}}


def test_v3_on_two_gloo_ranks_equals_one_process_over_the_whole_batch(tmp_path):
    """Positives at r·B + i of the all-gathered keys: the mean of the ranks' losses (and, as DDP averages
    them, of their gradients) is the one-process loss over the concatenated batch, with BN synced."""
    tau, world = 0.2, 2
    ranks = launch(_v3_rank, world, tmp_path, tau)
    model = MoCoV3(_encoder(), m=0.9, tau=tau)
    x1, x2 = _views(B * world)
    out = model(x1, x2)
    out.loss.backward()
    assert sum(r["loss"] for r in ranks) / world == pytest.approx(float(out.loss), rel=1e-5)
    for i, p in enumerate(model.encoder_q.parameters()):
        mean_grad = sum(r["grads"][i] for r in ranks) / world
        assert torch.allclose(mean_grad, p.grad, atol=1e-5, rtol=1e-4), i
    # pretext accuracy: rank r's queries hold rows r·B.. of each direction
    both = torch.cat([torch.cat([r["correct"][:B] for r in ranks]), torch.cat([r["correct"][B:] for r in ranks])])
    assert torch.equal(both, out.correct)
    for name, p in model.encoder_k.named_parameters():
        assert torch.allclose(ranks[0]["key"][name], p, atol=1e-6)


def test_positive_is_the_same_image_across_ranks_not_row_zero(tmp_path):
    """A sanity check that cannot pass by accident: with identical views the key of query i is its own
    image, so every query (on both ranks) finds its positive at r·B + i."""
    ranks = launch(_same_views_rank, 2, tmp_path)
    assert all(bool(r["correct"].all()) for r in ranks)


def _same_views_rank(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    enc = build_encoder("convnet", 1, width=4, head="linear", dim=C, predictor=False)
    model = MoCoV3(enc, m=0.0, tau=0.2).eval()
    x, _ = _views(B * world)
    x = x * 10  # distinct images, far apart
    mine = slice(rank * B, (rank + 1) * B)
    with torch.no_grad():
        out = model(x[mine], x[mine])
    return {"correct": out.correct}
