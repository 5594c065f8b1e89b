"""Provenance tags: which code and which Ray job produced a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def ray_job_id() -> str | None:
    """The submission id of a ``ray job submit``, else the job id of a Ray this process already joined.

    Ray is read from ``sys.modules``, never imported: tracking must work (and stay light) without it.
    """
    sub = os.environ.get("RAY_JOB_SUBMISSION_ID") or os.environ.get("RAY_JOB_ID")
    if sub:
        return sub
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            return ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - a tag is not worth failing a run for
        pass
    return None
