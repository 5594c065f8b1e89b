"""Indexed sets stored whole (data/canvas.py): the training crop draws from the whole image at the reference's
rate, evaluation takes the centre crop, and the canvas bookkeeping holds for any shape.

Real files written into a temporary image folder and indexed the normal way; torchvision's own
``RandomResizedCrop.get_params`` is the reference the crops are held to."""

from __future__ import annotations

import warnings

import pytest
import torch

from mocolab.config import build_config, validate
from mocolab.data import canvas
from mocolab.data.augment import TwoViews, centre_views, whole_image_crops
from mocolab.data.canvas import StoreLayout, place, stored_sizes
from mocolab.data.sets import load_dataset
from mocolab.data.sources import MemorySource, choose_loader

H, W = 64, 256  # a wide image: its centre square is columns 96..159
SIZE = 32


def _coordinate_image(h: int = H, w: int = W) -> torch.Tensor:
    """Channel 0 is the column, channel 1 four times the row: a crop's pixels say where it was cut."""
    img = torch.zeros(3, h, w, dtype=torch.uint8)
    img[0] = torch.arange(w, dtype=torch.uint8)[None, :]
    img[1] = (torch.arange(h) * 4).to(torch.uint8)[:, None]
    return img


def _write(root, images: dict[str, torch.Tensor]) -> None:
    from torchvision.io import write_png

    for split in ("train", "val"):
        for name, img in images.items():
            folder = root / split / "c0"
            folder.mkdir(parents=True, exist_ok=True)
            with warnings.catch_warnings():  # torchvision 0.29 deprecates its codecs
                warnings.simplefilter("ignore", DeprecationWarning)
                write_png(img, str(folder / f"{name}.png"))


def _wide_set(tmp_path):
    """The wide image, indexed the normal way and stored at its own size (short side 64, cap 256)."""
    _write(tmp_path, {"wide": _coordinate_image()})
    return {split: load_dataset("imagefolder", split, tmp_path, image_size=SIZE, store_short_side=H,
                                store_max_side=W) for split in ("train", "test")}


def _statistics(x1: torch.Tensor, x2: torch.Tensor) -> tuple[float, float, float]:
    """Of crops spanning columns x1..x2: the share not inside the centre square, the share reaching into the
    left eighth, the mean width."""
    lo, hi = (W - H) // 2, (W + H) // 2 - 1
    return (((x1 < lo) | (x2 > hi)).float().mean().item(), (x1 < W // 8).float().mean().item(),
            (x2 - x1 + 1).float().mean().item())


def _reference(draws: int, scale: tuple[float, float]) -> tuple[float, float, float]:
    """``_statistics`` of torchvision's RandomResizedCrop on a H×W image."""
    from torchvision.transforms import RandomResizedCrop

    image = torch.zeros(1, H, W)
    torch.manual_seed(123)
    boxes = torch.tensor([RandomResizedCrop.get_params(image, scale=list(scale), ratio=[3 / 4, 4 / 3])
                          for _ in range(draws)])
    return _statistics(boxes[:, 1], boxes[:, 1] + boxes[:, 3] - 1)


def test_crops_land_outside_the_centre_square_at_the_references_rate(tmp_path):
    train = _wide_set(tmp_path)["train"]
    assert train.images.shape == (1, 3, H + 1, W)  # stored whole: nothing was cut away
    scale = (0.2, 1.0)
    want_rate, want_left, want_width = _reference(20_000, scale)
    assert want_rate > 0.9 and want_left > 0.05  # the reference draws most crops beyond the centre square
    torch.manual_seed(0)
    x1, x2 = [], []
    for _ in range(8):
        crops = whole_image_crops(train.images.expand(500, -1, -1, -1), SIZE, scale[0]) * 255
        x1.append(crops[:, 0].amin((1, 2)).round())  # column values: the crop's first and last column
        x2.append(crops[:, 0].amax((1, 2)).round())
    rate, left, width = _statistics(torch.cat(x1), torch.cat(x2))
    # 4,000 crops: each share's standard error is under 0.008; a centre-square-only crop scores 0 on both
    assert abs(rate - want_rate) < 0.02, (rate, want_rate)
    assert abs(left - want_left) < 0.025, (left, want_left)
    assert abs(width - want_width) < 0.04 * want_width, (width, want_width)
    x1, x2 = torch.cat(x1), torch.cat(x2)
    assert x1.min() == 0 and x2.max() == W - 1  # both ends of the image are reached


def test_the_two_views_of_a_canvas_batch_are_whole_image_crops_from_the_augment_stream(tmp_path):
    images = _wide_set(tmp_path)["train"].images.expand(64, -1, -1, -1)
    aug = TwoViews("crop", SIZE, 3)
    torch.manual_seed(5)
    q, k = aug(images)
    torch.manual_seed(5)
    q2, _ = aug(images)
    assert q.shape == k.shape == (64, 3, SIZE, SIZE) and torch.equal(q, q2) and not torch.equal(q, k)
    columns = (q[:, 0] * aug.normalise.std[0, 0] + aug.normalise.mean[0, 0]) * 255
    assert columns.amin() < 20 and columns.amax() > 235  # crops from both ends, beyond the centre square
    q, k = TwoViews("none", SIZE, 3)(images)  # no crop: the evaluation's view
    assert torch.equal(q, k)


def test_evaluation_reads_the_centre_crop(tmp_path):
    from torchvision.transforms.functional import center_crop, resize

    test = _wide_set(tmp_path)["test"]
    source = MemorySource(test, test)
    (views, _), = list(source.eval_split("test", None))
    original = _coordinate_image()
    # the reference's Resize(64) (this image is stored at its short side of 64) + CenterCrop(32)
    assert torch.equal(views[0], center_crop(resize(original, [H], antialias=True), [SIZE, SIZE]))
    assert views[0, 0].min() == 112 and views[0, 0].max() == 143  # the middle columns
    assert source.image_size == SIZE  # what the encoder is built for, not the canvas's width


def test_canvas_bookkeeping_for_wide_tall_capped_and_square_images():
    layout = StoreLayout.derived(SIZE)  # short side 37 (32 x 256/224), cap 74
    assert (layout.short, layout.longest, layout.canvas_hw) == (37, 74, (38, 74))
    shapes = {"wide": (50, 75), "tall": (120, 80), "panorama": (30, 300), "square": (20, 20), "tiny": (3, 5)}
    canvases = torch.stack([place(torch.full((3, h, w), 100, dtype=torch.uint8), layout)
                            for h, w in shapes.values()])
    h, w, flip = stored_sizes(canvases)
    # aspect kept, short side 37 unless the long side would pass 74; portrait stored transposed
    assert list(zip(h.tolist(), w.tolist(), flip.tolist())) == [
        (37, 56, False), (37, 56, True), (7, 74, False), (37, 37, False), (37, 62, False)]
    for i in range(len(shapes)):
        assert (canvases[i, :, :h[i], :w[i]] == 100).all()  # the image, top-left
        body = canvases[i, :, :-1].clone()
        body[:, :h[i], :w[i]] = 0
        assert not body.any()  # zeros around it
    oh, ow = canvas.oriented(h, w, flip)
    assert (oh[1].item(), ow[1].item()) == (56, 37)  # the tall image in its own orientation
    # an unreadable file's canvas is zeros: its header reads as a 1×1 image, never out of the canvas
    h0, w0, f0 = stored_sizes(torch.zeros(1, 3, 38, 74, dtype=torch.uint8))
    assert (h0.item(), w0.item(), f0.item()) == (1, 1, False)
    # a tall image's crop comes back upright: its centre view is the wide one's transposed
    pair = torch.stack([place(_coordinate_image(40, 80), layout), place(_coordinate_image(40, 80).transpose(1, 2),
                                                                        layout)])
    views = centre_views(pair, SIZE).float()
    assert (views[0] - views[1].transpose(1, 2)).abs().max() <= 1  # uint8 resizes of each orientation round apart


def test_random_boxes_follow_torchvisions_fallback_and_stay_inside():
    # ten tries that never fit (area beyond the image) fall back to the centre crop clipped to the ratio range
    h, w = torch.tensor([10, 100, 50]), torch.tensor([100, 10, 60])
    u = torch.rand(3, 2 * canvas.ATTEMPTS + 2)
    from torchvision.transforms import RandomResizedCrop

    boxes = canvas.random_boxes(h, w, u, (4.0, 5.0))
    want = [list(RandomResizedCrop.get_params(torch.zeros(1, a, b), [4.0, 5.0], [3 / 4, 4 / 3]))
            for a, b in zip(h.tolist(), w.tolist())]
    assert boxes.tolist() == want == [[0, 43, 10, 13], [43, 0, 13, 10], [0, 0, 50, 60]]
    torch.manual_seed(0)
    h, w = torch.randint(1, 300, (2000,)), torch.randint(1, 300, (2000,))
    top, left, bh, bw = canvas.random_boxes(h, w, torch.rand(2000, 2 * canvas.ATTEMPTS + 2), (0.08, 1.0)).unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (bh >= 1).all() and (bw >= 1).all()
    assert (top + bh <= h).all() and (left + bw <= w).all()


def test_the_memory_budget_counts_the_canvas():
    layout = StoreLayout.derived(224)
    assert (layout.short, layout.longest, layout.image_bytes(3)) == (256, 512, 3 * 257 * 512)
    images = 10_000
    need = images * 3 * 257 * 512 / 2 ** 20  # 3.8 GiB of canvases (1.4 GiB as 224 px squares)
    assert choose_loader("imagefolder", "auto", images, 224, 3, round(need) - 1).loader == "stream"
    choice = choose_loader("imagefolder", "auto", images, 224, 3, round(need) + 1)
    assert choice.loader == "memory" and "3x257x512" in choice.reason
    small = StoreLayout.derived(224, 224, 224)  # the user's smaller store: counted as given
    assert choose_loader("imagefolder", "auto", images, 224, 3, round(need) - 1, small).loader == "memory"


def test_store_sides_are_used_or_refused(tmp_path):
    _write(tmp_path, {"wide": _coordinate_image()})
    base = {"data.name": "imagefolder", "data.root": str(tmp_path), "data.image_size": SIZE}
    cfg = build_config("smoke", {**base, "data.store_short_side": 48, "data.store_max_side": 120})
    from mocolab.data.splits import load_data

    train, _, _ = load_data(cfg)
    assert train.images.shape == (1, 3, 49, 120) and stored_sizes(train.images)[1].item() == 120  # 64×256 capped
    assert build_config("smoke", base).data.store_sides(SIZE) == (37, 74)
    for override, match in (({"data.store_short_side": 31}, r"data.store_short_side: 31 is out of range; "
                                                             r"allowed 0 \(derived\) or \[32, 4096\]"),
                            ({"data.store_max_side": 36}, r"data.store_max_side: 36 is out of range; allowed 0 "
                                                          r"\(derived\) or \[37, 8192\]"),
                            ({"data.name": "synthetic", "data.root": None, "data.store_short_side": 40},
                             r"data.store_short_side: applies to imagefolder and parquet")):
        with pytest.raises(ValueError, match=match):
            validate(build_config("smoke", {**base, **override}))
