"""What ``mocolab repro`` reads, checked before it reads it: the results files and the MLflow store.

A CSV without the columns the write-up reads would otherwise end in a ``KeyError`` deep in a figure, and a
store that is not MLflow's (a Git LFS pointer left by a clone without LFS, a stray file) in a database
traceback, or, missing, be created empty and exported as "no runs"; its committed, packed form is expanded
first, and one that is damaged or conflicts with the store is refused too. Each is refused here, in one line
that names the file and what is wrong with it, before anything is run or written.
"""

from __future__ import annotations

import csv
import sqlite3
from pathlib import Path
from typing import Iterable

from mocolab.repro.plan import (HEADLINE_BEGIN, HEADLINE_END, HISTORY, HISTORY_READ_COLUMNS, MOMENTUM_COLUMNS,
                                READ_COLUMNS, STUDIES, Study)
from mocolab.repro.store_file import packed_path, unpack

SQLITE_MAGIC = b"SQLite format 3\x00"
LFS_POINTER = b"version https://git-lfs"
MLFLOW_TABLES = ("alembic_version", "experiments", "runs", "metrics", "params", "tags")


def check_columns(path: Path, expected: Iterable[str]) -> None:
    """``path``'s header row holds every one of ``expected``; a file that is not there passes (not run yet)."""
    if not path.is_file():
        return
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        header = next(csv.reader(f), [])
    missing = [c for c in expected if c not in header]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}{'' if header else ' (the file is empty)'}; "
                         f"`mocolab repro --skip-run` writes it again from the MLflow store, or restore it with "
                         f"`git checkout -- {path}`")


def check_results(results: Path, studies: Iterable[Study] = STUDIES) -> None:
    """Every study's ``results/<study>.csv`` and ``results/history/<study>.csv`` the write-up would read."""
    for study in studies:
        check_columns(results / f"{study.name}.csv",
                      (*READ_COLUMNS, *(MOMENTUM_COLUMNS if study.by == "moco.m" else ())))
        check_columns(results / HISTORY / f"{study.name}.csv", HISTORY_READ_COLUMNS)


def check_store(path: Path, *, must_exist: bool) -> None:
    """``path`` is an MLflow sqlite store (or absent where the run may create it), expanded first from its
    committed, packed form where that is newer (``store_file.unpack``)."""
    unpack(path)
    if not path.exists():
        if must_exist:
            raise ValueError(f"{path}: no MLflow store there to export from, nor its packed form "
                             f"{packed_path(path).name}; the committed store is RESULTS/runs.db.xz "
                             f"(`git checkout -- {packed_path(path)}`), or name another with --tracking-uri")
        return
    with path.open("rb") as f:
        head = f.read(64)
    if head.startswith(LFS_POINTER):
        raise ValueError(f"{path}: a Git LFS pointer, not the MLflow store: fetch it with `git lfs pull`")
    if not head.startswith(SQLITE_MAGIC):
        what = "an empty file" if not head else "not an SQLite file"
        raise ValueError(f"{path}: not an MLflow store ({what}); {_restore(path)} or name another with "
                         f"--tracking-uri")
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
            tables = {row[0] for row in db.execute("select name from sqlite_master where type = 'table'")}
    except sqlite3.DatabaseError as err:
        raise ValueError(f"{path}: not an MLflow store (a damaged SQLite file: {err}); {_restore(path)} or name "
                         f"another with --tracking-uri") from None
    missing = [t for t in MLFLOW_TABLES if t not in tables]
    if missing:
        raise ValueError(f"{path}: an SQLite file but not an MLflow store (no table {missing}); {_restore(path)} "
                         f"or name another with --tracking-uri")


def _restore(path: Path) -> str:
    """How to get the committed store back: expanded again from its packed form, else from git."""
    packed = packed_path(path)
    if packed.is_file():
        return f"move it away and the next command expands {packed} again"
    return f"restore it with `git checkout -- {path}`"


def check_readme(readme: Path) -> None:
    """A README the headline table goes into has its markers (else the document is written, then refused)."""

    if readme.is_file():
        text = readme.read_text(encoding="utf-8", errors="replace")
        if HEADLINE_BEGIN not in text or HEADLINE_END not in text.split(HEADLINE_BEGIN, 1)[-1]:
            raise ValueError(f"{readme}: no {HEADLINE_BEGIN} ... {HEADLINE_END} block for the headline table "
                             f"(give another file with --readme)")
