"""Is the data a config names on this disk, and big enough for it: the checks that read the file system.

``config.validate`` answers from the config alone. What it cannot know is asked here, where the data is
used and before any work starts: ``mocolab train`` and ``train.fit``, a sweep's ``check_sweep`` (before its
parent MLflow run or Ray), a study's own sizing, ``mocolab baselines`` and ``mocolab eval``. A bad
``data.root`` (or ``$MOCOLAB_DATA``) is refused naming the field, and a folder of images (imagefolder,
parquet) is counted without decoding, so that ``queue.size``, ``optim.batch_size``, ``bank.negatives`` and
``data.val_size`` are held to its real size as ``validate`` holds them to a known set's. Where no folder is
named, a set is found or downloaded under ``default_data_root``.
"""

from __future__ import annotations

import os
from pathlib import Path

from mocolab.config.choices import STREAMABLE
from mocolab.config import Config, DataConfig, check_train_size


def default_data_root() -> Path:
    """One place for every downloaded or user-provided data set, overridable per machine.

    ``$MOCOLAB_DATA`` lets a cluster point all workers at shared storage and a
    laptop at wherever the files already are, without touching configs.
    """
    env = os.environ.get("MOCOLAB_DATA", "").strip()
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/mocolab").expanduser()


def check_data(cfg: Config) -> Config:
    """``cfg``, once its data is there and holds enough images for it; else a ValueError naming the field."""
    check_root(cfg.data)
    if cfg.data.name in STREAMABLE:
        check_train_size(cfg, cfg.train_size)
    return cfg


def check_root(d: DataConfig) -> None:
    """``data.root`` (else ``$MOCOLAB_DATA``) is a readable folder; a folder of images has its splits.

    A downloadable set may name a root that does not exist yet (the download makes it); one that exists
    must be a folder this process can read.
    """
    root = d.root
    if root is None:
        env = os.environ.get("MOCOLAB_DATA")
        if env and Path(env).exists() and not (Path(env).is_dir() and os.access(env, os.R_OK | os.X_OK)):
            raise ValueError(f"data.root: $MOCOLAB_DATA={env!r} is not a readable folder")
        return
    p = Path(root).expanduser()
    if d.name in STREAMABLE and not p.exists():
        raise ValueError(f"data.root: {root!r} does not exist")
    if p.exists() and not (p.is_dir() and os.access(p, os.R_OK | os.X_OK)):
        raise ValueError(f"data.root: {root!r} is not a readable folder")
    if d.name in STREAMABLE:
        missing = [name for name, options in (("train/", ("train",)), ("test/ or val/", ("test", "val")))
                   if not any((p / o).is_dir() for o in options)]
        if missing:
            layout = ("root/train/<class>/*.jpg and root/val/<class>/*.jpg" if d.name == "imagefolder"
                      else "root/train/*.parquet and root/val/*.parquet")
            raise ValueError(f"data.root: {d.name} {root!r} has no {' and no '.join(missing)} folder "
                             f"(expected {layout})")
