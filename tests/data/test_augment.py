import pytest
import torch
import torch.nn.functional as F

from mocolab.data.augment import PRESETS, TwoViews, _random_resized_crop, resized_crops


def _images(n: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)


def test_same_image_gets_different_views_per_sample():
    img = _images(1).expand(16, 1, 28, 28).contiguous()  # one image, 16 copies
    q, k = TwoViews("mocov2", 28, 1, crop_min=0.3)(img)
    flat = q.flatten(1)
    distinct = {tuple(row.round(decimals=4).tolist()) for row in flat}
    assert len(distinct) == 16  # per-sample parameters, not one draw per batch
    assert not torch.allclose(q, k)


def test_same_seed_same_output():
    x = _images()
    aug = TwoViews("mocov2", 28, 1)
    torch.manual_seed(7)
    a = aug(x)
    torch.manual_seed(7)
    b = aug(x)
    torch.manual_seed(8)
    c = aug(x)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_keep_shape_and_dtype(preset):
    x = _images(8)
    q, k = TwoViews(preset, 28, 1)(x)
    assert q.shape == k.shape == (8, 1, 28, 28) and q.dtype == torch.float32


def test_none_is_deterministic_normalisation_only():
    x = _images(4)
    q, k = TwoViews("none", 28, 1)(x)
    assert torch.equal(q, k)


def test_rgb_jitter_and_mocov3_asymmetry():
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    aug = TwoViews("mocov3", 32, 3)
    q, k = aug(x)
    assert q.shape == (8, 3, 32, 32)
    names_q = [type(m).__name__ for m in aug.view_q.children()]
    names_k = [type(m).__name__ for m in aug.view_k.children()]
    assert "RandomSolarize" in names_k and "RandomSolarize" not in names_q


def test_grayscale_jitter_is_brightness_contrast_only():
    aug = TwoViews("mocov1", 28, 1)
    jitter = [m for m in aug.view_q.children() if type(m).__name__ == "ColorJitter"][0]
    assert float(jitter.saturation) == 0.0 and float(jitter.hue) == 0.0
    assert float(jitter.brightness) == float(jitter.contrast) == 0.4


def test_unknown_preset():
    with pytest.raises(ValueError, match="augment.preset: unknown value 'simclr'"):
        TwoViews("simclr", 28, 1)


def test_batched_resized_crops_equal_slicing_and_interpolating_each_image():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(40, 3, 20, 24, generator=g)
    boxes = []
    for i in range(40):  # every kind of box: a single pixel, a row, a column, the whole image, random ones
        x1, x2 = sorted(torch.randint(0, 24, (2,), generator=g).tolist())
        y1, y2 = sorted(torch.randint(0, 20, (2,), generator=g).tolist())
        boxes.append([(5, 7, 5, 7), (0, 3, 23, 3), (9, 0, 9, 19), (0, 0, 23, 19)][i] if i < 4 else (x1, y1, x2, y2))
    boxes = torch.tensor(boxes)
    out = resized_crops(x, boxes, (16, 12))
    for i, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
        ref = F.interpolate(x[i:i + 1, :, y1:y2 + 1, x1:x2 + 1], size=(16, 12), mode="bilinear", align_corners=True)
        torch.testing.assert_close(out[i:i + 1], ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("crop_min", [0.08, 0.5])
def test_batched_random_resized_crop_is_kornias_from_the_same_draws(crop_min):
    import kornia.augmentation as K

    x = torch.rand(64, 3, 28, 28)
    ours = _random_resized_crop(28, crop_min)
    theirs = K.RandomResizedCrop((28, 28), scale=(crop_min, 1.0))
    torch.manual_seed(5)
    a = ours(x)
    after_ours = torch.rand(1)
    torch.manual_seed(5)
    b = theirs(x)
    assert torch.equal(torch.rand(1), after_ours)  # the same random draws, no more, no fewer
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert not torch.equal(a, x)  # something was cropped
