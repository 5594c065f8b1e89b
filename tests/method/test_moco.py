import pytest
import torch

from mocolab.models.backbones import build_encoder
from mocolab.method.moco import MoCo, momentum_update
from mocolab.method.shuffle import LocalShuffle
from mocolab.method.key_queue import KeyQueue


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


@pytest.mark.parametrize("m, tau", [(1.0, 0.2), (-0.1, 0.2), (0.9, 0.0)])
def test_bad_hyperparameters(m, tau):
    enc = build_encoder("convnet", 1, width=4, dim=8)
    with pytest.raises(ValueError, match="moco"):
        MoCo(enc, KeyQueue(32, 8, 8), m=m, tau=tau)


def test_momentum_one_leaves_the_key_encoder_and_a_momentum_outside_0_1_is_refused():
    """m = 1 is where a cosine momentum schedule ends (MoCo v3): the key encoder stays as it is. Outside
    [0, 1] the update is refused, naming m."""
    model = _moco(m=0.9)
    _perturb(model)
    before = [p.clone() for p in model.encoder_k.parameters()]
    momentum_update(model.encoder_k, model.encoder_q, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, model.encoder_k.parameters()))
    for m in (1.5, -0.5):
        with pytest.raises(ValueError, match=rf"^momentum_update: m={m} is out of range; allowed \[0, 1\]"):
            momentum_update(model.encoder_k, model.encoder_q, m)


def test_a_key_encoder_parameter_the_query_encoder_lacks_is_named():
    model = _moco()
    model.encoder_k.register_parameter("extra", torch.nn.Parameter(torch.zeros(1), requires_grad=False))
    with pytest.raises(ValueError, match=r"^momentum_update: the query encoder has no parameter 'extra' "
                                         r"\(1 of the key encoder's \d+ are missing\)"):
        model.momentum_update()


def test_the_queue_records_which_training_image_each_written_key_came_from():
    """The drift probes follow a key back to its image: the forward hands the batch's indices to the queue."""
    model = _moco()
    index = torch.tensor([5, 3, 9, 1, 0, 7, 2, 4])
    out = model(torch.randn(8, 1, 28, 28), torch.randn(8, 1, 28, 28), index)
    assert torch.equal(model.queue.source[out.written], index)


def test_the_constructors_defaults_are_the_presets():
    """What a user of the library gets without a config (docs/api.md): MoCo v2's m = 0.999 and τ = 0.2, the
    paper's; MoCo v3's m = 0.99 and τ = 0.2."""
    from mocolab.method.moco import MoCoV3

    enc = build_encoder("convnet", 1, width=4, dim=8)
    v2 = MoCo(enc, KeyQueue(32, 8, 8))
    v3 = MoCoV3(build_encoder("convnet", 1, width=4, dim=8, predictor=True))
    assert (v2.m, v2.tau, v3.m, v3.tau) == (0.999, 0.2, 0.99, 0.2)
    from mocolab.method.negative_sources import InBatchContrast, MemoryBank, MemoryBankContrast

    # the other sources of negatives: the same τ
    assert InBatchContrast(enc).tau == MemoryBankContrast(enc, MemoryBank(4, 8, 2)).tau == 0.2
