"""Reports from a real MLflow store filled through mocolab's own logging code; rendered in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mocolab.config import build_config
from mocolab.config.manifest import RunManifest
from mocolab.analysis.report import build_report, png_size
from mocolab.tracking import MetricsLogger, RunTracker, trials_frame
from conftest import mlflow_store


def _fill(uri: str, experiment: str, trials: list[tuple[float, int, str]],
          recipes: dict[str, dict] | None = None, preset: str = "smoke") -> str:
    """A parent run and one child per (m, seed, status), logged as a sweep's trials are; with ``recipes``,
    one child per (label, overrides) instead, each with a per-step first-layer gradient series."""
    tracker = RunTracker(uri, experiment)
    client = MlflowClient(uri)
    parent = client.create_run(tracker.experiment_id, run_name="sweep", tags={"mocolab.sweep_parent": "sweep"})
    items = ([(label, ov, "finished") for label, ov in recipes.items()] if recipes else
             [(f"m={m:g} seed={seed}", {"moco.m": m, "run.seed": seed}, status) for m, seed, status in trials])
    for label, overrides, status in items:
        cfg = build_config(preset, overrides)
        m, seed = cfg.moco.m, cfg.run.seed
        child = RunTracker(uri, experiment)
        run_id, _ = child.start(RunManifest.of(cfg.replace(**{"run.name": f"sweep--{label}"})), tags={"trial": label},
                                parent_run_id=parent.info.run_id, display_name=label)
        log = MetricsLogger(uri, run_id)
        base = 0.6 + 0.3 * (1 - (1 - m) ** 0.5) + 0.01 * seed
        for epoch in (1, 2, 3):
            if status == "diverged" and epoch == 3:
                break
            series = {"grad_norm_first_layer": [[s, 1.0 / s] for s in range(epoch * 10 - 9, epoch * 10 + 1)]}
            log.log({"loss": 7 - epoch * (m + 0.1), "knn_top1": base - 0.1 + 0.03 * epoch,
                     "pretext_acc": 0.1 * epoch, "staleness_mean": 4.0}, epoch * 10, series=series)
        if status == "diverged":
            log.log_final({"final_loss": float("nan")}, 25)
        else:
            log.log_final({"linear_top1": base + 0.1, "knn_top1": base, "final_loss": 7 - 3 * m}, 30)
        child.finish(status)
    return parent.info.run_id


@pytest.fixture
def store(tmp_path):
    uri = mlflow_store(tmp_path)
    trials = [(m, s, "finished") for m in (0.9, 0.99, 0.999) for s in (0, 1)] + [(0.0, 0, "diverged")]
    return uri, _fill(uri, "momentum-ablation", trials)


def test_report_from_a_real_store(tmp_path, store):
    uri, parent = store
    rep = build_report("momentum-ablation", tmp_path / "out", parent_run=parent, tracking_uri=uri)
    assert rep.trials == 7 and "1 did not finish" in rep.message
    names = {p.name for p in rep.figures}
    assert names == {"momentum.png", "curves.png"}
    assert png_size(tmp_path / "out" / "momentum.png") == (770, 462)
    assert png_size(tmp_path / "out" / "curves.png") == (1600, 340)
    page = rep.html.read_text()
    for label in ["m=0.9 seed=0", "m=0.9 seed=1", "m=0.99 seed=0", "m=0.999 seed=1", "m=0 seed=0"]:
        assert f">{label}<" in page
    assert page.count("data:image/png;base64,") == 2 and 'class="diverged"' in page
    assert "#/experiments/" in page  # links into the MLflow UI
    client = MlflowClient(uri)
    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert logged == {"report/report.html", "report/momentum.png", "report/curves.png"}
    assert "bands: the random-init encoder" not in page  # no baselines logged for this sweep yet


def test_a_sweeps_momentum_plot_shows_the_baselines_its_study_logged(tmp_path, store, monkeypatch):
    """The report's momentum plot draws the random-init encoder and raw pixels the study logged under the
    sweep's name (``mocolab baselines``' set), as the study's own plot does; another set's are not this sweep's."""
    from mocolab.analysis import momentum_plots
    from mocolab.repro.baseline_runs import KIND_TAG, SET_TAG
    from mocolab.tracking import Store

    uri, parent = store
    client, st = MlflowClient(uri), Store(uri)
    exp = st.experiment_id("baselines", create=True)
    for name, kind, seed, linear in (("sweep", "random-init", 0, 0.80), ("sweep", "random-init", 1, 0.82),
                                     ("sweep", "raw-pixels", 0, 0.78), ("other", "random-init", 0, 0.10)):
        run = client.create_run(exp, tags={KIND_TAG: kind, SET_TAG: name, "mocolab.status": "finished"})
        st.log_params(run.info.run_id, build_config("smoke", {"run.seed": seed}).flatten())
        client.log_metric(run.info.run_id, "linear_top1", linear)
        client.log_metric(run.info.run_id, "knn_top1", linear - 0.1)
        client.set_terminated(run.info.run_id, "FINISHED")
    drawn = {}
    keep = momentum_plots.save_figure

    def save(fig, path):
        drawn[path.name] = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        return keep(fig, path)

    monkeypatch.setattr(momentum_plots, "save_figure", save)
    rep = build_report("momentum-ablation", tmp_path / "out", parent_run=parent, tracking_uri=uri)
    assert "bands: the random-init encoder of the same seeds, 95 % interval; dashed: raw pixels" in rep.html.read_text()
    assert {"random-init encoder, linear (95 % CI, 2 seeds)", "raw pixels, linear probe"} <= set(drawn["momentum.png"])
    build_report("momentum-ablation", tmp_path / "all", tracking_uri=uri)  # the whole experiment: no one sweep's set
    assert not [label for label in drawn["momentum.png"] if "random-init" in label or "pixels" in label]


def test_single_seed_and_whole_experiment(tmp_path):
    uri = mlflow_store(tmp_path)
    _fill(uri, "momentum-ablation", [(0.9, 0, "finished"), (0.999, 0, "finished")])
    rep = build_report("momentum-ablation", tmp_path / "out", tracking_uri=uri)  # no parent: all trials
    assert rep.trials == 2 and "1 seed(s)" in rep.message and "Warning" not in rep.message
    assert png_size(tmp_path / "out" / "momentum.png")[0] > 0
    # a second sweep of the same experiment in another precision: pooled, the report says so
    client = MlflowClient(uri)
    _fill(uri, "momentum-ablation", [(0.9, 1, "finished")])
    runs = [r for r in client.search_runs([client.get_experiment_by_name("momentum-ablation").experiment_id])
            if "mlflow.parentRunId" in r.data.tags]
    for run in runs:
        client.set_tag(run.info.run_id, "mocolab.precision", "fp32" if run.data.params["run.seed"] == "1" else "bf16")
    rep = build_report("momentum-ablation", tmp_path / "out", tracking_uri=uri)
    assert rep.trials == 3 and "Warning: the trials come from 2 different precisions (bf16; fp32)" in rep.message
    assert "2 different precisions" in rep.html.read_text()


def test_empty_and_unknown_experiments(tmp_path):
    uri = mlflow_store(tmp_path)
    MlflowClient(uri).create_experiment("empty-study")
    rep = build_report("empty-study", tmp_path / "out", tracking_uri=uri)
    assert rep.trials == 0 and "no trial runs" in rep.message and rep.html.exists()
    with pytest.raises(ValueError, match=r"--experiment: no experiment 'nope'.*empty-study"):
        build_report("nope", tmp_path / "out2", tracking_uri=uri)


@pytest.mark.slow
def test_html_opens_in_headless_chromium(tmp_path, store):
    # `make test` installs the browser (its chromium target); a test does not install one itself, so a missing
    # browser is said at once: a skip with the reason, which CI=true turns into a failure
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium executable (make chromium: apt-get install chromium)")
    uri, parent = store
    rep = build_report("momentum-ablation", tmp_path / "out", parent_run=parent, tracking_uri=uri)
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--enable-logging=stderr"]
    url = Path(rep.html).resolve().as_uri()
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert "images loaded: 2/2" in dom.stdout, dom.stdout[-2000:] + dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    shot = tmp_path / "report.png"
    subprocess.run([*flags, "--window-size=1400,2400", f"--screenshot={shot}", url], capture_output=True,
                   timeout=120)
    assert png_size(shot) == (1400, 2400)


def test_report_command_line(tmp_path, store, capsys):
    from mocolab.cli.commands import main

    uri, parent = store
    assert main(["report", "--experiment", "momentum-ablation", "--parent-run", parent, "--out",
                 str(tmp_path / "cli"), "--tracking-uri", uri]) == 0
    assert "report: " in capsys.readouterr().out and (tmp_path / "cli" / "report.html").exists()
    assert main(["report", "--experiment", "nope", "--out", str(tmp_path / "x"), "--tracking-uri", uri]) == 2
    assert "no experiment 'nope'" in capsys.readouterr().err


def _running_sweep(uri: str) -> tuple[str, str, str]:
    """A sweep in progress, as a study leaves it mid-run: parent RUNNING, one trial finished, one at epoch 2."""
    parent = _fill(uri, "live-study", [(0.9, 0, "finished")])
    client = MlflowClient(uri)
    client.update_run(parent, status="RUNNING")
    cfg = build_config("smoke", {"moco.m": 0.99})
    trial = RunManifest.of(cfg.replace(**{"run.name": "sweep--m=0.99 seed=0"}))
    run_id, _ = RunTracker(uri, "live-study").start(trial, tags={"trial": "m=0.99 seed=0"}, parent_run_id=parent,
                                                    display_name="m=0.99 seed=0")
    log = MetricsLogger(uri, run_id)
    for epoch in (1, 2):
        log.log({"loss": 6.5 - 0.25 * epoch, "knn_top1": 0.5 + 0.1 * epoch}, epoch * 10)
    return parent, run_id, log


def _finish(uri: str, parent: str, run_id: str, log: MetricsLogger) -> None:
    log.log({"loss": 5.5, "knn_top1": 0.75}, 30)
    log.log_final({"linear_top1": 0.8, "knn_top1": 0.75, "final_loss": 5.5}, 30)
    MlflowClient(uri).set_tag(run_id, "mocolab.status", "finished")
    MlflowClient(uri).set_terminated(run_id, "FINISHED")
    MlflowClient(uri).set_terminated(parent, "FINISHED")


def _row(page: str, label: str) -> str:
    start = page.index(f"<td>{label}</td>")
    return page[start:page.index("</tr>", start)]


def test_live_report_shows_the_running_trial_then_its_end(tmp_path):
    uri = mlflow_store(tmp_path)
    parent, run_id, log = _running_sweep(uri)
    rep = build_report("live-study", tmp_path / "out", parent_run=parent, tracking_uri=uri, refresh_s=7,
                       log_artifacts=False)
    page = rep.html.read_text()
    assert rep.live and rep.running == 1
    assert '<meta http-equiv="refresh" content="7">' in page and "1 trial(s) running" in page
    row = _row(page, "m=0.99 seed=0")
    assert '<td class="running">running</td><td>2</td>' in row and "<td>6</td>" in row  # epochs done, latest loss
    assert '<td class="finished">finished</td><td>3</td>' in _row(page, "m=0.9 seed=0")
    _finish(uri, parent, run_id, log)
    rep = build_report("live-study", tmp_path / "out", parent_run=parent, tracking_uri=uri, refresh_s=7,
                       log_artifacts=False)
    page = rep.html.read_text()
    assert not rep.live and "http-equiv" not in page and "Final: nothing is running" in page
    assert '<td class="finished">finished</td><td>3</td>' in _row(page, "m=0.99 seed=0") and "80.00%" in page


@pytest.mark.slow
def test_report_watch_follows_a_sweep_until_it_ends(tmp_path):
    """``mocolab report --watch`` in its own process: live while the sweep runs, final when it has ended."""
    import sys
    import time

    uri = mlflow_store(tmp_path)
    parent, run_id, log = _running_sweep(uri)
    page = tmp_path / "watch" / "report.html"
    proc = subprocess.Popen([sys.executable, "-m", "mocolab", "report", "--experiment", "live-study", "--parent-run",
                             parent, "--out", str(page.parent), "--tracking-uri", uri, "--watch", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (page.exists() and "running</td>" in page.read_text()):
            time.sleep(0.3)
        assert "http-equiv" in page.read_text() and proc.poll() is None  # still watching a live sweep
        _finish(uri, parent, run_id, log)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    final = page.read_text()
    assert "http-equiv" not in final and "running</td>" not in final and "80.00%" in final
    assert "1 running" in out and "report: " in out
    logged = {a.path for a in MlflowClient(uri).list_artifacts(parent, "report")}
    assert "report/report.html" in logged  # the final page is the sweep's record, as a study's closing one is


def test_v3_reports_draw_what_their_studies_vary(tmp_path):
    """The ViT ablation (patch projection x base m) gets accuracy per setting beside every trial's per-step
    gradient norm, not the v1 paper's momentum curve; a versions comparison gets one bar per recipe and
    nothing finer (its recipes differ in augmentation, BN and more at once)."""
    uri = mlflow_store(tmp_path)
    patch = {f"patch={'frozen' if f else 'trained'} m={m:g} seed=0": {"vit.freeze_patch_embed": f, "moco.m": m}
             for f in (False, True) for m in (0.9, 0.99)}
    parent = _fill(uri, "vit-ablation", [], recipes=patch, preset="vit-quick")
    steps = [p.step for p in MlflowClient(uri).get_metric_history(
        MlflowClient(uri).search_runs(["1"], "tags.trial = 'patch=frozen m=0.9 seed=0'")[0].info.run_id,
        "grad_norm_first_layer")]
    assert sorted(steps) == list(range(1, 31))  # the per-step series, every step once
    rep = build_report("vit-ablation", tmp_path / "patch", parent_run=parent, tracking_uri=uri)
    assert {p.name for p in rep.figures} == {"vit.png", "curves.png"}
    assert png_size(tmp_path / "patch" / "vit.png") == (1320, 462)

    versions = {"v1 convnet seed=0": {"moco.version": "v1", "model.backbone": "convnet", "model.head": "linear",
                                      "vit.patch_size": 0, "vit.depth": 0, "augment.preset": "mocov1"},
                "v3 vit_tiny seed=0": {}}
    parent = _fill(uri, "versions", [], recipes=versions, preset="vit-quick")
    rep = build_report("versions", tmp_path / "versions", parent_run=parent, tracking_uri=uri)
    assert {p.name for p in rep.figures} == {"versions.png", "curves.png"}


def test_negatives_report_reads_the_middle_epochs_drift_probes(tmp_path):
    """A negatives sweep (sources and queue policies vary): the report draws negatives.png, not the momentum
    curve, from each trial's per-epoch diagnostics artifacts, and the table's drift is the middle epoch's."""
    from mocolab.analysis.negatives_plots import negatives_drift
    from mocolab.tracking import Store

    uri = mlflow_store(tmp_path)
    recipes = {"in batch": {"moco.negatives": "in_batch"}, "memory bank": {"moco.negatives": "memory_bank"},
               "queue fifo m=0.5": {"moco.m": 0.5}, "queue random m=0.99": {"queue.policy": "random"}}
    parent = _fill(uri, "negatives-ablation", [], recipes=recipes)
    store = Store(uri)
    for run in store.runs(store.experiment_id("negatives-ablation"), parent_run_id=parent):
        if run.data.params["moco.negatives"] == "in_batch":
            continue
        log = MetricsLogger(uri, run.info.run_id)
        for epoch, cos in ((1, 0.9), (2, 0.5), (3, 0.99)):  # epoch 2, the middle, is the one to read
            log.log_dict({"step": 10 * epoch, "age_histogram": {"edges": [0, 4, 8], "counts": [3, 5]},
                          "probes": {"age": [1.0, 8.0], "drift_cos": [cos, cos - 0.1], "stored_cos": [0.8, 0.7]}},
                         f"negatives/epoch_{epoch:04d}.json")
    df = trials_frame(store.runs(store.experiment_id("negatives-ablation"), parent_run_id=parent))
    table, drift, epoch = negatives_drift(store, df)
    assert epoch == "2" and set(drift) == {"memory bank", "queue fifo m=0.5", "queue random m=0.99"}
    assert list(table["setting"]) == ["in batch", "memory bank", "queue fifo m=0.5", "queue random m=0.99"]
    assert table["drift_cos"].tolist() == pytest.approx([1.0, 0.45, 0.45, 0.45])
    rep = build_report("negatives-ablation", tmp_path / "out", parent_run=parent, tracking_uri=uri)
    assert {p.name for p in rep.figures} == {"negatives.png", "curves.png"} and len(df) == 4
    assert png_size(tmp_path / "out" / "negatives.png") == (1430, 506)


def test_a_runs_dictionary_plot_draws_ages_and_drift_per_epoch(tmp_path):
    from mocolab.analysis import dictionary_plot

    drift = {e: ([1.0, 2.0, 3.0, 4.0], [1.0, 0.9 - 0.01 * e, 0.8, 0.7]) for e in range(1, 10)}
    path = dictionary_plot({"age_histogram": {"edges": [0, 2, 4], "counts": [2, 2]}}, drift,
                           tmp_path / "d.png", "queue", fifo_bound=4)
    assert png_size(path) == (1320, 462)


def _leaderboard_store(uri: str) -> dict[str, str]:
    """Two studies' trials, a transfer test of one of them, and the baselines of two settings, logged by
    mocolab's own code: which baseline stands beside which encoder depends on how each was scored."""
    from mocolab.repro.baseline_runs import KIND_TAG, SET_TAG
    from mocolab.tracking import Store
    from mocolab.evaluation.transfer import SOURCE_EXPERIMENT_TAG, SOURCE_RUN_TAG

    _fill(uri, "momentum-ablation", [(m, 0, "finished") for m in (0.9, 0.99)] + [(0.0, 0, "diverged")])
    _fill(uri, "queue-ablation", [(0.999, 0, "finished")])
    client = MlflowClient(uri)
    runs = {r.data.tags["trial"] + " " + e: r for e in ("momentum-ablation", "queue-ablation")
            for r in client.search_runs([client.get_experiment_by_name(e).experiment_id]) if "trial" in r.data.tags}
    store = Store(uri)
    for name, overrides, kind, linear in (("smoke", {}, "random-init", 0.70), ("smoke", {}, "raw-pixels", 0.74),
                                          ("other", {"eval.knn_k": 20}, "random-init", 0.10)):
        cfg = build_config("smoke", overrides)
        exp = store.experiment_id("baselines", create=True)
        run = client.create_run(exp, tags={KIND_TAG: kind, SET_TAG: name, "mocolab.status": "finished"})
        store.log_params(run.info.run_id, cfg.flatten())
        client.log_metric(run.info.run_id, "linear_top1", linear)
        client.log_metric(run.info.run_id, "knn_top1", linear - 0.1)
        client.set_terminated(run.info.run_id, "FINISHED")
    source = runs["m=0.99 seed=0 momentum-ablation"]
    cfg = build_config("smoke", {"data.name": "synthetic"})
    tracker = RunTracker(uri, "transfer")
    rid, _ = tracker.start(RunManifest.of(cfg.replace(**{"run.name": "eval"})), tags={
        SOURCE_RUN_TAG: source.info.run_id, SOURCE_EXPERIMENT_TAG: "momentum-ablation"})
    MetricsLogger(uri, rid).log_final({"linear_top1": 0.5, "knn_top1": 0.4}, 1)
    tracker.finish()
    return {"best": runs["m=0.999 seed=0 queue-ablation"].info.run_id, "source": source.info.run_id,
            "diverged": runs["m=0 seed=0 momentum-ablation"].info.run_id, "eval": rid}


def test_leaderboard_ranks_encoders_across_experiments_beside_their_baselines(tmp_path):
    from mocolab.evaluation.leaderboard import build_leaderboard, write_leaderboard

    uri = mlflow_store(tmp_path)
    ids = _leaderboard_store(uri)
    board = build_leaderboard(tracking_uri=uri)
    fm = board.table[board.table["data_name"] == "fashion-mnist"]
    # the best first, across both studies; the diverged trial is no encoder
    assert list(fm["run_id"])[0] == ids["best"] and ids["diverged"] not in set(board.table["run_id"])
    assert list(fm["rank"]) == [1, 2, 3] and list(fm["experiment"]) == ["queue-ablation", "momentum-ablation",
                                                                      "momentum-ablation"]
    assert fm["score"].is_monotonic_decreasing
    # the baselines scored as they were (the smoke set), not the set scored with another kNN k
    assert (fm["random_init"].tolist() == pytest.approx([0.70] * 3)
            and fm["raw_pixels"].tolist() == pytest.approx([0.74] * 3))
    assert fm["delta"].tolist() == pytest.approx((fm["score"] - 0.70).tolist())
    # the transfer test ranks on its own data, and names the run its encoder came from
    syn = board.table[board.table["data_name"] == "synthetic"]
    assert list(syn["run_id"]) == [ids["eval"]] and list(syn["source_run"]) == [ids["source"]]
    assert syn["random_init"].isna().all()  # no baseline was scored on synthetic data
    text = board.text()
    assert "fashion-mnist" in text and "synthetic" in text and f"{ids['source'][:8]} (momentum-ablation)" in text
    assert "baseline random-init 'other'" in text  # listed under its data set, not beside any encoder
    page = write_leaderboard(board, tmp_path / "lb")
    assert ids["best"] in page.read_text() and (tmp_path / "lb" / "leaderboard.csv").is_file()
    by_knn = build_leaderboard("knn_top1", top=1, experiment="momentum-ablation", tracking_uri=uri)
    assert list(by_knn.table["run_id"]) == [ids["source"]]


def test_leaderboard_command_line(tmp_path, capsys):
    from mocolab.cli.commands import main

    uri = mlflow_store(tmp_path)
    assert main(["report", "--leaderboard", "--tracking-uri", uri]) == 1  # an empty store: no encoder yet
    assert "no finished run with linear_top1" in capsys.readouterr().out
    ids = _leaderboard_store(uri)
    assert main(["report", "--leaderboard", "--out", str(tmp_path / "lb"), "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert ids["best"][:8] in out and f"leaderboard: {tmp_path / 'lb' / 'leaderboard.html'}" in out
    with pytest.raises(SystemExit) as bad_choice:  # argparse refuses it, with status 2 as every bad input
        main(["report", "--leaderboard", "--metric", "loss", "--tracking-uri", uri])
    assert bad_choice.value.code == 2 and "invalid choice: 'loss'" in capsys.readouterr().err
    for argv, message in ((["--top", "0"], "--top: 0 is out of range; allowed [1, inf]"),
                          (["--experiment", "nope"], "no experiment 'nope'"),
                          (["--watch"], "--watch applies to one sweep's report")):
        assert main(["report", "--leaderboard", *argv, "--tracking-uri", uri]) == 2
        assert message in capsys.readouterr().err
    assert main(["report", "--out", str(tmp_path / "x"), "--tracking-uri", uri]) == 2
    assert "--experiment required (or --leaderboard" in capsys.readouterr().err
    for seconds in ("0", "-5"):  # the interval is --watch's own value, as in the studies
        assert main(["report", "--experiment", "e", "--out", str(tmp_path / "x"), "--watch", seconds,
                     "--tracking-uri", uri]) == 2
        assert f"--watch: {seconds} is out of range; allowed [1, 86400]" in capsys.readouterr().err

