"""What a driver sends to a Ray cluster's nodes, and what it checks they already have.

A cluster node runs a trial without anyone installing mocolab on it: the
driver ships the package it imported itself (Ray runtime env ``py_modules``),
so the code that runs is the code that was submitted, also when a node has an
older mocolab installed.  The environment (torch, Ray, MLflow, ...) is large
and changes rarely: it belongs to the nodes' image, not to each job.  Ray's
``pip`` runtime env would clone the whole environment per node and download
what is missing (gigabytes per node, and no laptop cluster has
PyPI), so instead the driver pins the versions it runs with and checks every
node against them before any trial starts; a node that differs is an error
naming the node, the package and the two versions.

Relative paths are the other trap: under ``ray job submit --working-dir`` the
driver runs in Ray's temporary copy of the folder, deleted with the session,
and a relative store there would silently lose the results.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable


# Distribution -> module, for what trial processes import.  Matplotlib, SciPy and Optuna are
# driver-only (plots, statistics, search) and are not needed on the nodes.
NODE_REQUIREMENTS: dict[str, str] = {
    "torch": "torch", "torchvision": "torchvision", "kornia": "kornia", "numpy": "numpy", "pyyaml": "yaml",
    "ray": "ray", "mlflow": "mlflow", "pandas": "pandas", "pyarrow": "pyarrow",
    "psutil": "psutil",  # MLflow's system metrics, sampled on every worker node
}
DRIVER_ONLY = ("matplotlib", "scipy", "optuna")
# Used on a node when present, not checked: GPU metrics need it only where a GPU is (MLflow skips them without)
NODE_OPTIONAL = ("nvidia-ml-py",)
# Must equal the driver's: tensors, checkpoints and collectives cross these, and Ray refuses other versions.
EXACT = ("python", "torch", "torchvision", "ray")

_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def package_dir() -> Path:
    """The mocolab folder this process imported: what trials will run."""
    return Path(__file__).resolve().parents[1]


def job_runtime_env() -> dict[str, Any]:
    """The runtime env of the Ray job this driver runs in (``ray job submit``), else {}."""
    try:
        return json.loads(os.environ.get(_JOB_CONFIG, "{}")).get("runtime_env") or {}
    except ValueError:
        return {}


def submitted_copy() -> Path | None:
    """This folder, when it is Ray's temporary copy of a ``--working-dir`` (results written here are lost)."""
    if job_runtime_env().get("working_dir"):
        return Path.cwd().resolve()
    return None


def check_job_paths(paths: dict[str, str | None]) -> None:
    """Refuse local paths inside a ``--working-dir`` copy before any work, naming the field.

    ``paths`` maps a field (``--storage``) to an absolute local path, or to
    None/a URI for what is not local.
    """
    copy = submitted_copy()
    if copy is None:
        return
    for field, value in paths.items():
        if value and Path(value).resolve().is_relative_to(copy):
            raise ValueError(
                f"{field}: {value} is inside this job's --working-dir copy ({copy}), which Ray deletes "
                f"with the session; give an absolute path that outlives the job (on a cluster: storage "
                f"every node shares, or an mlflow server URI for --tracking-uri)")


def code_runtime_env() -> tuple[dict[str, Any], bool]:
    """The runtime env that ships mocolab to every task and actor, and whether it overrides the job's.

    A job that already ships its own ``py_modules`` keeps them; mocolab is added to the list.
    """
    mine = [str(package_dir())]
    theirs = list(job_runtime_env().get("py_modules") or [])
    if theirs:
        return {"py_modules": theirs + [m for m in mine if m not in theirs]}, True
    return {"py_modules": mine}, False


def method_runtime_env(folders: Iterable[str]) -> dict[str, Any]:
    """Ray Train's workers' runtime env for a run whose method is named by a ``module:Class`` path
    (method/plugins.py): the module's folder on their path, as a ``local://`` ``py_modules`` entry, beside
    what the job ships (a worker's ``py_modules`` replace the job's, so the job's come first). {} where there
    is none: an installed plugin is on every worker of the environment already.

    Ray uploads a local folder only for a job (``ray.init``), not for the workers Ray Train's controller
    starts: the folder is used in place, so it must be on every node that trains (this machine, or shared
    storage); a node without it fails the run naming the folder."""
    folders = list(folders)
    if not folders:
        return {}
    import ray

    theirs = list((ray.get_runtime_context().runtime_env or {}).get("py_modules") or [])
    mine = [f"local://{folder}" for folder in folders]
    return {"py_modules": theirs + [m for m in mine if m not in theirs]}


def driver_versions(dists: Iterable[str] = NODE_REQUIREMENTS) -> dict[str, str]:
    """The versions this driver runs with: the pins every node is checked against."""
    out = {"python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def check_nodes(timeout_s: float = 600.0, requirements: dict[str, str] | None = None,
                say=print) -> list[dict[str, Any]]:
    """Ask every alive node what it can import, with this job's runtime env; raise on any mismatch.

    The probe runs as a zero-CPU task pinned to each node, so a busy cluster still answers.  It is
    built here (a nested function travels by value) so it runs even where mocolab is not importable.
    Returns the nodes' reports.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    wanted = dict(requirements or NODE_REQUIREMENTS)

    def probe(reqs: dict[str, str]) -> dict[str, Any]:
        import importlib
        import importlib.metadata as md
        import socket
        import sys as _sys

        report: dict[str, Any] = {"host": socket.gethostname(), "executable": _sys.executable,
                                  "python": f"{_sys.version_info.major}.{_sys.version_info.minor}"}
        for dist, module in {**reqs, "mocolab": "mocolab"}.items():
            try:
                mod = importlib.import_module(module)
            except Exception as err:  # noqa: BLE001 - the report says what failed
                report[dist] = f"missing ({type(err).__name__}: {err})"
                continue
            if dist == "mocolab":
                report[dist] = str(getattr(mod, "__file__", "?"))
                continue
            try:
                report[dist] = md.version(dist)
            except md.PackageNotFoundError:
                report[dist] = str(getattr(mod, "__version__", "unknown"))
        return report

    pins = driver_versions(wanted)
    remote = ray.remote(num_cpus=0, max_retries=0)(probe)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = {n["NodeID"]: remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(wanted) for n in nodes}
    reports, problems = [], []
    for node in nodes:
        where = f"node {node['NodeManagerAddress']} ({node['NodeID'][:8]})"
        try:
            report = ray.get(refs[node["NodeID"]], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            problems.append(f"{where}: did not answer the environment check in {timeout_s:.0f} s")
            continue
        except Exception as err:  # noqa: BLE001 - e.g. the runtime env could not be set up there
            problems.append(f"{where}: the environment check failed: {type(err).__name__}: {err}")
            continue
        report["node"] = where
        reports.append(report)
        python = report.get("executable", "?")
        for key, pin in pins.items():
            got = report.get(key, "missing")
            if str(got).startswith("missing"):
                problems.append(f"{where}: {key} is {got}; install {key}=={pin} into {python}")
            elif key in EXACT and got != pin:
                problems.append(f"{where}: {key} {got}, but the driver runs {pin}; the versions must match")
        if str(report.get("mocolab", "")).startswith("missing"):
            problems.append(f"{where}: mocolab could not be imported from the shipped copy: {report['mocolab']}")
    if problems:
        raise ValueError("the cluster's nodes cannot run these trials:\n  " + "\n  ".join(problems))
    say(f"Ray cluster: {len(reports)} node(s) checked: python {pins['python']}, "
        + ", ".join(f"{k} {pins[k]}" for k in ('torch', 'ray', 'mlflow') if k in pins)
        + f"; mocolab shipped from {package_dir()}")
    return reports
