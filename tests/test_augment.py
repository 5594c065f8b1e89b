import pytest
import torch

from mocolab.augment import PRESETS, TwoViews


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
