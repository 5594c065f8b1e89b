"""Checkpoint files: one per rank (each holds its own queue shard and RNG), written atomically.

A checkpoint is a folder ``checkpoint_<time>`` in the run's folder holding ``rank<r>.pt`` for every
rank. Ray Train names, merges and keeps the folders its workers report (W >= 1). Its local mode
(W = 0) persists no report, so there the run writes and keeps its folders itself (``save_local``), in
the same layout: a run's files, its ``mocolab.checkpoint`` tag and whatever reads them do not depend on
how many workers trained it. Files are plain tensors, numbers and strings, so they load with
``torch.load(weights_only=True)``: nothing in a checkpoint can run code. Each carries the run's
manifest, which the loader compares with the attempt's.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from mocolab.config.manifest import FORMAT_VERSION, RunManifest, refuse_format
from mocolab.training.storage import Location

PREFIX = "checkpoint_"


def rank_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.pt"


def atomic_save(obj: object, path: str | Path) -> Path:
    """``torch.save`` that a crash at any point cannot corrupt: a unique temporary file beside the
    target, flushed and fsynced, renamed over it, and the folder fsynced.  Until the rename the
    previous file is untouched; after it the new one is complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a writer killed mid-write
        stale.unlink(missing_ok=True)
    return path


def save_rank_state(state: dict, manifest: RunManifest, directory: str | Path, rank: int, world_size: int) -> Path:
    """This rank's checkpoint file, written atomically (``atomic_save``)."""
    return atomic_save({"format": FORMAT_VERSION, "rank": rank, "world_size": world_size,
                        "manifest": manifest.to_dict(), "state": state}, rank_file(directory, rank))


def load_rank_state(directory: str | Path, rank: int, world_size: int) -> tuple[dict, RunManifest]:
    """(trainer state, run manifest) of ``rank``; a file of another run format or world size is an error."""
    path = rank_file(directory, rank)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {directory} has no file for rank {rank}")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if blob.get("format") != FORMAT_VERSION:  # its manifest, or format 1's config, may name the run
        recorded = blob.get("manifest") or {}
        name = recorded.get("name") or (blob.get("config") or {}).get("run", {}).get("name")
        refuse_format(f"run '{name}' (checkpoint {path})" if name else f"checkpoint {path}", blob.get("format"),
                      recorded.get("mocolab"), "--set run.name=<a new name>, or remove the run's folder")
    manifest = RunManifest.from_dict(blob["manifest"], f"checkpoint {path}")
    if blob["world_size"] != world_size:
        raise ValueError(f"checkpoint {path} was written by {blob['world_size']} workers; this run has "
                         f"{world_size} (run.num_workers must match to resume; use a new run.name)")
    return blob["state"], manifest


def checkpoint_name() -> str:
    """A new checkpoint folder's name, as Ray Train names its own (``checkpoint_<date>_<time>``), in UTC so
    that names sort in the order they were written across a change of daylight-saving time."""
    return f"{PREFIX}{datetime.now(timezone.utc):%Y-%m-%d_%H-%M-%S.%f}"


def local_checkpoints(run_dir: Location) -> list[str]:
    """The complete checkpoint folders of a run (a ``rank0.pt`` in each), oldest first."""
    return [n for n in run_dir.children() if n.startswith(PREFIX) and run_dir.exists(f"{n}/rank0.pt")]


def save_local(run_dir: Location, state: dict, manifest: RunManifest, keep: int) -> str:
    """W = 0: this rank's state as a new checkpoint folder of the run, then all but the newest ``keep``
    removed (Ray's ``num_to_keep``); the new folder's name. A folder is complete once its file is (the
    file is renamed or uploaded whole), so a crash leaves the previous checkpoints as they were."""
    name = checkpoint_name()
    if not run_dir.remote:
        save_rank_state(state, manifest, Path(run_dir.root) / name, 0, 1)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            save_rank_state(state, manifest, tmp, 0, 1)
            run_dir.put_dir(tmp, name)
    kept = set(local_checkpoints(run_dir)[-keep:]) | {name}
    for old in run_dir.children():
        if old.startswith(PREFIX) and old not in kept:
            run_dir.delete_dir(old)
    return name
