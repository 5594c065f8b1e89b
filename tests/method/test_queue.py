import pytest
import torch

from mocolab.method.key_queue import KeyQueue


def _batch(step: int, b: int = 4, c: int = 3) -> torch.Tensor:
    """Keys whose value encodes (step, row) so order can be read back."""
    return torch.arange(b, dtype=torch.float32).view(b, 1).expand(b, c) + 100 * step


def test_fifo_order_and_wrap_around():
    q = KeyQueue(size=12, dim=3, batch_size=4)
    for step in range(5):  # 5 batches into 3 slots: wraps twice
        q.enqueue(_batch(step), step)
    # the queue holds steps 2, 3, 4, oldest first
    expect = torch.cat([_batch(2), _batch(3), _batch(4)])
    assert torch.equal(q.ordered(), expect)
    assert int(q.ptr) == (5 * 4) % 12
    assert q.write_step.tolist() == [3] * 4 + [4] * 4 + [2] * 4


def test_max_staleness_is_k_over_batch():
    q = KeyQueue(size=32, dim=2, batch_size=8)
    assert q.staleness(0) == (0.0, 0.0)  # nothing written yet: the random init does not count
    for step in range(10):
        mean, max_age = q.staleness(step)
        if step >= 4:  # full from step 4 on: ages K/B .. 1
            assert max_age == q.max_staleness == 4
            assert mean == pytest.approx((4 + 3 + 2 + 1) / 4)
        q.enqueue(torch.randn(8, 2), step)


def test_negative_logits_shape_and_no_grad_into_queue():
    q = KeyQueue(size=16, dim=5, batch_size=4)
    query = torch.randn(4, 5, requires_grad=True)
    logits = q.negative_logits(query)
    assert logits.shape == (4, 16)
    q.enqueue(torch.randn(4, 5), 0)  # in-place overwrite must not break backward
    logits.sum().backward()
    assert query.grad is not None and not q.keys.requires_grad


@pytest.mark.parametrize("size, batch, world, refused", [
    (1, 1, 1, None), (8, 4, 2, None),  # the smallest queue; one global batch of two ranks
    (0, 4, 1, r"^queue.size: 0 must be > 0$"), (-8, 4, 1, r"^queue.size: -8 must be > 0$"),
    (10, 4, 1, r"^queue.size: 10 must be a positive multiple of the global batch 4$"),
    (12, 4, 2, r"^queue.size: 12 must be a positive multiple of the global batch 8$"),  # of B·W, not B
    (8, 0, 1, r"^queue.size: 8 must be a positive multiple of the global batch 0$"),
    (8, 4, 0, r"^queue.size: 8 must be a positive multiple of the global batch 0$")])
def test_a_queue_takes_any_multiple_of_its_global_batch_and_names_what_is_not(size, batch, world, refused):
    if refused:
        with pytest.raises(ValueError, match=refused):
            KeyQueue(size=size, dim=2, batch_size=batch, world_size=world)
        return
    q = KeyQueue(size=size, dim=2, batch_size=batch, world_size=world)
    # random unit keys, none a real key yet (write step and image -1), the ring at its start, whole numbers
    torch.testing.assert_close(q.keys.norm(dim=1), torch.ones(size))
    assert q.write_step.tolist() == q.source.tolist() == [-1] * size and int(q.ptr) == 0
    assert q.write_step.dtype == q.source.dtype == q.ptr.dtype == torch.long
    # random replacement's stream is the seed's: seed 0 unless told
    draws = KeyQueue(size, 2, batch, world_size=world, policy="random").slot_generator.initial_seed()
    assert draws == KeyQueue(size, 2, batch, world_size=world, policy="random", seed=0).slot_generator.initial_seed()


def test_wrong_batch_enqueue():
    q = KeyQueue(size=8, dim=2, batch_size=4)
    with pytest.raises(ValueError, match="built for batches of 4"):
        q.enqueue(torch.randn(3, 2), 0)


def test_a_contrast_reads_the_keys_its_snapshot_took_and_refuses_them_once_overwritten():
    q = KeyQueue(size=8, dim=2, batch_size=4)
    query, l_pos = torch.nn.functional.normalize(torch.randn(4, 2), dim=1), torch.randn(4, 1)
    taken = q.snapshot()
    before = q.contrast(query, l_pos, 0.2, negatives=taken)
    q.enqueue(torch.randn(4, 2), 0)
    with pytest.raises(RuntimeError, match=r"^the queue was written after its snapshot: contrast must run before "
                                           r"enqueue$"):
        q.contrast(query, l_pos, 0.2, negatives=taken)
    assert not torch.equal(q.contrast(query, l_pos, 0.2)[0], before[0])  # the keys as they are now


def test_random_replacement_fills_the_ring_in_order_before_it_draws_slots():
    """queue.policy=random: the random initial keys are replaced in FIFO order first (every slot once), and only
    then do the keys overwrite slots drawn at random, B distinct ones a step."""
    q = KeyQueue(size=16, dim=2, batch_size=4, policy="random", seed=1)
    for step in range(4):
        assert q.enqueue(torch.randn(4, 2), step, torch.arange(4)).tolist() == list(range(4 * step, 4 * step + 4))
    assert q.write_step.tolist() == [s for s in range(4) for _ in range(4)]
    drawn = [q.enqueue(torch.randn(4, 2), step).tolist() for step in range(4, 12)]
    assert all(len(set(d)) == 4 for d in drawn) and drawn != [list(range(4 * (s % 4), 4 * (s % 4) + 4))
                                                              for s in range(4, 12)]
    written = torch.tensor(drawn[-1])
    assert q.source[written].tolist() == [-1] * 4  # keys enqueued without their images: unknown


def test_state_dict_carries_queue():
    q = KeyQueue(size=8, dim=2, batch_size=4)
    q.enqueue(torch.ones(4, 2), 7)
    r = KeyQueue(size=8, dim=2, batch_size=4)
    r.load_state_dict(q.state_dict())
    assert torch.equal(r.keys, q.keys) and int(r.ptr) == 4 and r.write_step[:4].tolist() == [7] * 4


def test_fifo_oldest_key_is_k_over_bw_and_random_replacement_exceeds_it():
    """queue.policy: FIFO's oldest key, once full, is exactly K/(B·W) steps old at every step; random
    replacement fills the ring as FIFO, then overwrites random slots, so some keys grow older than that."""
    k, b = 64, 8
    fifo, rand = KeyQueue(size=k, dim=2, batch_size=b), KeyQueue(size=k, dim=2, batch_size=b, policy="random")
    ages_fifo, ages_rand = [], []
    for step in range(200):
        for q in (fifo, rand):
            q.enqueue(torch.randn(b, 2), step, index=torch.arange(b) + b * step)
        if step + 1 >= k // b:  # full
            ages_fifo.append(fifo.staleness(step + 1)[1])
            ages_rand.append(rand.staleness(step + 1)[1])
    assert set(ages_fifo) == {k / b} == {fifo.max_staleness}
    assert max(ages_rand) > k / b  # unbounded: here several times the FIFO bound
    assert min(ages_rand) >= k / b  # never younger than FIFO's oldest: a full ring loses a key per slot drawn
    assert rand.ages(200).mean() == pytest.approx(k / b, rel=0.5)  # geometric ages with mean about K/(B·W)
    # every key remembers its training image: FIFO's slots hold the last K/B batches' images
    assert sorted(fifo.source.tolist()) == list(range(b * (200 - k // b), b * 200))


def test_random_replacement_is_reproducible_and_resumes_from_its_state_dict():
    a = KeyQueue(size=32, dim=2, batch_size=4, policy="random", seed=3)
    for step in range(12):
        a.enqueue(torch.randn(4, 2), step)
    b = KeyQueue(size=32, dim=2, batch_size=4, policy="random", seed=3)
    b.load_state_dict(a.state_dict())
    keys = torch.randn(4, 2)
    assert torch.equal(a.enqueue(keys, 12), b.enqueue(keys, 12))  # the same slots drawn after a resume
    assert torch.equal(a.keys, b.keys) and torch.equal(a.write_step, b.write_step)


@pytest.mark.parametrize("policy", ["fifo", "random"])
def test_a_queue_loads_a_checkpoint_from_before_source_and_its_extra_state_existed(policy):
    old = KeyQueue(size=8, dim=2, batch_size=4, policy=policy)
    state = {k: v for k, v in old.state_dict().items() if k not in ("source", "_extra_state")}
    new = KeyQueue(size=8, dim=2, batch_size=4, policy=policy, seed=5)
    draws = new.slot_generator.get_state() if policy == "random" else None
    new.load_state_dict(state)  # strict: the missing entries are filled in, not reported missing
    assert new.source.tolist() == [-1] * 8
    if policy == "random":  # no generator state saved: its own stream goes on
        assert torch.equal(new.slot_generator.get_state(), draws)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="queue.policy"):
        KeyQueue(size=8, dim=2, batch_size=4, policy="lifo")
