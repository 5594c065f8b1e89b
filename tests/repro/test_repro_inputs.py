"""The files ``mocolab repro`` reads are checked before it reads them: a results or history CSV without its
columns, a store that is missing or not MLflow's, a README without its table markers are each refused in one
line naming the file and what is wrong, exit status 2, and nothing written."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from mocolab.cli.commands import main

REPO = Path(__file__).resolve().parents[2]


def _repro(tmp_path: Path, monkeypatch, *flags: str) -> int:
    """``mocolab repro`` on tmp_path/results, its document and README there too (the store: results/runs.db)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return main(["repro", *flags, "--results", str(tmp_path / "results"), "--doc", str(tmp_path / "doc" / "R.md"),
                 "--readme", str(tmp_path / "README.md")])


def _written(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if not p.is_relative_to(
        tmp_path / "results"))


@pytest.mark.parametrize("file, column", [("momentum-cpu-full.csv", "arm"),
                                          ("history/momentum-cpu-full.csv", "metric")])
def test_a_results_file_without_its_columns_is_named_with_them(tmp_path, monkeypatch, capsys, file, column):
    results = tmp_path / "results"
    for name in {file, Path(file).name}:  # a history file is read beside its study's own
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "results" / name, results / name)
    pd.read_csv(results / file).drop(columns=[column]).to_csv(results / file, index=False)
    assert _repro(tmp_path, monkeypatch, "--document-only") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(results / file) in err[0] and f"missing column(s) ['{column}']" in err[0], err
    assert _written(tmp_path) == []  # no document, no figure


STORES = {
    "missing": (None, "no MLflow store there"),
    "an LFS pointer": (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 1\n", "git lfs pull"),
    "a text file": (b"not a database\n", "not an MLflow store (not an SQLite file)"),
    "an empty file": (b"", "not an MLflow store (an empty file)"),
    "another sqlite file": ("sqlite", "not an MLflow store (no table"),
}


@pytest.mark.parametrize("kind", STORES)
def test_the_store_repro_exports_from_is_refused_by_name_when_it_is_not_mlflows(tmp_path, monkeypatch, capsys, kind):
    content, message = STORES[kind]
    (tmp_path / "results").mkdir()
    store = tmp_path / "results" / "runs.db"
    if content == "sqlite":
        with sqlite3.connect(store) as db:
            db.execute("create table runs (id text)")
    elif content is not None:
        store.write_bytes(content)
    before = store.read_bytes() if store.exists() else None
    assert _repro(tmp_path, monkeypatch, "--skip-run") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(store) in err[0] and message in err[0], err
    assert (store.read_bytes() if store.exists() else None) == before  # not created, not migrated
    assert _written(tmp_path) == []


def test_the_committed_store_passes_its_check():
    from mocolab.repro.inputs import check_store

    check_store(REPO / "results" / "runs.db", must_exist=True)


def test_a_readme_without_the_table_markers_is_refused_before_the_document_is_written(tmp_path, monkeypatch, capsys):
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text("# a README of another project\n")
    assert _repro(tmp_path, monkeypatch, "--document-only") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path / "README.md") in err[0] and "headline" in err[0], err
    assert _written(tmp_path) == ["README.md"]
