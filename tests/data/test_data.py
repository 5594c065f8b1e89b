"""Tests for mocolab.data.sets: loading, IDX parsing, data-root rules, batching across ranks."""

from __future__ import annotations

import gzip
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from mocolab.data import fashion_mnist as data  # SYSTEM_FASHION_MNIST_DIRS, pointed elsewhere
from mocolab.data.sets import (DATASETS, FASHION_MNIST_FILES, ImageDataset, batches_per_epoch, check_readable,
                               default_data_root, fashion_mnist_dir, iterate_batches, load_dataset, read_idx)

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")


# --------------------------------------------------------------------------- helpers


def _idx_bytes(arr: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    dtype = {0x08: "u1", 0x0C: ">i4"}[type_code]
    return header + arr.astype(dtype).tobytes()


def _write_idx(path: Path, arr: np.ndarray, *, gz: bool, type_code: int = 0x08) -> Path:
    payload = _idx_bytes(arr, type_code)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def _write_tiny_fashion_mnist(folder: Path, *, gz: bool = True, n_train: int = 12, n_test: int = 5) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        img_stem, lbl_stem = FASHION_MNIST_FILES[split]
        _write_idx(folder / img_stem, images, gz=gz)
        _write_idx(folder / lbl_stem, labels, gz=gz)
        arrays[split] = (images, labels)
    return arrays


def _dataset(n: int) -> ImageDataset:
    images = torch.arange(n, dtype=torch.int64).remainder(256).to(torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2)
    return ImageDataset(images=images.contiguous(), labels=torch.arange(n) % 10, classes=10, name="toy")


# --------------------------------------------------------------------------- fashion-mnist


def _installed_fashion_mnist() -> Path:
    """The real set wherever mocolab finds it ($MOCOLAB_DATA, Debian's folder, torchvision's download under the
    default data root): a machine that has it elsewhere than Debian's folder still runs these tests."""
    found = fashion_mnist_dir()
    if found is None:
        pytest.skip(f"Fashion-MNIST is in none of $MOCOLAB_DATA, {DEBIAN_DIR} or {default_data_root()} (make data)")
    return found


def test_fashion_mnist_from_debian_dir_shapes_and_cache():
    root = str(_installed_fashion_mnist())
    train = load_dataset("fashion-mnist", "train", root)
    test = load_dataset("fashion-mnist", "test", root)
    assert train.images.shape == (60000, 1, 28, 28)
    assert test.images.shape == (10000, 1, 28, 28)
    assert len(train) == 60000 and len(test) == 10000
    for ds in (train, test):
        assert ds.images.dtype == torch.uint8 and ds.images.is_contiguous()
        assert ds.labels.dtype == torch.int64
        assert ds.labels.min() == 0 and ds.labels.max() == 9
        assert torch.unique(ds.labels).tolist() == list(range(10))
        assert ds.classes == 10 and ds.name == "fashion-mnist"
    # Fashion-MNIST is balanced: 6000 per class in train, 1000 in test.
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    assert torch.bincount(test.labels).tolist() == [1000] * 10
    # Not a blank decode: real images have dark backgrounds and bright items.
    assert train.images[:100].float().mean() > 20 and train.images.max() == 255
    again = load_dataset("fashion-mnist", "train", root)
    assert again is train and again.images is train.images


def test_fashion_mnist_image_size_resizes_without_touching_cache():
    root = str(_installed_fashion_mnist())
    small = load_dataset("fashion-mnist", "test", root, image_size=16)
    assert small.images.shape == (10000, 1, 16, 16) and small.images.dtype == torch.uint8
    assert load_dataset("fashion-mnist", "test", root).images.shape == (10000, 1, 28, 28)


# --------------------------------------------------------------------------- IDX parsing


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_roundtrip(tmp_path, gz):
    images = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    labels = np.array([7, 0, 9], dtype=np.uint8)
    ints = np.array([[-1, 2], [300000, -40]], dtype=np.int32)
    p_img = _write_idx(tmp_path / "img-idx3-ubyte", images, gz=gz)
    p_lbl = _write_idx(tmp_path / "lbl-idx1-ubyte", labels, gz=gz)
    p_int = _write_idx(tmp_path / "ints-idx2-int", ints, gz=gz, type_code=0x0C)
    np.testing.assert_array_equal(read_idx(p_img), images)
    np.testing.assert_array_equal(read_idx(p_lbl), labels)
    got = read_idx(p_int)
    np.testing.assert_array_equal(got, ints)
    assert got.dtype.byteorder in ("=", "|", "<")  # native order, usable by torch


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_corrupt_magic(tmp_path, gz):
    payload = bytearray(_idx_bytes(np.zeros((2, 3), dtype=np.uint8)))
    payload[0] = 0x12  # first two bytes of the magic must be zero
    path = tmp_path / ("bad.gz" if gz else "bad")
    path.write_bytes(gzip.compress(bytes(payload)) if gz else bytes(payload))
    with pytest.raises(ValueError, match="magic"):
        read_idx(path)
    payload[0] = 0
    payload[2] = 0x42  # unknown type code
    path.write_bytes(bytes(payload))
    with pytest.raises(ValueError, match="magic"):
        read_idx(path)


def test_read_idx_truncated_and_bad_gzip(tmp_path):
    payload = _idx_bytes(np.zeros((4, 4), dtype=np.uint8))
    (tmp_path / "short").write_bytes(payload[:-3])
    with pytest.raises(ValueError, match="declares shape"):
        read_idx(tmp_path / "short")
    good_gz = gzip.compress(payload)
    (tmp_path / "broken.gz").write_bytes(good_gz[:12])
    with pytest.raises(ValueError, match="corrupt IDX"):
        read_idx(tmp_path / "broken.gz")


@pytest.mark.parametrize("gz", [True, False])
def test_load_fashion_mnist_from_tiny_idx_root(tmp_path, gz):
    arrays = _write_tiny_fashion_mnist(tmp_path / "fm", gz=gz)
    assert fashion_mnist_dir(str(tmp_path / "fm")) == tmp_path / "fm"
    ds = load_dataset("fashion-mnist", "train", str(tmp_path / "fm"), download=False)
    images, labels = arrays["train"]
    assert ds.images.shape == (12, 1, 28, 28) and ds.images.dtype == torch.uint8
    assert torch.equal(ds.images[:, 0], torch.from_numpy(images))
    assert ds.labels.tolist() == labels.tolist() and ds.labels.dtype == torch.int64
    assert len(load_dataset("fashion-mnist", "test", str(tmp_path / "fm"), download=False)) == 5


def test_load_fashion_mnist_corrupt_file_is_value_error(tmp_path):
    folder = tmp_path / "fm"
    _write_tiny_fashion_mnist(folder, gz=False)
    path = folder / "train-images-idx3-ubyte"
    raw = bytearray(path.read_bytes())
    raw[2] = 0x77
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="train-images-idx3-ubyte"):
        load_dataset("fashion-mnist", "train", str(folder), download=False)


def test_torchvision_layout_accepted(tmp_path):
    _write_tiny_fashion_mnist(tmp_path / "FashionMNIST" / "raw", gz=True)
    assert fashion_mnist_dir(str(tmp_path)) == tmp_path / "FashionMNIST" / "raw"
    assert len(load_dataset("fashion-mnist", "train", str(tmp_path), download=False)) == 12


def test_mocolab_data_env_is_honoured(tmp_path, monkeypatch):
    folder = tmp_path / "datahome"
    _write_tiny_fashion_mnist(folder, gz=True, n_train=20)
    monkeypatch.setenv("MOCOLAB_DATA", str(folder))
    assert default_data_root() == folder
    # Found before the Debian copy, without any root argument.
    assert fashion_mnist_dir() == folder
    ds = load_dataset("fashion-mnist", "train")
    assert ds.images.shape == (20, 1, 28, 28)


def test_default_data_root_without_env(monkeypatch):
    monkeypatch.delenv("MOCOLAB_DATA", raising=False)
    assert default_data_root() == Path.home() / ".cache" / "mocolab"


def test_fashion_mnist_not_found_message(tmp_path, monkeypatch):
    # Point every search location at empty folders; download=False keeps this offline.
    monkeypatch.setenv("MOCOLAB_DATA", str(tmp_path / "empty"))
    monkeypatch.setattr(data, "SYSTEM_FASHION_MNIST_DIRS", (str(tmp_path / "no-debian"),))
    assert fashion_mnist_dir() is None
    with pytest.raises(RuntimeError) as info:
        load_dataset("fashion-mnist", "train", download=False)
    msg = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "$MOCOLAB_DATA" in msg
    for pair in FASHION_MNIST_FILES.values():
        for stem in pair:
            assert f"{stem}.gz" in msg


# --------------------------------------------------------------------------- names, splits, roots


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as info:
        load_dataset("mnist", "train")
    msg = str(info.value)
    assert "data.name" in msg
    for name in DATASETS:
        assert name in msg
    with pytest.raises(ValueError, match="data.name"):
        check_readable("imagenet", None)


def test_bad_split():
    with pytest.raises(ValueError, match="train, test"):
        load_dataset("synthetic", "validation")


def test_imagefolder_missing_root(tmp_path):
    with pytest.raises(ValueError, match="data.root"):
        load_dataset("imagefolder", "train")
    with pytest.raises(ValueError, match="data.root"):
        load_dataset("imagefolder", "train", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="data.root"):
        check_readable("imagefolder", None)
    with pytest.raises(ValueError, match="data.root"):
        check_readable("imagefolder", str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="data.root"):
        check_readable("imagefolder", str(tmp_path / "file"))
    with pytest.raises(ValueError, match="data.root"):
        check_readable("cifar10", str(tmp_path / "file"))
    # A downloadable set may name a root that does not exist yet.
    check_readable("cifar10", str(tmp_path / "later"))
    check_readable("fashion-mnist", None)
    # An existing root with no class folders.
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match="data.root.*class folders"):
        load_dataset("imagefolder", "train", str(tmp_path / "empty"))


def _write_png_folder(root: Path) -> None:
    from torchvision.io import write_png

    g = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for cls, colour_channel in (("cat", 0), ("dog", 2)):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(3):
                if cls == "dog" and i == 2:
                    # grayscale, non-square: must come out 3-channel, square
                    img = torch.randint(0, 256, (1, 20, 30), generator=g, dtype=torch.uint8)
                else:
                    img = torch.zeros(3, 24, 24, dtype=torch.uint8)
                    img[colour_channel] = 200
                with warnings.catch_warnings():  # torchvision 0.29 deprecates its codecs
                    warnings.simplefilter("ignore", DeprecationWarning)
                    write_png(img, str(d / f"{i}.png"))


def test_imagefolder_loads_pngs(tmp_path):
    _write_png_folder(tmp_path)
    from mocolab.data.augment import centre_views

    train = load_dataset("imagefolder", "train", str(tmp_path), image_size=16)
    # stored whole (data/canvas.py): short side 18 (16 x 256/224), longer side at most 36, one header row
    assert train.images.shape == (6, 3, 19, 36) and train.images.dtype == torch.uint8 and train.view_size == 16
    assert train.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert train.classes == 2 and train.name == "imagefolder"
    views = centre_views(train.images, 16)
    assert views.shape == (6, 3, 16, 16)
    # Colour survives decoding and resizing: cats are red, dogs (colour ones) blue.
    assert (views[0, 0] == 200).all() and (views[0, 2] == 0).all()
    assert (views[3, 2] == 200).all() and (views[3, 0] == 0).all()
    # The grayscale image became three equal channels.
    assert torch.equal(views[5, 0], views[5, 1]) and torch.equal(views[5, 1], views[5, 2])
    # "test" falls back to val/ ; default size is 64 (stored at 73, capped at 146).
    test = load_dataset("imagefolder", "test", str(tmp_path))
    assert test.images.shape == (6, 3, 74, 146) and test.view_size == 64
    assert test.labels.tolist() == [0, 0, 0, 1, 1, 1]
    check_readable("imagefolder", str(tmp_path))


def test_validation_counts_the_images_the_loader_decodes(tmp_path):
    """One list of image suffixes: files the loader skips (.bmp, .ppm, .txt, hidden folders) are not counted."""
    from mocolab.config import build_config
    from mocolab.data.image_folders import IMAGE_EXTENSIONS, count_images

    _write_png_folder(tmp_path)
    for name in ("x.bmp", "y.ppm", "notes.txt"):
        (tmp_path / "train" / "cat" / name).write_bytes(b"not decoded")
    (tmp_path / "train" / ".cache").mkdir()
    (tmp_path / "train" / ".cache" / "z.png").write_bytes(b"ignored")
    assert ".bmp" not in IMAGE_EXTENSIONS and ".ppm" not in IMAGE_EXTENSIONS
    train = load_dataset("imagefolder", "train", str(tmp_path), image_size=16)
    assert count_images(str(tmp_path), "train") == len(train) == 6
    cfg = build_config("smoke", {"data.name": "imagefolder", "data.root": str(tmp_path), "data.subset": None,
                                 "optim.batch_size": 2, "queue.size": 4, "moco.bn": "plain"})
    assert cfg.train_size == 6
    assert count_images(str(tmp_path / "nope")) is None


def test_imagefolder_names_corrupt_files_and_converts_16_bit_and_palette(tmp_path):
    """Unreadable files are named and keep their rows (zeros, a negative label naming the file), so positions
    agree with the streaming index; 16-bit and palette images become correct 8-bit RGB."""
    import numpy as np
    from PIL import Image

    for split in ("train", "val"):
        d = tmp_path / split / "a"
        d.mkdir(parents=True)
        deep = np.full((8, 8), 128 * 257, dtype=np.uint16)  # 16-bit 32896 is 8-bit 128 exactly
        Image.fromarray(deep).save(d / "grey16.png")
        pal = Image.fromarray(np.zeros((8, 8), dtype=np.uint8), mode="P")
        pal.putpalette([10, 200, 30] + [0] * 765)  # index 0 is (10, 200, 30)
        pal.save(d / "palette.png")
        (d / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
        (d / "empty.jpg").write_bytes(b"")
    with pytest.warns(UserWarning, match=r": 2 unreadable file\(s\) \(train/a/broken.png, train/a/empty.jpg\)"):
        train = load_dataset("imagefolder", "train", str(tmp_path), image_size=8)
    assert len(train) == 4 and train.skipped == ("train/a/broken.png", "train/a/empty.jpg")
    assert train.labels.tolist() == [-1, -2, 0, 0] and train.unreadable_rows.tolist() == [True, True, False, False]
    assert train.unreadable_names() == ["train/a/broken.png", "train/a/empty.jpg"]
    assert not train.images[:2].any()
    from mocolab.data.augment import centre_views

    grey, palette = centre_views(train.images[2:], 8)
    assert (grey == 128).all()
    assert palette[:, 4, 4].tolist() == [10, 200, 30]


def test_imagefolder_missing_split_is_a_config_error(tmp_path):
    from mocolab.config import build_config
    from mocolab.data.roots import check_data

    _write_png_folder(tmp_path)
    import shutil

    shutil.rmtree(tmp_path / "val")
    with pytest.raises(ValueError, match=r"data.root: imagefolder .* has no test/ or val/ folder"):
        check_data(build_config("smoke", {"data.name": "imagefolder", "data.root": str(tmp_path),
                                          "optim.batch_size": 2, "queue.size": 4, "moco.bn": "plain"}))


def test_cifar10_offline_message(tmp_path):
    with pytest.raises(RuntimeError) as info:
        load_dataset("cifar10", "train", str(tmp_path), download=False)
    msg = str(info.value)
    assert "cifar-10-batches-py" in msg and "MOCOLAB_DATA" in msg and str(tmp_path) in msg


# --------------------------------------------------------------------------- synthetic


def test_synthetic_deterministic_and_seeded():
    a = load_dataset("synthetic", "train", synthetic_size=256, seed=3)
    b = load_dataset("synthetic", "train", synthetic_size=256, seed=3)
    c = load_dataset("synthetic", "train", synthetic_size=256, seed=4)
    t = load_dataset("synthetic", "test", synthetic_size=256, seed=3)
    assert a.images.shape == (256, 1, 28, 28) and a.images.dtype == torch.uint8
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, c.images)
    assert len(t) == 64
    assert not torch.equal(t.images, a.images[:64])
    assert torch.bincount(a.labels, minlength=10).tolist() == [26] * 6 + [25] * 4
    assert load_dataset("synthetic", "train", synthetic_size=16, image_size=32).images.shape == (16, 1, 32, 32)


def test_synthetic_does_not_touch_global_rng():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    load_dataset("synthetic", "train", synthetic_size=64)
    assert torch.equal(torch.rand(3), before)


def test_synthetic_is_learnable_by_raw_pixel_knn():
    train = load_dataset("synthetic", "train", synthetic_size=2048, seed=0)
    test = load_dataset("synthetic", "test", synthetic_size=2048, seed=0)
    xtr = train.images.flatten(1).float()
    xte = test.images.flatten(1).float()
    nearest = torch.cdist(xte, xtr).argmin(dim=1)
    accuracy = (train.labels[nearest] == test.labels).float().mean().item()
    assert accuracy > 0.5, accuracy  # chance is 0.1


# --------------------------------------------------------------------------- batching


def test_iterate_batches_single_rank_epoch():
    ds = _dataset(103)
    batches = list(iterate_batches(ds, 10, torch.Generator().manual_seed(0)))
    assert len(batches) == 10 == batches_per_epoch(103, 10)
    seen = torch.cat([idx for _, _, idx in batches])
    assert seen.numel() == 100 and torch.unique(seen).numel() == 100  # each index at most once
    for images, labels, idx in batches:
        assert images.shape == (10, 1, 2, 2) and images.dtype == torch.uint8
        assert torch.equal(labels, ds.labels[idx]) and torch.equal(images, ds.images[idx])
    # drop_last=False covers every index exactly once.
    full = torch.cat([idx for _, _, idx in iterate_batches(ds, 10, torch.Generator().manual_seed(0), drop_last=False)])
    assert sorted(full.tolist()) == list(range(103))


def test_iterate_batches_two_ranks_partition_global_batches():
    ds = _dataset(103)
    bs, world = 8, 2
    global_batches = [idx for _, _, idx in iterate_batches(ds, bs * world, torch.Generator().manual_seed(7))]
    per_rank = [
        [idx for _, _, idx in iterate_batches(ds, bs, torch.Generator().manual_seed(7), rank=r, world_size=world)]
        for r in range(world)
    ]
    assert len(per_rank[0]) == len(per_rank[1]) == len(global_batches) == batches_per_epoch(103, bs, world) == 6
    assert all(idx.numel() == bs for rank in per_rank for idx in rank)
    r0 = set(torch.cat(per_rank[0]).tolist())
    r1 = set(torch.cat(per_rank[1]).tolist())
    assert not r0 & r1
    assert r0 | r1 == set(torch.cat(global_batches).tolist())
    for step, g in enumerate(global_batches):
        assert torch.equal(torch.cat([per_rank[0][step], per_rank[1][step]]), g)


def test_iterate_batches_order_follows_generator():
    ds = _dataset(50)

    def order(gen: torch.Generator) -> list[int]:
        return torch.cat([idx for _, _, idx in iterate_batches(ds, 5, gen)]).tolist()

    assert order(torch.Generator().manual_seed(1)) == order(torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(1)
    first = order(g)
    second = order(g)  # the generator advanced: next epoch differs
    assert first != second
    assert order(torch.Generator().manual_seed(2)) != first


def test_batching_rejects_bad_arguments():
    ds = _dataset(10)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="batch_size"):
        list(iterate_batches(ds, 0, g))
    with pytest.raises(ValueError, match="rank"):
        list(iterate_batches(ds, 2, g, rank=2, world_size=2))
    with pytest.raises(ValueError, match="world_size"):
        batches_per_epoch(10, 2, 0)


def test_image_dataset_validates_layout():
    with pytest.raises(ValueError, match="uint8"):
        ImageDataset(images=torch.zeros(2, 1, 4, 4), labels=torch.zeros(2, dtype=torch.int64), classes=2, name="x")
    with pytest.raises(ValueError, match="labels"):
        ImageDataset(
            images=torch.zeros(2, 1, 4, 4, dtype=torch.uint8), labels=torch.zeros(3, dtype=torch.int64), classes=2,
            name="x"
        )


def _photo_like_jpeg(w: int = 500, h: int = 375, seed: int = 0) -> bytes:
    """Smooth shading, hard-edged shapes and a little grain: what the decoders are compared on."""
    import io

    from PIL import Image, ImageDraw

    gen = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (w + h) + 64], axis=-1)
    img = Image.fromarray((base + gen.normal(0, 4, base.shape)).clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x0, y0 = int(gen.integers(0, w - 40)), int(gen.integers(0, h - 40))
        draw.ellipse([x0, y0, x0 + int(gen.integers(20, 120)), y0 + int(gen.integers(20, 120))],
                     fill=tuple(int(c) for c in gen.integers(0, 256, 3)))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_reduced_scale_decode_stays_close_to_the_full_size_decode():
    """The loaders' decoder (DCT scaling, resize on uint8) against every pixel decoded and resized in float."""
    from mocolab.data.canvas import StoreLayout, stored_sizes
    from mocolab.data.image_index import dct_scale, decode_bytes, decode_bytes_full

    stored = [StoreLayout.derived(s).stored_size(375, 500) for s in (224, 160, 112, 64, 32)]
    assert stored[0] == (256, 341) and stored[3] == (73, 97)
    assert [dct_scale(500, 375, w, h) for h, w in stored] == [1, 2, 2, 4, 8]
    assert dct_scale(2000, 1500, 341, 256) == 4 and dct_scale(100, 80, 341, 256) == 1  # small: enlarged, never reduced
    for seed in range(3):
        data = _photo_like_jpeg(seed=seed) if seed != 2 else _photo_like_jpeg(375, 500, seed)  # and a portrait
        for size in (224, 112, 64):
            layout = StoreLayout.derived(size)
            fast, full = decode_bytes(data, layout), decode_bytes_full(data, layout)
            assert fast.shape == full.shape == (3, *layout.canvas_hw) and fast.dtype == torch.uint8
            h, w, flip = stored_sizes(fast[None])
            assert [h.item(), w.item(), flip.item()] == [layout.short, round(500 * layout.short / 375), seed == 2]
            assert torch.equal(fast[0, -1], full[0, -1])  # the same header
            fast, full = fast[:, :h, :w], full[:, :h, :w]
            diff = (fast.float() - full.float()).abs()
            assert diff.mean() < 1.0, (seed, size, float(diff.mean()))  # of 255; a one-pixel shift is 2 to 5
            assert (diff > 32).float().mean() < 0.01, (seed, size)  # no region decoded wrong, only edges resampled


def test_decoders_read_png_and_grayscale_jpeg_alike():
    import io

    from PIL import Image

    from mocolab.data.image_index import decode_bytes, decode_bytes_full

    grey = Image.fromarray(np.tile(np.arange(0, 250, 2, dtype=np.uint8), (100, 1)))
    for fmt in ("PNG", "JPEG"):
        buf = io.BytesIO()
        grey.save(buf, fmt)
        fast, full = decode_bytes(buf.getvalue(), 32), decode_bytes_full(buf.getvalue(), 32)
        assert fast.shape == (3, 38, 74) and torch.equal(fast[1], fast[2])  # channel 0 holds the header
        fast, full = fast[:, :37, :74], full[:, :37, :74]  # 100×125 stored at 37×46 (of a 37×74 canvas)
        assert torch.equal(fast[0], fast[1]) and not fast[:, :, 46:].any() and fast[:, :, 45].any()
        assert (fast.float() - full.float()).abs().max() <= 2, fmt
