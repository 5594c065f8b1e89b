"""A trained encoder, from whatever a user holds: an MLflow run id, a ``models:/`` URI or an export folder.

The encoder comes back as the backbone it was trained as (``models.build_backbone`` from the run's config,
with the logged weights), not as the exported program: a plain module runs in eval mode, on any device
and under the run's autocast, exactly as ``evaluation.extract_features`` scored it during training.
MLflow is asked only for a run id or a model URI, and only through ``tracking.logged_models``; an export folder
needs neither MLflow nor a store.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from mocolab.config import Config, from_dict
from mocolab.models.exported import FeatureExtractor, backbone_state
from mocolab.models.backbones import build_backbone

EXPORT_FILES = ("backbone.pt", "config.yaml")  # what `mocolab export` writes that an encoder is rebuilt from
# The first line of an export's README.md names its run (tracking/logged_models.py writes it)
_EXPORT_RUN = re.compile(r"^MLflow run `(?P<run>[0-9a-f]{32})` \(experiment (?P<exp>[^)]+)\)", re.M)


@dataclass(frozen=True)
class SourceRef:
    """What ``source`` names, checked without loading anything: a folder, or a logged encoder."""

    source: str
    path: Path | None = None  # an export folder
    run_id: str | None = None  # the run that trained the encoder (when known)
    run_name: str | None = None
    experiment_id: str | None = None
    experiment: str | None = None  # its experiment's name (logged encoders)
    model_uri: str | None = None

    @property
    def label(self) -> str:
        """How the encoder is named in output and in an evaluation run's name."""
        if self.run_name:
            return self.run_name
        return self.path.name if self.path is not None else self.source


@dataclass
class SavedEncoder:
    """A trained backbone (float32, CPU, eval mode), its input shape and the config it was trained with."""

    backbone: nn.Module
    channels: int
    image_size: int
    config: Config
    ref: SourceRef

    def module(self) -> FeatureExtractor:
        """Float images in [0, 1] (N×C×H×W) -> features, normalised inside as training normalised them."""
        return FeatureExtractor(self.backbone, self.channels).eval()


def resolve_source(source: str | os.PathLike[str], tracking_uri: str | None = None) -> SourceRef:
    """``source`` checked: an export folder with its files, a run with a logged encoder, or a logged model.

    A ValueError names what is wrong (a missing file, an unknown run) before anything is downloaded.
    """
    text = str(source)
    path = Path(text).expanduser()
    if not text.startswith("models:/") and path.is_dir():
        missing = [f for f in EXPORT_FILES if not (path / f).is_file()]
        if missing:
            raise ValueError(f"EXPORT_DIR: {text!r} has no {' and no '.join(missing)} (a folder `mocolab export` "
                             f"wrote has {', '.join(EXPORT_FILES)})")
        readme = path / "README.md"
        m = _EXPORT_RUN.search(readme.read_text()) if readme.is_file() else None
        return SourceRef(text, path=path.resolve(), run_id=m["run"] if m else None,
                         experiment_id=m["exp"] if m else None)
    # meant as a path: say so rather than look it up as a run
    if not text.startswith("models:/") and (os.sep in text or text.startswith(".")):
        raise ValueError(f"EXPORT_DIR: {text!r} is not a folder")
    from mocolab.tracking.logged_models import find_encoder

    found = find_encoder(text, tracking_uri)
    return SourceRef(text, run_id=found.run_id, run_name=found.run_name, experiment_id=found.experiment_id,
                     experiment=found.experiment, model_uri=found.model_uri)


def load_saved_encoder(source: str | os.PathLike[str] | SourceRef, tracking_uri: str | None = None) -> SavedEncoder:
    """The encoder ``source`` names (see ``resolve_source``), rebuilt as its training backbone."""
    ref = source if isinstance(source, SourceRef) else resolve_source(source, tracking_uri)
    if ref.path is not None:
        state = torch.load(ref.path / "backbone.pt", weights_only=True, map_location="cpu")
        return _rebuild(state, (ref.path / "config.yaml").read_text(), ref)
    from mocolab.tracking.logged_models import LoggedEncoder, fetch_encoder

    found = LoggedEncoder(ref.run_id or "", ref.run_name or "", ref.experiment_id or "", ref.experiment or "",
                          ref.model_uri or "")
    with tempfile.TemporaryDirectory() as tmp:
        program, config = fetch_encoder(found, tmp, tracking_uri)
        state = backbone_state(dict(torch.export.load(str(program)).state_dict))
        return _rebuild(state, config.read_text(), ref)


def _rebuild(state: dict[str, torch.Tensor], config_text: str, ref: SourceRef) -> SavedEncoder:
    cfg = from_dict(yaml.safe_load(config_text) or {}, where=f"{ref.source}: config.yaml")
    stem = next((v for v in state.values() if v.ndim == 4), None)  # every backbone opens with a conv (or patches)
    if stem is None:
        raise ValueError(f"{ref.source}: no convolution in the weights; not an encoder mocolab trained")
    channels = int(stem.shape[1])
    mo, vit = cfg.model, cfg.vit
    backbone = build_backbone(mo.backbone, channels, mo.width, image_size=cfg.image_size, patch_size=vit.patch_size,
                              depth=vit.depth, freeze_patch_embed=vit.freeze_patch_embed)
    try:
        backbone.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{ref.source}: the weights do not fit model.backbone={mo.backbone!r} of its config "
                         f"({str(err).splitlines()[0]})") from None
    return SavedEncoder(backbone.float().eval(), channels, cfg.image_size, cfg, ref)
