"""Distributed MoCo pieces on real gloo process groups (W spawned CPU processes, no mocks).

Each multi-process test runs a module-level function on every rank through
``launch`` (tests/gloo_launch.py); ranks write their results to tmp_path and
report success or their traceback through a queue, so a failing rank fails the
test.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_launch import launch
from torch import nn

from mocolab.method.shuffle import CrossRankShuffle, build_shuffler
from mocolab.method.queue_layouts import ReplicatedKeyQueue, ShardedKeyQueue, build_queue, gather_queue_state
from mocolab.method.collectives import rank_and_world
from mocolab.method.shuffle import LocalShuffle, NoShuffle
from mocolab.method.key_queue import KeyQueue

# --------------------------------------------------------------------------------------------- layouts

DIM, IN, TAU, LR, STEPS, QUEUE_SEED = 8, 6, 0.2, 0.5, 7, 1


def _make_model() -> nn.Module:
    """A tiny per-sample encoder (no BN), identical wherever it is built."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(IN, 16), nn.Tanh(), nn.Linear(16, DIM))


def _global_batch(step: int, g: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global query and key inputs of a step: G×IN each, the same on every rank."""
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(g, IN, generator=gen)
    return x + 0.1 * torch.randn(g, IN, generator=gen), x + 0.1 * torch.randn(g, IN, generator=gen)


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def _train_layout(rank: int, world: int, layout: str, b: int, k: int) -> dict:
    """STEPS SGD steps of one layout; gradients averaged across ranks as DDP would."""
    model, key_encoder = _make_model(), _make_model()
    queue = build_queue(layout, k, DIM, b, generator=torch.Generator().manual_seed(QUEUE_SEED))
    out: dict = {"loss": [], "grad_local": [], "grad_avg": [], "correct": [], "keys": [], "write_step": [],
                 "raw_keys": [], "raw_write_step": [], "queue_numel": queue.keys.numel()}
    for step in range(STEPS):
        xq, xk = (x[rank * b:(rank + 1) * b] for x in _global_batch(step, b * world))
        q = F.normalize(model(xq), dim=1)  # B×C
        with torch.no_grad():
            kk = F.normalize(key_encoder(xk), dim=1)  # B×C
        l_pos = (q * kk).sum(1, keepdim=True)
        loss, correct = queue.contrast(q, l_pos, TAU)
        model.zero_grad()
        loss.backward()
        out["grad_local"].append(_grads(model))
        for p in model.parameters():  # DDP: all_reduce then / W
            dist.all_reduce(p.grad)
            p.grad /= world
        out["grad_avg"].append(_grads(model))
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
        queue.enqueue(kk, step)
        out["loss"].append(loss.detach())
        out["correct"].append(correct)
        keys, ws = gather_queue_state(queue)
        out["keys"].append(keys)
        out["write_step"].append(ws)
        raw = [torch.empty_like(queue.keys) for _ in range(world)]  # the shards as they are, for the set check
        dist.all_gather(raw, queue.keys)
        raw_ws = [torch.empty_like(queue.write_step) for _ in range(world)]
        dist.all_gather(raw_ws, queue.write_step)
        out["raw_keys"].append(torch.cat(raw))
        out["raw_write_step"].append(torch.cat(raw_ws))
    return out


def _both_layouts(rank: int, world: int, b: int, k: int) -> dict:
    assert rank_and_world() == (rank, world)
    return {layout: _train_layout(rank, world, layout, b, k) for layout in ("replicated", "sharded")}


def _random_replicated_queue(rank: int, world: int, seed: int) -> dict:
    q = build_queue("replicated", 16, DIM, 2, policy="random", seed=seed)
    try:
        build_queue("sharded", 16, DIM, 2, policy="random", seed=seed)
        refused = None
    except ValueError as e:
        refused = str(e)
    return {"type": type(q).__name__, "policy": q.policy, "world": q.world_size,
            "draws": q.slot_generator.initial_seed(), "sharded": refused}


def _ground_truth(g: int, k: int) -> dict:
    """One process, one KeyQueue, the whole global batch: what both layouts must reproduce."""
    model, key_encoder = _make_model(), _make_model()
    queue = KeyQueue(k, DIM, g, generator=torch.Generator().manual_seed(QUEUE_SEED))
    out: dict = {"loss": [], "grad": [], "correct": [], "keys": []}
    for step in range(STEPS):
        xq, xk = _global_batch(step, g)
        q = F.normalize(model(xq), dim=1)
        with torch.no_grad():
            kk = F.normalize(key_encoder(xk), dim=1)
        loss, correct = queue.contrast(q, (q * kk).sum(1, keepdim=True), TAU)
        model.zero_grad()
        loss.backward()
        out["grad"].append(_grads(model))
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
        queue.enqueue(kk, step)
        out["loss"].append(loss.detach())
        out["correct"].append(correct)
        out["keys"].append(gather_queue_state(queue))
    return out


def _row_set(x: torch.Tensor) -> list[tuple[float, ...]]:
    return sorted(tuple(r) for r in x.tolist())


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_sharded_matches_replicated_and_single_process(world, tmp_path):
    b = 3
    g = b * world
    k = 3 * g  # wraps after 3 steps: STEPS = 7 goes round twice
    res = launch(_both_layouts, world, tmp_path, b, k)
    gt = _ground_truth(g, k)
    rep = [r["replicated"] for r in res]
    sh = [r["sharded"] for r in res]
    assert sh[0]["queue_numel"] * world == rep[0]["queue_numel"] == k * DIM  # O(K/W) memory per rank
    for step in range(STEPS):
        ctx = f"step {step}"
        # loss: per rank equal, and the rank average equals the global loss
        for r in range(world):
            torch.testing.assert_close(sh[r]["loss"][step], rep[r]["loss"][step], atol=1e-5, rtol=1e-5, msg=ctx)
        mean_loss = torch.stack([sh[r]["loss"][step] for r in range(world)]).mean()
        torch.testing.assert_close(mean_loss, gt["loss"][step], atol=1e-5, rtol=1e-5, msg=ctx)
        # gradients: per rank before averaging (the stronger property), and DDP's average
        for r in range(world):
            for a, c in zip(sh[r]["grad_local"][step], rep[r]["grad_local"][step]):
                torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-4, msg=ctx)
            for a, c, t in zip(sh[r]["grad_avg"][step], rep[r]["grad_avg"][step], gt["grad"][step]):
                torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-4, msg=ctx)
                torch.testing.assert_close(a, t, atol=1e-5, rtol=1e-4, msg=ctx)
        # pretext accuracy agrees query by query
        sh_correct = torch.cat([sh[r]["correct"][step] for r in range(world)])
        assert torch.equal(sh_correct, torch.cat([rep[r]["correct"][step] for r in range(world)])), ctx
        assert torch.equal(sh_correct, gt["correct"][step]), ctx
        # queue contents: union of shards == replicated keys, as row sets and in FIFO order, with write steps
        rep_keys = rep[0]["raw_keys"][step][:k]  # rank 0's full replicated queue
        assert _row_set(sh[0]["raw_keys"][step]) == _row_set(rep_keys), ctx
        assert sorted(sh[0]["raw_write_step"][step].tolist()) == sorted(rep[0]["raw_write_step"][step][:k].tolist())
        for r in range(world):
            assert torch.equal(sh[r]["keys"][step], rep[r]["keys"][step]), ctx
            assert torch.equal(sh[r]["write_step"][step], rep[r]["write_step"][step]), ctx
            assert torch.equal(rep[r]["keys"][step], rep[0]["keys"][step]), ctx  # replicas agree
        gt_keys, gt_ws = gt["keys"][step]
        torch.testing.assert_close(sh[0]["keys"][step], gt_keys, atol=1e-6, rtol=1e-5, msg=ctx)
        assert torch.equal(sh[0]["write_step"][step], gt_ws), ctx
    # the ring did wrap: after the last step the oldest key is from step STEPS - K/G
    assert sh[0]["write_step"][-1].min().item() == STEPS - k // g


# --------------------------------------------------------------------------------------------- shuffle

def _shuffle_worker(rank: int, world: int, b: int) -> dict:
    torch.manual_seed(0)
    f = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5)).eval()  # per-sample in eval mode
    with torch.no_grad():
        f[1].running_mean.uniform_(-1, 1)
        f[1].running_var.uniform_(0.5, 2)
    ids = torch.arange(rank * b, (rank + 1) * b, dtype=torch.float32)
    x = torch.cat([ids[:, None], torch.randn(b, 3, generator=torch.Generator().manual_seed(rank))], 1)  # B×4
    out = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        sh = CrossRankShuffle(seed)
        xs, restore = sh.shuffle(x)
        with torch.no_grad():
            k = sh.unshuffle(f(xs), restore)
            direct = f(x)
        # the reference's way: gather the whole global batch, take this rank's slice of one permutation
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x)
        perm = torch.randperm(b * world, generator=torch.Generator().manual_seed(seed))
        gathered = torch.cat(parts)[perm.view(world, b)[rank]]
        out[name] = {"shuffled_ids": xs[:, 0].long(), "unshuffled": k, "direct": direct, "shuffled": xs,
                     "gathered": gathered}
    return out


def test_cross_rank_shuffle_roundtrip_and_mixing(tmp_path):
    world, b = 2, 8
    res = launch(_shuffle_worker, world, tmp_path, b)
    for r in range(world):
        for name in "abc":
            torch.testing.assert_close(res[r][name]["unshuffled"], res[r][name]["direct"], atol=1e-6, rtol=1e-5)
            # all_to_all moves 1/W of what a gather moves, and gives the gathered slice, to the bit
            assert torch.equal(res[r][name]["shuffled"], res[r][name]["gathered"])
    for name in "abc":
        ids = [res[r][name]["shuffled_ids"] for r in range(world)]
        assert sorted(torch.cat(ids).tolist()) == list(range(world * b))  # one permutation of all samples
        assert any(((i // b) != r).any() for r, i in enumerate(ids))  # samples really crossed ranks
    for r in range(world):
        assert torch.equal(res[r]["a"]["shuffled_ids"], res[r]["b"]["shuffled_ids"])  # same seed, same perm
    assert any(not torch.equal(res[r]["a"]["shuffled_ids"], res[r]["c"]["shuffled_ids"]) for r in range(world))


def _moco_worker(rank: int, world: int, b: int, k: int) -> dict:
    """MoCo with shuffle BN (train-mode BN) and each queue layout as drop-in parts."""
    from mocolab.models.backbones import build_encoder
    from mocolab.method.moco import MoCo

    out = {}
    for layout in ("replicated", "sharded"):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            encoder = build_encoder("convnet", 1, width=4, head="mlp", dim=DIM)
        queue = build_queue(layout, k, DIM, b, generator=torch.Generator().manual_seed(QUEUE_SEED))
        model = MoCo(encoder, queue, m=0.9, tau=TAU, shuffler=build_shuffler("shuffle", 3))
        opt = torch.optim.SGD(model.encoder_q.parameters(), lr=0.1)
        losses, accs = [], []
        for step in range(3):
            gen = torch.Generator().manual_seed(step)
            im = torch.randn(b * world, 1, 8, 8, generator=gen)[rank * b:(rank + 1) * b]
            res = model(im + 0.1 * torch.randn(im.shape, generator=gen), im)
            opt.zero_grad()
            res.loss.backward()
            for p in model.encoder_q.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            losses.append(res.loss.detach())
            accs.append(res.pretext_accuracy)
        out[layout] = {"loss": torch.stack(losses), "acc": accs, "queue": gather_queue_state(model.queue)[0]}
    return out


@pytest.mark.slow
def test_moco_drop_in_with_shuffle_bn(tmp_path):
    world, b = 2, 4
    res = launch(_moco_worker, world, tmp_path, b, 2 * b * world)
    for r in range(world):
        torch.testing.assert_close(res[r]["sharded"]["loss"], res[r]["replicated"]["loss"], atol=1e-5, rtol=1e-5)
        assert res[r]["sharded"]["acc"] == res[r]["replicated"]["acc"]
        torch.testing.assert_close(res[r]["sharded"]["queue"], res[r]["replicated"]["queue"], atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------------------------- single process

@pytest.mark.parametrize("size, b, world", [(12, 4, 2), (10, 5, 4), (0, 4, 2)])
def test_sharded_size_must_be_multiple_of_global_batch(size, b, world):
    with pytest.raises(ValueError, match="queue.size"):
        ShardedKeyQueue(size, 3, b, rank=0, world_size=world)


@pytest.mark.parametrize("rank, world, b, size, refused", [
    (0, 1, 1, 1, None), (1, 2, 1, 2, None), (0, 2, 4, 8, None),  # the smallest legal cases
    (0, 0, 4, 8, r"^rank 0 / world size 0 are inconsistent$"), (2, 2, 4, 8, r"^rank 2 / world size 2 "),
    (-1, 2, 4, 8, r"^rank -1 / world size 2 "), (0, 2, 0, 8, r"^per-rank batch: 0 must be > 0$"),
    (0, 2, -1, 8, r"^per-rank batch: -1 "), (0, 1, 1, 0, r"^queue.size: 0 must be a positive multiple of world "
                                                        r"size × per-rank batch = 1×1 = 1 for the sharded layout$")])
def test_a_sharded_queue_takes_any_consistent_rank_batch_and_size_and_names_what_is_not(rank, world, b, size,
                                                                                          refused):
    if refused:
        with pytest.raises(ValueError, match=refused):
            ShardedKeyQueue(size, 3, b, rank=rank, world_size=world)
        return
    q = ShardedKeyQueue(size, 3, b, rank=rank, world_size=world)
    # every queue's names (docs/ARCHITECTURE.md): K, the per-rank B, W, B·W, the keys held here, K/W
    assert (q.size, q.batch_size, q.world_size, q.global_batch, q.slots) == (size, b, world, b * world, size // world)
    assert type(q.shard_size) is int and q.shard_size == size // world == q.keys.shape[0]


def test_a_sharded_queue_draws_its_keys_from_its_generator_only():
    """The base class's throwaway keys come from a generator of their own: building a queue leaves the process's
    random stream (the encoders' initialisation, the data order) where it was, as the replicated queue does."""
    torch.manual_seed(0)
    ShardedKeyQueue(16, 3, 2, torch.Generator().manual_seed(5), rank=1, world_size=2)
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))


def test_a_sharded_queue_refuses_a_batch_other_than_its_own_and_keys_written_after_its_snapshot():
    q = ShardedKeyQueue(16, 3, 2, rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"^contrast got 3 queries; the queue was built for batches of 2$"):
        q.contrast(torch.randn(3, 3), torch.randn(3, 1), 0.2)
    taken = q.snapshot()
    q.enqueue(torch.randn(2, 3), 0)  # this rank's own keys: no collective
    with pytest.raises(RuntimeError, match=r"^the queue was written after its snapshot"):  # before any collective
        q.contrast(torch.randn(2, 3), torch.randn(2, 1), 0.2, negatives=taken)


@pytest.mark.parametrize("policy, seed", [(None, None), ("fifo", 3), ("random", 3), ("random", None)])
def test_a_replicated_queue_on_one_process_is_the_plain_queue(policy, seed):
    """Its world size read from the process group (1 here) unless given, the policy and seed passed on (FIFO and
    seed 0 by default), and the batch's images recorded with its keys."""
    told = {k: v for k, v in (("policy", policy), ("seed", seed)) if v is not None}
    plain, replicated = KeyQueue(16, 3, 4, **told), ReplicatedKeyQueue(16, 3, 4, **told)
    assert replicated.world_size == 1 and replicated.global_batch == 4
    g = torch.Generator().manual_seed(1)
    for step in range(7):  # past the ring's end: random replacement draws its slots from here on
        keys, index = torch.randn(4, 3, generator=g), torch.arange(4 * step, 4 * step + 4)
        assert torch.equal(replicated.enqueue(keys, step, index), plain.enqueue(keys, step, index))
    for name in ("keys", "write_step", "source"):
        assert torch.equal(getattr(replicated, name), getattr(plain, name)), name
    assert replicated.source.min() >= 0  # every slot's image known
    assert ReplicatedKeyQueue(16, 3, 2, world_size=2).global_batch == 4  # a world size given is used


def test_sharded_init_is_slice_of_replicated_init():
    b, world, k, c = 2, 3, 12, 4
    full = KeyQueue(k, c, b * world, generator=torch.Generator().manual_seed(5)).keys
    shards = [ShardedKeyQueue(k, c, b, torch.Generator().manual_seed(5), rank=r, world_size=world).keys
              for r in range(world)]
    for r, s in enumerate(shards):  # local slot n·B + i is global slot n·G + r·B + i
        for n in range(k // (b * world)):
            assert torch.equal(s[n * b:(n + 1) * b], full[n * b * world + r * b:n * b * world + (r + 1) * b])


def test_replicated_random_replacement_on_two_ranks_keeps_the_policy_and_the_run_s_seed(tmp_path):
    """queue.policy=random with several ranks: every rank's replicated queue draws its slots from the one stream
    the run's seed names, as a one-process queue of that seed does."""
    alone = KeyQueue(16, DIM, 4, policy="random", seed=3).slot_generator.initial_seed()
    for r in launch(_random_replicated_queue, 2, tmp_path, 3):
        assert r == {"type": "ReplicatedKeyQueue", "policy": "random", "world": 2, "draws": alone,
                     "sharded": "queue.policy: 'random' needs queue.layout=replicated with several ranks"}


def test_unknown_layout_and_bn_mode():
    with pytest.raises(ValueError, match=r"^queue.layout: unknown layout 'striped'; allowed replicated, sharded$"):
        build_queue("striped", 16, 4, 4)
    # one process: the default seed is the run's default, 0
    assert build_queue("replicated", 16, 4, 4, policy="random").slot_generator.initial_seed() == \
        KeyQueue(16, 4, 4, policy="random", seed=0).slot_generator.initial_seed()
    with pytest.raises(ValueError, match="moco.bn"):
        build_shuffler("ghost")


def test_single_process_builders():
    assert rank_and_world() == (0, 1)
    for layout in ("replicated", "sharded"):
        q = build_queue(layout, 16, 4, 4)
        assert type(q) is KeyQueue and q.size == 16
    assert isinstance(build_shuffler("shuffle", 3), CrossRankShuffle)
    assert isinstance(build_shuffler("split", 3), LocalShuffle)
    assert isinstance(build_shuffler("plain"), NoShuffle) and isinstance(build_shuffler("sync"), NoShuffle)
    x = torch.arange(6.0).view(6, 1)
    sh = CrossRankShuffle(0)  # one process: a local permutation that round-trips
    xs, restore = sh.shuffle(x)
    assert sorted(xs.view(-1).tolist()) == x.view(-1).tolist()
    assert torch.equal(sh.unshuffle(xs, restore), x)


# --------------------------------------------------------------------------------------------- global-batch BN

def _global_bn_rank(rank: int, world: int, shape: tuple) -> dict:
    from mocolab.method.batchnorm import GlobalBatchNorm

    g = torch.Generator().manual_seed(7)
    x_all = torch.randn(*shape, generator=g) * 3 + 1
    target = torch.randn(*shape, generator=g)
    n = shape[0] // world
    x = x_all[rank * n:(rank + 1) * n].clone().requires_grad_(True)
    bn = GlobalBatchNorm(shape[1], momentum=0.1)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, shape[1]))
        bn.bias.copy_(torch.linspace(-1, 1, shape[1]))
    out = bn(x)
    (out * target[rank * n:(rank + 1) * n]).sum().backward()
    grads = torch.cat([bn.weight.grad, bn.bias.grad])
    dist.all_reduce(grads)  # the ranks' parameter gradients together: what one process over the batch gets
    return {"out": out.detach(), "grad_x": x.grad, "grads": grads, "running_mean": bn.running_mean.clone(),
            "running_var": bn.running_var.clone()}


@pytest.mark.parametrize("shape", [(16, 6), (8, 3, 5, 5)], ids=["projector-1d", "conv-2d"])
def test_global_batch_norm_on_gloo_equals_one_process_with_the_whole_batch(tmp_path, shape):
    """MoCo v3's bn=sync on CPU: two gloo ranks with half the batch each give what nn.BatchNorm gives on all
    of it: outputs, input and parameter gradients, running statistics."""
    ranks = launch(_global_bn_rank, 2, tmp_path, shape)
    g = torch.Generator().manual_seed(7)
    x_all = (torch.randn(*shape, generator=g) * 3 + 1).requires_grad_(True)
    target = torch.randn(*shape, generator=g)
    bn = (nn.BatchNorm1d if len(shape) == 2 else nn.BatchNorm2d)(shape[1], momentum=0.1)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, shape[1]))
        bn.bias.copy_(torch.linspace(-1, 1, shape[1]))
    out = bn(x_all)
    (out * target).sum().backward()
    assert torch.allclose(torch.cat([r["out"] for r in ranks]), out.detach(), atol=1e-5)
    assert torch.allclose(torch.cat([r["grad_x"] for r in ranks]), x_all.grad, atol=1e-5)
    assert torch.allclose(ranks[0]["grads"], torch.cat([bn.weight.grad, bn.bias.grad]), atol=1e-4)
    for r in ranks:
        assert torch.allclose(r["running_mean"], bn.running_mean, atol=1e-6)
        assert torch.allclose(r["running_var"], bn.running_var, atol=1e-5)
    # a split half alone would normalise differently: the test can tell global from per-rank statistics
    half = nn.functional.batch_norm(x_all[: shape[0] // 2].detach(), None, None, bn.weight, bn.bias, True)
    assert not torch.allclose(half, out.detach()[: shape[0] // 2], atol=1e-3)


def test_global_batch_norm_without_a_group_is_plain_batch_norm():
    from mocolab.method.batchnorm import GlobalBatchNorm, convert_global_bn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3), nn.BatchNorm1d(3))
    x = torch.randn(10, 4)
    ref = net(x)
    plain_keys = set(net.state_dict())
    converted = convert_global_bn(net)
    assert sum(isinstance(m, GlobalBatchNorm) for m in converted.modules()) == 2
    assert torch.allclose(converted(x), ref, atol=1e-6)  # same weights, same statistics, one process
    converted.eval()
    assert set(converted.state_dict()) == plain_keys  # a checkpoint loads into plain BN and back


def _sync_bn_trainer_rank(rank: int, world: int) -> dict:
    """The real Trainer with moco.bn=sync on a CPU gloo group: DDP over the query encoder, global-batch BN."""
    from mocolab.config import build_config
    from mocolab.training.trainer import Trainer
    from mocolab.method.batchnorm import GlobalBatchNorm

    cfg = build_config("smoke", {"moco.bn": "sync", "run.num_workers": world, "data.subset": 512,
                                 "queue.size": 256, "optim.batch_size": 64, "model.width": 8})
    tr = Trainer(cfg, device=torch.device("cpu"))
    assert sum(isinstance(m, GlobalBatchNorm) for m in tr.encoder.modules()) > 0
    assert not any(type(m) in (nn.BatchNorm1d, nn.BatchNorm2d) for m in tr.model.encoder_k.modules())
    batches = tr.data.epoch(tr.epoch_order(0), tr.batch, rank, world, start_step=0)
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(tr.rng_state)
        losses = [tr.train_step(next(batches), None, tr.schedule.momentum(tr.step)).loss for _ in range(3)]
    bn = [m for m in tr.encoder.modules() if isinstance(m, GlobalBatchNorm)]
    return {"losses": losses, "weights": torch.cat([p.detach().flatten() for p in tr.encoder.parameters()]),
            "running": torch.cat([torch.cat([m.running_mean, m.running_var]) for m in bn]),
            "key_running": torch.cat([torch.cat([m.running_mean, m.running_var]) for m in tr.model.encoder_k.modules()
                                      if isinstance(m, GlobalBatchNorm)])}


@pytest.mark.slow
@pytest.mark.skipif(__import__("mocolab.data.sets", fromlist=["x"]).fashion_mnist_dir() is None,
                    reason="Fashion-MNIST not installed (make data)")
def test_trainer_with_sync_bn_trains_on_two_cpu_ranks(tmp_path):
    """bn=sync on CPU: three steps of the real Trainer under DDP on gloo; every rank ends with the same weights
    and the same BN running statistics (they were computed over the global batch, not per rank)."""
    res = launch(_sync_bn_trainer_rank, 2, tmp_path)
    assert all(all(torch.isfinite(torch.tensor(r["losses"]))) for r in res)
    assert torch.equal(res[0]["weights"], res[1]["weights"])
    assert torch.allclose(res[0]["running"], res[1]["running"], atol=1e-6)
    assert torch.allclose(res[0]["key_running"], res[1]["key_running"], atol=1e-6)
    assert not torch.allclose(res[0]["running"][: res[0]["running"].numel() // 2], torch.zeros(1))  # they moved
