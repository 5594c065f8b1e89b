"""What every study script shares: its command-line flags, building the Sweep, the closing report."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from ..config import list_presets, parse_overrides
from ..report import build_report
from .sweep import Sweep, Trial, resolve_sweep, run_sweep, sweep_dir

# What a study's report function returns: the printed summary, its plot (or None) and its table.
StudyReport = tuple[str, Path | None, pd.DataFrame]


def study_parser(description: str, default_name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--preset", default="cpu-quick", help=f"one of {list_presets()} (default cpu-quick)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per setting (default 1)")
    p.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed .. first-seed+seeds-1")
    p.add_argument("--name", default=None, help=f"the sweep's name; the same name resumes it "
                                                f"(default {default_name}-<preset>-s<first seed>)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field in every trial, e.g. --set optim.epochs=5")
    p.add_argument("--workers-per-trial", type=int, default=1, help="Ray Train workers per trial (default 1)")
    p.add_argument("--cpus-per-worker", type=float, default=None,
                   help="CPUs per worker (default: the cluster's CPUs shared among concurrent trials)")
    p.add_argument("--gpus-per-worker", type=float, default=0.0, help="GPUs per worker (default 0)")
    p.add_argument("--max-concurrent", type=int, default=None,
                   help="trials at once (default: as many as the CPUs hold)")
    p.add_argument("--storage", default="runs/sweeps", help="where Tune and Train keep sweep state")
    p.add_argument("--stop-after", type=int, default=None,
                   help="end after N trials have finished; run the same command again to continue")
    p.set_defaults(default_name=default_name)
    return p


def seeds_of(args: argparse.Namespace) -> list[int]:
    if args.seeds < 1:
        raise ValueError(f"--seeds: {args.seeds} must be >= 1")
    return list(range(args.first_seed, args.first_seed + args.seeds))


def make_sweep(args: argparse.Namespace, study: str, description: str, trials: list[Trial],
               **search: Any) -> Sweep:
    """The Sweep the common flags describe; ``search`` passes a search's fields (``search="optuna"``,
    ``search_space``, ``scheduler``, ``metric``, ``num_samples``, ``seeds``) through."""
    name = args.name or f"{args.default_name}-{args.preset}-s{args.first_seed}"
    return Sweep(study=study, name=name, preset=args.preset, description=description,
                 base_overrides=parse_overrides(args.set), trials=trials,
                 workers_per_trial=args.workers_per_trial, cpus_per_worker=args.cpus_per_worker,
                 gpus_per_worker=args.gpus_per_worker, max_concurrent=args.max_concurrent,
                 tracking_uri=args.tracking_uri, storage=args.storage, stop_after=args.stop_after, **search)


def check_cluster() -> None:
    """A RAY_ADDRESS that does not answer is an error before any MLflow run is made."""
    address = os.environ.get("RAY_ADDRESS")
    if not address or address == "auto":
        return
    import socket
    from urllib.parse import urlparse

    if "://" in address:
        u = urlparse(address)
        host, port = u.hostname, u.port or (8265 if u.scheme.startswith("http") else 10001)
    else:
        host, _, port_text = address.rpartition(":")
        port = int(port_text) if port_text.isdigit() else 6379
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as err:
        raise ValueError(f"RAY_ADDRESS={address}: the cluster does not answer ({err}); start it "
                         f"(`ray start --head`) or unset RAY_ADDRESS to run on a local Ray") from None


def run_study(sweep: Sweep, report: Callable[[Path, pd.DataFrame], StudyReport]) -> int:
    """Run the sweep, then ``report(out_dir, trials) -> (text, figure, table)``; print and log it.

    ``out_dir`` is the sweep's folder (``<storage>/<name>``, absolute), where the study saves its plot.
    """
    sweep = resolve_sweep(sweep)
    try:
        check_cluster()
        parent, _ = run_sweep(sweep)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    trials = parent.trials()
    if trials.empty:
        print("no trial finished: nothing to summarise", file=sys.stderr)
        return 1
    text, figure, table = report(sweep_dir(sweep), trials)
    print(text)
    parent.log_summary(table, trials, figure, text)
    rep = build_report(sweep.study, sweep_dir(sweep) / "report", parent_run=parent.run_id,
                       tracking_uri=sweep.tracking_uri)
    bad = trials["status"].isin(["failed", "running", "stopped"]).sum()
    parent.set_status("finished")
    print(f"\nMLflow: experiment '{sweep.study}', parent run {parent.run_id} with {len(trials)} child runs.")
    print(f"Open the UI: mlflow ui --backend-store-uri {parent.uri}   (then http://127.0.0.1:5000)")
    if figure is not None:
        print(f"Plot: {figure}")
    print(f"Report: {rep.html}  (also under the parent run's artifacts, report/)")
    return 0 if bad == 0 else 1
