"""``mocolab`` command line: ``mocolab train --preset cpu-quick --set moco.m=0.9``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from mocolab.training.code_fingerprint import neutral_changes
from mocolab.config.manifest import mocolab_version
from mocolab.training.rerun import CONTINUE_FLAG, CONTINUE_HELP, REUSE_FLAG, REUSE_HELP
from mocolab.evaluation import transfer
from mocolab.config.addresses import check_addresses
from mocolab.api import evaluate, sweep, train
from mocolab.config.choices import DATASETS
from mocolab.cluster import DEFAULT_DIR, LocalCluster
from mocolab.config import (CHOICES, build_config, check_name, config_file_overrides, list_presets, parse_overrides,
                     preset_summary, to_yaml)
from mocolab.data.roots import check_data
from mocolab.cli.exiting import exit_now
from mocolab.config.flags import check_numbers, parse_checked
from mocolab.training.interrupts import closing_on_signals, exit_code
from mocolab.repro.run import main as repro_main
from mocolab.config.choices import STUDIES
from mocolab.config.launch_fields import config_file_requests


def _overrides(args: argparse.Namespace, more: list[str] = ()) -> dict:
    """--config's fields, then --set's (and ``more``): what build_config applies over the preset."""
    out = config_file_overrides(args.config) if getattr(args, "config", None) else {}
    return {**out, **parse_overrides([*(args.set or []), *more])}


def _train_overrides(args: argparse.Namespace) -> dict:
    """--config's and --set's fields with --storage's run.output_dir: one they give agrees with --storage or is
    refused naming both, and is taken over $MOCOLAB_STORAGE (a node's default, the cluster's shared storage)."""
    fields = config_file_requests(args.preset, config_file_overrides(args.config)) if args.config else {}
    over = {**fields, **parse_overrides(args.set or [])}
    asked = over.get("run.output_dir")
    if args.storage is not None and asked is not None and str(asked) != args.storage:
        raise ValueError(f"run.output_dir: {asked!r} (--set or --config) and --storage {args.storage} disagree: "
                         f"give one of them, or the same folder to both")
    storage = args.storage or (None if asked is not None else os.environ.get("MOCOLAB_STORAGE"))
    return {**over, "run.output_dir": storage} if storage else over


def _train(args: argparse.Namespace) -> int:
    cfg = check_data(build_config(args.preset, _train_overrides(args)))
    if args.print_config:  # the resolved config, validated, and nothing else: no Ray, no MLflow, no training
        print(f"# mocolab train --preset {args.preset}: every resolved field; --config FILE reads it back")
        print(to_yaml(cfg), end="")
        return 0
    if not args.in_process:
        check_addresses(args.tracking_uri)  # before the seconds of importing torch, Ray and MLflow
    if args.in_process:
        out = train(cfg, in_process=True, measure_init=args.measure_init)
    else:
        with closing_on_signals():
            try:
                out = train(cfg, tracking_uri=args.tracking_uri, ray_train_info=args.verbose,
                            reuse_other_code=args.reuse_other_code, continue_across_code=args.continue_across_code)
            except KeyboardInterrupt as err:
                print(f"interrupted: run '{cfg.run_name}' is marked interrupted in MLflow; the same command "
                      f"resumes it from its latest checkpoint", file=sys.stderr)
                return exit_code(err)
        print(f"run '{out.run_name}' {out.status}: linear top-1 {_pct(out.linear_top1)}, kNN top-1 "
              f"{_pct(out.knn_top1)}; MLflow run {out.mlflow_run_id}")
        if out.mlflow_run_id:
            _print_run_link(out.mlflow_run_id, args.tracking_uri)
    diverged, steps, loss = out.status == "diverged", out.steps, out.final_loss
    if diverged:
        print(f"training diverged after {steps} steps (final loss {loss})", file=sys.stderr)
        return DIVERGED
    return 0


# `mocolab train`'s exit statuses: 0 finished, 1 failed (or MLflow unreachable at the end), 2 bad input,
# 3 diverged (a result, not a mistake in the command), 128+N stopped by signal N
DIVERGED = 3


def _print_run_link(run_id: str, tracking_uri: str | None) -> None:
    from mocolab.tracking import Store, resolve_tracking_uri, run_link, ui_advice

    exp_id = Store(tracking_uri).client.get_run(run_id).info.experiment_id
    command, base = ui_advice(resolve_tracking_uri(tracking_uri))
    link = run_link(exp_id, run_id, base)
    print(f"open the MLflow UI with: {command}, then {link}" if command
          else f"open the run in the MLflow server's UI: {link}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _report(args: argparse.Namespace) -> int:
    if args.leaderboard:
        return _leaderboard(args)
    missing = [flag for flag, value in (("--experiment", args.experiment), ("--out", args.out)) if not value]
    if missing:
        raise ValueError(f"report: {' and '.join(missing)} required (or --leaderboard: the best encoders of "
                         f"every experiment)")
    from mocolab.analysis.report import build_report, watch_report

    if args.watch is not None:
        try:
            rep = watch_report(args.experiment, args.out, interval_s=args.watch, parent_run=args.parent_run,
                               tracking_uri=args.tracking_uri, ui_url=args.ui_url)
        except KeyboardInterrupt:
            print(f"stopped watching; the last report is {args.out}/report.html")
            return 130
    else:
        rep = build_report(args.experiment, args.out, parent_run=args.parent_run, tracking_uri=args.tracking_uri,
                           ui_url=args.ui_url)
    print(rep.message)
    print(f"report: {rep.html}" + (f" ({len(rep.figures)} plots)" if rep.figures else ""))
    return 0 if rep.trials else 1


def _leaderboard(args: argparse.Namespace) -> int:
    given = [flag for flag, value in (("--parent-run", args.parent_run), ("--watch", args.watch)) if value is not None]
    if given:
        raise ValueError(f"--leaderboard: ranks whole experiments; {' and '.join(given)} "
                         f"{'apply' if len(given) > 1 else 'applies'} to one sweep's report")
    from mocolab.evaluation.leaderboard import build_leaderboard, write_leaderboard

    board = build_leaderboard(args.metric, top=args.top, experiment=args.experiment, tracking_uri=args.tracking_uri)
    print(board.text())
    if args.out:
        print(f"leaderboard: {write_leaderboard(board, args.out, args.ui_url)}")
    return 0 if not board.table.empty else 1


def _eval(args: argparse.Namespace) -> int:
    overrides = parse_overrides(args.set or [])
    transfer.check_request(args.data, overrides)  # before torch and MLflow load: a bad --data or --set, at once
    check_addresses(args.tracking_uri)
    res = evaluate(args.source, args.data, overrides, tracking_uri=args.tracking_uri, experiment=args.experiment)
    print(f"'{res.encoder.label}' on {args.data}: linear top-1 {_pct(res.linear_top1)}, kNN top-1 "
          f"{_pct(res.knn_top1)}; MLflow run {res.run_id} in experiment '{args.experiment}'")
    _print_run_link(res.run_id, args.tracking_uri)
    return 0


def _eval_parser(sub) -> None:
    ev = sub.add_parser("eval", help="kNN and linear probe of a trained encoder on any supported data set (a "
                        "transfer test), logged as an MLflow run tagged with the source run")
    ev.add_argument("source", metavar="RUN_ID|MODEL_URI|EXPORT_DIR",
                    help="an MLflow run id, a models:/ URI (logged model or registered version), or a folder "
                         "`mocolab export` wrote")
    ev.add_argument("--data", required=True, metavar="NAME", help=f"the data set: one of {list(DATASETS)}")
    ev.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="a data.*, eval.* or run.seed/device/precision/threads field, e.g. --set data.root=DIR "
                         "(repeatable; the rest are the source run's)")
    ev.add_argument("--experiment", default=transfer.EXPERIMENT,
                    help=f"MLflow experiment of the evaluation run (default {transfer.EXPERIMENT})")
    ev.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    ev.set_defaults(func=_eval)


def sweep_parser() -> argparse.ArgumentParser:
    """``mocolab sweep``'s flags: the studies' common ones and the grid's, apart from the run so that they can be
    read (and every number's range checked) without starting one."""
    from mocolab.tune.grid import EXPERIMENT
    from mocolab.tune.search import SCHEDULERS, SEARCHERS
    from mocolab.tune.study import study_parser

    p = study_parser("a Ray Tune sweep over any config fields: every point of --grid for each seed (or a search "
                     "over the grid's values), a parent MLflow run with one child run per trial", "sweep")
    p.prog = "mocolab sweep"
    p.add_argument("--grid", action="append", required=True, metavar="FIELD=V1,V2",
                   help="a config field and its values, e.g. --grid moco.tau=0.07,0.2 (repeatable: the product)")
    p.add_argument("--search", default="grid", choices=SEARCHERS,
                   help="grid: every point; optuna or random: --samples trials per seed sample the grid's values")
    p.add_argument("--samples", type=int, default=None, help="trials a search samples per seed (with --search)")
    p.add_argument("--scheduler", default="fifo", choices=SCHEDULERS, help="asha: stop a search's poor trials early")
    p.add_argument("--metric", default="val_knn_top1",
                   help="what a search maximises, on the validation split (data.val_size; default val_knn_top1, "
                        "every epoch)")
    p.add_argument("--experiment", default=None,
                   help=f"MLflow experiment (default --set run.experiment if given, else {EXPERIMENT})")
    return p


def _sweep(args: argparse.Namespace) -> int:
    from mocolab.tune.study import seeds_of

    sys.argv = ["mocolab sweep"]  # its usage line and its runs' MLflow source name say so
    a = parse_checked(sweep_parser(), args.args)
    if a.search == "grid" and a.samples is not None:
        raise ValueError("--samples: applies to --search optuna or random; a grid runs every point")
    seeds = seeds_of(a)
    res = sweep(a.grid, preset=a.preset, seeds=len(seeds), first_seed=a.first_seed, overrides=a.set,
                config_file=a.config, name=a.name, experiment=a.experiment, search=a.search,
                samples=1 if a.samples is None else a.samples, scheduler=a.scheduler, metric=a.metric,
                workers_per_trial=a.workers_per_trial, cpus_per_worker=a.cpus_per_worker,
                gpus_per_worker=a.gpus_per_worker, max_concurrent=a.max_concurrent, tracking_uri=a.tracking_uri,
                storage=a.storage, stop_after=a.stop_after, register=a.register, register_metric=a.register_metric,
                verbose=a.verbose, watch_s=a.watch, reuse_other_code=a.reuse_other_code,
                continue_across_code=a.continue_across_code,
                neutral_changes=tuple(sorted(neutral_changes(a.neutral_code_changes))) if a.neutral_code_changes
                else ())
    return res.code


def _export(args: argparse.Namespace) -> int:
    from mocolab.tracking.logged_models import export_run, register_model

    if args.register is not None:
        check_name("--register", args.register)
    out = export_run(args.run_id, args.out, tracking_uri=args.tracking_uri)
    print(f"exported run {args.run_id} to {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))
    if args.register:
        name, version = register_model(args.run_id, args.register, tracking_uri=args.tracking_uri)
        print(f"registered as model '{name}' version {version}")
    return 0


def _cluster(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.dir)
    if args.action == "up":
        cluster.up(workers=args.workers, cpus_per_worker=args.cpus_per_worker, gpus_per_worker=args.gpus_per_worker,
                   head_cpus=args.head_cpus, backend=args.backend, port=args.port, dashboard_port=args.dashboard_port,
                   mlflow_port=args.mlflow_port, postgres_port=args.postgres_port,
                   object_store_mb=args.object_store_mb)
    elif args.action == "down":
        cluster.down(purge=args.purge)
    elif args.action == "status":
        if cluster.state is None:
            print(f"no cluster in {cluster.dir}")
            return 1
        for line in cluster.describe():
            print(line)
        return 0 if cluster.running() else 1
    elif args.action == "add-worker":
        cluster.add_worker(args.cpus, args.gpus)
    elif args.action == "remove-worker":
        cluster.remove_worker(args.name)
    return 0


def _cluster_parser(sub) -> None:
    cl = sub.add_parser("cluster", help="a Ray head, N worker nodes and an MLflow server (PostgreSQL or sqlite) "
                        "on this machine, all on 127.0.0.1: the cluster topology without Docker")
    actions = cl.add_subparsers(dest="action", required=True)
    parsers = {
        "up": actions.add_parser("up", help="start the cluster and print the `ray job submit` command to use"),
        "down": actions.add_parser("down", help="stop what `up` started, and nothing else"),
        "status": actions.add_parser("status", help="what is up, and the submit command (exit 1 if nothing runs)"),
        "add-worker": actions.add_parser("add-worker", help="start one more worker node (a machine joining)"),
        "remove-worker": actions.add_parser("remove-worker", help="kill a worker node as a machine failure would"),
    }
    for p in parsers.values():
        p.add_argument("--dir", default=str(DEFAULT_DIR),
                       help=f"the cluster's folder: its record, logs, MLflow store, shared storage "
                            f"(default {DEFAULT_DIR})")
    up = parsers["up"]
    up.add_argument("--workers", type=int, default=2, help="worker nodes (default 2)")
    up.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs each worker node offers (default 1)")
    up.add_argument("--gpus-per-worker", type=float, default=0.0, help="GPUs each worker node offers (default 0)")
    up.add_argument("--head-cpus", type=float, default=0.0,
                    help="CPUs the head offers for work (default 0: the head only coordinates, as on a cluster)")
    up.add_argument("--backend", default="auto", help="MLflow store: postgres, sqlite, or auto (postgres where "
                    "its server binaries are installed)")
    up.add_argument("--port", type=int, default=6379, help="Ray GCS port (default 6379; 0 = any free port)")
    up.add_argument("--dashboard-port", type=int, default=8265, help="Ray dashboard and job port (default 8265)")
    up.add_argument("--mlflow-port", type=int, default=5000, help="MLflow server port (default 5000)")
    up.add_argument("--postgres-port", type=int, default=0, help="PostgreSQL port (default 0: any free port)")
    up.add_argument("--object-store-mb", type=int, default=1024, help="Ray object store per node (default 1024)")
    parsers["down"].add_argument("--purge", action="store_true",
                                 help="also delete the MLflow store, artifacts, checkpoints and logs")
    parsers["add-worker"].add_argument("--cpus", type=float, default=1.0, help="CPUs it offers (default 1)")
    parsers["add-worker"].add_argument("--gpus", type=float, default=0.0, help="GPUs it offers (default 0)")
    parsers["remove-worker"].add_argument("name", help="the node's name in `mocolab cluster status` (worker1, ...)")
    cl.set_defaults(func=_cluster)


class _StudiesHelp(argparse.Action):
    """``mocolab study --help``: the studies and what each is, from their modules' first lines, which are
    imported only when asked (``mocolab study NAME --help`` reaches the study's own parser instead)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        lines = [f"  {name:<13} {importlib.import_module(f'mocolab.tune.studies.{name}').__doc__.splitlines()[0]}"
                 for name in STUDIES]
        parser.epilog = "studies:\n" + "\n".join(lines) + "\n\nmocolab study NAME --help lists a study's flags"
        parser.print_help()
        parser.exit()


def _study(args: argparse.Namespace) -> int:
    sys.argv = [f"mocolab study {args.name}"]  # its usage line and its runs' MLflow source name say so
    return importlib.import_module(f"mocolab.tune.studies.{args.name}").main(args.args)


def _presets(_args: argparse.Namespace) -> int:
    names = list_presets()
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {preset_summary(name)}")
    print("use one with --preset NAME; see every field it sets with: mocolab train --preset NAME --print-config")
    return 0


def _baselines(args: argparse.Namespace) -> int:
    overrides = [f"{k}={v}" for k, v in _overrides(args).items()]
    check_data(build_config(args.preset, overrides))  # bad fields and data refused before torch and MLflow load
    check_addresses(args.tracking_uri)
    from mocolab.repro.baseline_runs import log_baselines

    log_baselines(args.name or args.preset, args.preset, overrides,
                  list(range(args.first_seed, args.first_seed + args.seeds)), tracking_uri=args.tracking_uri)
    return 0


def _baselines_parser(sub) -> None:
    bl = sub.add_parser("baselines", help="what a trained encoder must beat: the random-init encoder of each seed "
                        "and a linear probe on raw pixels, scored like a run's final evaluation, logged to MLflow")
    bl.add_argument("--preset", default="cpu-quick", help=f"one of {list_presets()} (default cpu-quick)")
    bl.add_argument("--config", default=None, metavar="FILE.yaml", help="a config of your own, over --preset")
    bl.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    bl.add_argument("--seeds", type=int, default=1, help="seeds (default 1)")
    bl.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed .. first-seed+seeds-1")
    bl.add_argument("--name", default=None, help="the set's name (default the preset); the same name skips "
                    "what is logged already")
    bl.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    bl.set_defaults(func=_baselines)


def _repro(args: argparse.Namespace) -> int:
    if not args.document_only:
        check_addresses(args.tracking_uri)
    return repro_main(args)


def _repro_parser(sub) -> None:
    rp = sub.add_parser("repro", help="run or resume the reproduction's studies, export them to results/*.csv "
                        "and write docs/REPRODUCTION.md from those files")
    rp.add_argument("--study", action="append", help="only this study (repeatable; default all)")
    rp.add_argument("--precision", default="auto", help="auto (resolved once, then pinned), bf16 or fp32")
    rp.add_argument("--threads", type=int, default=1, help="torch threads per trial (default 1: one trial per core)")
    rp.add_argument("--stop-after", type=int, default=None, help="end each study after N more trials (resume later)")
    rp.add_argument("--skip-run", action="store_true", help="export and write only: run nothing")
    rp.add_argument("--document-only", action="store_true", help="write the document from results/ only")
    rp.add_argument("--status", action="store_true",
                    help="print each study's trials ended and left, and the hours left, from the store: run nothing")
    rp.add_argument("--pack", action="store_true",
                    help="pack the store into RESULTS/runs.db.xz, the form git commits (after new runs `mocolab "
                         "repro` does it too): run nothing")
    rp.add_argument("--unpack", action="store_true",
                    help="expand RESULTS/runs.db.xz into RESULTS/runs.db, the file MLflow (and `mlflow ui`) reads, "
                         "where it is missing or older (every repro command does it first): run nothing")
    rp.add_argument("--results", default="results", help="the CSV folder (default results)")
    rp.add_argument("--doc", default="docs/REPRODUCTION.md", help="the document (default docs/REPRODUCTION.md)")
    rp.add_argument("--readme", default="README.md", help="README whose headline table is regenerated")
    rp.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else the committed store "
                         "RESULTS/runs.db, expanded from RESULTS/runs.db.xz, so that a clone on another machine "
                         "resumes the same runs)")
    rp.set_defaults(func=_repro)


def build_parser() -> argparse.ArgumentParser:
    """Every command's flags, apart from main so that they can be read without running a command."""
    parser = argparse.ArgumentParser(prog="mocolab", description="Momentum Contrast experiments.")
    parser.add_argument("--version", action="version", version=f"mocolab {mocolab_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    choices = "\n".join(f"  {key:<16} {', '.join(values)}" for key, values in CHOICES.items())
    tr = sub.add_parser("train", help="train one MoCo model with Ray Train (run.num_workers workers; 0 = this "
                        "process), log it to MLflow, and report the linear probe",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog=f"fields with a fixed set of values (--set KEY=VALUE):\n{choices}\n"
                               f"every field and its value: --print-config")
    tr.add_argument("--preset", default="cpu-quick", help=f"one of {list_presets()} (default cpu-quick)")
    tr.add_argument("--config", default=None, metavar="FILE.yaml",
                    help="a config of your own, in the presets' form (what --print-config prints): applied over "
                         "--preset, under --set")
    tr.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a config field, e.g. --set moco.m=0.9 (repeatable)")
    tr.add_argument("--storage", default=None, metavar="FOLDER_OR_URI",
                    help="where checkpoints live (run.output_dir): a folder, or any URI Ray Train writes to "
                         "(s3://bucket/runs, gs://..., file:///...); default --set run.output_dir if given, else "
                         "$MOCOLAB_STORAGE, else the preset's run.output_dir")
    tr.add_argument("--print-config", action="store_true",
                    help="print the resolved, validated config as YAML (--config reads it back) and exit")
    tr.add_argument("--measure-init", action="store_true",
                    help="also score the encoder before training, kNN and linear probe (with --in-process)")
    tr.add_argument("--in-process", action="store_true",
                    help="run the loop directly in this process: no Ray, no MLflow, no checkpoints")
    tr.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    tr.add_argument("--verbose", action="store_true",
                    help="also print Ray Train's INFO lines (a checkpoint written, a report sent) and its state-API "
                         "warnings")
    tr.add_argument(REUSE_FLAG, action="store_true", help=REUSE_HELP)
    tr.add_argument(CONTINUE_FLAG, action="store_true", help=CONTINUE_HELP)
    tr.set_defaults(func=_train)
    rp = sub.add_parser("report", help="draw an ablation report (PNG + HTML) from an MLflow experiment or sweep")
    rp.add_argument("--experiment", default=None, help="MLflow experiment, e.g. momentum-ablation (with "
                    "--leaderboard: rank this one only)")
    rp.add_argument("--parent-run", default=None, help="only the trials of this sweep (parent run id)")
    rp.add_argument("--out", default=None, help="folder for report.html and the PNGs (--leaderboard: "
                    "leaderboard.html and .csv)")
    rp.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    rp.add_argument("--ui-url", default="http://127.0.0.1:5000", help="MLflow UI address for the run links")
    rp.add_argument("--watch", type=int, nargs="?", const=30, default=None, metavar="SECONDS",
                    help="keep the report current while trials run, rewritten every SECONDS (default 30; the page "
                         "reloads itself), as the studies' --watch; ends when nothing runs (with --parent-run: when "
                         "the sweep has ended)")
    rp.add_argument("--leaderboard", action="store_true",
                    help="the best encoders of every experiment per data set, with their source runs, key config "
                         "fields and the baselines scored the same way")
    rp.add_argument("--metric", default="linear_top1", choices=["linear_top1", "knn_top1"],
                    help="what --leaderboard ranks by (default linear_top1)")
    rp.add_argument("--top", type=int, default=10, help="encoders per data set on --leaderboard (default 10)")
    rp.set_defaults(func=_report)
    ex = sub.add_parser("export", help="write a finished run's encoder (backbone weights, torch.export programs), "
                        "config, metrics and a README to a folder; optionally register it")
    ex.add_argument("run_id", metavar="RUN_ID", help="the MLflow run id (the UI's run page, or a sweep's summary)")
    ex.add_argument("--out", required=True, help="a new (or empty) folder")
    ex.add_argument("--register", default=None, metavar="NAME",
                    help="also register the encoder in the MLflow Model Registry under NAME (a new version)")
    ex.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    ex.set_defaults(func=_export)
    _cluster_parser(sub)
    sub.add_parser("presets", help="list the presets, one line each").set_defaults(func=_presets)
    st = sub.add_parser("study", help="run a named study as a Ray Tune sweep (the same as "
                        "experiments/NAME_ablation.py); mocolab study NAME --help lists its flags", add_help=False,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    st.add_argument("-h", "--help", action=_StudiesHelp, help="list the studies and exit")
    st.add_argument("name", choices=STUDIES, help="the study")
    st.add_argument("args", nargs=argparse.REMAINDER, help="the study's flags (--preset, --seeds, --name, ...)")
    st.set_defaults(func=_study)
    sw = sub.add_parser("sweep", help="a Ray Tune sweep over any config fields (--grid FIELD=V1,V2 ...), with the "
                        "named studies' parent/child runs, resume, report and exit codes; mocolab sweep --help "
                        "lists its flags", add_help=False)
    sw.set_defaults(func=_sweep)  # its flags are parsed by _sweep (argparse hands over what it does not know)
    _eval_parser(sub)
    _baselines_parser(sub)
    _repro_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "sweep":
        args.args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        check_numbers(parser, args)  # before any command's work: no Ray, MLflow or torch yet
        return args.func(args)
    except ValueError as err:  # configuration mistakes: one clear line, no traceback
        print(f"mocolab: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # a store that did not answer at the end: what is kept, and how to finish
        from mocolab.tracking import TrackingUnreachable

        if not isinstance(err, TrackingUnreachable):
            raise
        print(f"mocolab: {err}", file=sys.stderr)
        return 1


def entry() -> None:
    """The ``mocolab`` command (pyproject's console script)."""
    exit_now(main())


if __name__ == "__main__":
    entry()
