"""Sweeps: Train inside Tune, MLflow parent/child runs, resume after a stop, diverged trials, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import mlflow_store, run_concurrently
from mlflow.tracking import MlflowClient

from mocolab.data.sets import fashion_mnist_dir
from mocolab.training.baselines import Baseline
from mocolab.tune import Launch, Sweep, Trial, run_sweep
from mocolab.analysis import summarise
from mocolab.tracking import trials_frame

REPO = Path(__file__).resolve().parents[2]
needs_fmnist = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")

TINY = {"data.subset": 1024, "eval.knn_bank": 1024, "eval.knn_test": 500, "eval.linear_train": 1024,
        "eval.linear_steps": 20, "optim.max_steps": 10, "queue.size": 512,
        "run.log_models": False}  # no trial here is about its MLflow models but the --register one


def _sweep(tmp_path: Path, trials: list[Trial], name: str = "s1", **kw) -> tuple[Sweep, Launch]:
    """A sweep of ``trials`` and its launch (``kw``: Launch fields), each trial in its own process (no workers:
    what is tested here is the sweep)."""
    kw.setdefault("workers_per_trial", 0)
    return (Sweep(study="test-sweeps", name=name, preset="smoke", description="test sweep",
                  base_overrides=dict(TINY), trials=trials),
            Launch(tracking_uri=mlflow_store(tmp_path), storage=str(tmp_path / "sweeps"), **kw))


def _children(uri: str, parent_id: str):
    c = MlflowClient(uri)
    run = c.get_run(parent_id)
    return c.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")


def _report_queues() -> int:
    """How many of Tune's report queues (one actor process each) this Ray has started: its actor table, as
    the state API needs the dashboard."""
    import ray

    return sum(a.get("ActorClassName", "").endswith("_QueueActor") for a in ray._private.state.actors().values())


@pytest.mark.slow
@needs_fmnist
def test_sweep_stopped_after_first_trial_resumes_without_rerunning(tmp_path, ray_session):
    trials = [Trial("m=0.9 seed=0", {"moco.m": 0.9}), Trial("m=0.99 seed=0", {"moco.m": 0.99})]
    sweep, launch = _sweep(tmp_path, trials, max_concurrent=1, stop_after=1)
    queues = _report_queues()
    parent, _ = run_sweep(sweep, launch, progress=lambda _m: None)
    assert _report_queues() == queues  # a W = 0 trial reports to Tune itself: no queue actor for Train's callback
    first = _children(parent.uri, parent.run_id)
    assert [r.data.tags["trial"] for r in first] == ["m=0.9 seed=0"]
    assert first[0].info.status == "FINISHED"
    first_end = first[0].info.end_time

    again, _ = run_sweep(*_sweep(tmp_path, trials, max_concurrent=1), progress=lambda _m: None)
    assert again.run_id == parent.run_id and again.resumed  # one parent, found again
    kids = _children(parent.uri, parent.run_id)
    assert sorted(r.data.tags["trial"] for r in kids) == ["m=0.9 seed=0", "m=0.99 seed=0"]  # no duplicate
    done = {r.data.tags["trial"]: r for r in kids}
    assert done["m=0.9 seed=0"].info.end_time == first_end  # not run again
    assert all(r.info.status == "FINISHED" for r in kids)
    df = trials_frame(kids)
    assert set(df["params.moco.m"]) == {0.9, 0.99} and df["linear_top1"].notna().all()
    table = summarise(df, "moco.m")
    assert list(table["moco.m"]) == [0.9, 0.99] and (table["status"] == "finished").all()
    # children are named by what varies, and carry the config as params
    assert {r.info.run_name for r in kids} == {"m=0.9 seed=0", "m=0.99 seed=0"}


@pytest.mark.slow
@needs_fmnist
def test_diverged_trial_is_recorded_and_the_sweep_goes_on(tmp_path, ray_session):
    trials = [Trial("boom", {"optim.lr": 1e6, "optim.schedule": "constant", "moco.tau": 0.01}),
              Trial("fine", {})]
    parent, _ = run_sweep(*_sweep(tmp_path, trials, name="div"), progress=lambda _m: None)
    kids = {r.data.tags["trial"]: r for r in _children(parent.uri, parent.run_id)}
    assert kids["boom"].data.tags["mocolab.status"] == "diverged"
    assert "linear_top1" not in kids["boom"].data.metrics and "final_loss" in kids["boom"].data.metrics
    assert kids["fine"].data.tags["mocolab.status"] == "finished" and kids["fine"].data.metrics["linear_top1"] > 0.3
    df = trials_frame(kids.values())
    assert set(df["status"]) == {"diverged", "finished"}


@pytest.mark.parametrize("cluster, asked, expected", [
    (2, {}, (2, 0.95, 1)),  # the default: two 1-thread trials on two cores
    (2, {"max_concurrent": 1}, (1, 1.95, 2)),  # one trial: its worker computes on both cores
    (2, {"cpus_per_worker": 2}, (1, 1.95, 2)),  # 2 + the driver's 0.05 would never fit: a sliver less
    (2, {"cpus_per_worker": 2, "max_concurrent": 1}, (1, 1.95, 2)),
    (2, {"cpus_per_worker": 1, "max_concurrent": 1}, (1, 1, 1)),  # one trial fits with its driver: as asked
    (2, {"cpus_per_worker": 1, "max_concurrent": 2}, (2, 0.95, 1)),
    (4, {"cpus_per_worker": 2}, (2, 1.95, 2)),  # ... and the slivers never cost a whole trial
    (2, {"cpus_per_worker": 1, "workers_per_trial": 2}, (1, 0.97, 1)),
    (2, {"cpus_per_worker": 1.5}, (1, 1.5, 1)),  # fits with its driver: as asked
    (2, {"cpus_per_worker": 3}, (1, 3, 3)),  # can never fit: left for check_placement to refuse
    (2, {"cpus_per_worker": 2, "workers_per_trial": 0}, (1, 2, 2)),  # local mode: no driver beside a worker
])
def test_trial_drivers_never_cost_a_whole_trial_or_a_thread(cluster, asked, expected):
    """What a sweep asks Ray for and how many threads its workers compute on, from the cluster's CPUs."""
    from mocolab.training.resources import threads_for
    from mocolab.tune.sweep import resolve_resources

    conc, cpus = resolve_resources(Launch(**asked), cluster)
    assert (conc, cpus, threads_for(cpus)) == expected


# Four seeds whose encoders differ by several points (a seed effect every arm shares), and arms that differ by
# about a point in every seed: paired across seeds the difference is plain, as two independent samples it is not.
SEED_EFFECT = (0.0, 3.0, -2.0, 5.0)
ARMS = {0.0: -10.0, 0.9: -1.0, 0.999: 0.0}  # points from m = 0.999 in every seed (m = 0.9: ± 0.1 of noise)
NOISE = (0.1, -0.1, 0.0, 0.05)
INIT_ABOVE = 2.0  # the random-init encoder of a seed: 2 points above its m = 0.999 trial (m = 0: 12 below it)


def _momentum_trials(seeds: int = 4) -> pd.DataFrame:
    """A momentum study's trials table as MLflow gives it: fractions, one finished trial per (m, seed)."""
    rows = []
    for m, offset in ARMS.items():
        for s in range(seeds):
            linear = (80.0 + SEED_EFFECT[s] + offset + (NOISE[s] if m == 0.9 else 0.0)) / 100
            rows.append({"label": f"m={m:g} seed={s}", "status": "finished", "run_id": f"r{m:g}{s}",
                         "params.moco.m": m, "params.run.seed": s, "linear_top1": linear, "knn_top1": linear - 0.1,
                         "final_loss": 7.0, "ema_half_life": 1.0, "max_staleness_bound": 64.0})
    return pd.DataFrame(rows)


def _momentum_baselines(seeds: int = 4) -> list[Baseline]:
    init = [Baseline("random-init", s, (70.0 + SEED_EFFECT[s]) / 100, (80.0 + SEED_EFFECT[s] + INIT_ABOVE) / 100)
            for s in range(seeds)]
    return init + [Baseline("raw-pixels", None, 0.70, 0.81)]


def _momentum_report(tmp_path: Path, monkeypatch, argv: list[str], baselines: list[Baseline]):
    """The momentum study's own report function, as run_study would call it, with the given baselines."""
    from mocolab.tune import study
    from mocolab.tune.studies import momentum

    held = {}
    monkeypatch.setattr(study, "run_study", lambda sweep, launch, report: held.update(report=report) or 0)
    monkeypatch.setattr(momentum, "random_init", lambda sweep, seeds, tracking_uri: (baselines, ""))
    assert momentum.main(["--preset", "smoke", "--storage", str(tmp_path), *argv]) == 0
    return held["report"]


def test_momentum_study_report_pairs_seeds_and_shows_the_random_init_encoder(tmp_path, monkeypatch):
    """The study's closing table is the reproduction's analysis: each m against m = 0.999 by a paired t-test
    across seeds, Holm-corrected, and each m beside the random-init encoder of its seed; the plot draws that
    encoder as a labelled band (its 95 % interval over seeds) and the raw pixels as a line."""
    from scipy import stats

    from mocolab.analysis import momentum_plots
    from mocolab.analysis.stats import interval

    drawn = {}
    keep = momentum_plots.save_figure

    def save(fig, path):
        ax = fig.axes[0]
        drawn["labels"] = [t.get_text() for t in ax.get_legend().get_texts()]
        drawn["bands"] = {p.get_label(): p.get_patch_transform().transform(p.get_path().vertices)[:, 1]
                          for p in ax.patches if p.get_label().startswith("random-init")}
        return keep(fig, path)

    monkeypatch.setattr(momentum_plots, "save_figure", save)
    trials = _momentum_trials()
    report = _momentum_report(tmp_path, monkeypatch, ["--momenta", "0,0.9,0.999", "--seeds", "4"],
                              _momentum_baselines())
    text, figure, table = report(tmp_path, trials)
    lines = text.splitlines()

    # m = 0.9 is a point below m = 0.999 in every seed: Welch's test on the two columns cannot tell, the pairs can
    lin = {m: [100 * v for v in trials.loc[trials["params.moco.m"] == m, "linear_top1"]] for m in ARMS}
    assert stats.ttest_ind(lin[0.9], lin[0.999], equal_var=False).pvalue > 0.5
    paired_line = next(line for line in lines if line.strip().startswith("m=0.9 − m=0.999"))
    assert "4 seeds" in paired_line and paired_line.endswith("m=0.9 < m=0.999"), paired_line
    p = stats.ttest_rel(lin[0.9], lin[0.999]).pvalue
    assert p < 0.001 and "p < 0.001" in paired_line
    assert "Holm p < 0.001" in paired_line  # two comparisons in the family: 2p is still below 0.001
    assert "each m against m=0.999, the paper's m (a family of 2):" in text
    assert "Welch" not in text
    # the random-init encoder: its row (mean ± std over the seeds), its interval, and each arm against it
    init = interval([80.0 + e + INIT_ABOVE for e in SEED_EFFECT])
    row = next(line for line in lines if line.strip().startswith("random-init "))
    assert row.split()[1] == "4" and f"{init.mean:.2f} ± {init.std:.2f}" in row and "baseline" in row
    assert f"linear {init.mean:.2f} [{init.low:.2f}, {init.high:.2f}]" in text
    assert next(line for line in lines if line.strip().startswith("raw-pixels")).split()[1:3] == ["1", "81.00"]
    zero = next(line for line in lines if line.strip().startswith("m=0 − random-init"))
    assert "Δ -12.00" in zero and zero.endswith("m=0 < random-init"), zero  # m = 0 learned nothing: it lost
    assert "(the baseline check, a family of 3)" in text
    assert table.set_index("moco.m").loc[0.0, "linear_vs_init"] == pytest.approx(-12.0)
    # the plot: a band per probe over the random-init encoder's 95 % interval, labelled, and the pixels' line
    assert figure == tmp_path / "momentum.png" and figure.is_file()
    assert {"random-init encoder, linear (95 % CI, 4 seeds)", "random-init encoder, kNN (95 % CI, 4 seeds)",
            "raw pixels, linear probe"} <= set(drawn["labels"])
    band = drawn["bands"]["random-init encoder, linear (95 % CI, 4 seeds)"]
    assert (band.min(), band.max()) == (pytest.approx(init.low), pytest.approx(init.high))


def test_momentum_study_report_says_what_one_seed_cannot_test(tmp_path, monkeypatch):
    report = _momentum_report(tmp_path, monkeypatch, ["--momenta", "0,0.9,0.999"], _momentum_baselines(1))
    text, _, _ = report(tmp_path, _momentum_trials(1))
    assert "Paired t-tests across seeds need two seeds or more of an arm (--seeds 2); none here." in text
    assert "linear 82.00, kNN 70.00 (1 seed)." in text  # the random-init encoder of the one seed, no interval
    report = _momentum_report(tmp_path, monkeypatch, ["--momenta", "0,0.9,0.999", "--seeds", "4", "--no-baselines"],
                              _momentum_baselines())
    text, _, _ = report(tmp_path, _momentum_trials())
    assert "The random-init encoder was not measured (--no-baselines)" in text
    assert not [line for line in text.splitlines() if line.strip().startswith(("random-init", "raw-pixels"))]
    assert "m=0.9 < m=0.999" in text


def _study_call(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[list[str], dict]:
    """(argv, subprocess.run arguments) of a smoke study writing under tmp_path; never a user's cluster."""
    e = {**os.environ, **(env or {})}
    e.pop("RAY_ADDRESS", None) if "RAY_ADDRESS" not in (env or {}) else None
    return ([sys.executable, str(REPO / "experiments/momentum_ablation.py"), "--preset", "smoke",
             "--tracking-uri", mlflow_store(tmp_path), "--storage", str(tmp_path / "sweeps"), *args],
            {"env": e, "cwd": tmp_path, "timeout": 300})


# What the study's arguments and config refuse: before Ray, MLflow or torch load (tune/spec.py), so the
# study's own main() in this process tells what its process would (tests/suite/test_layers.py holds the
# imports), at no interpreter's start each
BAD_ARGUMENTS = [
    (["--seeds", "0"], "--seeds: 0 is out of range; allowed [1, 1000]"),
    (["--momenta", ""], "--momenta: give at least one value of m in [0, 1)"),
    (["--momenta", "0.9,abc"], "--momenta: 'abc' is not a number"),
    (["--momenta", "0.9,1.5"], "moco.m: 1.5 is out of range"),
    (["--set", "moco.mm=0.9"], "unknown config key 'moco.mm'"),
]
# What the study finds unreachable: through a study process, as a user starts it (its environment is its own)
UNREACHABLE = [
    (["--tracking-uri", "http://127.0.0.1:9"], None, "does not answer"),
    ([], {"RAY_ADDRESS": "127.0.0.1:9"}, "the cluster does not answer"),
]


def _no_parent_run(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    if db.exists():
        client = MlflowClient(f"sqlite:///{db}")
        assert not client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert not (tmp_path / "sweeps").exists()


@pytest.mark.parametrize("args, message", BAD_ARGUMENTS)
def test_bad_arguments_fail_before_any_trial_and_leave_no_parent_run(tmp_path, monkeypatch, capsys, args, message):
    from mocolab.tune.studies.momentum import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    argv, _ = _study_call(tmp_path, *args)
    assert main(argv[2:]) == 2
    err = capsys.readouterr().err
    assert message in err, err[-2000:]
    _no_parent_run(tmp_path)


@pytest.fixture(scope="module")
def refused_studies(request, tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Every selected unreachable case, each study in its own folder, run at once: message -> (folder, result)."""
    cases = [c.values if hasattr(c, "values") else c for c in UNREACHABLE]
    selected = {item.callspec.params["message"] for item in request.session.items
                if item.originalname == "test_an_unreachable_store_or_cluster_fails_before_any_trial"}
    cases = [c for c in cases if c[2] in selected]
    folders = [tmp_path_factory.mktemp("refused") for _ in cases]
    calls = [_study_call(folder, *args, env=env) for folder, (args, env, _) in zip(folders, cases)]
    runs = run_concurrently([argv for argv, _ in calls], [own for _, own in calls])
    return {message: (folder, run) for folder, (_, _, message), run in zip(folders, cases, runs)}


@pytest.mark.parametrize("args, env, message", UNREACHABLE)
def test_an_unreachable_store_or_cluster_fails_before_any_trial(refused_studies, args, env, message):
    tmp_path, res = refused_studies[message]
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert message in res.stderr, res.stderr[-2000:]
    _no_parent_run(tmp_path)


# For the studies whose preset (cpu-quick, vit-quick) scores on all 10,000 test images and maps 2,000: the probe
# on the first 500, each arm's t-SNE map on 50, the fewest a map takes (2,000 points cost 13 CPU seconds an arm
# here, 50 half a second). What is checked is the study's table, artifacts and report, not its scores.
SCORED_ON_FEW = ["--set=eval.linear_test=500", "--set=eval.feature_map_images=50"]
# Studies here train in their trials' processes (W = 0): what they test is the study; Ray Train workers in a
# study are test_faults.py's SIGKILL study, test_storage.py's and the cluster tests'.
TINY_ARGS = [f"--set={k}={v}" for k, v in TINY.items() if k != "queue.size"] + ["--workers-per-trial", "0"]


def _study(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, str(REPO / "experiments" / script), "--preset", "smoke",
                           "--tracking-uri", mlflow_store(tmp_path),
                           "--storage", str(tmp_path / "sweeps"), *TINY_ARGS, *args],
                          capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)


def _parent_and_children(tmp_path: Path, experiment: str):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return client, parents, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


@pytest.mark.slow
@needs_fmnist
def test_queue_study_searches_with_optuna_and_asha(tmp_path):
    """A search tells the truth: a trial ASHA stops is a normal outcome (exit 0, said with its epoch), and a K
    sampled twice with one seed counts as one seed, not two.

    Both happen by construction, not by luck: 512 images leave two queue sizes (128, 256), so five samples
    repeat one; one trial at a time, and ASHA (a quarter kept) stops a trial whose epoch-1 kNN is below the
    75th percentile of the earlier ones, so the lower-scoring K is stopped as soon as it runs after the other
    (Optuna's seeded draws give both orders).
    """
    res = _study(tmp_path, "queue_ablation.py", "--samples", "5", "--max-concurrent", "1", "--set=data.subset=512",
                 "--set=queue.size=256",
                 "--set=eval.knn_bank=512", "--set=eval.linear_train=512")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    client, parents, children = _parent_and_children(tmp_path, "queue-ablation")
    assert len(parents) == 1 and len(children) == 5
    assert parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["mlflow.note.content"].startswith("Optuna search over K in [128, 256]")
    assert {int(r.data.params["queue.size"]) for r in children} == {128, 256}
    assert {a.path for a in client.list_artifacts(parents[0].info.run_id)} >= {"summary.csv", "queue.png"}
    assert "K" in res.stdout and "linear top-1 %" in res.stdout and "trials seeds" in res.stdout
    statuses = [r.data.tags["mocolab.status"] for r in children]
    assert set(statuses) == {"finished", "stopped_early"}, statuses
    for r in children:
        if r.data.tags["mocolab.status"] == "stopped_early":
            epoch = r.data.tags["mocolab.stopped_at_epoch"]
            assert r.info.status == "KILLED" and f"after epoch {epoch}" in res.stdout
    table = summarise(trials_frame(children), "queue.size")
    assert (table["seeds"] == 1).all() and table["trials"].sum() == 5
    assert (table["repeats"] == table["trials"] - 1).all() and table["repeats"].sum() == 3


@pytest.mark.slow
@needs_fmnist
def test_bn_study_logs_pretext_accuracy(tmp_path):
    """Also what a study prints by default (its own lines, not Ray's), --watch and --register (by a test-split
    metric, chosen with the warning that this is selection on the test split: the grid holds out no validation
    split, where the default metric would refuse it)."""
    res = _study(tmp_path, "augmentation_ablation.py", "--what", "bn", "--set=queue.size=512", "--watch", "2",
                 "--register", "bn-best", "--register-metric", "linear_top1", "--set=run.log_models=true")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    _check_console(res.stdout + res.stderr, ["bn=groups seed=0", "bn=plain seed=0", "bn=split seed=0"])
    live = tmp_path / "sweeps" / "augmentation-smoke-s0" / "report" / "report.html"
    assert f"live report: {live}" in res.stdout and live.exists() and "http-equiv" not in live.read_text()
    assert "Registered the best trial by linear_top1" in res.stdout
    assert "(chosen on the test split: its test scores are optimistic)" in res.stdout
    assert "warning: --register-metric linear_top1 picks the best trial by its test-split score" in res.stderr
    assert "bn=shuffle needs --workers-per-trial >= 2" in res.stdout
    client, parents, children = _parent_and_children(tmp_path, "augmentation-ablation")
    assert sorted(r.data.tags["trial"] for r in children) == ["bn=groups seed=0", "bn=plain seed=0",
                                                               "bn=split seed=0"]
    for r in children:
        history = client.get_metric_history(r.info.run_id, "pretext_acc")
        assert history and all(0.0 <= m.value <= 1.0 for m in history)
    assert "pretext %" in res.stdout
    scores = {r.info.run_id: r.data.metrics["linear_top1"] for r in children}
    version = client.get_registered_model("bn-best").latest_versions[0]
    assert scores[version.run_id] == max(scores.values())  # the best (the two may tie on 10 steps)


def _check_console(out: str, labels: list[str]) -> None:
    """One line per trial per epoch and a sweep line, each once; none of Ray's tables and worker logs."""
    for label in labels:
        epochs = [line for line in out.splitlines() if line.startswith(f"[{label}] epoch ")]
        assert [line.split()[3] for line in epochs] == ["1/4", "2/4"], epochs  # TINY: 10 steps = 2 epochs
        assert "img/s" in epochs[0] and "loss" in epochs[0]
        assert sum(line.startswith(f"[{label}] finished in ") for line in out.splitlines()) == 1
    assert f"sweep: {len(labels)}/{len(labels)} trials done, 0 running, 0 pending" in out
    for noise in ("RayTrainWorker", "Failed to query Ray Train Controller", "╭", "Trial status",
                  "Reporting training result", "View detailed results"):
        assert noise not in out, noise
    assert "--verbose prints it here too" in out


def test_sweep_lines_count_trials_and_estimate_what_is_left():
    """The lines a quiet sweep prints, fed as Tune feeds them (real Tune Trial records, stub trainables)."""
    from ray.tune.experiment import Trial as TuneTrial

    from mocolab.tune.progress import SweepProgress, fmt_duration

    said: list[str] = []
    lines = SweepProgress(total_trials=3, epochs=4, say=said.append, every_s=0.0)
    trials = [TuneTrial("t", config={"trial": {"label": f"m={m}"}}, trial_id=f"id{i}", stub=True)
              for i, m in enumerate((0.9, 0.99, 0.999))]
    for t in trials[:2]:
        t.set_status(TuneTrial.RUNNING)
        lines.on_trial_start(0, trials, t)
    assert lines.line(trials).startswith("sweep: 0/3 trials done, 2 running, 1 pending")
    assert lines.line(trials).endswith("ETA after the first epoch")
    lines.t0 -= 100  # 100 s in, both running trials half way: 1 of 3 trials' work done, 200 s to go
    for t in trials[:2]:
        lines.on_trial_result(0, trials, t, {"epoch": 2, "loss": 7.0, "knn_top1": 0.5, "images_per_s": 600.0})
    assert said[-4] == "[m=0.9] epoch 2/4  loss 7.0000  kNN 50.00%  600 img/s"
    assert said[-1].endswith("ETA 3m20s"), said[-1]
    lines.on_trial_result(0, trials, trials[0], {"final": 1.0, "status": "finished", "linear_top1": 0.8,
                                                 "knn_top1": 0.7})
    lines.on_trial_result(0, trials, trials[0], {"final": 1.0, "steps": 12.0, "linear_top1": 0.8})  # Train's own
    lines.on_trial_complete(0, trials, trials[0])
    assert said[-2].startswith("[m=0.9] finished in ") and said[-2].endswith("linear top-1 80.00%, kNN top-1 70.00%")
    assert said[-1].startswith("sweep: 1/3 trials done, 1 running, 1 pending")
    lines.on_trial_result(0, trials, trials[1], {"epoch": 4, "loss": 6.0, "images_per_s": 600.0})
    assert "kNN (at the end)" in said[-2] and "ETA" in said[-1]  # its last epoch logged: evaluating, not done
    lines.on_trial_result(0, trials, trials[2], {"epoch": 1, "loss": 8.0, "val_knn_top1": 0.75, "images_per_s": 600.0})
    assert "[m=0.999] epoch 1/4  loss 8.0000  val kNN 75.00%  600 img/s" in said  # data.val_size: the monitor's split
    assert [fmt_duration(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m"]


def test_vit_study_recipes_are_valid_configs():
    """--compare-versions' recipes over vit-quick build, and say what they are (a fast check of the script's data)."""
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        from vit_ablation import RECIPES
    finally:
        sys.path.pop(0)
    from mocolab.config import build_config

    got = {name: build_config("vit-quick", ov) for name, ov in RECIPES.items()}
    assert [(c.moco.version, c.model.backbone, c.model.head, c.optim.name) for c in got.values()] == [
        ("v1", "convnet", "linear", "sgd"), ("v2", "convnet", "mlp", "sgd"), ("v3", "convnet", "mlp-bn", "lars"),
        ("v3", "vit_tiny", "mlp3-bn", "adamw")]
    assert {c.optim.batch_size for c in got.values()} == {256} and {c.data.subset for c in got.values()} == {10_000}


def test_negatives_study_settings_are_valid_configs():
    """The negatives ablation's settings over cpu-quick build, each what its name says (a fast check)."""
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        from negatives_ablation import settings
    finally:
        sys.path.pop(0)
    from mocolab.analysis.negatives_plots import negatives_setting
    from mocolab.config import build_config

    got = {name: build_config("cpu-quick", ov) for name, ov in settings([0.5, 0.999]).items()}
    assert list(got) == ["in batch", "memory bank", "queue fifo m=0.5", "queue fifo m=0.999", "queue random m=0.999"]
    assert {c.optim.batch_size for c in got.values()} == {256} and got["memory bank"].bank_negatives == 16384
    from mocolab.tune.studies.negatives import catalogue

    every = {name: build_config("cpu-quick", ov) for name, ov in catalogue([0.5, 0.999]).items()}
    assert {"queue fifo symmetric m=0.999", "batch keys m=0.5"} <= set(every) and set(got) <= set(every)
    for name, cfg in every.items():  # the report's label for a trial is the setting it was run as
        assert negatives_setting(cfg.moco.negatives, cfg.queue.policy, cfg.moco.m, cfg.moco.symmetric) == name


def test_the_negatives_table_orders_every_setting_the_study_can_run():
    """The control study's settings (batch keys, the symmetric queue, in batch) reach the table under their own
    names, in-batch and bank first, then by source and m; a setting's runs are not pooled with another's."""
    from mocolab.analysis.negatives_plots import negatives_table

    rows = [("queue", "fifo", 0.999, "True"), ("batch_keys", "fifo", 0.999, "False"), ("in_batch", "fifo", 0.999, ""),
            ("queue", "fifo", 0.999, "False"), ("batch_keys", "fifo", 0.99, "False"), ("queue", "random", 0.99, "")]
    df = pd.DataFrame([{"params.moco.negatives": n, "params.queue.policy": p, "params.moco.m": m,
                        "params.moco.symmetric": b, "status": "finished", "linear_top1": 0.8 + i / 100,
                        "knn_top1": 0.7, "params.run.seed": 0, "final_loss": 6.0, "ema_half_life": 693.0,
                        "max_staleness_bound": 64.0} for i, (n, p, m, b) in enumerate(rows)])
    table = negatives_table(df)
    assert list(table["setting"]) == ["in batch", "batch keys m=0.99", "batch keys m=0.999", "queue fifo m=0.999",
                                      "queue fifo symmetric m=0.999", "queue random m=0.99"]
    assert table.set_index("setting").loc["queue fifo symmetric m=0.999", "linear_top1_mean"] == pytest.approx(80.0)


@pytest.mark.slow
@needs_fmnist
def test_negatives_study_reports_ages_drift_and_accuracy_per_source(tmp_path):
    """The script end to end on tiny settings: every source's trial, the table with ages and drift, the plot,
    the per-epoch diagnostics artifacts of every stored dictionary."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    tiny = ["--set=data.subset=1024", "--set=eval.knn_bank=512", "--set=eval.knn_test=256",
            "--set=eval.linear_train=512", "--set=eval.linear_steps=10", "--set=optim.epochs=2",
            "--set=optim.batch_size=64", "--set=queue.size=256", "--set=eval.drift_probes=32", *SCORED_ON_FEW]
    res = subprocess.run([sys.executable, str(REPO / "experiments" / "negatives_ablation.py"),
                          "--tracking-uri", mlflow_store(tmp_path), "--storage", str(tmp_path / "sweeps"),
                          "--momenta", "0.5", "--workers-per-trial", "0", *tiny],
                         capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    client, parents, children = _parent_and_children(tmp_path, "negatives-ablation")
    assert sorted(r.data.tags["trial"] for r in children) == [
        "in batch seed=0", "memory bank seed=0", "queue fifo m=0.5 seed=0", "queue random m=0.999 seed=0"]
    settings = ("in batch", "memory bank", "queue fifo m=0.5", "queue random m=0.999")
    rows = {name: line.strip()[len(name):].split() for line in res.stdout.splitlines() for name in settings
            if line.strip().startswith(name + " ")}  # linear, kNN, age mean, age max, drift, entry, status
    assert set(rows) == set(settings), res.stdout[-3000:]
    assert float(rows["queue fifo m=0.5"][3]) == 256 / 64  # age max: FIFO's K/(B·W)
    assert float(rows["queue random m=0.999"][3]) > 256 / 64  # random replacement keeps keys longer
    assert float(rows["memory bank"][3]) > 256 / 64  # a bank's entries are up to an epoch old
    assert float(rows["in batch"][3]) == 0 and float(rows["in batch"][4]) == 1.0  # fresh by construction
    assert all(0 < float(row[4]) <= 1.0 for row in rows.values())
    for r in children:
        arts = {a.path for a in client.list_artifacts(r.info.run_id, "negatives")}
        if r.data.tags["trial"].startswith("in batch"):
            assert "negatives/dictionary.png" not in arts  # nothing stored: no ages to draw
        else:
            assert {"negatives/epoch_0001.json", "negatives/epoch_0002.json", "negatives/dictionary.png"} <= arts
    assert {a.path for a in client.list_artifacts(parents[0].info.run_id)} >= {"summary.csv", "negatives.png"}
    report = tmp_path / "sweeps" / "negatives-cpu-quick-s0" / "report"
    # no momentum curve; the online probe's curves and the arms' feature maps
    assert sorted(p.name for p in report.glob("*.png")) == ["curves.png", "feature_maps.png", "negatives.png",
                                                            "online_probe.png"]


@pytest.mark.slow
@needs_fmnist
def test_vit_study_reports_accuracy_and_the_first_layer_gradient(tmp_path):
    """The script end to end on tiny settings (--compare-versions: its recipes above, its report figure in
    test_report.py; a run of it costs another 90 s here)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    tiny = ["--set=data.subset=1024", "--set=eval.knn_bank=1024", "--set=eval.knn_test=500",
            "--set=eval.linear_train=1024", "--set=eval.linear_steps=10", "--set=optim.max_steps=8",
            "--set=optim.batch_size=128", "--set=queue.size=512", "--set=vit.depth=1", "--set=optim.warmup_epochs=0",
            *SCORED_ON_FEW]

    def study(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "experiments" / "vit_ablation.py"),
                               "--tracking-uri", mlflow_store(tmp_path),
                               "--storage", str(tmp_path / "sweeps"), "--workers-per-trial", "0", *tiny, *args],
                              capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)

    res = study("--momenta", "0.99")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    client, parents, children = _parent_and_children(tmp_path, "vit-ablation")
    assert sorted(r.data.tags["trial"] for r in children) == ["patch=frozen m=0.99 seed=0",
                                                              "patch=trained m=0.99 seed=0"]
    for r in children:  # every step's gradient norm, frozen or not
        assert len(client.get_metric_history(r.info.run_id, "grad_norm_first_layer")) == 8
    rows = [line.split() for line in res.stdout.splitlines() if line.split()[:2] in (["frozen", "0.99"],
                                                                                   ["trained", "0.99"])]
    assert len(rows) == 2 and all(float(row[-3]) > 0 for row in rows), res.stdout[-2000:]  # ‖g₁‖ max
    assert {a.path for a in client.list_artifacts(parents[0].info.run_id)} >= {"summary.csv", "vit.png"}
    report = tmp_path / "sweeps" / "patch-vit-quick-s0" / "report"
    # not the v1 paper's curve; the online probe's curves and the arms' feature maps
    assert sorted(p.name for p in report.glob("*.png")) == ["curves.png", "feature_maps.png", "online_probe.png",
                                                            "vit.png"]



@pytest.mark.slow
@needs_fmnist
def test_momentum_study_measures_the_random_init_encoder_once_and_reads_it_back(tmp_path, capsys):
    """The baselines beside the table: the encoder of each seed before training and the raw pixels, scored
    with the sweep's own settings, logged in the set named as the sweep; the study's next report reads them."""
    from mocolab.tune.studies.momentum import random_init

    sweep = Sweep(study="momentum-ablation", name="m-tiny", preset="smoke", description="test",
                  base_overrides={**TINY, "eval.linear_test": 500})
    uri = mlflow_store(tmp_path)
    first, note = random_init(sweep, [0], uri)
    assert note == "" and [(b.kind, b.seed) for b in first] == [("random-init", 0), ("raw-pixels", None)]
    assert all(0.1 < b.linear_top1 < 1 and 0.1 < b.knn_top1 < 1 for b in first)
    assert "measuring random-init and raw-pixels" in capsys.readouterr().out
    again, _ = random_init(sweep, [0], uri)
    assert again == first and "measuring" not in capsys.readouterr().out  # logged before: read, not measured
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("baselines").experiment_id])
    assert sorted(r.data.tags["mocolab.baseline_set"] for r in runs) == ["m-tiny"] * 2
    # the same name scored otherwise (another kNN k) is not this sweep's: the table goes on without it, saying why
    other = Sweep(**{**sweep.__dict__, "base_overrides": {**sweep.base_overrides, "eval.knn_k": 5}})
    none, note = random_init(other, [0], uri)
    assert none == [] and "m-tiny" in note
