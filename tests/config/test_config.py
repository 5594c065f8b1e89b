import math
import re

import pytest

from mocolab.config import Config, build_config, list_presets, load_preset, parse_overrides, validate


def test_presets_load_and_validate():
    assert {"smoke", "cpu-quick"} <= set(list_presets())
    for name in list_presets():
        if load_preset(name).data.name in ("imagefolder", "parquet"):  # the user's folder: refused without one
            with pytest.raises(ValueError, match=r"^data.root: .* needs a folder path"):
                build_config(name)
            continue
        cfg = build_config(name)
        assert cfg.run.preset == name


def test_overrides_are_typed_and_flattened():
    cfg = build_config("smoke", ["moco.m=0.9", "queue.size=2048", "data.subset=null", "optim.lr=1e-2"])
    flat = cfg.flatten()
    assert flat["moco.m"] == 0.9 and isinstance(flat["moco.m"], float)
    assert flat["queue.size"] == 2048 and flat["data.subset"] is None
    assert flat["optim.lr"] == pytest.approx(0.01)


def test_closed_forms():
    cfg = build_config("cpu-quick", ["moco.m=0.999"])
    assert cfg.ema_half_life == pytest.approx(692.8, abs=0.1)
    assert cfg.replace(**{"moco.m": 0.9}).ema_half_life == pytest.approx(6.58, abs=0.01)
    assert cfg.max_staleness == cfg.queue.size / cfg.optim.batch_size


@pytest.mark.parametrize("overrides, field, hint", [
    ({"moco.m": 1.0}, "moco.m", "[0, 1)"),
    ({"moco.m": -0.1}, "moco.m", "[0, 1)"),
    ({"moco.tau": 0.0}, "moco.tau", "[0.001, 10]"),
    ({"queue.size": 0}, "queue.size", "> 0"),
    ({"queue.size": 1000}, "queue.size", "multiple of the global batch"),
    ({"queue.size": 60_160}, "queue.size", "below the training-set size 60000"),
    ({"optim.batch_size": 1}, "optim.batch_size", "batch_size >= 2"),
    ({"optim.lr": 0.0}, "optim.lr", "lr > 0"),
    ({"optim.lr": -1.0}, "optim.lr", "lr > 0"),
    ({"optim.lr": float("inf")}, "optim.lr", "finite"),
    ({"optim.lr": float("nan")}, "optim.lr", "lr > 0"),
    ({"moco.tau": 1e-9}, "moco.tau", "[0.001, 10]"),
    ({"moco.tau": float("inf")}, "moco.tau", "[0.001, 10]"),
    ({"eval.knn_t": float("inf")}, "eval.knn_t", "(0.0, 100.0]"),
    ({"optim.weight_decay": float("inf")}, "optim.weight_decay", "[0.0, 1.0]"),
    ({"run.name": "../escape"}, "run.name", "letters, digits"),
    ({"run.name": ".."}, "run.name", "letters, digits"),
    ({"run.name": ""}, "run.name", "1 to 200"),
    ({"run.name": "it's"}, "run.name", "MLflow filter"),
    ({"run.name": "a/b"}, "run.name", "folder"),
    ({"data.name": "mnist2"}, "data.name", "fashion-mnist"),
    ({"model.backbone": "vit"}, "model.backbone", "resnet18"),
    ({"data.name": "synthetic", "data.image_size": 4}, "data.image_size", "below the 8 px model.backbone 'convnet'"),
    ({"data.name": "synthetic", "data.image_size": 7}, "data.image_size", "allowed >= 8"),
    ({"augment.preset": "simclr"}, "augment.preset", "mocov2"),
    ({"moco.bn": "group"}, "moco.bn", "shuffle"),
    ({"moco.bn_groups": 3}, "moco.bn_groups", "divide the per-rank batch 256"),
    ({"data.name": "imagefolder"}, "data.root", "folder"),
    ({"moco.version": "v4"}, "moco.version", "'v3'"),
    ({"moco.m_schedule": "linear"}, "moco.m_schedule", "cosine"),
    ({"optim.name": "adam"}, "optim.name", "adamw"),
    ({"optim.warmup_epochs": 3}, "optim.warmup_epochs", "[0, optim.epochs=3)"),
    ({"optim.warmup_epochs": -1}, "optim.warmup_epochs", "[0, optim.epochs=3)"),
    ({"vit.freeze_patch_embed": True}, "vit.freeze_patch_embed", "ViT backbones ['vit_tiny', 'vit_small'] only"),
    ({"vit.depth": 2}, "vit.depth", "model.backbone is 'convnet'"),
    ({"model.backbone": "vit_tiny", "vit.patch_size": 5}, "vit.patch_size", "one of [2, 4, 7, 14]"),
    ({"model.backbone": "vit_tiny", "vit.depth": 65}, "vit.depth", "to 64"),
    ({"model.head": "mlp4"}, "model.head", "mlp3-bn"),
    ({"moco.negatives": "bank"}, "moco.negatives", "'memory_bank'"),
    ({"moco.negatives": "in_batch", "moco.version": "v3"}, "moco.negatives", "use moco.version=v2"),
    ({"moco.negatives": "in_batch", "moco.bn": "shuffle", "run.num_workers": 2}, "moco.bn", "no key encoder"),
    ({"queue.policy": "lru"}, "queue.policy", "'random'"),
    ({"queue.policy": "random", "queue.layout": "sharded", "run.num_workers": 2}, "queue.policy",
     "queue.layout=replicated"),
    ({"queue.policy": "random", "moco.negatives": "in_batch"}, "queue.policy", "there is none"),
    ({"bank.momentum": 0.9}, "bank.momentum", "moco.negatives=memory_bank only"),
    ({"moco.negatives": "memory_bank", "bank.momentum": 1.0}, "bank.momentum", "[0, 1)"),
    ({"moco.negatives": "memory_bank", "bank.negatives": -1}, "bank.negatives", "0 (queue.size)"),
    ({"moco.negatives": "memory_bank", "bank.negatives": 60_000}, "bank.negatives", "training-set size 60000"),
    ({"eval.drift_probes": -1}, "eval.drift_probes", ">= 0"),
])
def test_validation_errors_name_field_and_range(overrides, field, hint):
    with pytest.raises(ValueError) as err:
        build_config("cpu-quick", overrides)
    msg = str(err.value)
    assert msg.startswith(field), msg
    assert hint in msg, msg


def test_good_names_and_relative_paths(tmp_path):
    from mocolab.config import absolute_paths, check_name, with_absolute_paths

    for name in ("momentum-cpu-quick-s0", "m=0.9_seed=1", "run_1.b"):
        assert check_name("run.name", name) == name
    cfg = build_config("smoke", {"run.output_dir": "out/runs", "data.root": "data"})
    absolute = with_absolute_paths(cfg, tmp_path)
    assert absolute.run.output_dir == str(tmp_path / "out/runs") and absolute.data.root == str(tmp_path / "data")
    assert absolute_paths({"data.root": "/abs", "moco.m": 0.9}, tmp_path) == {"data.root": "/abs", "moco.m": 0.9}


def test_config_diff_lists_changes_and_ignores_fields_newer_than_the_run():
    from mocolab.config import config_diff

    old = {"moco.m": 0.99, "queue.size": 512, "run.threads": 1}
    new = {"moco.m": 0.9, "queue.size": 512, "run.threads": 2, "model.new_field": 3}
    assert config_diff(old, new) == ["moco.m: 0.99 -> 0.9"]  # run.threads may change; new_field is newer
    assert config_diff(old, new, new_field=lambda k: False) == ["moco.m: 0.99 -> 0.9",
                                                                 "model.new_field: (absent) -> 3"]


def test_unreadable_data_root(tmp_path, monkeypatch):
    from mocolab.data.roots import check_data

    f = tmp_path / "not-a-dir"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"^data.root: .* is not a readable folder$"):
        check_data(build_config("smoke", {"data.root": str(f)}))
    monkeypatch.setenv("MOCOLAB_DATA", str(f))
    with pytest.raises(ValueError, match=r"^data.root: \$MOCOLAB_DATA=.* is not a readable folder$"):
        check_data(build_config("smoke"))


def _image_folder(root, train: int, val: int) -> None:
    """An imagefolder's layout with empty files: what the data check counts (nothing is decoded)."""
    for split, n in (("train", train), ("val", val)):
        (root / split / "c").mkdir(parents=True)
        for i in range(n):
            (root / split / "c" / f"{i}.png").touch()


def test_validate_reads_the_config_alone_and_the_data_check_reads_the_disk(tmp_path):
    """validate answers from the config: a folder that is not there, or holds too few images, passes it, and
    the refusal comes from check_data, which every command runs where it uses the data, before any work."""
    from mocolab.data.roots import check_data

    folder = {"data.name": "imagefolder", "data.root": str(tmp_path / "imagenet"), "data.subset": None,
              "optim.batch_size": 4, "queue.size": 8, "moco.bn": "plain"}
    cfg = validate(build_config("smoke", folder))
    with pytest.raises(ValueError, match=r"^data.root: '.*imagenet' does not exist$"):
        check_data(cfg)
    (tmp_path / "imagenet" / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"^data.root: imagefolder '.*' has no test/ or val/ folder"):
        check_data(cfg)
    _image_folder(tmp_path / "other", train=6, val=2)
    small = validate(build_config("smoke", {**folder, "data.root": str(tmp_path / "other")}))
    with pytest.raises(ValueError, match=r"^queue.size: 8 must be below the training-set size 6 "):
        check_data(small)
    for over, message in (({"data.val_size": 6}, "data.val_size: 6 holds out every training image"),
                          ({"moco.negatives": "in_batch", "optim.batch_size": 8},
                           "optim.batch_size: 8 is larger than the training set (6 images)"),
                          ({"moco.negatives": "memory_bank", "bank.negatives": 6},
                           "bank.negatives: 6 negatives per step must be below the training-set size 6")):
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            check_data(validate(small.replace(**over)))
    fitting = small.replace(**{"queue.size": 4})
    assert check_data(fitting) is fitting and fitting.train_size == 6


def test_k_against_subset_size():
    with pytest.raises(ValueError, match="below the training-set size 8192"):
        build_config("smoke", {"queue.size": 8192, "optim.batch_size": 128})


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(ValueError, match=r"run.preset: unknown preset 'nope'.*smoke"):
        load_preset("nope")


@pytest.mark.parametrize("item, match", [
    ("moco.mm=0.9", r"unknown config key 'moco.mm'.*'m'"),
    ("mocco.m=0.9", "unknown config key 'mocco.m'"),
    ("moco.m", "expected section.key=value"),
    ("queue.size=abc", "queue.size: 'abc' is not a valid int"),
    ("queue.size=10.5", "queue.size: 10.5 is not a valid int"),
    ("run.log_models=maybe", r"run.log_models: 'maybe' is not a bool \(true or false\)"),
])
def test_bad_overrides(item, match):
    with pytest.raises(ValueError, match=match):
        build_config("smoke", parse_overrides([item]))


def test_sync_bn_and_shuffle_need_ranks():
    with pytest.raises(ValueError, match="moco.bn: 'shuffle' needs run.num_workers >= 2"):
        build_config("smoke", {"moco.bn": "shuffle"})
    with pytest.raises(ValueError, match="moco.bn: 'sync' .* needs run.num_workers >= 2"):
        build_config("smoke", {"moco.bn": "sync"})
    assert build_config("smoke", {"moco.bn": "sync", "run.num_workers": 2}).moco.bn == "sync"  # CPU too (gloo)


def test_validate_returns_config_and_defaults_are_valid():
    cfg = Config()
    assert validate(cfg) is cfg


def test_v3_reads_no_queue_and_a_field_at_its_default_leaves_run_names_alone(monkeypatch):
    """v3 has no queue, so queue.size is not held to the queue's rules. Derived names and fingerprints read the
    fields that differ from their defaults: a field every config holds at its default (one added since a run
    started) leaves them as they were, and any other value of it names another run."""
    from mocolab.config import Config, fingerprint

    cfg = build_config("cpu-quick", {"moco.version": "v3", "queue.size": 1000, "model.backbone": "vit_tiny"})
    assert cfg.run_name.startswith("cpu-quick-v3-m0.999-s0-") and cfg.image_size == 28 and cfg.is_vit
    pins = {"cpu-quick": ("cpu-quick-m0.999-s0-659c040a", "cb8b14e4ca960ea9"),
            "smoke": ("smoke-m0.99-s0-47159235", "adf581ca1b431b25")}
    for preset, pin in pins.items():
        cfg = build_config(preset)
        assert (cfg.run_name, fingerprint(cfg)) == pin
    flatten = Config.flatten
    monkeypatch.setattr(Config, "flatten", lambda self: {**flatten(self), "moco.later": 1})  # its default: 1
    for preset, pin in pins.items():
        cfg = build_config(preset)
        assert (cfg.run_name, fingerprint(cfg)) == pin
    monkeypatch.setattr(Config, "flatten",  # smoke's m: moco.later = 2, not its default
                        lambda self: {**flatten(self), "moco.later": 2 if self.moco.m == 0.99 else 1})
    smoke = build_config("smoke")
    assert smoke.run_name != pins["smoke"][0] and fingerprint(smoke) != pins["smoke"][1]
    monkeypatch.undo()
    assert build_config("smoke", {"optim.name": "adamw"}).run_name != pins["smoke"][0]
    scaled = build_config("smoke", {"optim.scale_lr": True, "optim.lr": 0.1})
    assert scaled.effective_lr == pytest.approx(0.1 * 128 / 256)


def test_negative_sources_read_only_their_own_fields_and_name_their_runs():
    """A memory bank or in-batch negatives read no queue (queue.size need not divide anything); the bank's K
    defaults to the queue's, and a non-queue source names its runs."""
    bank = build_config("cpu-quick", {"moco.negatives": "memory_bank", "queue.size": 16384})
    assert bank.bank_negatives == 16384 and not bank.uses_queue
    assert bank.run_name.startswith("cpu-quick-bank-m0.999-s0-")
    inb = build_config("cpu-quick", {"moco.negatives": "in_batch", "queue.size": 1000})
    assert inb.run_name.startswith("cpu-quick-inbatch-") and not inb.uses_queue
    assert build_config("cpu-quick", {"moco.negatives": "memory_bank", "bank.negatives": 4096}).bank_negatives == 4096
    rand = build_config("cpu-quick", {"queue.policy": "random"})
    assert rand.uses_queue and rand.run_name != build_config("cpu-quick").run_name
    # one rank: the layouts are one queue, so random replacement is allowed with either
    build_config("cpu-quick", {"queue.policy": "random", "queue.layout": "sharded"})


def test_a_string_field_may_hold_the_word_none_and_other_fields_may_not_be_emptied():
    """``augment.preset=none`` (no augmentation) is a preset's name, not an empty value: the augmentation study's
    ``aug=none`` trial and ``--set augment.preset=none`` build; an emptied number or required field is refused."""
    assert build_config("smoke", {"augment.preset": "none"}).augment.preset == "none"
    assert build_config("smoke", ["augment.preset=none"]).augment.preset == "none"
    assert build_config("smoke", ["eval.knn_test=none"]).eval.knn_test is None  # optional: none means unset
    for bad in ({"optim.lr": "none"}, {"augment.preset": None}):
        with pytest.raises(ValueError, match=r"may not be empty"):
            build_config("smoke", bad)


# Numeric fields that take a huge value on purpose: counts capped by what exists, lengths a user may ask for.
TAKES_HUGE = {
    "data.subset": "capped at the set's size", "data.memory_budget_mb": "a budget, not an allocation",
    "optim.epochs": "a long run", "optim.max_steps": "a long run", "optim.lr": "recorded as diverged if too high",
    "eval.knn_k": "capped at the bank", "eval.knn_k_small": "capped at the bank",
    "eval.knn_every": "never within the run", "eval.knn_bank": "capped at the set",
    "eval.knn_test": "capped at the set", "eval.linear_train": "capped at the set",
    "eval.linear_test": "capped at the set",
    "eval.drift_probes": "capped at the dictionary's slots", "run.checkpoint_every": "never within the run",
    "run.keep_checkpoints": "keeps all", "run.step_metrics_every": "never within the run",
    "eval.feature_map_images": "capped at the test split",
    "run.max_failures": "retries that many times", "run.fault_step": "never reached",
    "data.image_size": "refused later by the memory check", "queue.size": "refused against the set size",
    "bank.negatives": "refused against the bank size", "vit.depth": "a deep model",
    "data.stream_tasks": "capped at 64",
}
# ... and zero: a field that is off at 0, or whose 0 is a value
TAKES_ZERO = {"run.step_metrics_every", "eval.feature_map_images",
              "augment.jitter", "model.hidden", "moco.m", "bank.negatives", "optim.warmup_epochs", "optim.momentum",
              "optim.weight_decay", "eval.knn_every", "eval.linear_wd", "eval.drift_probes", "run.seed",
              "eval.knn_k_small", "eval.low_label_wd",
              "run.num_workers", "run.threads", "run.gpus_per_worker", "run.checkpoint_every",
              "run.system_metrics_s", "run.max_failures", "run.fault_step", "vit.patch_size", "vit.depth",
              "vit.heads", "vit.mlp_ratio", "bank.momentum", "queue.size", "data.max_bad_fraction",
              "data.val_size", "data.store_short_side", "data.store_max_side"}  # 0: derived from data.image_size


@pytest.mark.parametrize("preset", list_presets())
def test_every_numeric_field_refuses_what_it_cannot_use_naming_itself(preset):
    """Zero, negative, huge, non-integer and non-finite values of every numeric field of every preset:
    each is taken on purpose (the lists above say why) or refused with a ValueError that names the field."""
    try:
        base = {}
        flat = build_config(preset).flatten()
    except ValueError:  # the ImageNet presets read a folder of the user's: their numbers on generated data
        base = {"data.name": "synthetic", "data.synthetic_size": 200_000, "data.loader": "memory"}
        flat = build_config(preset, base).flatten()
    numeric = {k: v for k, v in flat.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert len(numeric) > 30
    surprises = []
    for key, value in numeric.items():
        trials = {"zero": 0, "negative": -1, "huge": 10**12}
        trials.update({"non-integer": 2.5} if isinstance(value, int) else {"nan": math.nan, "inf": math.inf})
        for kind, bad in trials.items():
            try:
                build_config(preset, {**base, key: bad})
            except ValueError as err:
                if not str(err).startswith(key.split(".")[0]) and key not in str(err):
                    surprises.append(f"{key}={bad!r}: the error does not name the field: {err}")
                continue
            except Exception as err:  # noqa: BLE001 - what this test exists to catch
                surprises.append(f"{key}={bad!r}: {type(err).__name__}: {err}")
                continue
            if kind in ("negative", "non-integer", "nan", "inf") or (kind == "huge" and key not in TAKES_HUGE) \
                    or (kind == "zero" and key not in TAKES_ZERO):
                surprises.append(f"{key}={bad!r} ({kind}) was accepted")
    assert not surprises, "\n".join(surprises)
