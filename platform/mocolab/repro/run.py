"""``mocolab repro``: run or resume every study of the plan, export its runs to CSV, write the document.

Studies run as their scripts, under their plan names, so an interrupted reproduction continues with the same
command (finished trials are not rerun). Precision and threads are pinned on the command line (``auto``
is resolved once, here, and recorded), so a resume on another kind of machine is refused by the sweep
instead of mixing precisions.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

from mocolab.config.flags import check_number
from mocolab.repro.inputs import check_readme, check_results, check_store
from mocolab.repro.plan import STUDIES, Study
from mocolab.repro.store_file import pack, packed_path
from mocolab.training.interrupts import closing_on_signals, exit_code

REPO = Path(__file__).resolve().parents[3]
NEUTRAL_CHANGES = "results/neutral_code_changes.json"  # code changes declared neutral, each with its reason


STORE = "runs.db"


def repro_store(tracking_uri: str | None, results: str | Path) -> str:
    """The reproduction's MLflow store: ``--tracking-uri``, else $MLFLOW_TRACKING_URI, else ``RESULTS/runs.db``.

    A machine's own files do not outlive its session, and a study at the cpu-full budget takes longer than
    one; the store is committed beside the CSV files it exports (packed: ``RESULTS/runs.db.xz``, which
    ``check_store`` expands), so that ``mocolab repro`` on a fresh clone finds the trials that finished
    elsewhere (a grid resumes from MLflow) and runs only the rest.
    """
    from mocolab.tracking import resolve_tracking_uri

    return resolve_tracking_uri(tracking_uri, default=Path(results) / STORE)


def _local_store(uri: str) -> Path | None:
    """The store's file, expanded from its packed form and checked; None for a server or a database."""
    from mocolab.tracking import local_store_path

    local = local_store_path(uri)
    if local:
        check_store(Path(local), must_exist=True)
    return Path(local) if local else None


def _pack(uri: str, results: Path) -> None:
    """``--pack``, and after new runs: the committed (packed) form of the reproduction's store brought up to date."""
    from mocolab.tracking import local_store_path

    local = local_store_path(uri)
    if not local:
        print(f"{uri}: not a file; nothing to pack")
        return
    store = Path(local)
    if not (packed_path(store).exists() or store.resolve() == (results / STORE).resolve()):
        return  # another sqlite file the user named: not the committed store
    check_store(store, must_exist=True)
    packed = packed_path(store)
    if pack(store):
        print(f"packed {store} into {packed} ({packed.stat().st_size / 2**20:.1f} MiB): commit {packed} with "
              f"the CSV files")
    else:
        print(f"{packed} already holds {store}")


def resolve_precision(name: str) -> str:
    import torch

    from mocolab.config.hardware import resolve_precision as resolve

    if name not in ("auto", "bf16", "fp32"):
        raise ValueError(f"--precision: {name!r}; choose auto, bf16 or fp32")
    return "bf16" if resolve(name, torch.device("cpu")) == torch.bfloat16 else "fp32"


def run_study(study: Study, precision: str, threads: int, *, tracking_uri: str | None, stop_after: int | None,
              say: Callable[[str], None] = print) -> int:
    """Baselines (seconds), then the study (resumed where it stopped); the study's exit code."""
    from mocolab.repro.baseline_runs import log_baselines
    from mocolab.repro.preregistration import tag_runs

    tag_runs(study)  # every run made from here on, baselines included, carries the hash of its rules
    try:
        with closing_on_signals():  # SIGTERM as Ctrl-C: said, not a silent end
            log_baselines(study.name, study.preset, study.baseline_overrides(precision), list(range(study.seeds)),
                          tracking_uri=tracking_uri, say=say)
    except KeyboardInterrupt as err:
        say(f"stopped while measuring {study.name}'s baselines: each is logged once measured, so none is half "
            f"there; `mocolab repro` again measures the missing ones")
        return exit_code(err)
    script = study.command(precision, threads)
    argv = [sys.executable, str(REPO / script[0]), *script[1:]]
    if tracking_uri:
        argv += ["--tracking-uri", tracking_uri]
    if stop_after:
        argv += ["--stop-after", str(stop_after)]
    # a study of days outlives code changes: its ended trials count whatever code made them (the document
    # shows which), and an unfinished one continues only across a change the committed list declares neutral
    argv += ["--reuse-other-code", "--neutral-code-changes", str(REPO / NEUTRAL_CHANGES)]
    say("$ " + " ".join(["python", *script]))
    return call_passing_signals(argv, REPO)


def _status(studies: list[Study], uri: str) -> int:
    """``--status``: each study's trials ended and left, from the store; nothing is run or written."""
    from mocolab.repro.status import status_lines
    from mocolab.tracking import Store

    _local_store(uri)
    for line in status_lines(studies, Store(uri)):
        print(line)
    return 0


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def call_passing_signals(argv: list[str], cwd: Path) -> int:
    """Run the study's script and hand it every stop signal this process gets; its exit code (128+N by signal N).

    A study left running when ``mocolab repro`` is stopped would go on training, unseen, beside whatever runs
    next. The child has its own process group, so Ctrl-C in a terminal reaches it once (through here), and it
    closes its runs as an interrupted study does; this process waits for that before it exits.
    """
    child = subprocess.Popen(argv, cwd=cwd, process_group=0)
    got: list[int] = []  # a stop is this process's to report: a study stopped in its start-up may exit 1

    def forward(signum: int, _frame) -> None:
        got.append(signum)
        child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 + got[0] if got else 128 - code if code < 0 else code


def main(args) -> int:
    studies = [s for s in STUDIES if not args.study or s.name in args.study]
    unknown = sorted(set(args.study or []) - {s.name for s in STUDIES})
    if unknown:
        raise ValueError(f"--study: unknown {unknown}; the plan has {[s.name for s in STUDIES]}")
    check_number("--threads", args.threads)
    check_number("--stop-after", args.stop_after)
    if getattr(args, "status", False):
        return _status(studies, repro_store(args.tracking_uri, args.results))
    if getattr(args, "pack", False):
        _pack(repro_store(args.tracking_uri, args.results), Path(args.results))
        return 0
    if getattr(args, "unpack", False):
        uri = repro_store(args.tracking_uri, args.results)
        local = _local_store(uri)
        print(f"MLflow store: {uri}" + (f" (its packed form: {local}.xz)" if local and
                                        packed_path(local).exists() else ""))
        return 0
    results, doc = Path(args.results), Path(args.doc)
    # what is read and not exported again first: a damaged file is named before hours of training, not after
    check_results(results, STUDIES if args.document_only else [s for s in STUDIES if s not in studies])
    check_readme(Path(args.readme))
    from mocolab.tracking import Store, local_store_path
    from mocolab.repro.document import replace_headline, write
    from mocolab.repro.export import export

    code = 0
    if not args.document_only:
        uri = repro_store(args.tracking_uri, results)
        local = local_store_path(uri)  # None for a server or a database: nothing on disk to check
        if local:
            check_store(Path(local), must_exist=args.skip_run)
        if not args.skip_run:
            precision = resolve_precision(args.precision)
            for study in studies:
                code = run_study(study, precision, args.threads, tracking_uri=uri,
                                 stop_after=args.stop_after) or code
                if code >= 128:  # stopped by a signal: the same command resumes; nothing more this time
                    print(f"stopped during {study.name}; `mocolab repro` again resumes it (`mocolab repro "
                          f"--pack` packs the runs so far for a commit)", file=sys.stderr)
                    return code
        store = Store(uri)
        for study in studies:
            path = export(study, store, results)
            print(f"exported {study.name}: {path}" if path else f"{study.name}: no runs in {store.uri} yet")
        if not args.skip_run:  # new runs: the committed form of the store too
            _pack(uri, results)
    written = write(results, doc, doc.parent / "figures")
    print(f"wrote {doc} ({len(written.figures)} figure(s))")
    readme = Path(args.readme)
    if readme.is_file():
        readme.write_text(replace_headline(readme.read_text(), written.headline))
        print(f"updated the headline table in {readme}")
    return code
