"""A timm or torchvision classification model as a backbone, by name: ``model.backbone=timm:NAME`` or ``tv:NAME``.

The model is built untrained (timm ``pretrained=False``, torchvision ``weights=None``: nothing is
downloaded) for the data's channels and image side, its classifier removed, and ``out_dim`` is the
feature width the model reports (timm: ``head_hidden_size``/``num_features`` with ``num_classes=0``;
torchvision: the removed classifier's input width).

Images of at most ``SMALL_IMAGE`` px (Fashion-MNIST's 28, CIFAR's 32, a 64-px folder, STL-10's 96) get
their family's small-image adaptation, so that the last stage still sees a grid rather than a pixel:

- ResNet (timm's ``resnet`` module: resnet*, resnext*, wide_resnet*, seresnet*, ...; torchvision's
  resnet*, resnext*, wide_resnet*): a 3×3 stride-1 stem convolution and no max-pool, as the built-in
  resnet18 (a deep stem keeps its three convolutions, the first at stride 1);
- ConvNeXt (timm's ``convnext`` module, torchvision's convnext_*): the 4×4 stride-4 patchify stem
  becomes a 3×3 stride-1 convolution (its LayerNorm kept);
- ViT (timm's ``vision_transformer`` module: vit_*; torchvision's vit_*): built for the image side
  with patches of ``default_patch_size`` (4 px up to 32 px, 8 px up to 96), which must divide it.

Any other family is refused on small images (``check_named``, at config validation). Above
``SMALL_IMAGE`` px every model is taken as its library builds it: timm adapts the first layer to the
channels itself (``in_chans``); torchvision's ResNets, ConvNeXts and ViTs get a first layer for the
channels here, its other models take 3-channel images only.
"""

from __future__ import annotations

import difflib
import functools
import math

import torch
from torch import nn

from mocolab.config.choices import SMALL_IMAGE, named_backbone
from mocolab.models.vision_transformer import default_patch_size

INSTALL_TIMM = "pip install 'mocolab[timm]'"
# The families with a small-image adaptation, by the module their library defines the model in.
FAMILIES: dict[str, dict[str, str]] = {
    "timm": {"timm.models.resnet": "resnet", "timm.models.convnext": "convnext",
             "timm.models.vision_transformer": "vit"},
    "tv": {"torchvision.models.resnet": "resnet", "torchvision.models.convnext": "convnext",
           "torchvision.models.vision_transformer": "vit"},
}
LISTS = {"timm": "timm.list_models()", "tv": "torchvision.models.list_models(module=torchvision.models)"}


class NamedBackbone(nn.Module):
    """A library's model as mocolab's backbone: N×C×H×W images -> N×``out_dim`` features."""

    def __init__(self, net: nn.Module, out_dim: int) -> None:
        super().__init__()
        self.net = net
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _timm():
    try:
        import timm
    except ImportError:
        raise ValueError(f"model.backbone: timm models need the timm package, which is not installed here: "
                         f"{INSTALL_TIMM}") from None
    return timm


@functools.cache
def _catalogue(source: str) -> tuple[str, ...]:
    """Every model name the library builds (timm: architectures, without pretrained tags)."""
    if source == "timm":
        return tuple(_timm().list_models())
    import torchvision

    return tuple(torchvision.models.list_models(module=torchvision.models))


def _builder(source: str, name: str):
    if source == "timm":
        return _timm().models.model_entrypoint(name)
    import torchvision

    return torchvision.models.get_model_builder(name)


def _patch_size(source: str, name: str, image_size: int) -> int:
    """A ViT's patch side: sized for small images, the model's own above (torchvision: the name's number)."""
    if image_size <= SMALL_IMAGE:
        return default_patch_size(image_size)
    return int(name.rsplit("_", 1)[-1]) if source == "tv" else 0  # timm: the model's own (0: keep it)


def check_named(value: str, image_size: int) -> str | None:
    """The small-image family of ``value`` (``timm:NAME`` / ``tv:NAME``), None for one without an adaptation
    (taken only above ``SMALL_IMAGE`` px); a ``ValueError`` naming ``model.backbone`` for an unknown name (with
    the closest ones), a family not adapted to ``image_size``, or timm missing. Builds nothing."""
    parsed = named_backbone(value)
    if parsed is None:
        raise ValueError(f"model.backbone: {value!r} is not of the form timm:NAME or tv:NAME")
    source, name = parsed
    names = _catalogue(source)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
        hint = f"closest: {', '.join(f'{source}:{c}' for c in close)}" if close else "nothing close"
        raise ValueError(f"model.backbone: unknown model {value!r}; {hint} (every name: {LISTS[source]})")
    module = _builder(source, name).__module__
    family = FAMILIES[source].get(module)
    if family is None and image_size <= SMALL_IMAGE:
        raise ValueError(
            f"model.backbone: {value!r} ({module}) has no small-image adaptation, and the images are "
            f"{image_size} px (up to {SMALL_IMAGE} px is small); small images take the ResNet, ConvNeXt and ViT "
            f"families (e.g. {source}:resnet18, {source}:{'convnext_atto' if source == 'timm' else 'convnext_tiny'}"
            f", {source}:{'vit_tiny_patch16_224' if source == 'timm' else 'vit_b_16'}), or set data.image_size "
            f"above {SMALL_IMAGE}")
    if family == "convnext" and image_size < 8:
        raise ValueError(f"model.backbone: {value!r} halves the image three times and needs 8 px or more; "
                         f"the images are {image_size} px")
    if family == "vit":
        patch = _patch_size(source, name, image_size)
        if patch and image_size % patch:
            raise ValueError(f"model.backbone: {value!r} cuts {image_size} px images into {patch} px patches, "
                             f"which do not divide them; set data.image_size to a multiple of {patch}")
    return family


def build_named(value: str, in_channels: int, image_size: int) -> NamedBackbone:
    """``value``'s model for ``in_channels``×``image_size``×``image_size`` images (see the module's docstring)."""
    family = check_named(value, image_size)
    source, name = named_backbone(value)
    small = image_size <= SMALL_IMAGE
    build = _build_timm if source == "timm" else _build_tv
    net, width = build(name, family, in_channels, image_size, small)
    _unfold_batchnorm_act(net)
    odd = sorted({type(m).__name__ for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                  and type(m) not in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)})
    if odd:  # moco.bn's split and sync conversions replace batch-norm layers by type: a subclass's extras would go
        raise ValueError(f"model.backbone: {value!r} normalises with {odd}, which moco.bn's conversions cannot "
                         f"keep; choose another model")
    return NamedBackbone(net, width)


# ----------------------------------------------------------------------------------------------------- timm
def _build_timm(name: str, family: str | None, in_channels: int, image_size: int,
                small: bool) -> tuple[nn.Module, int]:
    kwargs: dict = {"pretrained": False, "num_classes": 0, "in_chans": in_channels}
    if family == "vit":
        kwargs["img_size"] = image_size
        if small:
            kwargs["patch_size"] = default_patch_size(image_size)
    net = _timm().create_model(name, **kwargs)
    if small and family == "resnet":
        _small_resnet_stem(net, in_channels)
    elif small and family == "convnext":
        net.stem[0] = _convnext_stem(net.stem[0], in_channels)
    # the width of forward's output (with num_classes=0): pooling may widen num_features (catavgmax)
    return net, int(getattr(net, "head_hidden_size", None) or net.num_features)


def _small_resnet_stem(net: nn.Module, in_channels: int) -> None:
    """conv1 at stride 1 (a 3×3 convolution; a deep stem's first of three), no max-pool (timm or torchvision)."""
    if isinstance(net.conv1, nn.Conv2d):
        net.conv1 = _resnet_conv(in_channels, net.conv1.out_channels)
    else:  # timm's deep stems: Sequential(conv 3×3 s2, BN, act, conv, BN, act, conv)
        first = net.conv1[0]
        net.conv1[0] = _resnet_conv(in_channels, first.out_channels)
    net.maxpool = nn.Identity()


def _resnet_conv(in_channels: int, out_channels: int) -> nn.Conv2d:
    conv = nn.Conv2d(in_channels, out_channels, 3, 1, 1, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")  # timm's and torchvision's ResNet init
    return conv


def _convnext_stem(old: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """A 3×3 stride-1 convolution in place of the 4×4 stride-4 patchify stem, initialised as ConvNeXt's."""
    conv = nn.Conv2d(in_channels, old.out_channels, 3, 1, 1, bias=old.bias is not None)
    nn.init.trunc_normal_(conv.weight, std=0.02)
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)
    return conv


def _unfold_batchnorm_act(module: nn.Module) -> None:
    """timm's ``BatchNormAct2d`` (batch-norm, then dropout and activation, in one BatchNorm2d subclass) as
    ``Sequential(BatchNorm2d, drop, act)``: the same forward, and a batch-norm moco.bn can convert."""
    try:
        from timm.layers import BatchNormAct2d
    except ImportError:
        return
    for name, child in module.named_children():
        if type(child) is BatchNormAct2d:
            bn = nn.BatchNorm2d(child.num_features, child.eps, child.momentum, child.affine,
                                child.track_running_stats)
            bn.load_state_dict(child.state_dict())
            setattr(module, name, nn.Sequential(bn, child.drop, child.act))
        else:
            _unfold_batchnorm_act(child)


# ---------------------------------------------------------------------------------------------- torchvision
def _build_tv(name: str, family: str | None, in_channels: int, image_size: int,
              small: bool) -> tuple[nn.Module, int]:
    import torchvision

    builder = torchvision.models.get_model_builder(name)
    if family == "vit":
        net = _tv_vit(builder, in_channels, image_size, _patch_size("tv", name, image_size))
    else:
        extra = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
        net = builder(weights=None, **extra)
    if family == "resnet":
        if small:
            _small_resnet_stem(net, in_channels)
        elif in_channels != 3:
            old = net.conv1
            net.conv1 = nn.Conv2d(in_channels, old.out_channels, 7, 2, 3, bias=False)
            nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    elif family == "convnext":
        old = net.features[0][0]
        if small:
            net.features[0][0] = _convnext_stem(old, in_channels)
        elif in_channels != 3:
            new = nn.Conv2d(in_channels, old.out_channels, 4, 4)
            nn.init.trunc_normal_(new.weight, std=0.02)
            nn.init.zeros_(new.bias)
            net.features[0][0] = new
    elif family is None and in_channels != 3:
        raise ValueError(f"model.backbone: 'tv:{name}' takes 3-channel images (only torchvision's ResNets, "
                         f"ConvNeXts and ViTs are adapted to {in_channels}); timm:NAME adapts any model")
    return net, _drop_classifier(net, name)


def _tv_vit(builder, in_channels: int, image_size: int, patch: int) -> nn.Module:
    """torchvision's ViT of ``builder``'s size (read from a copy on the meta device, which allocates nothing)
    for ``image_size`` px images in ``patch`` px patches: its builders fix the patch size in the name."""
    from torchvision.models.vision_transformer import VisionTransformer

    with torch.device("meta"):
        shape = builder(weights=None)
    net = VisionTransformer(image_size=image_size, patch_size=patch, num_layers=len(shape.encoder.layers),
                            num_heads=shape.encoder.layers[0].num_heads, hidden_dim=shape.hidden_dim,
                            mlp_dim=shape.mlp_dim, dropout=shape.dropout, attention_dropout=shape.attention_dropout,
                            representation_size=shape.representation_size, norm_layer=shape.norm_layer)
    if in_channels != 3:
        net.conv_proj = nn.Conv2d(in_channels, net.hidden_dim, patch, patch)
        nn.init.trunc_normal_(net.conv_proj.weight, std=math.sqrt(1 / (in_channels * patch * patch)))  # as its own
        nn.init.zeros_(net.conv_proj.bias)
    return net


def _drop_classifier(net: nn.Module, name: str) -> int:
    """Replace the classifier's last linear layer (``fc``, ``classifier``, ``heads``, ``head``) by an identity;
    the features' width is its input width."""
    for attr in ("fc", "classifier", "heads", "head"):
        head = getattr(net, attr, None)
        if isinstance(head, nn.Linear):
            setattr(net, attr, nn.Identity())
            return head.in_features
        if isinstance(head, nn.Sequential) and len(head) and isinstance(head[-1], nn.Linear):
            width = head[-1].in_features
            head[-1] = nn.Identity()
            return width
    raise ValueError(f"model.backbone: 'tv:{name}' ends in no linear classifier to remove; choose another model")
