"""Backbones by name (models/named.py): any timm or torchvision classification model, ``model.backbone=timm:NAME``
or ``tv:NAME``, built untrained for the data's channels and image side, refused at validation when unknown."""

from __future__ import annotations

import math
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import run_concurrently, thread_share_env
from torch import nn

from mocolab.config import build_config
from mocolab.data.image_index import write_imagefolder
from mocolab.data.sets import _synthetic, fashion_mnist_dir
from mocolab.method.batchnorm import SplitBatchNorm2d
from mocolab.models import backbones, named
from mocolab.models.backbones import build_encoder
from mocolab.models.named import build_named

SYNTHETIC = {"data.name": "synthetic", "data.subset": None}


@pytest.fixture
def timm():
    """timm, for the tests that build its models: the `timm` extra, which `make test` installs (dev). Where it is
    missing those tests skip, and fail under CI=true (tests/conftest.py); the torchvision ones run all the same."""
    return pytest.importorskip("timm")


def _stride(conv: nn.Conv2d) -> tuple[int, int]:
    return tuple(conv.stride), tuple(conv.kernel_size)


# name, channels, side, feature width, the stem as (stride, kernel) or a ViT's token grid
SMALL = [
    ("timm:resnet18", 1, 28, 512), ("timm:resnet18", 3, 64, 512), ("tv:resnet18", 1, 28, 512),
    ("tv:resnet18", 3, 64, 512), ("timm:convnext_atto", 1, 28, 320), ("timm:convnext_atto", 3, 64, 320),
    ("timm:vit_tiny_patch16_224", 1, 28, 192), ("timm:vit_tiny_patch16_224", 3, 64, 192),
    # torchvision's smallest ConvNeXt and ViT are ImageNet's Tiny and Base (28M and 86M parameters): seconds
    pytest.param("tv:convnext_tiny", 1, 28, 768, marks=pytest.mark.slow),
    pytest.param("tv:vit_b_16", 1, 28, 768, marks=pytest.mark.slow),
]


def _first_stage_input(name: str, net: nn.Module) -> tuple:
    """What the small-image adaptation changed: the stem convolution's (stride, kernel), or a ViT's patch side."""
    if name.endswith("resnet18"):
        assert isinstance(net.maxpool, nn.Identity)
        return _stride(net.conv1)
    if name == "timm:convnext_atto":
        return _stride(net.stem[0])
    if name == "tv:convnext_tiny":
        return _stride(net.features[0][0])
    if name.startswith("timm:vit"):
        return tuple(net.patch_embed.proj.kernel_size)
    return (net.patch_size,) * 2  # torchvision's ViT


@pytest.mark.parametrize("name, channels, side, width", SMALL)
def test_small_images_get_their_family_s_stem_and_the_model_s_feature_width(name, channels, side, width, request):
    if name.startswith("timm:"):
        request.getfixturevalue("timm")
    torch.manual_seed(0)
    backbone = build_named(name, channels, side)
    assert backbone.out_dim == width
    stem = _first_stage_input(name, backbone.net)
    if "vit" in name:
        assert stem == ((4, 4) if side <= 32 else (8, 8))  # vision_transformer.default_patch_size
    else:
        assert stem == ((1, 1), (3, 3))  # a 3×3 stride-1 stem in place of the 7×7/2 (+ max-pool) or 4×4/4
    first = next(m for m in backbone.modules() if isinstance(m, nn.Conv2d))  # what the training monitor reads
    assert first.in_channels == channels
    backbone.eval()
    with torch.no_grad():
        assert backbone(torch.rand(2, channels, side, side)).shape == (2, width)


@pytest.mark.parametrize("name", ["timm:resnet18", "tv:resnet18", "timm:convnext_atto"])
def test_the_small_image_stem_keeps_the_image_s_side_and_starts_as_its_family_s_own(name, request):
    """The 3×3 stride-1 stem (padding 1) hands the next layer the whole image, neither cropped nor widened, and
    its weights start as the family's: ResNet's Kaiming normal over fan-out (std √(2 / (out·3·3))), no bias;
    ConvNeXt's truncated normal of std 0.02, its bias kept and zero."""
    if name.startswith("timm:"):
        request.getfixturevalue("timm")
    torch.manual_seed(0)
    net = build_named(name, 1, 28).net
    stem = net.stem[0] if "convnext" in name else net.conv1
    with torch.no_grad():
        assert stem(torch.rand(2, 1, 28, 28)).shape == (2, stem.out_channels, 28, 28)
    std = float(stem.weight.detach().std())
    if "convnext" in name:
        assert stem.bias is not None and not stem.bias.any()
        assert abs(std / 0.02 - 1) < 0.1, std
    else:
        assert stem.bias is None
        assert abs(std / math.sqrt(2 / (stem.out_channels * 9)) - 1) < 0.1, std


def test_googlenet_is_built_without_its_auxiliary_heads_and_with_its_own_init():
    """torchvision's GoogLeNet untrained: no auxiliary classifiers (a training forward returns the features, not
    its tuple of three outputs), its own truncated-normal init (std 0.01) asked for, so torchvision does not warn
    that it will change."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backbone = build_named("tv:googlenet", 3, 128)
    net = backbone.net
    assert net.aux1 is None and net.aux2 is None and backbone.out_dim == 1024
    assert abs(float(net.conv1.conv.weight.detach().std()) / 0.01 - 1) < 0.2
    assert backbone.train()(torch.rand(2, 3, 128, 128)).shape == (2, 1024)


def test_torchvision_s_classifiers_are_removed_whatever_their_name_and_a_model_without_one_is_refused():
    """The last linear layer goes, wherever the model keeps it (swin's ``head``, ViT's ``heads``, Inception's
    ``fc``, ConvNeXt's ``classifier``), and the features' width is its input; a model that ends in no linear
    layer (SqueezeNet's convolution) is refused by name. Inception v3 is built, as GoogLeNet, without auxiliary
    heads and with its own init asked for (no warning). On the meta device: the shapes without the parameters."""
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("error")
        swin = build_named("tv:swin_t", 3, 128)
        vit = build_named("tv:vit_b_16", 3, 128)
        inception = build_named("tv:inception_v3", 3, 128)
        convnext = build_named("tv:convnext_tiny", 1, 28)
        with pytest.raises(ValueError, match=r"^model.backbone: 'tv:squeezenet1_0' ends in no linear classifier"):
            build_named("tv:squeezenet1_0", 3, 128)
    assert isinstance(swin.net.head, nn.Identity) and swin.out_dim == 768
    assert isinstance(vit.net.heads[-1], nn.Identity) and vit.out_dim == 768
    assert isinstance(inception.net.fc, nn.Identity) and inception.out_dim == 2048
    assert inception.net.AuxLogits is None
    assert isinstance(convnext.net.classifier[-1], nn.Identity) and convnext.out_dim == 768
    stem = convnext.net.features[0][0]  # the small-image stem, as for timm's ConvNeXt
    assert stem.in_channels == 1 and _stride(stem) == ((1, 1), (3, 3))


def test_the_encoder_around_a_named_backbone_splits_its_batch_norm_and_trains_under_bf16(timm):
    torch.manual_seed(0)
    enc = build_encoder("timm:resnet18", 1, head="mlp", dim=16, bn_groups=2, image_size=28)
    assert enc.head[0].in_features == enc.backbone.out_dim == 512
    bns = [m for m in enc.backbone.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(isinstance(m, SplitBatchNorm2d) and m.groups == 2 for m in bns)
    x = torch.rand(4, 1, 28, 28)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = enc(x)
    assert z.shape == (4, 16)
    z.float().square().mean().backward()
    assert enc.backbone.net.conv1.weight.grad is not None
    # ConvNeXt normalises with LayerNorm: nothing to split, and it builds all the same
    convnext = build_encoder("timm:convnext_atto", 1, head="linear", dim=16, bn_groups=2, image_size=28)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in convnext.modules())
    assert convnext(torch.rand(4, 1, 28, 28)).shape == (4, 16)


def test_unknown_names_are_refused_at_validation_with_the_closest_ones_before_any_work(tmp_path, monkeypatch, timm):
    import mocolab

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(timm, "create_model", no_model)
    monkeypatch.setattr(backbones, "build_named", no_model)
    monkeypatch.chdir(tmp_path)
    for value, closest in (("timm:resnet181", "timm:resnet18"), ("tv:resnt18", "tv:resnet18"),
                           ("timm:convnext_atoo", "timm:convnext_atto")):
        with pytest.raises(ValueError, match=rf"^model.backbone: unknown model '{value}'; closest: .*{closest}\b"):
            build_config("smoke", {"model.backbone": value})
        with pytest.raises(ValueError, match="^model.backbone: unknown model"):
            mocolab.train("smoke", {"model.backbone": value})
    with pytest.raises(ValueError, match=r"model.backbone: unknown value 'tim:resnet18'; choose one of .*'timm:NAME'"):
        build_config("smoke", {"model.backbone": "tim:resnet18"})
    assert list(tmp_path.iterdir()) == []  # no store, no run folder: nothing started
    # the built-in five keep their names and their own checks
    assert build_config("smoke", {"model.backbone": "resnet18"}).model.backbone == "resnet18"


def test_a_refusal_names_at_most_five_close_names_or_nothing_close_and_the_families_that_do_fit(timm):
    """What a user reads to fix the value: up to five close names of the same library (or "nothing close"), and
    for a family without a small-image adaptation, that library's own ResNet, ConvNeXt and ViT to take instead."""
    with pytest.raises(ValueError) as many:
        named.check_named("timm:resnet5", 28)
    closest = str(many.value).split("closest: ")[1].split(" (every name")[0].split(", ")
    assert len(closest) == 5 and all(c.startswith("timm:resnet") for c in closest), closest
    with pytest.raises(ValueError, match=r"unknown model 'tv:qqqqzzzz'; nothing close \(every name: "):
        named.check_named("tv:qqqqzzzz", 28)
    for value, examples in (("timm:mobilenetv3_small_050", "timm:resnet18, timm:convnext_atto, "
                                                           "timm:vit_tiny_patch16_224"),
                            ("tv:mobilenet_v3_small", "tv:resnet18, tv:convnext_tiny, tv:vit_b_16")):
        with pytest.raises(ValueError, match=rf"\(e\.g\. {examples}\), or set data.image_size above 96$"):
            named.check_named(value, 28)


def test_a_convnext_needs_images_of_8_px_or_more_and_other_families_do_not(timm):
    """A ConvNeXt halves its grid three times after the stem: under 8 px nothing would be left to halve."""
    with pytest.raises(ValueError, match=r"^model.backbone: 'timm:convnext_atto' halves the image three times and "
                                         r"needs 8 px or more; the images are 7 px$"):
        named.check_named("timm:convnext_atto", 7)
    assert named.check_named("timm:convnext_atto", 8) == "convnext"
    assert named.check_named("timm:resnet18", 7) == "resnet"


def test_families_without_a_small_image_adaptation_are_refused_on_small_images_only(timm):
    with pytest.raises(ValueError, match=r"model.backbone: 'timm:mobilenetv3_small_050' \(timm.models.mobilenetv3\) "
                                         r"has no small-image adaptation, and the images are 28 px"):
        build_config("smoke", {"model.backbone": "timm:mobilenetv3_small_050"})
    with pytest.raises(ValueError, match="'tv:mobilenet_v3_small' .* has no small-image adaptation"):
        build_config("smoke", {**SYNTHETIC, "model.backbone": "tv:mobilenet_v3_small", "data.image_size": 96})
    with pytest.raises(ValueError, match="cuts 30 px images into 4 px patches.*a multiple of 4"):
        build_config("smoke", {**SYNTHETIC, "model.backbone": "timm:vit_tiny_patch16_224", "data.image_size": 30})
    with pytest.raises(ValueError, match="cuts 100 px images into 16 px patches"):  # torchvision's ViT: its own 16
        build_config("smoke", {**SYNTHETIC, "model.backbone": "tv:vit_b_16", "data.image_size": 100})
    cfg = build_config("smoke", {**SYNTHETIC, "model.backbone": "timm:mobilenetv3_small_050", "data.image_size": 128})
    assert cfg.image_size == 128  # above 96 px any model is taken as its library builds it


def test_96_px_images_are_small_and_above_them_a_vit_keeps_its_own_patch(timm):
    """96 px is small (SMALL_IMAGE): a ResNet gets the 3×3 stride-1 stem there, and torchvision's vit_b_16 cuts
    it into 8 px patches, as every ViT up to 96 px; above it the model keeps its own patch (torchvision: the
    name's 16; timm: the model's, not the name's last number, so vit_tiny_patch16_224 takes 128 px images, which
    224 would not divide). Built on the meta device: the shapes without the parameters (ViT-B's 86M)."""
    with torch.device("meta"):
        resnet = build_named("tv:resnet18", 1, 96).net
        assert build_named("tv:vit_b_16", 3, 96).net.patch_size == 8
        assert build_named("tv:vit_b_16", 3, 128).net.patch_size == 16
        timm_vit = build_named("timm:vit_tiny_patch16_224", 1, 128).net
    assert _stride(resnet.conv1) == ((1, 1), (3, 3)) and isinstance(resnet.maxpool, nn.Identity)
    assert tuple(timm_vit.patch_embed.proj.kernel_size) == (16, 16)
    assert named.check_named("timm:vit_tiny_patch16_224", 128) == "vit"


def test_large_images_take_any_model_and_timm_s_batchnorm_act_unfolds_unchanged(timm):
    torch.manual_seed(0)
    raw = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=0, in_chans=1).eval()
    torch.manual_seed(0)
    backbone = build_named("timm:mobilenetv3_small_050", 1, 128).eval()
    assert not any(type(m).__name__ == "BatchNormAct2d" for m in backbone.modules())
    x = torch.rand(2, 1, 128, 128)
    with torch.no_grad():
        assert torch.allclose(backbone(x), raw(x), atol=1e-6)  # the same network, its BN now moco.bn's to convert
        # in training too: the batch's statistics, and running averages moved by the same momentum
        assert torch.allclose(backbone.train()(x), raw.train()(x), atol=1e-5)
    unfolded, folded = ([m for m in net.modules() if isinstance(m, nn.BatchNorm2d)] for net in (backbone, raw))
    assert len(unfolded) == len(folded) > 0
    assert all(torch.allclose(a.running_var, b.running_var) and a.eps == b.eps for a, b in zip(unfolded, folded))
    backbone.eval()
    assert backbone(x).shape == (2, backbone.out_dim) == (2, raw.head_hidden_size)  # not num_features: a conv head
    tv = build_named("tv:mobilenet_v3_small", 3, 128).eval()
    with torch.no_grad():
        assert tv(torch.rand(2, 3, 128, 128)).shape == (2, tv.out_dim) == (2, 1024)
    with pytest.raises(ValueError, match="'tv:mobilenet_v3_small' takes 3-channel images.*timm:NAME adapts"):
        build_named("tv:mobilenet_v3_small", 1, 128)


def test_a_batch_norm_subclass_that_moco_bn_cannot_convert_is_refused_by_name(timm, monkeypatch):
    """moco.bn's split and sync conversions replace batch-norm layers by type, so a subclass's extras would be
    lost: a model left with one is refused, naming it. timm's BatchNormAct2d, left folded, is such a subclass."""
    monkeypatch.setattr(named, "_unfold_batchnorm_act", lambda net: None)
    with torch.device("meta"), pytest.raises(ValueError, match=r"^model.backbone: 'timm:mobilenetv3_small_050' "
                                                                 r"normalises with \['BatchNormAct2d'\]"):
        build_named("timm:mobilenetv3_small_050", 1, 128)


def test_a_timm_name_without_timm_says_what_to_install(monkeypatch):
    named._catalogue.cache_clear()
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` now fails as if it were not installed
    try:
        with pytest.raises(ValueError, match=r"model.backbone: timm models need the timm package, which is not "
                                             r"installed here: pip install 'mocolab\[timm\]'"):
            build_config("smoke", {"model.backbone": "timm:resnet18"})
        assert build_config("smoke", {"model.backbone": "tv:resnet18"}).model.backbone == "tv:resnet18"
    finally:
        named._catalogue.cache_clear()


def _image_folder(root: Path, n: int, side: int) -> Path:
    """A 3-channel imagefolder (train/ and val/, 10 classes) of generated side×side images."""
    for split, count, seed in (("train", n, 0), ("val", n // 4, 1)):
        ds = _synthetic(count, side, seed)
        write_imagefolder(ds.images.expand(-1, 3, -1, -1), ds.labels % 10, root, split)
    return root


@pytest.mark.slow
@pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")
def test_mocolab_train_trains_timm_and_torchvision_resnet18_on_fashion_mnist_and_a_64_px_folder(tmp_path, timm):
    """Issue 52's done-when for backbones, as a user types it: `mocolab train --preset smoke --set
    model.backbone=timm:resnet18` (and tv:resnet18), two steps each. On Fashion-MNIST (1×28×28) the whole path:
    Ray Train in this process, MLflow, the encoder exported as a model; on a 64-px folder (3×64×64, the
    small-image stem at its largest cost) the loop alone (--in-process)."""
    folder = _image_folder(tmp_path / "folder64", 64, 64)
    tiny = ["--set", "optim.max_steps=2", "--set", "eval.linear_steps=3", "--set", "run.system_metrics_s=0"]
    data = {"fmnist": ["--set", "data.subset=128", "--set", "optim.batch_size=16", "--set", "queue.size=32",
                       "--set", "eval.knn_bank=32", "--set", "eval.knn_test=16", "--set", "eval.linear_train=32",
                       "--set", "eval.linear_test=16"],
            "folder": ["--in-process", "--set", "data.name=imagefolder", "--set", f"data.root={folder}", "--set",
                       "data.subset=null", "--set", "optim.batch_size=8", "--set", "queue.size=16", "--set",
                       "eval.knn_bank=16", "--set", "eval.knn_test=8", "--set", "eval.linear_train=16", "--set",
                       "eval.linear_test=8"]}
    mocolab = str(Path(sys.executable).with_name("mocolab"))
    runs, commands, places = [], [], []
    for backbone in ("timm:resnet18", "tv:resnet18"):
        for where, args in data.items():
            work = tmp_path / f"{backbone.replace(':', '-')}-{where}"
            work.mkdir()
            runs.append((backbone, where))
            commands.append([mocolab, "train", "--preset", "smoke", "--set", f"model.backbone={backbone}", *args,
                             *tiny])
            places.append({"cwd": work})
    # run_concurrently starts one command per core: one thread each, unless the suite's worker has a share
    env = {**os.environ, "MOCOLAB_MAX_THREADS": "1", "OMP_NUM_THREADS": "1", **thread_share_env(),
           "PYTHONWARNINGS": "ignore"}
    env.pop("MLFLOW_TRACKING_URI", None)
    results = run_concurrently(commands, places, env=env, timeout=900)
    for (backbone, where), res in zip(runs, results):
        assert res.returncode == 0, (backbone, where, res.stdout[-2000:], res.stderr[-3000:])
        assert f"{backbone}, m=0.99" in res.stdout and "2 steps" in res.stdout, (backbone, where, res.stdout[-2000:])
        if where == "fmnist":
            assert "finished: linear top-1" in res.stdout and "encoder logged as models:/" in res.stdout, \
                (backbone, res.stdout[-2000:])
        else:
            assert "imagefolder (64 train" in res.stdout and "linear top-1" in res.stdout, res.stdout[-2000:]
