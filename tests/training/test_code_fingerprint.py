"""A result is what its code made it: the same command after a code change never returns the old run as new.

The story as a researcher lives it, in a copy of the package (tests/training/test_code_fingerprint.py edits
that copy, never the checkout): train a tiny run, edit the method, run the same command; interrupt a run,
edit, resume; edit what the training process does not import.  Each command is ``mocolab train`` in its own
interpreter (the fingerprint is taken from the code a process would run), on synthetic data in this
process (W = 0) with a local MLflow store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import thread_share_env

from mocolab.training.code_fingerprint import (ENTRY, UNKNOWN, CodeFingerprint, _closure, _code_digest, _source,
                                               _version, code_fingerprint)

REPO = Path(__file__).resolve().parents[2]
TINY = ["--preset", "smoke", "--set", "data.name=synthetic", "--set", "data.subset=512", "--set",
        "optim.batch_size=64", "--set", "queue.size=256", "--set", "optim.max_steps=4", "--set", "eval.knn_bank=256",
        "--set", "eval.knn_test=100", "--set", "eval.linear_train=256", "--set", "eval.linear_steps=3", "--set",
        "run.log_models=false", "--set", "run.system_metrics_s=0"]


def test_the_fingerprint_reads_code_not_comments_docstrings_or_layout(tmp_path):
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('"""Doc."""\n\ndef f(x):\n    """What f does."""\n    return x * 2  # double\n')
    b.write_text('"""Another doc."""\n# a comment\n\ndef f(x):\n    return (x\n            * 2)\n')
    c.write_text('def f(x):\n    return x * 3\n')
    assert _code_digest(a) == _code_digest(b) != _code_digest(c)
    # the code after a docstring counts, in a module and in a function
    d = tmp_path / "d.py"
    d.write_text('"""Doc."""\n\ndef f(x):\n    """What f does."""\n    return x * 3\n')
    assert _code_digest(d) == _code_digest(c) != _code_digest(a)
    # every recorded run keys on this digest: 16 hex digits of the SHA-256 of the unparsed code, kept as they are
    assert _code_digest(c) == hashlib.sha256(b"def f(x):\n    return x * 3").hexdigest()[:16]
    e = tmp_path / "e.py"
    e.write_text("def f(x):\n    return x *\n")  # a module that does not parse is named in the error
    with pytest.raises(SyntaxError) as raised:
        _code_digest(e)
    assert raised.value.filename == str(e)


def test_the_training_path_is_the_worker_s_import_closure():
    names = set(_closure([ENTRY]))
    assert {"mocolab", "mocolab.training"} <= names  # the packages whose __init__ an import of the entry runs
    for on_path in ("mocolab.training.trainer", "mocolab.method.moco", "mocolab.method.losses", "mocolab.data.augment",
                    "mocolab.models.backbones", "mocolab.evaluation.probe", "mocolab.config.schema"):
        assert on_path in names, on_path
    for off_path in ("mocolab.cli.commands", "mocolab.analysis.report", "mocolab.tune.sweep", "mocolab.repro.document",
                     "mocolab.evaluation.leaderboard"):
        assert off_path not in names, off_path
    fp = code_fingerprint()
    assert len(fp.digest) == 16 and set(fp.versions) >= {"python", "torch", "kornia"}
    changed = CodeFingerprint("x", {**fp.modules, "mocolab.method.losses": "0"}, {**fp.versions, "torch": "9"})
    assert fp.differences(changed) == ["mocolab.method.losses: changed", f"torch 9 -> {fp.versions['torch']}"]
    fewer = CodeFingerprint("y", {m: d for m, d in fp.modules.items() if m != "mocolab.method.losses"}, {})
    assert fp.differences(fewer) == ["mocolab.method.losses: added",
                                     *(f"{p} ? -> {v}" for p, v in sorted(fp.versions.items()))]
    assert fp.differences(CodeFingerprint("z", {**fp.modules, "tplug.x": "1"}, fp.versions)) == ["tplug.x: gone"]
    # a package this code no longer records, against an earlier run that did
    assert CodeFingerprint("w", fp.modules, {}).differences(fp) == [f"{p} {v} -> ?" for p, v in
                                                                    sorted(fp.versions.items())]


def _copy(tmp_path: Path) -> Path:
    """A copy of the package to edit, beside a folder to run commands in."""
    shutil.copytree(REPO / "platform" / "mocolab", tmp_path / "platform" / "mocolab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "work").mkdir()
    return tmp_path


def _train(root: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **thread_share_env(), "PYTHONPATH": str(root / "platform"), "PYTHONWARNINGS": "ignore"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "mocolab", "train", *TINY, *extra], cwd=root / "work", env=env,
                          capture_output=True, text=True, timeout=600)


def _edit(root: Path, module: str, old: str, new: str) -> None:
    path = root / "platform" / "mocolab" / module
    text = path.read_text()
    assert old in text, (module, old)
    path.write_text(text.replace(old, new, 1))


def _runs(root: Path) -> dict[str, dict]:
    """Each run folder's manifest and outcome."""
    out = {}
    for folder in sorted((root / "work" / "runs").iterdir()):
        out[folder.name] = {"manifest": json.loads((folder / "manifest.json").read_text()),
                            "outcome": json.loads(o.read_text()) if (o := folder / "outcome.json").exists() else None}
    return out


def _mlflow_runs(root: Path) -> list:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{root / 'work' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("mocolab")
    return client.search_runs([exp.experiment_id]) if exp else []


@pytest.mark.slow
def test_a_changed_method_trains_a_new_run_beside_the_old_and_an_unrelated_edit_keeps_the_run(tmp_path):
    root = _copy(tmp_path)
    first = _train(root)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    [(name, run)] = _runs(root).items()
    old_code = run["manifest"]["code"]["digest"]
    assert run["outcome"]["code"] == old_code and run["outcome"]["status"] == "finished"

    # a comment and a module the training process does not import: the same run, reported, nothing trained
    _edit(root, "method/losses.py", "import torch\n", "import torch  # a comment changes no result\n")
    _edit(root, "cli/commands.py", "def _train(", "def _unused() -> None:\n    pass\n\n\ndef _train(")
    same = _train(root)
    assert same.returncode == 0 and f"run '{name}' has ended (code {old_code[:8]}, this checkout)" in same.stdout
    assert "nothing to train" in same.stdout and "final kNN and linear probe" not in same.stdout
    assert list(_runs(root)) == [name]

    # the loss's temperature doubled: a new run beside the old, one line naming both
    _edit(root, "method/moco.py", "self.m, self.tau = m, tau\n", "self.m, self.tau = m, 2 * tau\n")
    edited = _train(root)
    assert edited.returncode == 0, edited.stdout[-3000:] + edited.stderr[-3000:]
    runs = _runs(root)
    new = [n for n in runs if n != name]
    assert len(new) == 1 and new[0].startswith(f"{name}-c")
    new_code = runs[new[0]]["manifest"]["code"]["digest"]
    assert new_code != old_code and new[0] == f"{name}-c{new_code[:8]}"
    assert (f"run '{name}' of this config was made by code {old_code[:8]}, not this checkout's code "
            f"{new_code[:8]}: finished, linear top-1" in edited.stdout)
    assert run["outcome"]["mlflow_run_id"] in edited.stdout and "--reuse-other-code" in edited.stdout
    mlflow_runs = {r.info.run_id: r for r in _mlflow_runs(root)}
    assert len(mlflow_runs) == 2
    assert {r.data.tags["mocolab.code_fingerprint"] for r in mlflow_runs.values()} == {old_code, new_code}
    assert {r.data.params["mocolab.code_fingerprint"] for r in mlflow_runs.values()} == {old_code, new_code}
    # the old run, asked for: reported as what it is, nothing trained
    reused = _train(root, "--reuse-other-code")
    assert reused.returncode == 0 and f"run '{name}' has ended (code {old_code[:8]}): finished" in reused.stdout
    assert len(_runs(root)) == 2


@pytest.mark.slow
def test_an_interrupted_run_is_refused_across_a_code_change_unless_continued_with_its_segments(tmp_path):
    root = _copy(tmp_path)
    crash = ["--set", "run.name=story", "--set", "run.fault_step=3", "--set", "run.max_failures=0",
             "--set", "run.checkpoint_every=1"]
    assert _train(root, *crash).returncode != 0  # interrupted at step 3, its checkpoint of step 2 kept
    started = _runs(root)["story"]["manifest"]["code"]["digest"]
    assert _runs(root)["story"]["outcome"] is None
    _edit(root, "method/moco.py", "self.m, self.tau = m, tau\n", "self.m, self.tau = m, 2 * tau\n")
    refused = _train(root, *crash)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    now = code_of(root)
    line = refused.stderr.strip().splitlines()[-1]
    assert (f"run 'story' ({root / 'work' / 'runs' / 'story'}) was started by code {started[:8]} and this "
            f"checkout's code is {now[:8]} (mocolab.method.moco: changed)") in line
    assert "--continue-across-code" in line and "--set run.name=<a new name>" in line
    assert _runs(root)["story"]["outcome"] is None  # nothing written

    continued = _train(root, *crash, "--continue-across-code")
    assert continued.returncode == 0, continued.stdout[-3000:] + continued.stderr[-3000:]
    assert "resuming at step 2" in continued.stdout
    run = _runs(root)["story"]
    assert run["manifest"]["segments"] == [{"code": started, "from_step": 0}, {"code": now, "from_step": 2}]
    assert run["outcome"]["status"] == "finished" and run["outcome"]["code"] == now
    [mlflow_run] = _mlflow_runs(root)
    assert mlflow_run.data.tags["mocolab.code_segments"] == f"{started}@0,{now}@2"
    assert mlflow_run.data.tags["mocolab.code_fingerprint"] == now


def code_of(root: Path) -> str:
    """The code fingerprint of the copy, as a process running it takes it."""
    out = subprocess.run([sys.executable, "-c", "from mocolab.training.code_fingerprint import code_fingerprint; "
                          "print(code_fingerprint().digest)"], env={**os.environ, "PYTHONPATH": str(root / "platform")},
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


def test_a_sweep_reruns_a_trial_whose_run_other_code_made_and_keeps_one_made_before_fingerprints(tmp_path):
    """Trial by trial, as a grid sweep resumes: settled means its latest run ended and was made by this code
    (or before fingerprints: code unknown); its table reads each trial's latest run."""
    import time

    from mocolab.tracking.store import CODE_TAG, PARENT_ID_TAG, STATUS_TAG, Store, SweepRun

    store = Store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = store.experiment_id("sweeps", create=True)
    parent = SweepRun(store, exp, store.client.create_run(exp).info.run_id, False)

    def child(label: str, status: str, code: str | None) -> str:
        tags = {"trial": label, STATUS_TAG: status, PARENT_ID_TAG: parent.run_id, **({CODE_TAG: code} if code else {})}
        run_id = store.client.create_run(exp, tags=tags).info.run_id
        store.client.set_terminated(run_id)
        time.sleep(0.01)  # start times order the runs
        return run_id

    child("m=0.9", "finished", "aaaa")  # this code
    child("m=0.99", "finished", None)  # before fingerprints: kept
    child("m=0.999", "finished", "bbbb")  # other code: runs again
    child("m=0", "finished", "bbbb")
    latest = child("m=0", "finished", "aaaa")  # ... and ran again by this code
    assert parent.done_labels(code="aaaa") == {"m=0.9", "m=0.99", "m=0"}
    assert parent.done_labels() == {"m=0.9", "m=0.99", "m=0.999", "m=0"}
    table = parent.trials().set_index("label")
    assert len(table) == 4 and table.loc["m=0", "run_id"] == latest
    assert table.loc["m=0.99", "code"] == "unknown" and table.loc["m=0.9", "code"] == "aaaa"


def test_a_fingerprint_reads_back_from_its_record_and_follows_a_plugin_s_own_package(tmp_path, monkeypatch):
    """What a manifest keeps is the fingerprint itself; a record without one is code unknown; a package that is
    not installed is "absent"; a module from outside mocolab brings the modules of its own package it imports
    (relatively or not), besides the training path, and a name that is no module's file brings nothing."""
    fp = code_fingerprint()
    assert CodeFingerprint.from_dict(json.loads(json.dumps(fp.to_dict()))) == fp
    assert CodeFingerprint.from_dict(None) == CodeFingerprint.from_dict({}) == CodeFingerprint(UNKNOWN)
    assert CodeFingerprint.from_dict({"digest": "ab"}) == CodeFingerprint("ab", {}, {})
    assert CodeFingerprint.from_dict({"versions": {"torch": "2"}}) == CodeFingerprint(UNKNOWN, {}, {"torch": "2"})
    assert _version("mocolab-no-such-package") == "absent" and _version("torch") == torch_version()
    pkg = tmp_path / "tplug_fp"
    (pkg / "sub").mkdir(parents=True)
    files = {"__init__.py": "", "method.py": PLUGIN_METHOD, "sub/__init__.py": "from . import leaf, twig\n",
             "sub/leaf.py": "from .. import helper\nfrom ..deep import f\n", "helper.py": "def f():\n    return 1\n",
             "deep.py": "def f():\n    return 2\n", "sub/twig.py": ""}  # deep: by sub.leaf only; twig: by sub only
    files.update({f"{name}.py": "" for name in ("fast", "slow", "more", "last", "other", "typing_only")})
    for name, text in files.items():
        (pkg / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    closure = _closure([ENTRY, "tplug_fp.method"])
    mine = {n: p for n, p in closure.items() if n.startswith("tplug_fp")}
    assert mine == {f"tplug_fp.{name[:-3].replace('/', '.')}".removesuffix(".__init__"): pkg / name
                    for name in files if name != "typing_only.py"} | {"tplug_fp": pkg / "__init__.py"}, sorted(mine)
    assert ENTRY in closure and closure["mocolab.config"] == (REPO / "platform" / "mocolab" / "config" /
                                                             "__init__.py").resolve()
    for nothing in ("mocolab.no_such_module", "builtins", "tplug_no_such_package.x", "mocolab.config.Config"):
        assert _source(nothing) is None, nothing
    (pkg / "broken.py").write_text("from . import helper\ndef f(:\n")  # a module of the path that does not parse
    with pytest.raises(SyntaxError) as raised:
        _closure(["tplug_fp.broken"])
    assert raised.value.filename == str(pkg / "broken.py")  # named, for the person who must mend it


# a plugin's module: imports at module level in every form _closure follows, and one for type checkers only
PLUGIN_METHOD = """from typing import TYPE_CHECKING

from . import helper
from tplug_fp.sub import leaf
try:
    from . import fast
except ImportError:
    from . import slow
else:
    from . import more
finally:
    from . import last
if helper:
    pass
else:
    from . import other
if TYPE_CHECKING:
    from . import typing_only
"""


def torch_version() -> str:
    from importlib.metadata import version

    return version("torch")


def test_a_step_package_of_another_version_is_other_code(tmp_path):
    """The same modules computed with another kornia are another fingerprint: a process that finds kornia 0.0.1
    first on its path (its distribution's metadata, as pip leaves it) takes a digest of its own."""
    meta = tmp_path / "site" / "kornia-0.0.1.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: kornia\nVersion: 0.0.1\n")
    code = ("import json, sys; from mocolab.training.code_fingerprint import code_fingerprint as f; "
            "print(json.dumps({**f().to_dict(), 'imported': sorted(m for m in sys.modules if m.startswith("
            "('mocolab', 'torch')))}))")
    path = os.pathsep.join([str(tmp_path / "site"), str(REPO / "platform")])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": path})
    assert out.returncode == 0, out.stderr[-3000:]
    # read from the package's files, never imported: the driver takes it before any work, torch unloaded
    assert json.loads(out.stdout)["imported"] == ["mocolab", "mocolab.training", "mocolab.training.code_fingerprint"]
    there, here = CodeFingerprint.from_dict(json.loads(out.stdout)), code_fingerprint()
    assert there.versions["kornia"] == "0.0.1" != here.versions["kornia"] and there.modules == here.modules
    assert there.digest != here.digest and here.differences(there) == [f"kornia 0.0.1 -> {here.versions['kornia']}"]


@pytest.mark.slow
def test_an_interrupted_run_continues_across_a_change_the_committed_list_declares_neutral(tmp_path):
    """The path `mocolab repro` takes (--neutral-code-changes): a run interrupted under code A continues under
    code B only where (A, B) is declared neutral, its segments recorded; any other change is refused. Code A
    here is the manifest's fingerprint set to another digest, the run's own checkpoint kept."""
    from mocolab.config import build_config
    from mocolab.training.rerun import CodeChanged
    from mocolab.training.launch import fit

    cfg = build_config("smoke", {"data.name": "synthetic", "data.subset": 256, "optim.batch_size": 32,
                                 "queue.size": 64, "optim.max_steps": 4, "eval.knn_bank": 64, "eval.knn_test": 50,
                                 "eval.linear_train": 64, "eval.linear_steps": 3, "run.log_models": False,
                                 "run.system_metrics_s": 0, "run.fault_step": 3, "run.max_failures": 0,
                                 "run.checkpoint_every": 1, "run.output_dir": str(tmp_path / "runs"),
                                 "run.name": "neutral", "run.num_workers": 0})
    with pytest.raises(Exception, match="injected fault"):
        fit(cfg, log_to_mlflow=False, progress=lambda _m: None)
    path = tmp_path / "runs" / "neutral" / "manifest.json"
    manifest = json.loads(path.read_text())
    now = manifest["code"]["digest"]
    before = "0123456789abcdef"
    path.write_text(json.dumps({**manifest, "code": {**manifest["code"], "digest": before}}))
    with pytest.raises(CodeChanged, match=f"was started by code {before[:8]}"):
        fit(cfg, log_to_mlflow=False, progress=lambda _m: None, neutral_changes=frozenset({(before, "f" * 16)}))
    said: list[str] = []
    between = "89abcdef01234567"  # declared in two steps, as the list grows one change at a time
    out = fit(cfg, log_to_mlflow=False, progress=said.append,
              neutral_changes=frozenset({(before, between), (between, now), (now, "f" * 16)}))
    assert out.status == "finished" and out.steps == 4
    assert any(f"continuing under this checkout's code {now[:8]}" in line and "a change declared neutral" in line
               for line in said), said
    assert json.loads(path.read_text())["segments"] == [{"code": before, "from_step": 0},
                                                         {"code": now, "from_step": 2}]


def test_neutral_changes_chain_one_way_only():
    from mocolab.training.launch import declared_neutral

    changes = frozenset({("a", "b"), ("b", "c"), ("x", "y")})
    assert declared_neutral("a", "b", changes) and declared_neutral("a", "c", changes)
    assert not declared_neutral("c", "a", changes)  # back is not declared
    assert not declared_neutral("a", "y", changes) and not declared_neutral("a", "a", changes)
    assert not declared_neutral("q", "b", changes)


def test_a_neutral_change_is_declared_with_its_reason(tmp_path):
    from mocolab.training.code_fingerprint import neutral_changes

    good = tmp_path / "neutral.json"
    good.write_text(json.dumps([{"from": "a" * 16, "to": "b" * 16, "reason": "a package move, no change of code"}]))
    assert neutral_changes(good) == {("a" * 16, "b" * 16)}
    committed = neutral_changes(REPO / "results" / "neutral_code_changes.json")  # the committed list reads
    assert isinstance(committed, frozenset) and all(len(a) == len(b) == 16 for a, b in committed), committed
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"from": "a" * 16, "to": "b" * 16}]))
    with pytest.raises(ValueError, match="entry 0 needs 'from' and 'to' .* and a 'reason'"):
        neutral_changes(bad)
    bad.write_text(json.dumps({"from": "a" * 16, "to": "b" * 16, "reason": "one entry, not a list of them"}))
    with pytest.raises(ValueError, match=r"bad.json: expected a list of \{from, to, reason\}"):
        neutral_changes(bad)
