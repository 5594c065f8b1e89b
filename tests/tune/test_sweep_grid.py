"""`mocolab sweep`: a sweep over any config fields, with the named studies' parent/child runs, resume,
report and exit codes; bad grids refused before Ray, MLflow or torch load."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import thread_share_env
from mocolab.data.sets import fashion_mnist_dir
from mocolab.tune.grid import check_grid, default_name, grid_sweep, grid_trials, parse_grid
from mocolab.tune.spec import Launch, check_sweep
from readme_blocks import commands

# Appended to each line of docs/studies.md's block: the smoke preset (its 8,192 images hold K = 4096), 4 steps
# a trial trained in the trial's own process (run.num_workers=0: a sweep takes it from --set), a small evaluation,
# one trial per invocation
SMALL = ["--preset", "smoke", "--set", "optim.max_steps=4", "--set", "eval.knn_every=0", "--set",
         "eval.knn_bank=512", "--set", "eval.knn_test=200", "--set", "eval.linear_train=512", "--set",
         "eval.linear_steps=5", "--set", "run.system_metrics_s=0", "--set", "run.log_models=false",
         "--set", "run.num_workers=0",
         "--max-concurrent", "1", "--stop-after", "1"]


def test_a_grid_is_typed_values_per_field_and_every_point_per_seed():
    grid = parse_grid(["moco.tau=0.07,0.2", "queue.size=1024, 4096", "augment.preset=none,mocov2"])
    assert grid == {"moco.tau": [0.07, 0.2], "queue.size": [1024, 4096], "augment.preset": ["none", "mocov2"]}
    trials = grid_trials(grid, [0, 1])
    assert len(trials) == 2 * 2 * 2 * 2 and len({t.label for t in trials}) == len(trials)
    assert trials[0].label == "moco.tau=0.07 queue.size=1024 augment.preset=none seed=0"
    assert trials[0].overrides == {"moco.tau": 0.07, "queue.size": 1024, "augment.preset": "none", "run.seed": 0}
    assert {t.overrides["run.seed"] for t in trials[:8]} == {0}  # seed by seed: a stopped sweep holds whole seeds
    assert default_name(grid, "smoke", 3) == "sweep-tau-size-preset-smoke-s3"


@pytest.mark.parametrize("items, message", [
    ([], "--grid: give at least one field"),
    (["moco.tau"], "expected section.field=value1,value2"),
    (["moco.tau="], "--grid moco.tau: no values given"),
    (["moco.bn="], "no values given (allowed: shuffle, split, groups, sync, plain)"),
    (["moco.tau=0.1,0.1"], "a value is listed twice"),
    (["moco.tau=0.1", "moco.tau=0.2"], "given twice"),
    (["run.seed=0,1"], "give seeds with --seeds N"),
    (["run.num_workers=1,2"], "the sweep sets it for every trial (use --workers-per-trial)"),
])
def test_a_bad_grid_names_what_is_wrong(items, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_grid(items)


@pytest.mark.parametrize("grid, message", [
    ({"moco.nope": [1]}, "unknown config key 'moco.nope'"),
    ({"moco.tau": [0.1, 50]}, "moco.tau: 50.0 is out of range"),
    ({"moco.bn": ["split", "group"]}, "moco.bn: unknown value 'group'"),
    ({"queue.size": [8192]}, "queue.size: 8192 must be below the training-set size 8192"),
])
def test_every_trials_config_is_checked_before_a_sweep_starts(grid, message):
    for search in ("grid", "optuna"):
        with pytest.raises(ValueError, match=re.escape(message)):
            check_sweep(grid_sweep(check_grid(grid), preset="smoke", search=search, samples=2), Launch())


def test_the_command_refuses_bad_input_at_once_and_writes_nothing(tmp_path):
    cases = [(["--grid", "moco.tau=0.1,0.1"], "a value is listed twice"),
             (["--grid", "moco.tau=0.1", "--samples", "3"], "--samples: applies to --search optuna or random"),
             (["--grid", "moco.tau=0.1", "--seeds", "0"], "--seeds: 0 is out of range; allowed [1, 1000]"),
             (["--grid", "moco.tau=0.1", "--search", "bayes"], "invalid choice: 'bayes'"),
             (["--grid", "moco.nope=1"], "unknown config key 'moco.nope'"),
             (["--grid", "moco.tau=0.1", "--name", "a/b"], "--name: 'a/b' is not a valid name")]
    code = ("import sys, json\nfrom mocolab.cli.commands import main\nrc = main(sys.argv[1:])\n"
            "print(json.dumps({'rc': rc, 'heavy': [m for m in ('torch', 'ray', 'mlflow') if m in sys.modules]}))")
    for argv, message in cases:
        res = subprocess.run([sys.executable, "-c", code, "sweep", *argv], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
        # one line naming the problem (argparse's own refusals print the usage above it)
        assert message in res.stderr.strip().splitlines()[-1], (argv, res.stderr)
        if res.returncode == 0:  # main returned (argparse's own refusals exit 2 from inside it)
            assert '"rc": 2' in res.stdout and '"heavy": []' in res.stdout, (argv, res.stdout)
        else:
            assert res.returncode == 2, (argv, res.returncode)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no store, no sweep folder


def _sh(line: str, work: Path) -> subprocess.CompletedProcess:
    env = {"HOME": os.environ.get("HOME", str(work)), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "LANG": "C.UTF-8", "MOCOLAB_DATA": str(fashion_mnist_dir()),
           **{k: v for k, v in os.environ.items() if k.startswith(("RAY_TMPDIR", "MOCOLAB_LOCKS"))},
           **thread_share_env()}
    return subprocess.run(["bash", "-e", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")
def test_docs_sweep_block_runs_resumes_and_records_a_parent_with_its_trials(tmp_path):
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    grid_line, search_line = commands("any-sweep")
    small = " " + " ".join(SMALL)
    first = _sh(grid_line + small, tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert re.search(r"^1 of 12 trials done \(--stop-after 1\); the same command runs the other 11\.$", first.stdout,
                     re.M), first.stdout[-3000:]
    again = _sh(grid_line + small, tmp_path)  # the same command: resumes, never repeats a trial
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "1 trial(s) already done, 11 to run" in again.stdout and "2 of 12 trials done" in again.stdout
    search = _sh(search_line + small, tmp_path)
    assert search.returncode == 0, search.stdout[-3000:] + search.stderr[-3000:]
    assert re.search(r"^1 of 6 trials done", search.stdout, re.M), search.stdout[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("sweeps").experiment_id])
    parents = {r.data.tags["mocolab.sweep_parent"]: r for r in runs if "mocolab.sweep_parent" in r.data.tags}
    assert set(parents) == {"sweep-tau-size-smoke-s0", "tau-search"}
    grid_parent = parents["sweep-tau-size-smoke-s0"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == grid_parent.info.run_id]
    assert [r.data.tags["trial"] for r in sorted(children, key=lambda r: r.info.start_time)] == [
        "moco.tau=0.07 queue.size=1024 seed=0", "moco.tau=0.07 queue.size=4096 seed=0"]
    assert all(r.info.status == "FINISHED" and "linear_top1" in r.data.metrics for r in children)
    assert {r.data.params["run.num_workers"] for r in children} == {"0"}  # the --set value, not the flag's default
    assert grid_parent.data.tags["mocolab.status"] == "partial"
    assert "moco.tau=0.07 queue.size=4096" in again.stdout  # the closing table, one row per point
    assert (tmp_path / "runs" / "sweeps" / "sweep-tau-size-smoke-s0" / "report" / "report.html").is_file()


def test_a_search_selects_on_a_validation_split_it_holds_out_never_on_the_test_split():
    sweep = grid_sweep(check_grid({"moco.tau": [0.1, 0.2]}), preset="smoke", search="optuna", samples=2)
    assert sweep.metric == "val_knn_top1" and sweep.base_overrides["data.val_size"] == 60_000 // 12
    assert "on val_knn_top1 of 5,000 held-out training images" in sweep.description
    check_sweep(sweep, Launch())
    mine = grid_sweep(check_grid({"moco.tau": [0.1]}), preset="smoke", search="optuna",
                      overrides={"data.val_size": 900})
    assert mine.base_overrides["data.val_size"] == 900  # the user's, kept
    assert "data.val_size" not in grid_sweep(check_grid({"moco.tau": [0.1]}), preset="smoke").base_overrides  # a grid
    for metric, message in (("knn_top1", "metric: 'knn_top1' is a test-split number"),
                            ("linear_top1", "metric: 'linear_top1' is a test-split number")):
        with pytest.raises(ValueError, match=re.escape(message)):
            check_sweep(replace(sweep, metric=metric), Launch())
    with pytest.raises(ValueError, match=re.escape("data.val_size: 0 holds out no validation split")):
        check_sweep(replace(sweep, base_overrides={**sweep.base_overrides, "data.val_size": 0}), Launch())
    with pytest.raises(ValueError, match=re.escape("--scheduler asha: stops a search's poor trials early, and "
                                                   "--search grid runs every point to its end")):  # never dropped
        check_sweep(grid_sweep(check_grid({"moco.tau": [0.1]}), preset="smoke", scheduler="asha"), Launch())
