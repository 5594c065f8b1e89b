"""The scale benchmark of sweeps (benchmarks/cluster/sweep_scale.py) at N = 3: real grid and ASHA sweeps on a
``mocolab cluster`` of their own, after which no actor or placement group may be left alive, and every figure
the benchmark records is there and sane.

ASHA stops trials in the middle of their Train run: there the placement group of a stopped trial's workers
outlives the trial unless ``tune/release.py`` removes it (ray#54305), and so does Ray Train's detached
placement-group cleaner, whose thread dies where several Rays run on one machine (as here, beside this
cluster) unless ``tune/release.py`` ends it: either is an actor or a group alive after the sweep. Whether
ASHA stops one of three trials depends on the search's draws and their scores (here it stopped 1, 2 and 0 in
three runs); ``tests/tune/test_release.py`` checks the cleaner's end on every run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mocolab.cluster.postgres import find_bindir

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "cluster" / "sweep_scale.py"
needs_postgres = pytest.mark.skipif(find_bindir() is None,
                                    reason="PostgreSQL server binaries not installed (make setup)")


@pytest.mark.slow
@pytest.mark.cluster
@needs_postgres
@pytest.mark.xdist_group("mocolab-clusters")
def test_sweeps_of_three_trials_leave_nothing_alive_and_record_every_figure(tmp_path):
    results = tmp_path / "scale.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO / "platform")}
    env.pop("RAY_ADDRESS", None)
    res = subprocess.run([sys.executable, str(SCRIPT), "--trials", "3", "--results", str(results)], env=env,
                         capture_output=True, text=True, timeout=1800)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert "cluster: stopped" in out and "deleted its data" in out, out[-3000:]
    rows = {r["kind"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert sorted(rows) == ["asha", "grid"], rows.keys()
    for kind, row in rows.items():
        where = f"{kind}: {json.dumps(row)[:3000]}"
        # nothing left: while the driver was connected, and once it had exited
        assert row["actors_in_driver"] == [] and row["pgs_in_driver"] == [], where
        assert row["actors_alive"] == [] and row["pgs_alive"] == [], where
        assert row["exit_code"] == 0 and row["n"] == 3 and row["runs"] == 3 and row["tune_trials"] == 3, where
        assert row["machine"].endswith("CPUs"), where
        finished = row["statuses"].get("finished", 0)
        assert finished >= 1 and finished + row["statuses"].get("stopped_early", 0) == 3, where
        # every trial's start-up and training; the rest over the finished ones (a stopped run closes late)
        for key, count in (("startup_s", 3), ("train_s", 3), ("eval_s", finished), ("close_s", finished),
                           ("run_s", finished), ("tune_s", finished)):
            part = row[key]
            assert part["n"] == count and 0 < part["p10"] <= part["median"] <= part["p90"] < 600, (key, where)
        # a trial's parts fit in its MLflow run, and the run in the sweep
        assert row["startup_s"]["median"] + row["train_s"]["median"] <= row["run_s"]["p90"] + 1, where
        assert 3 * row["run_s"]["p10"] / 2 <= row["wall_s"] < 1800, where  # two trials at a time at most
        assert math.isclose(row["per_trial_s"], row["wall_s"] / 3)
        assert 100 < row["driver_peak_rss_mb"] < 8000, where
        assert row["tune_state_bytes"] > 1000 and row["train_state_bytes"] > 1000, where
        assert 0 < row["store_bytes"] < row["store_total_bytes"], where
        for key in ("report_s", "leaderboard_s", "watch_first_s", "watch_next_s"):
            assert 0 < row[key] < 600, (key, where)
        assert len(row["load"]["before"]) == len(row["load"]["after"]) == 3, where
    assert rows["grid"]["statuses"] == {"finished": 3}, rows["grid"]["statuses"]  # a grid runs every point

    # a second call finds every cell in the file: nothing runs, no cluster starts
    again = subprocess.run([sys.executable, str(SCRIPT), "--trials", "3", "--results", str(results)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "every cell is there already" in again.stdout, again.stdout + again.stderr
    # the plot reads the file alone: one N fits no slope, and still draws
    figure = tmp_path / "scale.png"
    drawn = subprocess.run([sys.executable, str(SCRIPT), "--plot", "--results", str(results), "--figure", str(figure)],
                           env=env, capture_output=True, text=True, timeout=300)
    assert drawn.returncode == 0 and figure.stat().st_size > 10_000, drawn.stdout + drawn.stderr
    assert "driver peak RSS" in drawn.stdout and "nan" in drawn.stdout
