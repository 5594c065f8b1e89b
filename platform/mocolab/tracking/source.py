"""Provenance: which code, which person and which Ray job produced a run, under MLflow's own tag names.

MLflow's UI fills its Source, User and Version columns from the ``mlflow.source.*``
and ``mlflow.user`` tags; the fluent API sets them for a script, but our runs
are made with ``MlflowClient`` (and children in Tune's trial processes, whose
``sys.argv[0]`` is Ray's worker), so the driver computes them once
(``source_tags``) and every run it makes carries the same set.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

from mocolab.tracking.uri import local_store_path

DIRTY_TAG = "mocolab.source.git.dirty"  # MLflow has no standard tag for uncommitted changes
CHANGED_TAG = "mocolab.source.git.changed"  # which tracked files differ from the commit, when some do
PLAN_TAG = "mocolab.plan_hash"  # the hashes of the rules a run is made under (repro/preregistration.py)
PLAN_ENV = "MOCOLAB_PLAN_HASH"  # set by `mocolab repro` for the study it launches: every run made then carries it


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _repo_root(start: Path) -> Path | None:
    top = _git(["rev-parse", "--show-toplevel"], start)
    return Path(top) if top else None


def source_tags(entry: str | None = None, tracking_uri: str | None = None) -> dict[str, str]:
    """``mlflow.source.{name,type,git.commit,git.branch,git.repoURL}``, ``mlflow.user`` and a dirty flag.

    The repository is the one the command runs in (the working folder, as a user runs a study from their
    checkout), else the one this package was installed from. ``entry``: the script or command, by
    default ``sys.argv[0]``, named relative to the repository when it lies inside it. ``tracking_uri``:
    the store the tags go to. A store committed in the repository (the
    reproduction's ``results/runs.db``, committed packed as ``results/runs.db.xz``) changes as the run writes
    to it; that is the run's output, not its code, so neither file makes the checkout dirty. The files that do
    are named in a tag.
    """
    entry = entry or (sys.argv[0] if sys.argv and sys.argv[0] else "python")
    root = _repo_root(Path.cwd()) or _repo_root(Path(__file__).resolve().parent)
    path = Path(entry)
    if path.suffix != ".py":  # a console script: its name and subcommand, e.g. "mocolab train"
        name = " ".join([path.name, *sys.argv[1:2]]) if entry == (sys.argv[0] if sys.argv else None) else entry
    else:
        name = str(path.resolve()) if path.exists() else entry
        if root is not None:
            try:
                name = str(path.resolve().relative_to(root.resolve()))
            except ValueError:
                pass
    submitted = submission_id()  # `ray job submit`: a job; anything else runs locally
    tags = {"mlflow.source.name": name,
            "mlflow.source.type": "JOB" if submitted else "LOCAL",
            "mlflow.user": _user()}
    if root is not None:
        commit = _git(["rev-parse", "HEAD"], root)
        if commit:
            tags["mlflow.source.git.commit"] = commit
            # tracked files that differ from the commit, staged or not
            diff = _git(["diff", "--name-only", "HEAD", "--", ".", *_exclude(tracking_uri, root)], root)
            tags[DIRTY_TAG] = "unknown" if diff is None else str(bool(diff)).lower()
            if diff:
                changed = diff.splitlines()
                tags[CHANGED_TAG] = ", ".join(changed[:20]) + (f" and {len(changed) - 20} more"
                                                               if len(changed) > 20 else "")
        branch = _git(["rev-parse", "--abbrev-ref", "HEAD"], root)
        if branch and branch != "HEAD":
            tags["mlflow.source.git.branch"] = branch
        remote = _git(["config", "--get", "remote.origin.url"], root)
        if remote and "@" not in remote.split("://")[-1].split("/")[0]:  # never a URL with credentials in it
            tags["mlflow.source.git.repoURL"] = remote
    job = ray_job_id()
    if job:
        tags["ray_job_id"] = job
    if os.environ.get(PLAN_ENV):
        tags[PLAN_TAG] = os.environ[PLAN_ENV]
    return tags


def _exclude(tracking_uri: str | None, root: Path) -> list[str]:
    """git's pathspec leaving out the store's own file or folder (and its packed form), where it lies in the
    repository."""
    store = local_store_path(tracking_uri) if tracking_uri else None
    if not store:
        return []
    try:
        inside = Path(store).resolve().relative_to(root.resolve())
    except ValueError:
        return []
    # and its packed form, which git holds where the store itself is ignored (the reproduction's runs.db.xz)
    return [f":(exclude){inside}", f":(exclude){inside}.xz"]


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user with no passwd entry
        return os.environ.get("USER", "unknown")


def submission_id() -> str | None:
    """The id ``ray job submit`` gave this job: its supervisor passes it to the entrypoint in the job config
    (the environment variable RAY_JOB_CONFIG_JSON_ENV_VAR, metadata ``job_submission_id``)."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if raw:
        try:
            sub = (json.loads(raw).get("metadata") or {}).get("job_submission_id")
        except (ValueError, AttributeError):
            sub = None
        if sub:
            return str(sub)
    return os.environ.get("RAY_JOB_SUBMISSION_ID") or None


def ray_job_id() -> str | None:
    """The submission id of a ``ray job submit``, else the job id of a Ray this process already joined.

    Ray is read from ``sys.modules``, never imported: tracking must work (and stay light) without it.
    """
    sub = submission_id() or os.environ.get("RAY_JOB_ID")
    if sub:
        return sub
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            return ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - a tag is not worth failing a run for
        pass
    return None
