"""``moco.symmetric``: MoCo's queue arm with a symmetric loss, the first control that changes one thing between
the queue arm and the in-batch arm (issue 51).  q1 against k2 and q2 against k1, both against the same queue,
averaged; view 2's keys alone are enqueued, so the queue's writes and ages are the one-way arm's."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_launch import launch
from torch import nn

from mocolab.config import build_config, fingerprint
from mocolab.config.io import list_presets
from mocolab.config.schema import departures
from mocolab.method.key_queue import KeyQueue
from mocolab.method.losses import queue_info_nce
from mocolab.method.moco import MoCo
from mocolab.method.protocol import MethodParts
from mocolab.method.queue_layouts import build_queue, gather_queue_state
from mocolab.method.registry import build_method
from mocolab.method.shuffle import LocalShuffle, NoShuffle, build_shuffler
from mocolab.models.backbones import build_encoder
from mocolab.training.build import encoder_factory

DIM, IN, B, K, TAU, M = 8, 6, 4, 16, 0.2, 0.9


def _tiny() -> nn.Module:
    """A per-sample encoder (no BN): each query and key depends on its own input only."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(IN, 16), nn.Tanh(), nn.Linear(16, DIM))


def _views(step: int, n: int = B, shape: tuple[int, ...] = (IN,)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 + step)
    x = torch.randn(n, *shape, generator=g)
    return x + 0.1 * torch.randn(x.shape, generator=g), x + 0.1 * torch.randn(x.shape, generator=g)


def _convnet_moco(bn: str, symmetric: bool) -> MoCo:
    """A 4-wide convnet on 1×16×16 images; split BN shuffles the keys with a generator of its own."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        enc = build_encoder("convnet", 1, width=4, head="mlp", dim=DIM, bn_groups=2 if bn == "split" else 1)
    shuffler = LocalShuffle(torch.Generator().manual_seed(7)) if bn == "split" else NoShuffle()
    return MoCo(enc, KeyQueue(4 * 2 * B, DIM, 2 * B, torch.Generator().manual_seed(1)), m=M, tau=TAU,
                shuffler=shuffler, symmetric=symmetric)


# ------------------------------------------------------------------------------------------------ the loss

def test_the_loss_is_the_mean_of_the_two_one_way_losses_computed_by_hand():
    model = MoCo(_tiny(), KeyQueue(K, DIM, B, torch.Generator().manual_seed(1)), m=M, tau=TAU, symmetric=True)
    with torch.no_grad():  # f_q away from f_k, so the momentum update shows
        for p in model.encoder_q.parameters():
            p.add_(0.1 * torch.randn_like(p))
    f_q, f_k, queue = copy.deepcopy(model.encoder_q), copy.deepcopy(model.encoder_k), model.queue.keys.clone()
    x1, x2 = _views(0)
    out = model(x1, x2)
    out.loss.backward()

    with torch.no_grad():  # θ_k ← m·θ_k + (1 − m)·θ_q, then the keys of both views
        for p_k, p_q in zip(f_k.parameters(), f_q.parameters()):
            p_k.mul_(M).add_((1 - M) * p_q)
        k1, k2 = F.normalize(f_k(x1), dim=1), F.normalize(f_k(x2), dim=1)
    q1, q2 = F.normalize(f_q(x1), dim=1), F.normalize(f_q(x2), dim=1)
    loss12, c12 = queue_info_nce(q1, (q1 * k2).sum(1, keepdim=True), queue, TAU)  # the definition, unfused
    loss21, c21 = queue_info_nce(q2, (q2 * k1).sum(1, keepdim=True), queue, TAU)  # the same queue
    expected = (loss12 + loss21) / 2
    expected.backward()

    torch.testing.assert_close(out.loss, expected)
    assert torch.equal(out.correct, torch.cat([c12, c21]))
    for p, p_hand in zip(model.encoder_q.parameters(), f_q.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_hand.grad)
    assert all(p.grad is None for p in model.encoder_k.parameters())
    # view 2's keys alone were enqueued: B slots, the oldest, the rest as they were
    torch.testing.assert_close(out.keys, k2)
    torch.testing.assert_close(model.queue.keys[:B], k2)
    assert torch.equal(model.queue.keys[B:], queue[B:])
    assert torch.equal(out.written, torch.arange(B)) and int(model.queue.ptr) == B
    assert model.queue.ages(1).tolist() == [1.0] * B
    assert model.uniform_loss(B) == math.log(1 + K) and model.describe(B) == f"K={K}, symmetric loss"


@pytest.mark.parametrize("bn", ["plain", "split"])
def test_the_loss_is_the_mean_of_the_queue_arm_run_one_way_and_the_other(bn):
    """From one state, the symmetric step's loss is the mean of the one-way arm's on (x1, x2) and on (x2, x1): with
    a BN convnet, and with split BN, whose second key batch is shuffled by the next draw of the same generator."""
    sym = _convnet_moco(bn, symmetric=True).train()
    for step in range(2):
        one, other = copy.deepcopy(sym), copy.deepcopy(sym)
        one.symmetric = other.symmetric = False
        if bn == "split":  # the symmetric step shuffles k2 first, then k1: the other way round draws second
            torch.randperm(2 * B, generator=other.shuffler.generator)
        x1, x2 = _views(step, 2 * B, (1, 16, 16))
        out = sym(x1, x2)
        torch.testing.assert_close(out.loss, (one(x1, x2).loss + other(x2, x1).loss) / 2)
        assert out.correct.shape == (4 * B,)
        out.loss.backward()
        with torch.no_grad():
            for p in sym.encoder_q.parameters():
                p -= 0.5 * p.grad
                p.grad = None


def _algorithm_1(model: MoCo, im_q: torch.Tensor, im_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``MoCo.forward`` as it was before ``moco.symmetric`` existed, inlined."""
    earlier = model.queue.snapshot()
    q = F.normalize(model.encoder_q(im_q).float(), dim=1)
    model.momentum_update()
    k = model.compute_keys(im_k)
    loss, correct = model.queue.contrast(q, (q * k).sum(dim=1, keepdim=True), model.tau, earlier)
    model.queue.enqueue(k, model.step)
    model.step += 1
    return loss, correct


@pytest.mark.parametrize("bn", ["plain", "split"])
def test_symmetric_false_is_the_one_way_arm_bit_for_bit(bn):
    new, old = _convnet_moco(bn, symmetric=False).train(), _convnet_moco(bn, symmetric=False).train()
    assert new.describe(2 * B) == f"K={8 * B}"
    for step in range(3):
        x1, x2 = _views(step, 2 * B, (1, 16, 16))
        out = new(x1, x2)
        loss, correct = _algorithm_1(old, x1, x2)
        assert torch.equal(out.loss, loss) and torch.equal(out.correct, correct)
        for model, value in ((new, out.loss), (old, loss)):
            value.backward()
            with torch.no_grad():
                for p in model.encoder_q.parameters():
                    p -= 0.5 * p.grad
                    p.grad = None
    for (name, a), b in zip(new.state_dict().items(), old.state_dict().values(), strict=True):
        assert name.endswith("_extra_state") or torch.equal(a, b), name


# ------------------------------------------------------------------------------------------------ the config

TINY = {"data.name": "synthetic", "data.synthetic_size": 64, "data.image_size": 16, "model.width": 4,
        "model.dim": 16, "queue.size": 32, "optim.batch_size": 8}


@pytest.mark.parametrize("overrides, message", [
    ({"moco.version": "v3"}, "moco.symmetric: moco.version=v3's loss is symmetric always"),
    ({"moco.negatives": "in_batch"}, "moco.symmetric: moco.negatives=in_batch (NT-Xent) is symmetric already"),
    ({"moco.negatives": "memory_bank"}, "moco.symmetric: not supported with moco.negatives=memory_bank"),
    ({"method.name": "byol"}, "moco.symmetric: applies to MoCo's queue (moco.negatives=queue), and method.name=byol"),
])
def test_every_method_but_the_queue_refuses_it_at_the_door(overrides, message):
    build_config("smoke", {**TINY, **overrides})  # accepted at the default, false
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config("smoke", {**TINY, **overrides, "moco.symmetric": "true"})


def test_the_queue_arm_takes_it_and_builds_a_symmetric_method_that_keeps_the_contract():
    for version in ("v1", "v2"):
        assert build_config("smoke", {**TINY, "moco.version": version, "moco.symmetric": "true"}).moco.symmetric
    cfg = build_config("smoke", {**TINY, "moco.symmetric": True})

    def build(seed: int) -> MoCo:
        torch.manual_seed(seed)
        return build_method(cfg, MethodParts(encoder_factory(cfg, 1, 16, torch.device("cpu")), cfg.train_size, 8))

    a = build(0).train()
    assert a.symmetric and a.key_encoder is not None and a.dictionary is a.queue
    x1, x2 = _views(0, 8, (1, 16, 16))
    out = a(x1, x2, torch.arange(8))
    assert math.isfinite(float(out.loss.detach())) and out.correct.shape == (16,) and out.written.numel() == 8
    out.loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in a.key_encoder.parameters())
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in a.encoder_q.parameters())
    b = build(5).train()
    b.load_state_dict(a.state_dict())
    losses = []
    for method in (a, b):
        torch.manual_seed(3)  # split BN's shuffle draws from the global generator
        losses.append(float(method(*_views(1, 8, (1, 16, 16))).loss.detach()))
    assert losses[0] == losses[1]


def _preset(name: str, **overrides):
    """A preset as shipped; one that reads a folder of images (imagefolder) with a path where it needs one."""
    try:
        return build_config(name, overrides)
    except ValueError as e:
        if "data.root" not in str(e):
            raise
        return build_config(name, {"data.root": "/imagenet", **overrides})


@pytest.mark.parametrize("preset", list_presets())
def test_at_its_default_the_field_leaves_every_run_name_and_fingerprint_as_it_was(preset):
    """``departures`` leaves a field at its default out of the digests (tests/config/test_config.py pins two of
    them, computed before the field existed); true names another run of the queue arm."""
    cfg = _preset(preset)
    assert "moco.symmetric" in cfg.flatten() and "moco.symmetric" not in departures(cfg.flatten())
    if not cfg.uses_queue:  # v3 presets: refused (test above)
        return
    sym = _preset(preset, **{"moco.symmetric": True})
    assert departures(sym.flatten())["moco.symmetric"] is True
    assert sym.run_name != cfg.run_name and fingerprint(sym) != fingerprint(cfg)


# ------------------------------------------------------------------------------------------------ two ranks

def _step_sgd(model: MoCo, loss: torch.Tensor, world: int) -> None:
    loss.backward()
    with torch.no_grad():
        for p in model.encoder_q.parameters():  # DDP: the mean of the ranks' gradients
            dist.all_reduce(p.grad)
            p -= 0.1 * p.grad / world
            p.grad = None


def _symmetric_shuffle_bn_rank(rank: int, world: int, b: int) -> dict:
    """Three symmetric steps with shuffle BN per queue layout; at each, the one-way arm from the same state on
    (x1, x2) and on (x2, x1), the latter's cross-rank shuffle one draw on (the symmetric step's second)."""
    out = {}
    for layout in ("replicated", "sharded"):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            encoder = build_encoder("convnet", 1, width=4, head="mlp", dim=DIM)
        queue = build_queue(layout, 4 * b * world, DIM, b, generator=torch.Generator().manual_seed(1))
        model = MoCo(encoder, queue, m=M, tau=TAU, shuffler=build_shuffler("shuffle", 3), symmetric=True).train()
        losses, halves, keys = [], [], []
        for step in range(3):
            one, other = copy.deepcopy(model), copy.deepcopy(model)
            one.symmetric = other.symmetric = False
            torch.randperm(b * world, generator=other.shuffler.generator)
            x1, x2 = (x[rank * b:(rank + 1) * b] for x in _views(step, b * world, (1, 8, 8)))
            res = model(x1, x2)
            halves.append((one(x1, x2).loss.detach() + other(x2, x1).loss.detach()) / 2)
            losses.append(res.loss.detach())
            keys.append(res.keys)
            _step_sgd(model, res.loss, world)
        gathered = [torch.empty(3 * b, DIM) for _ in range(world)]
        dist.all_gather(gathered, torch.cat(keys))  # every rank's view-2 keys of every step
        written = torch.cat([g.view(3, b, DIM) for g in gathered], dim=1).view(3 * b * world, DIM)
        out[layout] = {"loss": torch.stack(losses), "halves": torch.stack(halves),
                       "queue": gather_queue_state(model.queue)[0], "written": written,
                       "weights": torch.cat([p.detach().flatten() for p in model.encoder_q.parameters()])}
    return out


def test_two_ranks_with_shuffle_bn_and_either_queue_layout(tmp_path):
    world, b = 2, 4
    res = launch(_symmetric_shuffle_bn_rank, world, tmp_path, b)
    for r in range(world):
        rep, sha = res[r]["replicated"], res[r]["sharded"]
        torch.testing.assert_close(rep["loss"], rep["halves"])
        torch.testing.assert_close(sha["loss"], sha["halves"])
        torch.testing.assert_close(sha["loss"], rep["loss"], atol=1e-5, rtol=1e-5)
        assert torch.isfinite(rep["loss"]).all()
        # the FIFO's newest 3·B·W keys are the steps' view-2 keys, in order; the oldest B·W still the random init
        g = b * world
        torch.testing.assert_close(rep["queue"][g:], rep["written"], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(sha["queue"], rep["queue"], atol=1e-6, rtol=1e-5)
    assert torch.equal(res[0]["replicated"]["weights"], res[1]["replicated"]["weights"])


def _symmetric_trainer_rank(rank: int, world: int) -> dict:
    """The real Trainer (DDP over f_q, two forwards a step) with moco.symmetric and shuffle BN on gloo."""
    from mocolab.training.trainer import Trainer

    cfg = build_config("smoke", {"moco.symmetric": True, "moco.bn": "shuffle", "run.num_workers": world,
                                 "data.name": "synthetic", "data.subset": 512, "queue.size": 256,
                                 "optim.batch_size": 32, "model.width": 4, "eval.drift_probes": 16})
    tr = Trainer(cfg, device=torch.device("cpu"))
    assert isinstance(tr.model.encoder_q, nn.parallel.DistributedDataParallel)
    batches = tr.data.epoch_indexed(tr.epoch_order(0), tr.batch, rank, world, start_step=0)
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(tr.rng_state)
        losses = [tr.train_step(*next(batches), tr.schedule.momentum(tr.step)).loss for _ in range(3)]
    return {"losses": losses, "queue": tr.model.queue.keys.clone(), "ptr": int(tr.model.queue.ptr),
            "weights": torch.cat([p.detach().flatten() for p in tr.encoder.parameters()])}


@pytest.mark.slow
def test_the_trainer_runs_it_on_two_gloo_ranks_with_shuffle_bn(tmp_path):
    res = launch(_symmetric_trainer_rank, 2, tmp_path)
    assert all(math.isfinite(loss) for r in res for loss in r["losses"])
    assert res[0]["ptr"] == res[1]["ptr"] == 3 * 32  # B·W keys a step, as the one-way arm writes
    assert torch.equal(res[0]["weights"], res[1]["weights"])
    assert torch.equal(res[0]["queue"], res[1]["queue"])
