"""A config's splits of a data set in memory: the validation split held out of the training set, then
``data.subset`` taken from what is left (the streaming loader takes the same images: ``data.sources``)."""

from __future__ import annotations

import dataclasses

import torch

from mocolab.config import Config
from mocolab.data import sets as datasets
from mocolab.data.sources import STREAMABLE, subset_positions, validation_positions


def _subset(ds: datasets.ImageDataset, n: int | None) -> datasets.ImageDataset:
    """``data.subset``: the first n of a set stored shuffled; a fixed random n (in stored order) of one
    stored in class order (imagefolder, parquet), as the streaming loader takes."""
    if n is None or n >= len(ds):
        return ds
    idx = torch.from_numpy(subset_positions(len(ds), n)) if ds.name in STREAMABLE else slice(0, n)
    return dataclasses.replace(ds, images=ds.images[idx], labels=ds.labels[idx])


def hold_out(ds: datasets.ImageDataset, n: int) -> tuple[datasets.ImageDataset, datasets.ImageDataset | None]:
    """(training set, validation split): ``data.val_size`` images held out before any subset is taken."""
    if not n:
        return ds, None
    held = torch.from_numpy(validation_positions(len(ds), n))
    keep = torch.ones(len(ds), dtype=torch.bool)
    keep[held] = False

    def part(idx: torch.Tensor) -> datasets.ImageDataset:
        return dataclasses.replace(ds, images=ds.images[idx], labels=ds.labels[idx])

    return part(keep.nonzero().squeeze(1)), part(held)


def load_data(cfg: Config) -> tuple[datasets.ImageDataset, datasets.ImageDataset, datasets.ImageDataset | None]:
    """(train, test, validation split or None) as the config asks: the validation split is held out of the
    whole training set, then ``data.subset`` is taken from what is left."""
    d = cfg.data
    kwargs = dict(synthetic_size=d.synthetic_size, image_size=d.image_size, seed=cfg.run.seed,
                  store_short_side=d.store_short_side, store_max_side=d.store_max_side)
    train, val = hold_out(datasets.load_dataset(d.name, "train", d.root, **kwargs), d.val_size)
    test = datasets.load_dataset(d.name, "test", d.root, **kwargs)
    return _subset(train, d.subset), test, val
