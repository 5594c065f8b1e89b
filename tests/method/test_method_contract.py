"""The contract of a method (method/protocol.py), checked on every registered one: what a new method must pass.

Each method is built by ``build_method`` from the smoke preset on tiny synthetic images (a 4-wide convnet,
16 px, a batch of 8), as the Trainer builds it, and driven by hand: the four built-ins, mocolab's own methods
named by ``method.name`` (the supervised bound), and every plugin installed in this environment (entry point
group ``mocolab.methods``; the suite installs examples/plugins/mocolab-byol), named by ``method.name`` too.
"""

from __future__ import annotations

import math
from itertools import product

import pytest
import torch

from mocolab.config.choices import NEGATIVE_SOURCES, VERSIONS, WITHOUT_KEY_ENCODER
from mocolab.config import build_config
from mocolab.training.build import encoder_factory
from mocolab.method import rng
from mocolab.method.protocol import MethodParts
from mocolab.method.plugins import OWN, installed
from mocolab.method.registry import METHODS, build_method, method_name
from mocolab.method.shuffle import CrossRankShuffle, LocalShuffle

B, SIZE, CHANNELS = 8, 16, 1
TINY = {"data.name": "synthetic", "data.synthetic_size": 64, "data.image_size": SIZE, "model.width": 4,
        "model.dim": 16, "queue.size": 32, "optim.batch_size": B}
CLASSES = 10  # of the labels a method trained with them reads (MethodParts.labels)
PLUGINS = sorted(OWN) + sorted(installed())  # what method.name names: mocolab's own, then the installed plugins
ALL = sorted(METHODS) + PLUGINS  # the built-ins, then those


def _config(name: str):
    """The config that asks for method ``name``: a plugin's name, a version of its own (v3), else a source of
    negatives."""
    key = "method.name" if name in PLUGINS else "moco.version" if name in VERSIONS else "moco.negatives"
    return build_config("smoke", {**TINY, key: name})


def _build(name: str, seed: int = 0, dtype: torch.dtype | None = None):
    """Method ``name`` as the Trainer builds it; ``dtype``: the encoders' autocast (run.precision)."""
    cfg = _config(name)
    torch.manual_seed(seed)  # the encoder's initial weights (the Trainer seeds the init stream here)
    labels = torch.arange(cfg.train_size) % CLASSES  # the training set's, by position (the Trainer: the source's)
    parts = MethodParts(encoder_factory(cfg, CHANNELS, SIZE, torch.device("cpu")), cfg.train_size, B,
                        encoder_dtype=dtype, labels=labels, classes=CLASSES)
    return build_method(cfg, parts)


def _batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two views (B×1×16×16) and the images' positions in the training set."""
    g = torch.Generator().manual_seed(seed)
    x1, x2 = torch.randn(B, CHANNELS, SIZE, SIZE, generator=g), torch.randn(B, CHANNELS, SIZE, SIZE, generator=g)
    return x1, x2, torch.randperm(TINY["data.synthetic_size"], generator=g)[:B]


def test_every_version_and_source_of_negatives_the_config_accepts_names_a_method():
    reached = set()
    for version, negatives in product(VERSIONS, NEGATIVE_SOURCES):
        try:
            cfg = build_config("smoke", {**TINY, "moco.version": version, "moco.negatives": negatives})
        except ValueError:  # a combination the config refuses (v3 takes no other negatives)
            continue
        assert method_name(cfg) in METHODS, (version, negatives)
        reached.add(method_name(cfg))
    assert reached == set(METHODS)  # and every registered method is reachable from a config


def test_the_suite_checks_a_plugin_too():
    """make setup-test installs the example plugin: without it the contract below would cover built-ins only."""
    assert "byol" in PLUGINS and "supervised" in PLUGINS
    assert method_name(_config("byol")) == "byol" and method_name(_config("supervised")) == "supervised"


@pytest.mark.parametrize("name", ALL)
def test_a_forward_gives_a_finite_loss_whose_gradient_reaches_the_encoder_only(name):
    method = _build(name).train()
    if method.key_encoder is not None:
        method.m = 0.9  # what the Trainer sets each step
    out = method(*_batch())
    assert out.loss.shape == () and math.isfinite(float(out.loss.detach()))
    assert out.correct.dtype == torch.bool and out.correct.numel() >= B and 0.0 <= out.pretext_accuracy <= 1.0
    assert out.keys.shape[0] == B and not out.keys.requires_grad
    out.loss.backward()
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in method.encoder_q.parameters())
    if method.key_encoder is not None:
        assert all(p.grad is None and not p.requires_grad for p in method.key_encoder.parameters())
    assert int(method.step) == 1
    assert math.isfinite(method.uniform_loss(B)) and method.uniform_loss(B) > 0


@pytest.mark.parametrize("name", sorted(METHODS) + ["supervised"])
def test_the_uniform_loss_is_the_loss_of_an_encoder_that_tells_no_image_apart(name):
    """``uniform_loss`` sets the divergence bar (ten times it, trainer.py): it must be this method's loss when
    every feature is the same. With every weight zero, each query, key and class score is zero, so every logit
    is equal: the loss of a uniform guess over the method's candidates, whatever they are. A memory bank drops
    each drawn negative that is the query's own entry, so its guess is over 1 + K − (those) candidates, and
    its uniform_loss, log(1 + K), is the loss where none is drawn."""
    method = _build(name).train()
    with torch.no_grad():
        for p in method.parameters():
            p.zero_()
    if method.key_encoder is not None:
        method.m = 0.9
    x1, x2, index = _batch()
    expected = method.uniform_loss(B)
    if name == "memory_bank":
        bank = method.dictionary
        drawn = torch.randint(bank.size, (bank.negatives,), generator=torch.Generator().set_state(
            bank.sampler.get_state()))  # what the forward's sample() is about to draw
        own = (drawn[None, :] == index[:, None]).sum(dim=1)
        assert math.log(1 + bank.negatives) == pytest.approx(expected)
        expected = float(torch.log1p(bank.negatives - own.double()).mean())
    assert float(method(x1, x2, index).loss.detach()) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_only_v3_asks_for_a_query_encoder_with_a_predictor(name):
    """MoCo v3 puts a predictor on f_q (its reference builder); v1, v2 and the sources of negatives are v2's
    encoder, whose features the head ends in."""
    cfg, asked = _config(name), []
    make = encoder_factory(cfg, CHANNELS, SIZE, torch.device("cpu"))

    def encoder(predictor: bool = False) -> torch.nn.Module:
        asked.append(predictor)
        return make(predictor=predictor)

    build_method(cfg, MethodParts(encoder, cfg.train_size, B))
    assert asked == [name == "v3"]


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("bn", ["shuffle", "split"])
def test_a_method_takes_its_momentum_temperature_shuffle_and_precision_from_the_config(name, bn):
    """Not the constructor's defaults (m = 0.999, τ = 0.2, no shuffle, float32). Shuffle BN goes with a key
    encoder, the batch-keys control's included."""
    overrides = {"moco.m": 0.95, "moco.tau": 0.3, "moco.bn": bn, "run.num_workers": 2 if bn == "shuffle" else 0,
                 "moco.version" if name in VERSIONS else "moco.negatives": name}
    if bn == "shuffle" and name in WITHOUT_KEY_ENCODER:  # no key encoder: no key batch to shuffle
        with pytest.raises(ValueError, match="^moco.bn: 'shuffle' shuffles the key encoder's batch"):
            build_config("smoke", {**TINY, **overrides})
        return
    cfg = build_config("smoke", {**TINY, **overrides})
    parts = MethodParts(encoder_factory(cfg, CHANNELS, SIZE, torch.device("cpu")), cfg.train_size, B,
                        encoder_dtype=torch.bfloat16)
    method = build_method(cfg, parts)
    assert method.tau == 0.3 and method.encoder_dtype is torch.bfloat16
    if method.key_encoder is not None:
        assert method.m == 0.95
        expected = {"shuffle": CrossRankShuffle, "split": LocalShuffle}[bn]
        assert type(method.shuffler) is expected


@pytest.mark.parametrize("name", ["v1", "v2", "memory_bank"])
def test_a_dictionary_s_initial_keys_come_from_the_run_s_queue_stream(name):
    """The random keys a queue or bank starts with are drawn from the "queue" stream of the run's seed
    (method/rng.py), not from the global generator the encoder's initial weights come from: whatever was
    drawn before, a seed starts with the same dictionary."""
    cfg = _config(name)
    starts = []
    for draws in (0, 5):
        torch.manual_seed(123)
        torch.randn(draws)  # what other code drew first
        parts = MethodParts(encoder_factory(cfg, CHANNELS, SIZE, torch.device("cpu")), cfg.train_size, B)
        starts.append(build_method(cfg, parts).dictionary.keys.clone())
    assert torch.equal(starts[0], starts[1])


def test_random_replacement_reaches_the_queue_with_the_run_s_seed():
    """queue.policy=random: the queue replaces random slots, drawn from a stream of the run's seed (so two
    seeds replace differently, one seed alike on every rank)."""
    def queue(seed: int):
        cfg = build_config("smoke", {**TINY, "queue.policy": "random", "run.seed": seed})
        return build_method(cfg, MethodParts(encoder_factory(cfg, CHANNELS, SIZE, torch.device("cpu")),
                                             cfg.train_size, B)).dictionary

    first, other = queue(0), queue(1)
    assert first.policy == other.policy == "random"
    assert first.slot_generator.initial_seed() != other.slot_generator.initial_seed()


def test_keys_in_bf16_on_one_process():
    """bf16 encoders with split BN's local shuffle: the key batch stays as it is (only a shuffle across ranks
    sends it in the encoder's dtype), and the step runs."""
    cfg = _config("v2")
    method = build_method(cfg, MethodParts(encoder_factory(cfg, CHANNELS, SIZE, torch.device("cpu")),
                                           cfg.train_size, B, encoder_dtype=torch.bfloat16)).train()
    assert type(method.shuffler) is LocalShuffle and not getattr(method.shuffler, "crosses_ranks", False)
    out = method(*_batch())
    assert math.isfinite(float(out.loss.detach())) and out.keys.dtype == torch.float32


@pytest.mark.parametrize("name", ALL)
def test_every_method_runs_its_encoders_in_the_run_s_precision(name):
    """run.precision=bf16: every convolution and linear layer of a step (query and key encoders, heads,
    predictors) computes under the encoders' autocast; the loss is still taken in float32."""
    method = _build(name, dtype=torch.bfloat16).train()
    seen = []
    for module in method.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            module.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    out = method(*_batch())
    assert seen and set(seen) == {torch.bfloat16}, f"{name}: layers outside the autocast ({len(seen)} calls)"
    assert out.loss.dtype == torch.float32


def test_the_memory_bank_takes_its_momentum_and_its_draws_from_the_config():
    def bank(seed: int, momentum: float):
        cfg = build_config("smoke", {**TINY, "moco.negatives": "memory_bank", "bank.momentum": momentum,
                                     "run.seed": seed})
        return build_method(cfg, MethodParts(encoder_factory(cfg, CHANNELS, SIZE, torch.device("cpu")),
                                             cfg.train_size, B)).bank

    first, again, other = bank(0, 0.7), bank(0, 0.3), bank(1, 0.7)
    assert (first.momentum, again.momentum) == (0.7, 0.3)
    draws = first.sample()
    assert torch.equal(draws, again.sample())  # the negatives drawn: the run's seed's
    assert not torch.equal(other.sample(), draws)
    assert other.sampler.initial_seed() != first.sampler.initial_seed()


def test_shuffle_bn_draws_its_permutations_from_the_run_seed_s_shuffle_stream():
    """Every rank builds the same generator from the config (so no permutation is broadcast), seeded by the
    run's seed through the "shuffle" stream (method/rng.py): another seed shuffles otherwise."""
    def shuffler(seed: int):
        cfg = build_config("smoke", {**TINY, "moco.bn": "shuffle", "run.num_workers": 2, "run.seed": seed})
        return build_method(cfg, MethodParts(encoder_factory(cfg, CHANNELS, SIZE, torch.device("cpu")),
                                             cfg.train_size, B)).shuffler

    first, again, other = shuffler(0), shuffler(0), shuffler(1)
    assert first.generator.initial_seed() == again.generator.initial_seed() == rng.stream_seed("shuffle", 0)
    assert other.generator.initial_seed() == rng.stream_seed("shuffle", 1) != rng.stream_seed("shuffle", 0)


@pytest.mark.parametrize("name", ALL)
def test_describe_is_one_line(name):
    text = _build(name).describe(B)
    assert text.strip() and "\n" not in text


@pytest.mark.parametrize("name", ALL)
def test_the_key_encoder_and_the_dictionary_are_there_exactly_when_the_method_has_them(name):
    method = _build(name)
    parts = method.checkpoint_parts()
    assert all(isinstance(p, torch.nn.Module) for p in parts.values())
    key, store = method.key_encoder, method.dictionary
    if key is None:  # no momentum encoder: nothing to set a momentum on
        assert not hasattr(method, "m") and "encoder_k" not in parts
    else:  # its own copy, saved with the checkpoint, momentum in [0, 1)
        assert parts["encoder_k"] is key and key is not method.encoder_q and 0.0 <= method.m < 1.0
        assert not {id(p) for p in key.parameters()} & {id(p) for p in method.encoder_q.parameters()}
    out = method(*_batch())
    if store is None:  # every negative is this step's: nothing stored, nothing written, no writer
        assert method.writer is None and out.written is None
    else:  # saved with the checkpoint; slots×C keys with ages; this step's slots written by the writer
        assert any(p is store for p in parts.values()) and method.writer is not None
        assert store.keys.shape == (store.slots, TINY["model.dim"])
        assert out.written is not None and out.written.numel() == B and store.ages(1).numel() >= B
    assert method.shuffle_generator is None or isinstance(method.shuffle_generator, torch.Generator)


def test_the_four_methods_hold_what_their_papers_give_them():
    methods = {name: _build(name) for name in ("queue", "v3", "memory_bank", "in_batch")}
    has = {name: (m.key_encoder is not None, m.dictionary is not None) for name, m in methods.items()}
    assert has == {"queue": (True, True), "v3": (True, False), "memory_bank": (False, True),
                   "in_batch": (False, False)}


@pytest.mark.parametrize("name", ALL)
def test_a_state_dict_restores_the_same_loss_in_a_fresh_instance(name):
    a = _build(name, seed=0).train()
    a(*_batch(1))  # a step: the queue or bank written, f_k moved, the counter advanced
    b = _build(name, seed=5).train()  # other initial weights (and keys), all overwritten by the load
    b.load_state_dict(a.state_dict())
    losses = []
    for method in (a, b):
        torch.manual_seed(3)  # a split-BN shuffle draws from the global generator
        losses.append(float(method(*_batch(2)).loss.detach()))
    assert losses[0] == losses[1]
    assert int(a.step) == int(b.step) == 2
