"""A config from its sources, in one order: a preset (YAML data in presets/), then a config file, then
``--set`` overrides, each value coerced to its field's type; validated before it is returned."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable, Mapping
import yaml

from mocolab.config.schema import _SECTION_TYPES, Config, _set, apply_overrides
from mocolab.training.storage import is_uri
from mocolab.config.validate import validate


PRESET_DIR = Path(__file__).with_name("presets")


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_summary(name: str) -> str:
    """What a preset is for: the start of its leading comment, up to its first colon (or, where that is too
    short to say anything, its first full stop)."""
    lines = []
    for line in (PRESET_DIR / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    head = text.split(": ", 1)[0]
    return head if len(head) >= 25 else text.split(". ", 1)[0].rstrip(".")


def load_preset(name: str) -> Config:
    """Defaults updated by ``presets/<name>.yaml``; a preset is data, never a code branch."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"run.preset: unknown preset {name!r}; choose one of {list_presets()}")
    with open(path) as fh:
        raw = yaml.safe_load(fh) or {}
    cfg = from_dict(raw, where=f"preset {name!r}")
    cfg.run.preset = name
    return cfg


def from_dict(raw: Mapping[str, Any], where: str = "config") -> Config:
    """Nested mapping -> Config, with unknown sections or keys reported by name."""
    cfg = Config()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping of sections, got {type(raw).__name__}")
    for section, values in raw.items():
        if section not in _SECTION_TYPES:
            raise ValueError(f"{where}: unknown section {section!r}; sections are {list(_SECTION_TYPES)}")
        if not isinstance(values, Mapping):
            raise ValueError(f"{where}: section {section!r} must be a mapping")
        for key, value in values.items():
            _set(cfg, f"{section}.{key}", value)
    return cfg


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["moco.m=0.9", "queue.size=4096"]`` -> dict, values parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected section.key=value, e.g. moco.m=0.9")
        key, text = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(text) if text.strip() else None
    return out


def config_file_overrides(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML config of the user's (``--config my.yaml``), in the presets' form (sections of fields), as
    ``--set``-style overrides: applied over the preset and under ``--set``.  What ``--print-config`` prints
    loads back unchanged."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"--config: {str(path)!r} is not a file")
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"--config: {str(path)!r} is not valid YAML ({err})".replace("\n", " ")) from None
    if not isinstance(raw, Mapping) or not all(isinstance(v, Mapping) for v in raw.values()):
        raise ValueError(f"--config: {str(path)!r} must map sections to fields, as the presets do "
                         f"(sections: {list(_SECTION_TYPES)})")
    out = {f"{section}.{key}": value for section, values in raw.items() for key, value in values.items()}
    for key in out:  # unknown sections or fields, named with the file
        section, _, name = key.partition(".")
        if section not in _SECTION_TYPES or name not in {f.name for f in fields(_SECTION_TYPES[section])}:
            raise ValueError(f"--config: {str(path)!r}: unknown config key {key!r}")
    return out


def to_yaml(cfg: Config) -> str:
    """Every resolved field, as YAML that ``--config`` reads back to the same config."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)








def build_config(preset: str = "cpu-quick", overrides: Iterable[str] | Mapping[str, Any] = ()) -> Config:
    """Preset + overrides, validated: the one entry point for the CLI and the experiments."""
    cfg = load_preset(preset)
    ov = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    cfg = apply_overrides(cfg, ov)
    validate(cfg)
    return cfg


PATH_FIELDS = ("data.root", "run.output_dir")  # resolved against the caller's folder before Ray moves processes


def absolute_paths(overrides: Mapping[str, Any], cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``overrides`` with relative path fields made absolute against ``cwd`` (default: this folder)."""
    base = Path(cwd) if cwd is not None else Path.cwd()
    out = dict(overrides)
    for key in PATH_FIELDS:
        value = out.get(key)
        if isinstance(value, str) and value and not is_uri(value):  # a URI is never a local path
            p = Path(value).expanduser()
            out[key] = str(p if p.is_absolute() else (base / p).resolve())
    return out


def with_absolute_paths(cfg: Config, cwd: str | os.PathLike[str] | None = None) -> Config:
    """The config with ``data.root`` and ``run.output_dir`` absolute: Ray's workers and trials run elsewhere."""
    flat = cfg.flatten()
    return apply_overrides(cfg, absolute_paths({k: flat[k] for k in PATH_FIELDS}, cwd))
