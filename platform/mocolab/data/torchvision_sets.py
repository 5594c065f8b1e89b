"""CIFAR-10 and STL-10 through torchvision, found in a folder or downloaded into it when asked to."""

from __future__ import annotations

import functools

import numpy as np
import torch

from mocolab.data.image_dataset import ImageDataset

__all__ = ["load_torchvision_set"]


_TORCHVISION_HOWTO: dict[str, str] = {
    "cifar10": (
        "put the extracted `cifar-10-batches-py/` folder (from cifar-10-python.tar.gz, "
        "https://www.cs.toronto.edu/~kriz/cifar.html) in {root}"
    ),
    "stl10": (
        "put the extracted `stl10_binary/` folder (from stl10_binary.tar.gz, "
        "https://cs.stanford.edu/~acoates/stl10/) in {root}"
    ),
}


@functools.lru_cache(maxsize=None)
def load_torchvision_set(name: str, split: str, root: str, download: bool) -> ImageDataset:
    import torchvision.datasets as tvd

    try:
        if name == "cifar10":
            ds = tvd.CIFAR10(root, train=(split == "train"), download=download)
            images = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2).contiguous()
            labels = torch.as_tensor(np.asarray(ds.targets, dtype=np.int64))
            classes = 10
        else:  # stl10: "train" is the labelled 5k split; "unlabeled" is never used here
            ds = tvd.STL10(root, split=split, download=download)
            images = torch.from_numpy(np.ascontiguousarray(ds.data)).contiguous()
            labels = torch.as_tensor(np.asarray(ds.labels, dtype=np.int64))
            classes = 10
    except Exception as exc:  # noqa: BLE001 - missing files and failed downloads alike
        reason = (
            "downloading was disabled (download=False)"
            if not download
            else "this machine could not download it"
        )
        raise RuntimeError(
            f"{name} {split} split not found under {root} and {reason} ({exc!r}). Provide it: "
            + _TORCHVISION_HOWTO[name].format(root=root)
            + ", or set $MOCOLAB_DATA / data.root to a folder that holds it, or run once with "
            "download enabled where the internet is reachable and copy the folder here."
        ) from exc
    return ImageDataset(images=images, labels=labels, classes=classes, name=name)
