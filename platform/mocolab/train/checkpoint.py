"""Checkpoint files: one per rank (each holds its own queue shard and RNG), written atomically.

A checkpoint directory holds ``rank<r>.pt`` for every rank; Ray Train merges
the files the workers report into one directory.  Files are plain tensors,
numbers and strings, so they load with ``torch.load(weights_only=True)``:
nothing in a checkpoint can run code.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

FORMAT_VERSION = 1
LOCAL_CHECKPOINT = "local-checkpoint"  # W = 0: Ray's local mode persists no checkpoint, so the run keeps one here


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


def save_rank_state(state: dict, config: dict, directory: str | Path, rank: int, world_size: int) -> Path:
    """This rank's checkpoint file, written atomically (``atomic_save``)."""
    return atomic_save({"format": FORMAT_VERSION, "rank": rank, "world_size": world_size, "config": config,
                        "state": state}, rank_file(directory, rank))


def load_rank_state(directory: str | Path, rank: int, world_size: int) -> tuple[dict, dict]:
    """(trainer state, config dict) of ``rank``; a checkpoint from another world size is an error."""
    path = rank_file(directory, rank)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {directory} has no file for rank {rank}")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if blob.get("format") != FORMAT_VERSION:
        raise ValueError(f"checkpoint {path}: format {blob.get('format')!r}, expected {FORMAT_VERSION}")
    if blob["world_size"] != world_size:
        raise ValueError(f"checkpoint {path} was written by {blob['world_size']} workers; this run has "
                         f"{world_size} (run.num_workers must match to resume; use a new run.name)")
    return blob["state"], blob["config"]
