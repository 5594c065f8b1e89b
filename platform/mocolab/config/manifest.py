"""A run's manifest: what the run is, written once in its folder and compared in one place.

The driver, every worker and the MLflow bookkeeping each meet a run again on a resume: the driver in
the run's folder, MLflow in the run it finds by name, a worker in the checkpoint it loads. Each holds
a ``RunManifest`` (the config, its fingerprint and the run format) and hands both to ``check_resume``,
so one rule decides whether an attempt continues a run.

The run format covers everything a run leaves behind: this manifest, the checkpoint files and the
MLflow record. A field added to the config needs no entry anywhere, provided its default computes what
the code does without the field: a record that lacks it is read at that default, and derived
names and fingerprints read only the fields that differ from their defaults. Anything else (a field
removed or renamed, a default whose meaning changed, another checkpoint layout) moves ``FORMAT_VERSION``,
and a run of another format is refused with the way to finish it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Mapping

from mocolab.config import Config, apply_overrides, check_same_config, fingerprint
from mocolab.training.code_fingerprint import CodeFingerprint, code_fingerprint
from mocolab.training.storage import Location



def mocolab_version() -> str:
    """mocolab's version, as pyproject.toml (its one source) gave it to the installed package; a checkout put
    on the path without an install (a Ray job's working_dir on a node without mocolab) says so instead."""
    try:
        return version("mocolab")
    except PackageNotFoundError:
        return "0+checkout"


__version__ = mocolab_version()
FORMAT_VERSION = 2
MANIFEST = "manifest.json"  # in the run's folder, beside its checkpoints
OUTCOME = "outcome.json"  # ... and, once it has ended, how: what the same command reports without training
FINAL_ERROR = "final_error.json"  # a worker's user error that ended the run, for the driver to raise once
# For each run format below FORMAT_VERSION, the last mocolab that writes it: the version that can finish such a run.
WRITTEN_BY = {1: "0.1.0"}
FORMAT1_RECORD = "config.json"  # what a format-1 run folder holds instead of a manifest


class OldRunFormat(ValueError):
    """A run another format started: one line that names the run, the version that can finish it and
    how to start fresh (a user's choice, so exit 2 and no traceback)."""


@dataclass(frozen=True)
class RunManifest:
    """What a run is. ``config`` is the flattened config (``Config.flatten``), the form MLflow params,
    ``--set`` and the comparison use; every value is JSON, so the manifest is plain data in a checkpoint
    (``torch.load(weights_only=True)``), in a file and in a pickle to a Ray worker."""

    name: str
    config: Mapping[str, Any]
    fingerprint: str
    format: int = FORMAT_VERSION
    mocolab: str = __version__
    # the code that trains it (training/code_fingerprint.py): empty for a run that records none
    code: Mapping[str, Any] = field(default_factory=dict)
    # where a run continued across a code change (--continue-across-code): [{"code": digest, "from_step": n}]
    segments: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, cfg: Config, code: CodeFingerprint | None = None) -> "RunManifest":
        code = code or code_fingerprint()
        return cls(cfg.run_name, cfg.flatten(), fingerprint(cfg), code=code.to_dict())

    @property
    def code_fingerprint(self) -> CodeFingerprint:
        return CodeFingerprint.from_dict(self.code)

    def to_config(self) -> Config:
        """The Config this manifest was made from; a field it lacks takes its default."""
        return apply_overrides(Config(), self.config)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "config": dict(self.config), "code": dict(self.code),
                "segments": [dict(s) for s in self.segments]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> "RunManifest":
        try:
            return cls(str(raw["name"]), dict(raw["config"]), str(raw["fingerprint"]), int(raw["format"]),
                       str(raw.get("mocolab", "")), dict(raw.get("code") or {}),
                       tuple(dict(s) for s in raw.get("segments") or ()))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{where}: not a run manifest ({type(err).__name__}: {err})") from None


def with_defaults(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``flat`` with every field it lacks at its default, so a record without a field reads as that default."""
    return {**Config().flatten(), **flat}


def check_resume(started: RunManifest, now: RunManifest, where: str, fresh: str) -> None:
    """Refuse to continue ``started`` with ``now`` unless both are this format and the same run.

    ``where`` names the record (``run 'x' (runs/x)``); ``fresh`` says how to start over instead. A run of
    another format is refused whatever its config: its files are read by the mocolab that wrote them.
    """
    if started.format != FORMAT_VERSION:
        refuse_format(where, started.format, started.mocolab, fresh)
    check_same_config(where, with_defaults(started.config), now.config, fresh)


def refuse_format(where: str, found: Any, version: str | None, fresh: str) -> None:
    """Raise the one-line ``OldRunFormat`` for a record of run format ``found``, written by ``version``."""
    version = version or WRITTEN_BY.get(found, "another version")
    raise OldRunFormat(f"{where} was started by mocolab {version} (run format {found}); mocolab {__version__} "
                       f"reads run format {FORMAT_VERSION} only: finish it with mocolab {version}, or start fresh: "
                       f"{fresh}")


def read_manifest(run_dir: Location, name: str) -> RunManifest | None:
    """The manifest of the run in ``run_dir``; None where no run has started. A format-1 folder (a config
    record, no manifest) reads as a manifest of format 1, which ``check_resume`` refuses."""
    if run_dir.exists(MANIFEST):
        return RunManifest.from_dict(json.loads(run_dir.read_text(MANIFEST)), f"{run_dir}/{MANIFEST}")
    if run_dir.exists(FORMAT1_RECORD):
        return RunManifest(name, {}, "", format=1, mocolab=WRITTEN_BY[1])
    return None


def write_manifest(run_dir: Location, manifest: RunManifest) -> None:
    run_dir.write_text(MANIFEST, json.dumps(manifest.to_dict(), indent=1))


def read_outcome(run_dir: Location) -> dict[str, Any] | None:
    """How the run in ``run_dir`` ended (``write_outcome``), or None while it has not."""
    return json.loads(run_dir.read_text(OUTCOME)) if run_dir.exists(OUTCOME) else None


def write_outcome(run_dir: Location, outcome: Mapping[str, Any]) -> None:
    run_dir.write_text(OUTCOME, json.dumps(dict(outcome), indent=1))


__all__ = ["FINAL_ERROR", "FORMAT_VERSION", "MANIFEST", "OUTCOME", "OldRunFormat", "RunManifest", "check_resume",
           "read_manifest", "read_outcome", "refuse_format", "with_defaults", "write_manifest", "write_outcome"]
