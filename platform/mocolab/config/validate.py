"""Every mistake in a config, caught before data is loaded or a process starts: a ``ValueError`` that names
the field, the value and what is allowed.  The checks read the config alone; whether the data it names is
on this disk is ``data.roots.check_data``'s question."""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

from mocolab.config.choices import (CHOICES, MIN_IMAGE_SIZE, STREAMABLE, VIT_SIZES, WITHOUT_KEY_ENCODER,
                                    named_backbone)
from mocolab.config.schema import Config


def _choice(name: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name}: unknown value {value!r}; choose one of {list(allowed)}")


def _range(name: str, value: float, lo: float | None = None, hi: float | None = None, *,
           lo_open: bool = False, hi_open: bool = False, allowed: str | None = None) -> None:
    # No field of a config means anything at infinity (or NaN): a non-finite number is always out of range.
    bad = isinstance(value, float) and not math.isfinite(value)
    if lo is not None:
        bad |= value <= lo if lo_open else value < lo
    if hi is not None:
        bad |= value >= hi if hi_open else value > hi
    if bad:
        if allowed is None:
            left = "(" if lo_open else "["
            right = ")" if hi_open else "]"
            allowed = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
        raise ValueError(f"{name}: {value!r} is out of range; allowed {allowed}")


def _check_store_sides(cfg: Config) -> None:
    """``data.store_short_side`` / ``store_max_side``: an indexed set's stored images hold the crops and the
    evaluation's centre crop at the training size, so the short side is at least that; the cap at least the
    short side."""
    d = cfg.data
    given = [f"data.{key}" for key in ("store_short_side", "store_max_side") if getattr(d, key)]
    if given and d.name not in STREAMABLE:
        raise ValueError(f"{given[0]}: applies to {' and '.join(STREAMABLE)} sets, whose images are stored whole; "
                         f"{d.name!r} is stored at data.image_size: leave it 0")
    if d.name not in STREAMABLE:
        return
    size = cfg.image_size
    if d.store_short_side:
        _range("data.store_short_side", d.store_short_side, size, 4096,
               allowed=f"0 (derived) or [{size}, 4096]: at least the training size data.image_size={size}")
    short, _ = d.store_sides(size)
    if d.store_max_side:
        _range("data.store_max_side", d.store_max_side, short, 8192,
               allowed=f"0 (derived) or [{short}, 8192]: at least the stored short side {short}")


def validate(cfg: Config) -> Config:
    """Every check of the config alone: a function of its fields that reads no file and no environment, so it
    answers the same wherever it runs (a ``timm:NAME`` backbone also needs timm installed, a plugin's method
    its plugin: ``_check_method``). What needs the disk
    (the data is there, and a folder holds enough images) is ``data_root.check_data``, which every command runs
    where it uses the data, before any work."""
    d, a, mo, mc, q, o, e, r = cfg.data, cfg.augment, cfg.model, cfg.moco, cfg.queue, cfg.optim, cfg.eval, cfg.run
    flat = cfg.flatten()
    for key, allowed in CHOICES.items():
        if key == "model.backbone" and named_backbone(flat[key]):
            continue  # timm:NAME or tv:NAME: the library's own list of names (_check_named_backbone)
        _choice(key, flat[key], allowed)

    _range("moco.m", mc.m, 0.0, 1.0, hi_open=True, allowed="[0, 1)")
    if r.compile and e.online_probe:
        raise ValueError("run.compile: true with eval.online_probe: true; the online probe reads the backbone's "
                         "features through a hook that a compiled encoder does not call reliably. Allowed: "
                         "run.compile=true with --set eval.online_probe=false, or run.compile=false")
    # tau below 1e-3 puts logits of 1/tau beyond what a bf16 encoder's embeddings resolve; above 10 the
    # softmax is flat and nothing is learned.  lr has no useful upper bound (large-batch recipes scale it
    # with the batch; a diverging run is an outcome the platform records), only finiteness.
    _range("moco.tau", mc.tau, 1e-3, 10.0, allowed="[0.001, 10]")
    _range("optim.lr", o.lr, 0.0, lo_open=True, allowed="lr > 0 and finite")
    _range("optim.batch_size", o.batch_size, 2, allowed="batch_size >= 2")
    _range("optim.epochs", o.epochs, 1, allowed="epochs >= 1")
    if o.max_steps is not None:
        _range("optim.max_steps", o.max_steps, 1, allowed="max_steps >= 1 or None")
    _range("optim.momentum", o.momentum, 0.0, 1.0, hi_open=True)
    _range("optim.warmup_epochs", o.warmup_epochs, 0.0, float(o.epochs), hi_open=True,
           allowed=f"[0, optim.epochs={o.epochs})")
    # the data's size first: the ViT's patch checks divide it
    for key in ("subset", "image_size"):
        val = getattr(d, key)
        if val is not None:
            _range(f"data.{key}", val, 1)
    smallest = MIN_IMAGE_SIZE.get(cfg.model.backbone, 1)
    if d.image_size is not None and d.image_size < smallest:
        raise ValueError(f"data.image_size: {d.image_size} is below the {smallest} px model.backbone "
                         f"{cfg.model.backbone!r} accepts; allowed >= {smallest} (or another backbone)")
    _check_vit(cfg)
    _range("optim.weight_decay", o.weight_decay, 0.0, 1.0)
    _range("augment.crop_min", a.crop_min, 0.0, 1.0, lo_open=True, allowed="(0, 1]")
    _range("augment.jitter", a.jitter, 0.0, 1.0)
    _range("augment.blur_sigma_max", a.blur_sigma_max, 0.1, 100.0)
    # Upper bounds where a larger value can only fail later (an allocation, a thread pool, a seed stream):
    # past them the error is this one line, not a traceback minutes in.
    _range("model.width", mo.width, 1, 8192)
    _range("model.dim", mo.dim, 1, 65536)
    _range("model.hidden", mo.hidden, 0, 65536)
    _range("eval.knn_k", e.knn_k, 1)
    _range("eval.knn_t", e.knn_t, 0.0, 100.0, lo_open=True)  # any t > 0: the kNN weights are computed stably
    _range("eval.knn_every", e.knn_every, 0)
    _range("eval.linear_steps", e.linear_steps, 1, 100_000)
    _range("eval.linear_wd", e.linear_wd, 0.0, 100.0)
    _range("eval.knn_k_small", e.knn_k_small, 0)
    for fraction in e.low_label:
        _range("eval.low_label_fractions", fraction, 0.0, 1.0, lo_open=True, hi_open=True, allowed="each in (0, 1)")
    if len(set(e.low_label)) != len(e.low_label):
        raise ValueError(f"eval.low_label_fractions: {e.low_label_fractions!r} names a fraction twice")
    _range("eval.low_label_draws", e.low_label_draws, 1, 100)
    _range("eval.low_label_steps", e.low_label_steps, 1, 100_000)
    _range("eval.low_label_wd", e.low_label_wd, 0.0, 100.0)
    _range("run.num_workers", r.num_workers, 0)
    _range("run.threads", r.threads, 0, 1024)
    _range("run.seed", r.seed, 0, 2**32 - 1)
    _range("run.cpus_per_worker", r.cpus_per_worker, 0.0, 4096.0, lo_open=True, allowed="(0, 4096]")
    if r.name is not None:
        check_name("run.name", r.name)
    # a rank computes on one device: a second GPU per worker would be held and never used
    _range("run.gpus_per_worker", r.gpus_per_worker, 0.0, 1.0,
           allowed="[0, 1]: one rank computes on one GPU (a fraction shares one); more GPUs are more workers, "
                   "run.num_workers")
    _range("run.collective_timeout_s", r.collective_timeout_s, 1.0, 7 * 86400.0)
    _range("run.checkpoint_every", r.checkpoint_every, 0)
    _range("run.keep_checkpoints", r.keep_checkpoints, 1)
    _range("run.system_metrics_s", r.system_metrics_s, 0, 86400)
    _range("run.step_metrics_every", r.step_metrics_every, 0, allowed="an integer >= 0 (0: at most 250 points a run)")
    _range("run.max_failures", r.max_failures, 0)
    _range("run.fault_step", r.fault_step, 0)
    _range("data.synthetic_size", d.synthetic_size, 2, 1_000_000)
    _range("data.memory_budget_mb", d.memory_budget_mb, 1)
    _range("data.stream_tasks", d.stream_tasks, 1, 64)
    _range("data.max_bad_fraction", d.max_bad_fraction, 0.0, 1.0)
    _range("data.val_size", d.val_size, 0, 10_000_000)
    _check_store_sides(cfg)
    if d.name == "imagefolder" and not d.root:
        raise ValueError("data.root: imagefolder needs a folder path (root/train/<class>/*.jpg)")
    if d.name == "parquet" and not d.root:
        raise ValueError("data.root: parquet needs a folder path (root/train/*.parquet, root/val/*.parquet)")
    if d.loader == "stream" and d.name not in STREAMABLE:
        raise ValueError(f"data.loader: 'stream' reads {' or '.join(STREAMABLE)} sets, not {d.name!r} "
                         f"(which is decoded into memory): use data.loader=memory or auto")
    for key in ("knn_bank", "knn_test", "linear_train", "linear_test"):
        val = getattr(e, key)
        if val is not None:
            _range(f"eval.{key}", val, 1)

    # checked even where the method does not read them (v3 has no queue, plain BN no groups): a nonsense
    # value in a config is refused, not kept until someone switches the method
    _range("queue.size", q.size, 0)
    _range("moco.bn_groups", mc.bn_groups, 1, 4096)
    ws = cfg.world_size
    if o.batch_size % ws:
        raise ValueError(f"optim.batch_size: {o.batch_size} must be a multiple of run.num_workers={ws}")
    if mc.bn in ("split", "groups"):
        g = mc.bn_groups
        _range("moco.bn_groups", g, 1)
        if cfg.per_rank_batch % g:
            raise ValueError(
                f"moco.bn_groups: {g} must divide the per-rank batch {cfg.per_rank_batch} "
                f"(optim.batch_size={o.batch_size} / {ws} workers)")
        if cfg.per_rank_batch // g < 2:
            raise ValueError(f"moco.bn_groups: {g} groups leave fewer than 2 samples per group "
                             f"in a per-rank batch of {cfg.per_rank_batch}")
    if mc.bn == "shuffle" and ws < 2:
        raise ValueError("moco.bn: 'shuffle' needs run.num_workers >= 2 ranks to shuffle across; "
                         "in one process use 'split' (virtual groups + in-process shuffle)")
    if mc.bn == "sync" and ws < 2:
        raise ValueError("moco.bn: 'sync' (batch-norm over the global batch) needs run.num_workers >= 2 ranks; "
                         "in one process use 'split' or 'plain'")

    _check_method_fields(cfg)
    _check_negatives(cfg)
    _check_symmetric(cfg)
    if cfg.uses_queue:  # the queue's own bounds (v3, a memory bank and in-batch read no queue.size)
        if q.size <= 0:
            raise ValueError(f"queue.size: {q.size} must be > 0")
        if q.size % o.batch_size:
            raise ValueError(f"queue.size: {q.size} must be a multiple of the global batch "
                             f"optim.batch_size={o.batch_size} (so the FIFO ring wraps on a batch boundary)")
    check_train_size(cfg, cfg.known_train_size)
    _check_named_backbone(cfg)  # after the checks without imports: it may load timm or torchvision (and torch)
    _check_method(cfg)  # last: it may import a plugin (and torch)
    return cfg


def check_train_size(cfg: Config, n: int | None) -> None:
    """The fields bounded by the training set's size ``n`` (images a run trains on; None: unknown, nothing
    checked): ``validate`` checks them where the config gives n, ``data_root.check_data`` where the disk does."""
    if n is None:
        return
    d, q, o = cfg.data, cfg.queue, cfg.optim
    if d.val_size and n == 0:
        raise ValueError(f"data.val_size: {d.val_size} holds out every training image; allowed: fewer than the "
                         f"training set")
    if cfg.moco.negatives == "memory_bank" and cfg.bank_negatives >= n:
        raise ValueError(f"bank.negatives: {cfg.bank_negatives} negatives per step must be below the "
                         f"training-set size {n}" + (" (bank.negatives=0 takes queue.size)" if not cfg.bank.negatives
                                                     else ""))
    if cfg.uses_queue and q.size >= n:
        raise ValueError(f"queue.size: {q.size} must be below the training-set size {n} "
                         f"(else an image's own older key is one of its negatives)")
    if o.batch_size > n:
        raise ValueError(f"optim.batch_size: {o.batch_size} is larger than the training set ({n} images)")


# method.name: an installed plugin's name (its fields are method.<name>.*, so no dot in it), or a module:Class path
_PLUGIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,99}")
_PLUGIN_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def _check_method_fields(cfg: Config) -> None:
    """``method.name``'s form, and the plugin's own fields named for it (the plugin itself: ``_check_method``)."""
    me = cfg.method
    if me.name and not (_PLUGIN_NAME.fullmatch(me.name) or _PLUGIN_PATH.fullmatch(me.name)):
        raise ValueError(f"method.name: {me.name!r} is neither a plugin's name (letters, digits, _ and -, starting "
                         f"with a letter) nor a module:Class path (e.g. my_methods:BYOL); empty: the built-in "
                         f"methods (moco.version, moco.negatives)")
    for key in me.options:
        plugin, _, name = key.partition(".")
        if not name.isidentifier():
            raise ValueError(f"method.{key}: a plugin's field is method.<plugin>.<field> "
                             f"(e.g. method.byol.symmetric)")
        if not me.name:
            raise ValueError(f"method.{key}: a field of the plugin {plugin!r}, and method.name is empty (the "
                             f"built-in methods, which take no method.* fields)")
        if plugin != me.namespace:
            raise ValueError(f"method.{key}: a field of the plugin {plugin!r}, and method.name is {me.name!r} "
                             f"(whose fields are method.{me.namespace}.*)")
    if me.name and cfg.moco.negatives != "queue":
        raise ValueError(f"moco.negatives: {cfg.moco.negatives!r} picks a built-in method, and method.name="
                         f"{me.name} picks the method; leave moco.negatives at 'queue' (its default)")


def _check_method(cfg: Config) -> None:
    """A plugin's method (``method.name``): found, loaded, checked against the ``Method`` protocol, its own
    fields read into the fields it declares (``method.options`` then holds them all, typed, the unset at their
    defaults) and its own checks of the config passed (method/plugins.py).
    It reads the environment (the installed plugins, Python's path) and imports code: only for a config that
    names a plugin, so a config of the built-in methods is still checked without torch."""
    if cfg.method.name:
        from mocolab.method.plugins import check_method

        check_method(cfg)


def _check_negatives(cfg: Config) -> None:
    mc, q, b = cfg.moco, cfg.queue, cfg.bank
    _range("eval.drift_probes", cfg.eval.drift_probes, 0, allowed="an integer >= 0 (0: no key-drift probes)")
    if cfg.eval.feature_map_images:  # a t-SNE of fewer points than its perplexity's neighbourhoods draws nothing
        _range("eval.feature_map_images", cfg.eval.feature_map_images, 50,
               allowed="0 (no feature map) or an integer >= 50")
    if mc.negatives != "queue" and mc.version == "v3":
        raise ValueError(f"moco.negatives: {mc.negatives!r} applies to the v1/v2 algorithm; moco.version=v3 "
                         f"takes its negatives from the global batch (use moco.version=v2)")
    if mc.negatives in WITHOUT_KEY_ENCODER and mc.bn == "shuffle":
        raise ValueError(f"moco.bn: 'shuffle' shuffles the key encoder's batch, and moco.negatives="
                         f"{mc.negatives} has no key encoder; use split, plain or sync")
    if q.policy != "fifo" and q.layout == "sharded" and cfg.world_size > 1:
        raise ValueError(f"queue.policy: {q.policy!r} needs queue.layout=replicated with run.num_workers > 1 "
                         f"(every rank draws the same slots); the sharded layout is FIFO only")
    if not cfg.uses_queue and q.policy != "fifo":
        raise ValueError(f"queue.policy: {q.policy!r} applies to MoCo's queue, and there is none "
                         + (f"(method.name={cfg.method.name})" if cfg.method.name else
                            f"(moco.version={mc.version}, moco.negatives={mc.negatives})"))
    if mc.negatives != "memory_bank":
        changed = [k for k, default in (("negatives", 0), ("momentum", 0.5)) if getattr(b, k) != default]
        if changed:
            raise ValueError(f"bank.{changed[0]}: applies to moco.negatives=memory_bank only, and "
                             f"moco.negatives is {mc.negatives!r}")
        return
    _range("bank.momentum", b.momentum, 0.0, 1.0, hi_open=True, allowed="[0, 1)")
    _range("bank.negatives", b.negatives, 0, allowed="0 (queue.size) or an integer >= 1")


def _check_symmetric(cfg: Config) -> None:
    """``moco.symmetric`` makes MoCo's queue arm (v1/v2) symmetric; every other method refuses it."""
    mc = cfg.moco
    if not mc.symmetric:
        return
    if cfg.method.name:
        raise ValueError(f"moco.symmetric: applies to MoCo's queue (moco.negatives=queue), and method.name="
                         f"{cfg.method.name} names another method; leave moco.symmetric false (a plugin's own "
                         f"fields, method.{cfg.method.namespace}.*, say how its loss is built)")
    if mc.version == "v3":
        raise ValueError("moco.symmetric: moco.version=v3's loss is symmetric always; moco.symmetric=true applies "
                         "to the queue of v1/v2 (leave it false with v3)")
    if mc.negatives == "batch_keys":
        raise ValueError("moco.symmetric: moco.negatives=batch_keys is symmetric already; "
                         "moco.symmetric=true applies to moco.negatives=queue")
    if mc.negatives == "in_batch":
        raise ValueError("moco.symmetric: moco.negatives=in_batch (NT-Xent) is symmetric already; "
                         "moco.symmetric=true applies to moco.negatives=queue")
    if mc.negatives != "queue":
        raise ValueError(f"moco.symmetric: not supported with moco.negatives={mc.negatives}; "
                         f"moco.symmetric=true applies to moco.negatives=queue")


def _check_named_backbone(cfg: Config) -> None:
    """``timm:NAME`` / ``tv:NAME``: a model the library has (else the closest names), a family adapted to the
    image size, timm installed. It loads the library (timm or torchvision, and torch): only for such a name, so
    a config of the built-in backbones is still checked without torch."""
    if named_backbone(cfg.model.backbone):
        from mocolab.models.named import check_named

        check_named(cfg.model.backbone, cfg.image_size)


def _check_vit(cfg: Config) -> None:
    v = cfg.vit
    _range("vit.patch_size", v.patch_size, 0, allowed="0 (sized for the data) or a divisor of the image size")
    _range("vit.depth", v.depth, 0, 64, allowed="0 (the named size's 12) to 64")
    if not cfg.is_vit:
        changed = [k for k, default in (("patch_size", 0), ("depth", 0), ("freeze_patch_embed", False))
                   if getattr(v, k) != default]
        if changed:
            raise ValueError(f"vit.{changed[0]}: applies to the ViT backbones {list(VIT_SIZES)} only, and "
                             f"model.backbone is {cfg.model.backbone!r}")
        return
    size = cfg.image_size
    if v.patch_size and size % v.patch_size:
        divisors = [p for p in range(2, size // 2 + 1) if size % p == 0]
        raise ValueError(f"vit.patch_size: {v.patch_size} does not divide the image size {size}; "
                         f"allowed 0 (sized for the data) or one of {divisors}")


NAME_RULE = ("1 to 200 characters from letters, digits and . _ = -, starting with a letter, digit or _ "
             "(it names a folder and an MLflow filter value)")


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._=-]{0,199}")


def check_name(field: str, name: str) -> str:
    """Run and sweep names become folder names and MLflow filter values: a safe set, nothing that escapes."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{field}: {name!r} is not a valid name; use {NAME_RULE}")
    return name
