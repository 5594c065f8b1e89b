"""Provenance tags: a checkout is dirty by its code, not by the store the run writes into."""

from __future__ import annotations

import subprocess

from mocolab.tracking import DIRTY_TAG, source_tags
from mocolab.tracking.source import CHANGED_TAG


def _git(cwd, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_a_committed_store_that_the_run_writes_leaves_the_checkout_clean(tmp_path, monkeypatch):
    """The store is committed packed (runs.db.xz) and expanded into an ignored runs.db, as the reproduction's:
    a run writes the one and ``mocolab repro`` packs the other, and neither is the code that made the run."""
    (tmp_path / "results").mkdir()
    store = tmp_path / "results" / "runs.db"
    packed = tmp_path / "results" / "runs.db.xz"
    store.write_bytes(b"before")
    packed.write_bytes(b"before, packed")
    (tmp_path / ".gitignore").write_text("/results/runs.db\n")
    (tmp_path / "train.py").write_text("print('train')\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".gitignore", "results/runs.db.xz", "train.py")
    _git(tmp_path, "commit", "-qm", "a study and its store")
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{store}"

    store.write_bytes(b"after: the run logged to it")
    packed.write_bytes(b"after, packed again")
    tags = source_tags("train.py", tracking_uri=uri)
    assert tags[DIRTY_TAG] == "false" and CHANGED_TAG not in tags
    # another store (or none named) still counts the committed file as a change, and says which
    assert source_tags("train.py")[DIRTY_TAG] == "true"
    other = source_tags("train.py", tracking_uri=f"sqlite:///{tmp_path / 'elsewhere.db'}")
    assert other[DIRTY_TAG] == "true" and other[CHANGED_TAG] == "results/runs.db.xz"

    (tmp_path / "train.py").write_text("print('changed')\n")
    tags = source_tags("train.py", tracking_uri=uri)
    assert tags[DIRTY_TAG] == "true" and tags[CHANGED_TAG] == "train.py"
    assert tags["mlflow.source.name"] == "train.py"
