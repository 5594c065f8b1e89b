"""What training/build.py makes from a config: the schedule's numbers, a method seeded from its own stream (the
caller's generator untouched), and the data source with its checks."""

from __future__ import annotations

import pytest
import torch

from mocolab.training.build import Schedule, build_run, training_source
from mocolab.config import build_config
from mocolab.data.sets import load_dataset
from mocolab.training.schedule import lr_at, momentum_at
from mocolab.data.sources import MemorySource

SYN = {"data.name": "synthetic", "data.synthetic_size": 256, "data.subset": None, "optim.batch_size": 32,
       "queue.size": 64, "model.width": 8, "run.precision": "fp32", "run.device": "cpu"}


def _source(n: int = 256) -> MemorySource:
    return MemorySource(load_dataset("synthetic", "train", synthetic_size=n, seed=0),
                        load_dataset("synthetic", "test", synthetic_size=n, seed=0))


def test_schedule_counts_the_run_and_gives_each_steps_lr_and_momentum():
    cfg = build_config("smoke", {**SYN, "optim.epochs": 3, "optim.warmup_epochs": 0.5, "moco.m_schedule": "cosine"})
    s = Schedule.from_config(cfg, 256, 32, 1)
    assert (s.steps_per_epoch, s.total_steps, s.warmup_steps) == (8, 24, 4)
    for step in (0, 3, 4, 11, 23):
        assert s.lr(step) == lr_at(cfg.optim.schedule, cfg.effective_lr, step, 24, 4)
        assert s.momentum(step) == momentum_at("cosine", cfg.moco.m, step, 24)
    assert s.lr(0) == 0.0 and s.momentum(0) == cfg.moco.m  # warm-up from 0; m rises from moco.m


def test_schedule_ends_at_max_steps_and_counts_a_rank_its_share():
    cfg = build_config("smoke", {**SYN, "optim.epochs": 3, "optim.max_steps": 5})
    assert Schedule.from_config(cfg, 256, 32, 1).total_steps == 5
    two = Schedule.from_config(cfg, 256, 16, 2)  # two ranks of 16: the same 8 global batches an epoch
    assert two.steps_per_epoch == 8


def test_build_run_draws_the_weights_from_the_init_stream_and_leaves_the_callers_generator_alone():
    cfg = build_config("smoke", SYN)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = build_run(cfg, _source(), torch.device("cpu"), 1)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(456)  # another caller's state: the same run
    b = build_run(cfg, _source(), torch.device("cpu"), 1)
    for (key, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        if not key.endswith("_extra_state"):
            assert torch.equal(x, y), key
    assert a.encoder is a.model.encoder_q and a.batch == 32 and a.precision is None
    assert {id(p) for g in a.optimizer.param_groups for p in g["params"]} <= {id(p) for p in a.encoder.parameters()}


def test_build_run_refuses_a_batch_larger_than_the_training_set():
    with pytest.raises(ValueError, match="optim.batch_size: 32 is larger than the training set \\(16 images\\)"):
        build_run(build_config("smoke", SYN), _source(16), torch.device("cpu"), 1)


def test_training_source_holds_out_the_validation_split_of_given_sets_and_refuses_what_it_cannot_do():
    cfg = build_config("smoke", {**SYN, "data.val_size": 64})
    train = load_dataset("synthetic", "train", synthetic_size=256, seed=0)
    test = load_dataset("synthetic", "test", synthetic_size=256, seed=0)
    source = training_source(cfg, train=train, test=test)
    assert source.size == 192 and len(source.val) == 64
    with pytest.raises(ValueError, match="data.val_size: a validation split is held out of in-memory sets only"):
        training_source(cfg, source=source)
    stream = build_config("smoke", SYN)
    stream.data.loader = "stream"  # what an imagefolder run asks for; read only through Ray Data
    with pytest.raises(ValueError, match="data.loader: 'stream' reads through Ray Data"):
        training_source(stream)
    plain = build_config("smoke", SYN)
    assert training_source(plain, source=source) is source
