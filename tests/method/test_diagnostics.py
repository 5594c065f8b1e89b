"""Key drift and ages (method/diagnostics.py) with a real encoder: exactly 1 for a frozen encoder, falling with age
for a moving one, and what the Trainer reports for each source of negatives."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mocolab.config import build_config
from mocolab.method.diagnostics import DriftProbes, age_histogram
from mocolab.evaluation.scoring import extract_features
from mocolab.training.trainer import Trainer, run_training
from mocolab.models.backbones import build_encoder
from mocolab.method.key_queue import KeyQueue

K, B, DIM, STEPS = 64, 8, 16, 40


def _images(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, 1, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _drift_run(m: float | None) -> dict:
    """A FIFO queue written by a key encoder that is frozen (m None) or the EMA, at momentum m, of a
    query encoder taking a random step each step (what SGD does to it, as far as the key encoder sees)."""
    torch.manual_seed(0)
    key = build_encoder("convnet", 1, width=8, head="mlp", dim=DIM, image_size=16)
    query = build_encoder("convnet", 1, width=8, head="mlp", dim=DIM, image_size=16)
    query.load_state_dict(key.state_dict())
    data = _images(B * STEPS, seed=1)
    queue, probes = KeyQueue(K, DIM, B), DriftProbes(K, 16, DIM)

    def embed(x: torch.Tensor) -> torch.Tensor:
        return F.normalize(extract_features(key, x), dim=1)

    for step in range(STEPS):
        index = torch.arange(step * B, (step + 1) * B)
        keys = embed(data[index])  # stands in for the training-mode key (the probes keep their own reference)
        written = queue.enqueue(keys, step, index)
        probes.observe(written, 0, index, data[index], embed, step)
        if m is not None:
            with torch.no_grad():
                for p in query.parameters():
                    p.add_(0.05 * torch.randn_like(p))
                for p_k, p_q in zip(key.parameters(), query.parameters()):
                    p_k.mul_(m).add_(p_q, alpha=1 - m)
    return probes.measure(STEPS, lambda idx: data[idx], embed, stored=queue.keys[probes.slots])


def test_drift_is_exactly_one_for_a_frozen_encoder():
    out = _drift_run(None)
    assert len(out["age"]) == 16 and min(out["age"]) >= 1 and max(out["age"]) == K // B
    assert out["drift_cos"] == pytest.approx([1.0] * 16, abs=1e-5)
    assert out["stored_cos"] == pytest.approx([1.0] * 16, abs=1e-5)  # here the stored key is that embedding


def test_drift_falls_with_age_for_a_moving_encoder_and_less_at_high_momentum():
    slow, fast = _drift_run(0.999), _drift_run(0.5)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(slow["drift_cos"]) > mean(fast["drift_cos"])
    assert min(slow["drift_cos"]) > 0.99
    pairs = sorted(zip(fast["age"], fast["drift_cos"]))
    young, old = [c for _, c in pairs[:5]], [c for _, c in pairs[-5:]]
    assert mean(old) < mean(young) < 1.0  # the older the entry, the further the encoder has moved since


def test_age_histogram_counts_every_age():
    h = age_histogram(torch.tensor([1.0, 2.0, 2.0, 8.0]), bins=4)
    assert sum(h["counts"]) == 4 and h["edges"][0] == 0 and h["edges"][-1] == 8 and len(h["edges"]) == 5
    assert age_histogram(torch.zeros(0)) == {"edges": [], "counts": []}


def _tiny(**overrides):
    return build_config("smoke", {"data.subset": 1024, "optim.batch_size": 64, "queue.size": 256,
                                  "optim.epochs": 2, "eval.knn_bank": 512, "eval.knn_test": 256,
                                  "eval.linear_steps": 10, "eval.drift_probes": 32, **overrides})


@pytest.mark.parametrize("source", ["queue", "memory_bank", "in_batch"])
def test_trainer_reports_ages_and_drift_for_every_source(source):
    cfg = _tiny(**{"moco.negatives": source})
    seen: list[dict] = []
    result = run_training(cfg, progress=None, on_epoch=lambda rec: seen.append(dict(rec.diagnostics)))
    rec, diag = result.history[-1], seen[-1]
    steps_per_epoch = 1024 // 64
    if source == "queue":  # FIFO: the oldest key is K/(B·W) steps old, and so at most is every probe
        assert rec.staleness_max == rec.max_staleness_bound == 256 / 64
        assert max(diag["probes"]["age"]) <= 4
    elif source == "memory_bank":  # every image written once per epoch: entries up to about an epoch old
        assert 1 <= rec.staleness_max < 2 * steps_per_epoch
        assert rec.staleness_mean == pytest.approx((steps_per_epoch + 1) / 2, rel=0.25)
        assert max(diag["probes"]["age"]) > 4  # older than the queue's keys at this batch
    else:  # in-batch negatives are this step's: nothing stored, fresh by construction
        assert rec.staleness_max == 0 and rec.drift_cos == 1.0 and "probes" not in diag
    assert rec.drift_cos is not None and 0.0 < rec.drift_cos <= 1.0 + 1e-6
    assert result.linear_top1 is not None


def test_trainer_probes_record_the_images_the_dictionary_holds():
    tr = Trainer(_tiny(**{"queue.policy": "random"}))
    for images, index in tr.data.epoch_indexed(tr.epoch_order(0), tr.batch, 0, 1, 0):
        with torch.random.fork_rng(devices=[]):
            tr.train_step(images, index, tr.schedule.momentum(tr.step))
    d = tr.drift.diagnostics(tr.step)
    p = tr.drift.probes
    assert torch.equal(p.image, tr.model.queue.source[p.slots])  # each probe knows its slot's image
    assert torch.equal(p.write_step, tr.model.queue.write_step[p.slots])
    assert len(d["probes"]["age"]) == len(p.slots) and sum(d["age_histogram"]["counts"]) == 256
    # the reference is the key encoder's embedding of that image when it was written: the last-written
    # probes, written by the key encoder as it is now but for one momentum step, are nearly identical
    assert max(d["probes"]["drift_cos"]) > 0.99


def test_probes_read_no_random_stream_so_training_is_the_same_with_or_without_them():
    with_probes, without = Trainer(_tiny(**{"optim.max_steps": 6})), Trainer(_tiny(**{"optim.max_steps": 6,
                                                                                        "eval.drift_probes": 0}))
    assert with_probes.drift.probes is not None and without.drift.probes is None
    for tr in (with_probes, without):
        tr.train_epoch()
    for key, value in with_probes.encoder.state_dict().items():
        assert torch.equal(value, without.encoder.state_dict()[key]), key
    assert torch.equal(with_probes.model.queue.keys, without.model.queue.keys)
