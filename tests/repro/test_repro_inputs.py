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
    assert (tmp_path / "README.md").read_text() == "# a README of another project\n"  # left as it was


def test_the_committed_store_is_expanded_from_its_packed_form_on_a_fresh_clone(tmp_path, monkeypatch, capsys):
    """Git holds results/runs.db.xz only; ``mocolab repro --status`` expands it into the ignored runs.db and
    reads it."""
    from mocolab.repro.store_file import file_sha256, state_path

    (tmp_path / "results").mkdir()
    shutil.copy(REPO / "results" / "runs.db.xz", tmp_path / "results" / "runs.db.xz")
    assert _repro(tmp_path, monkeypatch, "--status", "--study", "momentum-cpu-quick") == 0
    out = capsys.readouterr().out
    assert "momentum-cpu-quick" in out and "ended" in out, out
    store = tmp_path / "results" / "runs.db"
    assert store.is_file() and state_path(store).is_file()
    with sqlite3.connect(store) as db:
        assert db.execute("select count(*) from runs").fetchone()[0] >= 200
    assert _written(tmp_path) == []  # nothing outside results/
    before = file_sha256(store)
    assert _repro(tmp_path, monkeypatch, "--status", "--study", "momentum-cpu-quick") == 0
    assert file_sha256(store) == before  # read, not expanded again nor touched by MLflow


def _mlflow_shaped_store(path: Path, marker: str) -> None:
    """An sqlite file with MLflow's tables (what check_store reads), told apart from others by ``marker``."""
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        for table in ("alembic_version", "experiments", "runs", "metrics", "params", "tags"):
            db.execute(f"create table {table} (id text)")
        db.execute("insert into runs values (?)", (marker,))
    db.close()


def _runs(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        rows = [r[0] for r in db.execute("select id from runs")]
    db.close()
    return rows


def test_repro_pack_writes_the_packed_store_a_commit_needs(tmp_path, monkeypatch, capsys):
    import lzma

    store = tmp_path / "results" / "runs.db"
    store.parent.mkdir()
    _mlflow_shaped_store(store, "run-a")
    assert _repro(tmp_path, monkeypatch, "--pack") == 0
    packed = tmp_path / "results" / "runs.db.xz"
    assert lzma.decompress(packed.read_bytes()) == store.read_bytes()
    assert f"commit {packed}" in capsys.readouterr().out
    assert _repro(tmp_path, monkeypatch, "--pack") == 0  # nothing new: the packed file is left as it is
    assert "already holds" in capsys.readouterr().out
    # a clone that has the packed file only
    store.unlink()
    assert _repro(tmp_path, monkeypatch, "--unpack") == 0
    assert _runs(store) == ["run-a"]


def test_a_pulled_packed_store_is_expanded_and_one_that_conflicts_with_new_runs_is_refused(tmp_path):
    from mocolab.repro.store_file import pack, unpack

    store = tmp_path / "runs.db"
    _mlflow_shaped_store(store, "ours")
    assert pack(store) and not pack(store)
    packed = tmp_path / "runs.db.xz"
    assert not unpack(store)  # the store is the packed file's
    # a pull brings another packed store; ours holds nothing since it was expanded: the pulled one replaces it
    other = tmp_path / "other" / "runs.db"
    other.parent.mkdir()
    _mlflow_shaped_store(other, "pulled")
    pack(other)
    shutil.copy(other.with_name("runs.db.xz"), packed)
    assert unpack(store) and _runs(store) == ["pulled"]
    # a run writes to the store: it is kept (and packed by the next pack), never overwritten
    with sqlite3.connect(store) as db:
        db.execute("insert into runs values ('new run')")
    db.close()
    assert not unpack(store) and _runs(store) == ["pulled", "new run"]
    # ... and a pull of yet another packed store now conflicts with it: both named, nothing overwritten
    _mlflow_shaped_store(other, "pulled again")
    pack(other)
    shutil.copy(other.with_name("runs.db.xz"), packed)
    with pytest.raises(ValueError) as err:
        unpack(store)
    assert str(store) in str(err.value) and str(packed) in str(err.value) and "mocolab repro --pack" in str(err.value)
    assert _runs(store) == ["pulled", "new run"]
    # the user keeps the store's runs
    assert pack(store) and not unpack(store)
    store.unlink()
    assert unpack(store) and _runs(store) == ["pulled", "new run"]


def test_a_damaged_packed_store_is_refused_by_name(tmp_path, monkeypatch, capsys):
    (tmp_path / "results").mkdir()
    packed = tmp_path / "results" / "runs.db.xz"
    packed.write_bytes(b"not xz\n")
    assert _repro(tmp_path, monkeypatch, "--skip-run") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(packed) in err[0] and "not an xz file" in err[0], err
    assert not (tmp_path / "results" / "runs.db").exists() and _written(tmp_path) == []
