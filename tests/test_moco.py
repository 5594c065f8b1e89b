import pytest
import torch
import torch.nn.functional as F

from mocolab.models import build_encoder
from mocolab.moco import MoCo, info_nce
from mocolab.moco_loss import queue_info_nce
from mocolab.norm import LocalShuffle
from mocolab.queue import KeyQueue


def _moco(m: float = 0.9, bn_groups: int = 1) -> MoCo:
    enc = build_encoder("convnet", 1, width=4, head="mlp", dim=8, bn_groups=bn_groups)
    return MoCo(enc, KeyQueue(32, 8, 8), m=m, tau=0.2, shuffler=LocalShuffle())


def _perturb(model: MoCo) -> None:
    with torch.no_grad():
        for p in model.encoder_q.parameters():
            p.add_(torch.randn_like(p))


def test_ema_update_is_exact():
    model = _moco(m=0.9)
    _perturb(model)  # make θ_q differ from θ_k
    before_k = [p.clone() for p in model.encoder_k.parameters()]
    q_params = [p.clone() for p in model.encoder_q.parameters()]
    model.momentum_update()
    for k_old, q, k_new in zip(before_k, q_params, model.encoder_k.parameters()):
        torch.testing.assert_close(k_new, 0.9 * k_old + 0.1 * q, rtol=0, atol=1e-6)


def test_m_zero_copies_query_encoder():
    model = _moco(m=0.0)
    _perturb(model)
    model.momentum_update()
    for k, q in zip(model.encoder_k.parameters(), model.encoder_q.parameters()):
        assert torch.equal(k, q)


def test_key_encoder_gets_no_gradient_and_no_optimizer_slot():
    model = _moco()
    opt = torch.optim.SGD(model.encoder_q.parameters(), lr=0.1)
    out = model(torch.randn(8, 1, 28, 28), torch.randn(8, 1, 28, 28))
    out.loss.backward()
    opt.step()
    assert all(not p.requires_grad and p.grad is None for p in model.encoder_k.parameters())
    assert all(p.grad is not None for p in model.encoder_q.parameters())
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert not in_opt & {id(p) for p in model.encoder_k.parameters()}


def test_forward_updates_key_encoder_before_keys_and_enqueues():
    model = _moco(m=0.5)
    _perturb(model)
    expected_k = [0.5 * k + 0.5 * q for k, q in zip(model.encoder_k.parameters(), model.encoder_q.parameters())]
    im = torch.randn(8, 1, 28, 28)
    out = model(im, im)
    for e, k in zip(expected_k, model.encoder_k.parameters()):
        torch.testing.assert_close(k, e)
    assert out.correct.shape == (8,) and out.correct.dtype == torch.bool
    assert torch.equal(model.queue.keys[:8], out.keys) and int(model.queue.ptr) == 8 and int(model.step) == 1
    assert torch.allclose(out.keys.norm(dim=1), torch.ones(8))


def test_info_nce_matches_direct_log_softmax():
    l_pos = torch.tensor([[0.9], [0.1], [-0.3]])
    l_neg = torch.tensor([[0.2, -0.5, 0.1, 0.0], [0.8, 0.3, -0.1, 0.4], [0.0, 0.0, 0.5, -0.9]])
    tau = 0.07
    loss, logits = info_nce(l_pos, l_neg, tau)
    direct = []
    for i in range(3):
        row = torch.cat([l_pos[i], l_neg[i]]) / tau
        direct.append(-(row[0] - torch.logsumexp(row, 0)))
    torch.testing.assert_close(loss, torch.stack(direct).mean())
    assert logits.shape == (3, 5)
    # and against the closed form for one row: -log(e^{a/τ} / Σ e^{x/τ})
    row0 = torch.tensor([0.9, 0.2, -0.5, 0.1, 0.0]) / tau
    assert float(-F.log_softmax(row0, 0)[0]) == pytest.approx(float(direct[0]), abs=1e-6)


@pytest.mark.parametrize("n, k, tau", [(3, 4, 0.07), (64, 4096, 0.2)])
def test_fused_queue_loss_equals_info_nce_with_its_gradient(n, k, tau):
    g = torch.Generator().manual_seed(0)
    keys = F.normalize(torch.randn(k, 16, generator=g), dim=1)
    q0 = F.normalize(torch.randn(n, 16, generator=g), dim=1)
    k_pos = F.normalize(torch.randn(n, 16, generator=g), dim=1)
    ours, theirs = q0.clone().requires_grad_(), q0.clone().requires_grad_()
    loss, correct = queue_info_nce(ours, (ours * k_pos).sum(1, keepdim=True), keys, tau)
    ref, logits = info_nce((theirs * k_pos).sum(1, keepdim=True), theirs @ keys.T, tau)
    (2.5 * loss).backward()  # the incoming gradient scales what the forward pass prepared
    (2.5 * ref).backward()
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(correct, logits.argmax(dim=1) == 0)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5)  # float rounding at 1/τ ≈ 14


def test_fused_queue_loss_keeps_its_gradient_when_the_queue_is_overwritten():
    keys = F.normalize(torch.randn(32, 8), dim=1)
    q = F.normalize(torch.randn(4, 8), dim=1).requires_grad_()
    l_pos = torch.full((4, 1), 0.5)
    loss, _ = queue_info_nce(q, l_pos, keys, 0.2)
    ref, _ = info_nce(l_pos, q @ keys.clone().T, 0.2)
    expected, = torch.autograd.grad(ref, q)
    keys.fill_(0.0)  # enqueue overwrites slots in place before backward
    loss.backward()
    torch.testing.assert_close(q.grad, expected)


def test_fused_queue_loss_counts_a_tie_as_correct():
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    l_pos = torch.tensor([[1.0], [0.5]])  # query 0 ties its best negative; query 1 loses to it
    _, correct = queue_info_nce(q, l_pos, keys, 0.2)
    assert correct.tolist() == [True, False]


@pytest.mark.parametrize("m, tau", [(1.0, 0.2), (-0.1, 0.2), (0.9, 0.0)])
def test_bad_hyperparameters(m, tau):
    enc = build_encoder("convnet", 1, width=4, dim=8)
    with pytest.raises(ValueError, match="moco"):
        MoCo(enc, KeyQueue(32, 8, 8), m=m, tau=tau)
