"""What every study script shares: its command-line flags, its ``main`` (``study_main``), building the Sweep and
its Launch, the closing report.

Only the flags and the sweep's description load at import: a study refuses
bad input (``check_sweep``) before Ray, MLflow, torch or pandas start, which
takes seconds; ``run_study`` loads them once the input is good.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from mocolab.config import config_file_overrides, list_presets, parse_overrides
from mocolab.config.flags import check_seeds, parse_checked
from mocolab.training.interrupts import closing_on_signals, exit_code
from mocolab.training.code_fingerprint import neutral_changes
from mocolab.training.rerun import CONTINUE_FLAG, CONTINUE_HELP, REUSE_FLAG, REUSE_HELP
from mocolab.config.launch_fields import config_file_requests
from mocolab.tune.spec import (REGISTER_METRIC, REGISTER_METRICS, TEST_METRICS, Launch, Sweep, Trial,
                               check_sweep, register_warning, settle_launch)

if TYPE_CHECKING:
    import pandas as pd

    # What a study's report function returns: the printed summary, its plot (or None) and its table.
    StudyReport = tuple[str, Path | None, pd.DataFrame]
    Report = Callable[[Path, pd.DataFrame], StudyReport]


def study_parser(description: str, default_name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--preset", default="cpu-quick", help=f"one of {list_presets()} (default cpu-quick)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per setting (default 1)")
    p.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed .. first-seed+seeds-1")
    p.add_argument("--name", default=None, help=f"the sweep's name; the same name resumes it "
                                                f"(default {default_name}-<preset>-s<first seed>)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    p.add_argument("--config", default=None, metavar="FILE.yaml",
                   help="a config of your own in the presets' form, applied to every trial over --preset")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field in every trial, e.g. --set optim.epochs=5")
    p.add_argument("--workers-per-trial", type=int, default=None,
                   help="Ray Train workers per trial (default --set run.num_workers if given, else 1)")
    p.add_argument("--cpus-per-worker", type=float, default=None,
                   help="CPUs per worker (default --set run.cpus_per_worker if given, else the cluster's CPUs "
                        "shared among concurrent trials)")
    p.add_argument("--gpus-per-worker", type=float, default=None,
                   help="GPUs per worker, at most 1: more GPUs are more workers (default --set "
                        "run.gpus_per_worker if given, else 0)")
    p.add_argument("--max-concurrent", type=int, default=None,
                   help="trials at once (default: as many as the CPUs hold)")
    p.add_argument("--storage", default=os.environ.get("MOCOLAB_STORAGE", "runs/sweeps"),
                   help="where Tune and Train keep sweep state: a folder all nodes share, or a URI "
                        "(default $MOCOLAB_STORAGE, else runs/sweeps)")
    p.add_argument("--stop-after", type=int, default=None,
                   help="end after N trials have finished; run the same command again to continue")
    p.add_argument("--register", default=None, metavar="NAME",
                   help="at the end, register the best finished trial's encoder in the MLflow Model Registry as NAME")
    p.add_argument("--register-metric", default=REGISTER_METRIC, choices=list(REGISTER_METRICS),
                   help=f"what 'best' means for --register (default {REGISTER_METRIC}: the validation split's, which "
                        f"needs --set data.val_size=N in a grid; {' and '.join(TEST_METRICS)} rank by the test split, "
                        f"which is selection on it: the registered model's test score is then optimistic; "
                        f"final_loss: the lowest)")
    p.add_argument("--watch", type=int, nargs="?", const=30, default=None, metavar="SECONDS",
                   help="keep the sweep's HTML report current while trials run, rewritten after every trial and "
                        "at most every SECONDS (default 30); the page reloads itself")
    p.add_argument("--verbose", action="store_true",
                   help="also print Ray's own output: Tune's status tables, the workers' and actors' logs "
                        "(always kept in Ray's log files)")
    p.add_argument(REUSE_FLAG, action="store_true", help=f"for each trial: {REUSE_HELP}")
    p.add_argument(CONTINUE_FLAG, action="store_true", help=f"for each trial: {CONTINUE_HELP}")
    p.add_argument("--neutral-code-changes", default=None, metavar="FILE.json",
                   help="a committed list of code changes declared neutral ([{from, to, reason}]): a trial "
                        "interrupted under one of them continues across it, the change recorded")
    p.set_defaults(default_name=default_name)
    return p


def seeds_of(args: argparse.Namespace) -> list[int]:
    check_seeds(args.first_seed, args.seeds)
    return list(range(args.first_seed, args.first_seed + args.seeds))


def comma_values(flag: str, text: str, cast: Callable[[str], Any], kind: str, listing: str,
                 one: str) -> list[Any]:
    """A flag's comma-separated values, each read by ``cast``: ``kind`` and ``listing`` name what a word that
    does not read should have been, ``one`` what an empty list lacks (their ranges are the config's checks)."""
    values = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        try:
            values.append(cast(word))
        except ValueError:
            raise ValueError(f"{flag}: {word!r} is not {kind} ({listing})") from None
    if not values:
        raise ValueError(f"{flag}: give at least one {one}")
    return values


def momenta_of(args: argparse.Namespace) -> list[float]:
    """``--momenta``: comma-separated values of m (their range is the config's ``moco.m`` check)."""
    return comma_values("--momenta", args.momenta, float, "a number", "comma-separated values of m in [0, 1)",
                        "value of m in [0, 1)")


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    """--config's fields, then --set's: applied to every trial over the preset (and recorded as the
    sweep's settings, so a resume with another file is refused by name)."""
    fields = config_file_requests(args.preset, config_file_overrides(args.config)) if args.config else {}
    return {**fields, **parse_overrides(args.set)}


def study_main(parser: argparse.ArgumentParser, argv: list[str] | None,
               plan: Callable[[argparse.Namespace, list[int]], tuple[Sweep, Report]]) -> int:
    """A study's ``main``: its flags parsed and checked, ``plan(args, seeds) -> (sweep, report)``, the sweep
    checked as the flags launch it, then ``run_study``. Bad input, wherever it is found, is one line and exit
    status 2."""
    try:
        args = parse_checked(parser, argv)
        sweep, report = plan(args, seeds_of(args))
        sweep, launch = settle_launch(sweep, launch_of(args), launch_flags_given(args))
        check_sweep(sweep, launch)  # before the seconds of loading Ray, MLflow and torch
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run_study(sweep, launch, report)


def make_sweep(args: argparse.Namespace, study: str, description: str, trials: list[Trial],
               overrides: dict[str, Any] | None = None, **search: Any) -> Sweep:
    """The Sweep the common flags describe; ``overrides`` (default ``overrides_of(args)``) every trial's over the
    preset; ``search`` passes a search's fields (``search="optuna"``, ``search_space``, ``scheduler``, ``metric``,
    ``num_samples``, ``seeds``) through."""
    name = args.name or f"{args.default_name}-{args.preset}-s{args.first_seed}"
    return Sweep(study=study, name=name, preset=args.preset, description=description,
                 base_overrides=overrides_of(args) if overrides is None else dict(overrides), trials=trials,
                 register=args.register, register_metric=args.register_metric, **search)


def launch_of(args: argparse.Namespace) -> Launch:
    """The Launch the common flags describe: workers and their share of the cluster, the stores, this
    invocation's budget and output, what a trial made by other code counts as."""
    return Launch(workers_per_trial=1 if args.workers_per_trial is None else args.workers_per_trial,
                  cpus_per_worker=args.cpus_per_worker,
                  gpus_per_worker=0.0 if args.gpus_per_worker is None else args.gpus_per_worker,
                  max_concurrent=args.max_concurrent,
                  tracking_uri=args.tracking_uri, storage=args.storage, stop_after=args.stop_after,
                  verbose=args.verbose, watch_s=args.watch, reuse_other_code=args.reuse_other_code,
                  continue_across_code=args.continue_across_code,
                  neutral_changes=tuple(sorted(neutral_changes(args.neutral_code_changes)))
                  if args.neutral_code_changes else ())


def launch_flags_given(args: argparse.Namespace) -> set[str]:
    """The Launch fields whose flags the command line gives: the others take a --set / --config value
    (``spec.settle_launch``)."""
    return {f for f in ("workers_per_trial", "cpus_per_worker", "gpus_per_worker") if getattr(args, f) is not None}


def run_study(sweep: Sweep, launch: Launch, report: Report) -> int:
    """Run a sweep that ``check_sweep`` has passed as ``launch`` runs it, then ``report(out_dir, trials) -> (text,
    figure, table)``; print and log it.

    ``out_dir`` is the sweep's folder (``<storage>/<name>``, absolute), where the study saves its plot.
    Exit status: 0 every trial has an outcome (finished, diverged, or stopped early by the search's
    scheduler); 1 a trial failed; 2 bad input found once the cluster and the store are asked, before any trial;
    128+N ended by signal N (Ctrl-C: 130, SIGTERM: 143), the sweep marked interrupted and resumable by the same command.
    """
    if warning := register_warning(sweep):
        print(warning, file=sys.stderr)
    from mocolab.tune.sweep import ending, resolve_sweep, run_sweep

    sweep, launch = resolve_sweep(sweep, launch)
    with closing_on_signals():
        try:
            parent, grid = run_sweep(sweep, launch)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as err:
            print(f"interrupted: sweep '{sweep.name}' and its open trials are marked interrupted in MLflow; "
                  f"run the same command again to resume", file=sys.stderr)
            return exit_code(err)
        try:
            return _conclude(sweep, launch, parent, report, grid)
        except BaseException as err:  # the sweep ran; a failure while summarising must still close its parent
            status, mlflow_status = ending(err)
            parent.set_status(status, mlflow_status=mlflow_status,
                              reason=f"while summarising: {type(err).__name__}: {err}")
            if isinstance(err, KeyboardInterrupt):
                return exit_code(err)
            raise


def _register_best(sweep: Sweep, tracking_uri: str | None, trials: pd.DataFrame, runs: list) -> None:
    """--register: the best finished trial's encoder becomes a new version of the registered model (``runs``:
    the trials' MLflow runs, for a metric the trials table does not carry)."""
    from mocolab.tracking.logged_models import register_model

    metric, mode = sweep.register_metric, REGISTER_METRICS[sweep.register_metric]
    if metric not in trials:  # the validation split's scores: final metrics of the runs, not columns of the table
        scores = {r.info.run_id: r.data.metrics.get(metric, math.nan) for r in runs}
        trials = trials.assign(**{metric: [scores.get(i, math.nan) for i in trials["run_id"]]})
    done = trials[(trials["status"] == "finished") & trials[metric].notna()]
    if done.empty:
        print(f"--register: no finished trial has {metric}; nothing registered", file=sys.stderr)
        return
    best = done.loc[done[metric].idxmax() if mode == "max" else done[metric].idxmin()]
    try:
        name, version = register_model(best["run_id"], sweep.register, tracking_uri,
                                       description=f"best of sweep '{sweep.name}' by {metric} ({mode}): "
                                                   f"{best['label']}, {metric} = {best[metric]:.4f}"
                                                   + (" (chosen on the test split: its test scores are optimistic)"
                                                      if metric in TEST_METRICS else ""))
    except ValueError as err:
        print(f"--register: {err}", file=sys.stderr)
        return
    print(f"Registered the best trial by {metric} ({best['label']}, {best[metric]:.4f}) as model "
          f"'{name}' version {version}" + (" (chosen on the test split: its test scores are optimistic)"
                                           if metric in TEST_METRICS else ""))


def _conclude(sweep: Sweep, launch: Launch, parent, report: Report, grid: Any = None) -> int:
    """Summarise, report and close the parent run; the exit status. ``grid``: Tune's results of this
    invocation, for the trials that errored before their MLflow run existed."""
    from mocolab.analysis.feature_maps import PANELS_NAME
    from mocolab.analysis.report import build_report
    from mocolab.tracking import COMPARE_MAX_RUNS, ui_advice, ui_links
    from mocolab.tracking.chart_view import publish_sweep_view
    from mocolab.tune.lost import unrecorded_errors
    from mocolab.tune.sweep import publish_report, ray_logs_dir

    place = launch.place(sweep.name)
    trials = parent.trials()
    unrecorded = unrecorded_errors(grid, set(trials["label"]) if not trials.empty else set())
    if trials.empty:
        reason = "no trial ran" + (f" ({'; '.join(unrecorded)})" if unrecorded else "")
        print(f"{reason}: nothing to summarise", file=sys.stderr)
        parent.set_status("failed", mlflow_status="FAILED", reason=reason)
        return 1
    text, figure, table = report(place.local, trials)
    stopped = trials[trials["status"] == "stopped_early"]
    if not stopped.empty:
        text += "\nStopped early by the scheduler (a normal outcome of a search): " + ", ".join(
            f"{r.label} after epoch {int(r.stopped_at_epoch)}" if r.stopped_at_epoch == r.stopped_at_epoch
            else str(r.label) for r in stopped.itertuples())
    text += code_note(trials)
    print(text)
    parent.log_summary(table, trials, figure, text)
    rep = build_report(sweep.study, place.local / "report", parent_run=parent.run_id,
                       tracking_uri=launch.tracking_uri)
    published = publish_report(place)
    if sweep.register:
        _register_best(sweep, launch.tracking_uri, trials, parent.children())
    bad = trials[trials["status"].isin(["failed", "running", "interrupted"])]
    expected = len(sweep.trials) if sweep.search == "grid" else sweep.num_samples * len(sweep.seeds)
    left = expected - int(trials["status"].isin(["finished", "diverged", "stopped_early"]).sum()) - len(bad)
    # a trial missing from MLflow is one --stop-after left for later, or one that failed before its run existed
    missing, n_missing = [f"{u} (before its MLflow run was created)" for u in unrecorded], len(unrecorded)
    if not unrecorded and left > 0 and not launch.stop_after:
        missing = [f"{left} trial(s) ended without an MLflow run (Tune's record of each: {place.tune}; "
                   f"Ray's logs: {ray_logs_dir()})"]
        n_missing = left
    if bad.empty and not missing and left > 0:  # --stop-after ended this invocation early, as asked
        print(f"\n{expected - left} of {expected} trials done (--stop-after {launch.stop_after}); the same "
              f"command runs the other {left}.")
        parent.set_status("partial", reason=f"{left} of {expected} trials to run; the same command continues")
    elif bad.empty and not missing:
        parent.set_status("finished")
    else:
        failed = len(bad) + n_missing  # not the trials --stop-after paused
        what = (f"all {expected} trials failed" if failed >= expected
                else f"{failed} of {expected} trials did not finish")
        detail = "; ".join([f"{r.label}: {r.failure_reason or r.status}" for r in bad.itertuples()] + missing)
        print(f"\n{what}: {detail}\nRun the same command again to retry them.", file=sys.stderr)
        parent.set_status("failed", mlflow_status="FAILED", reason=f"{what}: {detail}")
    print(f"\nMLflow: experiment '{sweep.study}', parent run {parent.run_id} with {len(trials)} child runs.")
    command, base = ui_advice(parent.uri)
    best = trials.sort_values("linear_top1", ascending=False, na_position="last")
    links = ui_links(parent.experiment_id, list(best["run_id"]), base, parent_run_id=parent.run_id)
    print(f"Open the UI: {command}, then" if command else "Open the UI: the MLflow server's own, at")
    print(f"  runs:    {links['runs']}")
    print(f"  sweep:   {links['sweep']}")
    print(f"  compare: {links['compare']}")
    view = publish_sweep_view(parent, trials, base, prefer=[k for t in sweep.trials for k in t.overrides])
    if view:  # the studied param against linear_top1, charted (tracking/chart_view.py)
        print(f"  view:    {view}")
    shown = f"the {COMPARE_MAX_RUNS} best by linear_top1 of {len(trials)}; " if len(trials) > COMPARE_MAX_RUNS else ""
    print(f"           ({shown}Scatter Plot: X-axis moco.m or what the study varies, Y-axis linear_top1)")
    if figure is not None:
        print(f"Plot: {figure}")
    maps = next((f for f in rep.figures if f.name == PANELS_NAME), None)
    if maps is not None:
        print(f"Feature maps: {maps}  (a t-SNE map of each arm's test features, side by side)")
    print(f"Report: {rep.html}  (also under the parent run's artifacts, report/"
          + (f", and at {published})" if published else ")"))
    return 0 if bad.empty and not missing else 1


def code_note(trials: pd.DataFrame) -> str:
    """A line under a study's table where its trials were made by more than one version of the code (their
    code fingerprints, and the runs continued across a change): a table pooled over code changes says so."""
    if "code" not in trials or trials.empty:
        return ""
    codes = trials.groupby("code")["label"].apply(list)
    continued = [str(r.label) for r in trials.itertuples() if getattr(r, "code_segments", "")]
    if len(codes) < 2 and not continued:
        return ""
    parts = [f"code {c}: {', '.join(map(str, labels))}" for c, labels in codes.items()]
    note = f"\nThese trials come from {len(codes)} version(s) of the code ({'; '.join(parts)})"
    if continued:
        note += f"; continued across a code change: {', '.join(continued)}"
    return note + "."
