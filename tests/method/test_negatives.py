"""Memory bank, in-batch and batch-keys negatives (negative_sources.py, moco.py) on hand-made tensors, and NT-Xent
and the batch-keys control on two gloo ranks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from gloo_launch import launch

from mocolab.method.collectives import gather_with_grad
from mocolab.method.losses import nt_xent
from mocolab.method.negative_sources import MemoryBank

TAU = 0.5


def _bank(entries: torch.Tensor, k: int = 3, a: float = 0.5) -> MemoryBank:
    bank = MemoryBank(entries.shape[0], entries.shape[1], k, a)
    bank.entries.copy_(entries)
    return bank


def test_memory_bank_scores_the_own_entry_as_positive_and_the_drawn_entries_as_negatives():
    entries = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.6, 0.8], [0.8, -0.6]]), dim=1)
    bank = _bank(entries)
    q = F.normalize(torch.tensor([[1.0, 1.0], [1.0, -2.0]]), dim=1)
    index, neg = torch.tensor([3, 4]), torch.tensor([0, 2, 1])
    loss, correct = bank.contrast(q, index, TAU, negatives=neg)
    want = []
    for i in range(2):
        pos = float(q[i] @ entries[index[i]]) / TAU
        negs = [float(q[i] @ entries[j]) / TAU for j in neg.tolist()]
        want.append(-pos + math.log(math.exp(pos) + sum(math.exp(n) for n in negs)))
    assert float(loss) == pytest.approx(sum(want) / 2, rel=1e-6)
    assert correct.tolist() == [True, True]


def test_an_image_is_never_its_own_negative():
    entries = F.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)), dim=1)
    bank = _bank(entries)
    q = F.normalize(torch.randn(2, 4, generator=torch.Generator().manual_seed(1)), dim=1)
    index = torch.tensor([1, 5])
    with_own, _ = bank.contrast(q, index, TAU, negatives=torch.tensor([0, 1, 2, 5]))  # 1 and 5 are the queries'
    # query 0 (image 1) keeps negatives 0, 2, 5; query 1 (image 5) keeps 0, 1, 2
    per_query = []
    for i, keep in ((0, [0, 2, 5]), (1, [0, 1, 2])):
        logits = torch.cat([(q[i] @ entries[index[i]]).view(1), q[i] @ entries[keep].T]) / TAU
        per_query.append(-torch.log_softmax(logits, 0)[0])
    assert float(with_own) == pytest.approx(float(sum(per_query) / 2), rel=1e-6)


def test_memory_bank_update_moves_the_batch_entries_by_the_proximal_rule_and_no_other():
    entries = F.normalize(torch.randn(5, 3, generator=torch.Generator().manual_seed(2)), dim=1)
    bank = _bank(entries.clone(), a=0.25)
    q = F.normalize(torch.randn(2, 3, generator=torch.Generator().manual_seed(3)), dim=1)
    bank.update(q, torch.tensor([4, 0]), step=7)
    assert torch.allclose(bank.entries[4], F.normalize(0.25 * entries[4] + 0.75 * q[0], dim=0))
    assert torch.allclose(bank.entries[0], F.normalize(0.25 * entries[0] + 0.75 * q[1], dim=0))
    assert torch.equal(bank.entries[1:4], entries[1:4])
    assert bank.write_step.tolist() == [7, -1, -1, -1, 7]
    assert bank.ages(9).tolist() == [2.0, 2.0]  # written entries only: the random init is no negative's age


@pytest.mark.parametrize("size, k, a, refused", [
    (2, 1, 0.0, None), (2, 1, 0.999, None),  # the smallest bank, one negative, the momentum's both ends
    (1, 1, 0.5, r"^memory bank: 1 entries; it needs the training set \(>= 2 images\)$"),
    (2, 0, 0.5, r"^bank.negatives: 0 must be >= 1$"),
    (2, 1, 1.0, r"^bank.momentum: 1.0 is out of range; allowed \[0, 1\)$"), (2, 1, -0.1, r"^bank.momentum: -0.1 ")])
def test_a_memory_bank_takes_its_whole_range_and_names_what_is_outside(size, k, a, refused):
    if refused:
        with pytest.raises(ValueError, match=refused):
            MemoryBank(size, 4, k, a)
        return
    bank = MemoryBank(size, 4, k, a)
    # random unit entries, none written yet (their age is no negative's), whole write steps
    torch.testing.assert_close(bank.entries.norm(dim=1), torch.ones(size))
    assert bank.write_step.dtype == torch.long and bank.write_step.tolist() == [-1] * size


def test_memory_bank_draws_the_same_negatives_on_every_replica_and_after_a_resume():
    a, b = MemoryBank(100, 4, 8, seed=1), MemoryBank(100, 4, 8, seed=1)
    assert torch.equal(a.sample(), b.sample())
    a.sample()
    c = MemoryBank(100, 4, 8, seed=1)
    c.load_state_dict(a.state_dict())
    assert torch.equal(a.sample(), c.sample())
    assert not torch.equal(MemoryBank(100, 4, 8, seed=2).sample(), MemoryBank(100, 4, 8, seed=1).sample())
    assert torch.equal(MemoryBank(100, 4, 8).sample(), MemoryBank(100, 4, 8, seed=0).sample())  # seed 0 unless told


def _bank_model(dtype: torch.dtype | None = None):
    from mocolab.method.negative_sources import MemoryBankContrast
    from mocolab.models.backbones import build_encoder

    torch.manual_seed(0)
    return MemoryBankContrast(build_encoder("convnet", 1, width=4, head="mlp", dim=8), MemoryBank(20, 8, 5, 0.5),
                              tau=TAU, encoder_dtype=dtype)


def test_memory_bank_forward_scores_the_encoder_s_unit_features_then_writes_them():
    """moco.negatives=memory_bank: one view through the encoder, each row normalised, the bank's NCE of it
    (the negatives drawn as the bank draws them), then those features written into the batch's entries."""
    model = _bank_model()
    x = torch.randn(4, 1, 12, 12, generator=torch.Generator().manual_seed(5))
    index = torch.tensor([3, 7, 0, 19])
    before = MemoryBank(20, 8, 5, 0.5)
    before.load_state_dict(model.bank.state_dict())  # its entries and its sampler's state
    out = model(x, x.flip(-1), index)
    with torch.no_grad():
        q = F.normalize(model.encoder_q(x), dim=1)
        expected, correct = before.contrast(q, index, TAU)
    torch.testing.assert_close(out.loss.detach(), expected)
    assert torch.equal(out.correct, correct) and torch.equal(out.written, index) and int(model.step) == 1
    torch.testing.assert_close(out.keys, q)
    before.update(q, index, step=0)
    torch.testing.assert_close(model.bank.entries, before.entries)
    assert model.bank.write_step[index].tolist() == [0] * 4
    with pytest.raises(ValueError, match=r"^moco.negatives=memory_bank needs each image's index in the training "
                                         r"set$"):
        model(x, x)


def test_memory_bank_forward_runs_its_encoder_in_the_run_s_precision():
    model = _bank_model(torch.bfloat16)
    seen = []
    model.encoder_q.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    out = model(torch.randn(4, 1, 12, 12), torch.randn(4, 1, 12, 12), torch.arange(4))
    assert seen == [torch.bfloat16] and out.keys.dtype == torch.float32  # scored in float32 all the same


def _nt_xent_direct(z1: torch.Tensor, z2: torch.Tensor, tau: float) -> torch.Tensor:
    """NT-Xent written out: every one of the 2N views against the other 2N − 1, the positive its pair."""
    z = torch.cat([z1, z2])
    n = z1.shape[0]
    total = 0.0
    for i in range(2 * n):
        pair = (i + n) % (2 * n)
        others = [j for j in range(2 * n) if j != i]
        logits = torch.stack([z[i] @ z[j] for j in others]) / tau
        total = total - torch.log_softmax(logits, 0)[others.index(pair)]
    return total / (2 * n)


def _pairs(n: int, dim: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, dim, generator=g), dim=1), F.normalize(torch.randn(n, dim, generator=g), dim=1)


def test_nt_xent_equals_the_direct_computation_on_one_process():
    z1, z2 = _pairs(6)
    loss, correct = nt_xent(z1, z2, TAU)
    assert float(loss) == pytest.approx(float(_nt_xent_direct(z1, z2, TAU)), rel=1e-6)
    assert correct.shape == (12,)
    # identical views: each view's pair is itself a copy, so every query finds it
    _, correct = nt_xent(z1, z1.clone(), TAU)
    assert bool(correct.all())


def _nt_xent_rank(rank: int, world: int, n: int) -> dict:
    z1, z2 = _pairs(n * world)
    mine = slice(rank * n, (rank + 1) * n)
    a, b = z1[mine].clone().requires_grad_(), z2[mine].clone().requires_grad_()
    loss, correct = nt_xent(a, b, TAU, rank=rank, gather=gather_with_grad)
    loss.backward()
    return {"loss": loss.detach(), "grad1": a.grad, "grad2": b.grad, "correct": correct}


def test_nt_xent_on_two_gloo_ranks_equals_one_process_over_the_global_batch(tmp_path):
    """Each rank's loss is the mean over its 2B queries against all 2·B·W views; the mean over ranks is the
    global loss, and each rank's gradient (back through the gather) is W × the global loss's gradient for its
    views, which DDP's average over ranks turns into the global gradient."""
    n, world = 3, 2
    ranks = launch(_nt_xent_rank, world, tmp_path, n)
    z1, z2 = _pairs(n * world)
    z1, z2 = z1.clone().requires_grad_(), z2.clone().requires_grad_()
    full = _nt_xent_direct(z1, z2, TAU)
    full.backward()
    assert sum(float(r["loss"]) for r in ranks) / world == pytest.approx(float(full.detach()), rel=1e-5)
    for rank, r in enumerate(ranks):
        mine = slice(rank * n, (rank + 1) * n)
        assert torch.allclose(r["grad1"] / world, z1.grad[mine], atol=1e-6)
        assert torch.allclose(r["grad2"] / world, z2.grad[mine], atol=1e-6)


def _trainer_rank(rank: int, world: int, over: dict) -> dict:
    """Three steps of the real Trainer under DDP on gloo with a source of negatives other than the FIFO queue."""
    from mocolab.config import build_config
    from mocolab.training.trainer import Trainer

    cfg = build_config("smoke", {"run.num_workers": world, "data.subset": 512, "queue.size": 256,
                                 "optim.batch_size": 64, "model.width": 8, "eval.drift_probes": 64, **over})
    tr = Trainer(cfg, device=torch.device("cpu"))
    batches = tr.data.epoch_indexed(tr.epoch_order(0), tr.batch, rank, world, start_step=0)
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(tr.rng_state)
        losses = [tr.train_step(*next(batches), tr.schedule.momentum(tr.step)).loss for _ in range(3)]
    store = tr.model.dictionary.keys if tr.model.dictionary is not None else None  # the bank's or queue's
    out = {"losses": torch.tensor(losses),
           "weights": torch.cat([p.detach().flatten() for p in tr.encoder.parameters()])}
    if store is not None:
        probes = tr.drift.probes
        out.update(store=store.clone(), probe_ref=probes.ref, probe_image=probes.image, probe_step=probes.write_step)
    return out


@pytest.mark.slow
@pytest.mark.skipif(__import__("mocolab.data.sets", fromlist=["x"]).fashion_mnist_dir() is None,
                    reason="Fashion-MNIST not installed (make data)")
@pytest.mark.parametrize("over", [{"moco.negatives": "memory_bank", "moco.bn": "split"},
                                  {"queue.policy": "random"}, {"moco.negatives": "in_batch", "moco.bn": "sync"},
                                  {"queue.layout": "sharded"}],
                         ids=["memory_bank", "random_queue", "in_batch_sync_bn", "sharded_queue"])
def test_two_ranks_keep_one_dictionary_and_one_set_of_probes(tmp_path, over):
    """On two gloo ranks every rank ends with the same weights, the same bank or random queue (every rank
    writes the global batch, at the same drawn slots) and the same probes, whose images came from both ranks.
    A sharded queue's ranks each follow probes in their own shard, written from their own images."""
    res = launch(_trainer_rank, 2, tmp_path, over)
    assert all(bool(torch.isfinite(r["losses"]).all()) for r in res)
    assert torch.equal(res[0]["weights"], res[1]["weights"])
    # only in-batch negatives keep no dictionary: a bank or queue gone missing is a failure, not a reason to
    # leave the dictionary's checks out
    keeps_one = over.get("moco.negatives") != "in_batch"
    assert [("store" in r) for r in res] == [keeps_one] * 2, f"a dictionary expected: {keeps_one}, {over}"
    if over.get("queue.layout") == "sharded":
        assert not torch.equal(res[0]["store"], res[1]["store"])  # K/W keys each, their own
        for r in res:
            written = r["probe_step"] >= 0
            assert bool(written.any()) and bool((r["probe_ref"][written].norm(dim=1) > 0.99).all())
    elif keeps_one:
        for key in ("store", "probe_ref", "probe_image", "probe_step"):
            assert torch.equal(res[0][key], res[1][key]), key
        written = res[0]["probe_step"] >= 0
        assert bool(written.any()) and bool((res[0]["probe_ref"][written].norm(dim=1) > 0.99).all())


# ------------------------------------------------------------------------- the batch-keys control

def test_batch_keys_is_v2_without_its_queue_a_symmetric_infonce_against_the_batch_s_keys():
    """moco.negatives=batch_keys: v2's encoder (no predictor) and EMA key encoder, both views queries, each
    against the other view's keys of the batch (own key positive), the two directions' InfoNCE averaged."""
    from mocolab.config import build_config
    from mocolab.method.moco import BatchKeysMoCo
    from mocolab.training.trainer import Trainer

    cfg = build_config("smoke", {"data.name": "synthetic", "data.subset": 512, "optim.batch_size": 32,
                                 "moco.negatives": "batch_keys", "moco.bn": "plain", "optim.max_steps": 3,
                                 "eval.knn_every": 0})
    tr = Trainer(cfg)
    model = tr.model
    assert isinstance(model, BatchKeysMoCo) and model.queue is None and model.dictionary is None
    assert not hasattr(model.encoder_q, "predictor") or model.encoder_q.predictor is None
    torch.manual_seed(0)
    x1, x2 = torch.randn(2, 16, 1, 28, 28).unbind(0)
    out = model(x1, x2)
    # the same step by hand, from the encoders the model has after its EMA update
    with torch.no_grad():
        q1, q2 = (F.normalize(model.encoder_q(x), dim=1) for x in (x1, x2))
        k1, k2 = (F.normalize(model.encoder_k(x), dim=1) for x in (x1, x2))
        own = torch.arange(16)
        expected = (F.cross_entropy(q1 @ k2.T / model.tau, own) + F.cross_entropy(q2 @ k1.T / model.tau, own)) / 2
    torch.testing.assert_close(out.loss.detach(), expected, rtol=1e-5, atol=1e-5)
    assert out.correct.shape == (32,)
    assert model.uniform_loss(32) == pytest.approx(math.log(32))
    before = [p.clone() for p in model.encoder_k.parameters()]
    tr.train_epoch()
    assert tr.step == 3 and all(not p.requires_grad for p in model.encoder_k.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.encoder_k.parameters()))  # the EMA moved it
    with pytest.raises(ValueError, match="moco.negatives=batch_keys is symmetric already"):
        build_config("smoke", {"moco.negatives": "batch_keys", "moco.symmetric": True})


def _batch_keys_model(shuffler=None):
    from mocolab.method.batchnorm import convert_global_bn
    from mocolab.method.moco import BatchKeysMoCo
    from mocolab.models.backbones import build_encoder

    torch.manual_seed(0)  # the same initial weights on every rank; BN over the global batch
    return BatchKeysMoCo(convert_global_bn(build_encoder("convnet", 1, width=4, head="mlp", dim=8)), m=0.9, tau=TAU,
                         shuffler=shuffler)


def _batch_keys_views(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 12, 12, generator=g), torch.randn(n, 1, 12, 12, generator=g)


def _rank_step(rank: int, world: int, build, b: int) -> dict:
    """One step of ``build()``'s model on this rank's slice of the global batch (``build``: a module-level
    function, so the rank processes import it by name)."""
    model = build()
    x1, x2 = _batch_keys_views(b * world)
    mine = slice(rank * b, (rank + 1) * b)
    out = model(x1[mine], x2[mine])
    out.loss.backward()
    return {"loss": float(out.loss), "correct": out.correct,
            "grads": [p.grad.clone() for p in model.encoder_q.parameters()]}


def _ranks_are_one_process(tmp_path, build, b: int = 4, world: int = 2):
    """The mean of the ranks' losses and gradients against one process's step over the concatenated batch;
    returns the ranks' results and that step's output, for what a test checks besides."""
    ranks = launch(_rank_step, world, tmp_path, build, b)
    model = build()
    x1, x2 = _batch_keys_views(b * world)
    out = model(x1, x2)
    out.loss.backward()
    assert sum(r["loss"] for r in ranks) / world == pytest.approx(float(out.loss), rel=1e-5)
    for i, p in enumerate(model.encoder_q.parameters()):
        torch.testing.assert_close(sum(r["grads"][i] for r in ranks) / world, p.grad, atol=1e-5, rtol=1e-4)
    return ranks, out


def test_batch_keys_on_two_gloo_ranks_is_one_process_over_the_whole_batch(tmp_path):
    """Each rank's queries against the global batch's keys, the own image's key (at r·B + i) the positive: the
    mean of the ranks' losses and gradients is the one-process loss of the concatenated batch."""
    b = 4
    ranks, out = _ranks_are_one_process(tmp_path, _batch_keys_model, b)
    both = torch.cat([torch.cat([r["correct"][:b] for r in ranks]), torch.cat([r["correct"][b:] for r in ranks])])
    assert torch.equal(both, out.correct)


def _shuffled_batch_keys_rank(rank: int, world: int, b: int) -> dict:
    from mocolab.method.shuffle import CrossRankShuffle

    x1, x2 = _batch_keys_views(b * world)
    mine = slice(rank * b, (rank + 1) * b)
    out = {}
    for name, shuffler in (("shuffled", CrossRankShuffle(3)), ("in place", None)):
        model = _batch_keys_model(shuffler)
        model.encoder_k.eval()  # BN from running statistics: a key is its image's, whichever batch it rode in
        result = model(x1[mine], x2[mine])
        out[name] = {"loss": float(result.loss), "correct": result.correct}
    return out


def test_batch_keys_with_shuffle_bn_gives_each_query_its_own_image_s_key(tmp_path):
    """moco.bn=shuffle with the batch-keys control: the keys are computed on a batch shuffled across the ranks
    and must come back to their queries. With the key encoder's BN reading running statistics, the shuffle can
    change nothing, so the loss and the pretext accuracy equal the unshuffled step's on every rank."""
    for r in launch(_shuffled_batch_keys_rank, 2, tmp_path, 4):
        assert r["shuffled"]["loss"] == pytest.approx(r["in place"]["loss"], rel=1e-6)
        assert torch.equal(r["shuffled"]["correct"], r["in place"]["correct"])


def _in_batch_model():
    from mocolab.method.batchnorm import convert_global_bn
    from mocolab.method.negative_sources import InBatchContrast
    from mocolab.models.backbones import build_encoder

    torch.manual_seed(0)  # the same initial weights on every rank; BN over the global batch
    return InBatchContrast(convert_global_bn(build_encoder("convnet", 1, width=4, head="mlp", dim=8)), tau=TAU)


def test_in_batch_is_nt_xent_of_the_encoder_s_unit_features():
    """moco.negatives=in_batch: both views through the one encoder in one pass, normalised, and SimCLR's loss."""
    model = _in_batch_model()
    x1, x2 = _batch_keys_views(6)
    out = model(x1, x2)
    with torch.no_grad():
        z = F.normalize(model.encoder_q(torch.cat([x1, x2])), dim=1)
        expected, correct = nt_xent(z[:6], z[6:], TAU)
    torch.testing.assert_close(out.loss.detach(), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(out.correct, correct) and torch.equal(out.keys, z[6:]) and int(model.step) == 1


def test_in_batch_on_two_gloo_ranks_is_one_process_over_the_whole_batch(tmp_path):
    """Every view of the global batch a candidate, the own rank's views at their place in the gathered order:
    the mean of the ranks' losses and gradients is the one-process loss of the concatenated batch."""
    _ranks_are_one_process(tmp_path, _in_batch_model)
