"""A sweep's launch fields (run.num_workers, run.cpus_per_worker, run.gpus_per_worker, run.experiment,
run.output_dir, run.name) given by --set or --config: used, or refused naming the flag that sets them, at the
door (no Ray, no MLflow); a GPU per rank at most; ASHA only on a search; the no-GPU refusal's advice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mocolab.cli.commands import main
from mocolab.training.resources import RUN_NO_GPU, check_placement
from mocolab.config.launch_fields import LAUNCH_SETTINGS
from mocolab.tune.spec import NO_GPU, Launch, Sweep, Trial, check_sweep, trial_overrides

GRID = ["sweep", "--grid", "moco.m=0.9,0.99", "--preset", "smoke", "--set", "data.name=synthetic"]
MOMENTUM = ["study", "momentum", "--preset", "smoke", "--set", "data.name=synthetic"]


class _Accepted(Exception):
    """Raised in place of running the sweep: the sweep and launch the command would run."""


@pytest.fixture
def accepted(monkeypatch, tmp_path):
    """Runs a command up to the point where its sweep would start; returns (exit status, sweep, launch, stderr)
    (sweep and launch None where it was refused)."""
    import mocolab.tune.study

    def stop(sweep, launch, _report):
        raise _Accepted(sweep, launch)

    monkeypatch.setattr(mocolab.tune.study, "run_study", stop)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MOCOLAB_STORAGE", raising=False)

    def run(argv: list[str], capsys) -> tuple[int, Sweep | None, Launch | None, str]:
        try:
            code = main(argv)
        except _Accepted as ok:
            return 0, *ok.args, capsys.readouterr().err
        return code, None, None, capsys.readouterr().err

    return run


def _config_file(tmp_path: Path, fields: dict) -> str:
    raw: dict = {}
    for key, value in fields.items():
        section, name = key.split(".")
        raw.setdefault(section, {})[name] = value
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


# (field, a value of the user's, where the launch carries it)
USED = [("run.num_workers", 2, lambda s, la: la.workers_per_trial),
        ("run.cpus_per_worker", 0.5, lambda s, la: la.cpus_per_worker),
        ("run.gpus_per_worker", 0.5, lambda s, la: la.gpus_per_worker),
        ("run.experiment", "mine", lambda s, la: s.study)]


@pytest.mark.parametrize("key, value, carried", USED, ids=[u[0] for u in USED])
@pytest.mark.parametrize("source", ["--set", "--config"])
@pytest.mark.parametrize("command", ["sweep", "study"])
def test_a_launch_field_given_without_its_flag_is_used(accepted, capsys, tmp_path, key, value, carried, source,
                                                       command):
    """A study has no --experiment: there run.experiment names the study's MLflow experiment."""
    given = ["--set", f"{key}={value}"] if source == "--set" else ["--config", _config_file(tmp_path, {key: value})]
    code, sweep, launch, err = accepted([*(GRID if command == "sweep" else MOMENTUM), *given], capsys)
    assert code == 0, err
    assert carried(sweep, launch) == value
    first = {"trial": {"label": sweep.trials[0].label, "overrides": sweep.trials[0].overrides}}
    _, over = trial_overrides(sweep, launch, launch.place(sweep.name), first, launch.cpus_per_worker or 1.0)
    assert over[key] == value  # what each trial's run is configured with


FLAG = {"run.num_workers": ("--workers-per-trial", "0", "2"), "run.cpus_per_worker": ("--cpus-per-worker", "0.5", "1"),
        "run.gpus_per_worker": ("--gpus-per-worker", "0.5", "1"), "run.experiment": ("--experiment", "mine", "other")}


@pytest.mark.parametrize("key", list(FLAG))
def test_a_flag_and_a_set_value_agree_or_the_command_stops_naming_both(accepted, capsys, key):
    flag, value, other = FLAG[key]
    code, sweep, launch, err = accepted([*GRID, flag, value, "--set", f"{key}={value}"], capsys)
    assert code == 0, err
    code, _, _, err = accepted([*GRID, flag, other, "--set", f"{key}={value}"], capsys)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert key in line and flag in line and "disagree" in line, line


@pytest.mark.parametrize("key, value", [("run.output_dir", "elsewhere"), ("run.name", "mine")])
@pytest.mark.parametrize("command", ["sweep", "study"])
def test_a_field_the_sweep_makes_per_trial_is_refused_naming_its_flag(accepted, capsys, tmp_path, key, value,
                                                                      command):
    for given in (["--set", f"{key}={value}"], ["--config", _config_file(tmp_path, {key: value})]):
        code, _, _, err = accepted([*(GRID if command == "sweep" else MOMENTUM), *given], capsys)
        assert code == 2, err
        line = err.strip().splitlines()[-1]
        assert line.endswith("name the sweep with --name and drop run.name") if key == "run.name" else \
            f"choose the storage with {LAUNCH_SETTINGS[key]}" in line, line
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_a_config_file_that_restates_the_preset_asks_for_nothing(accepted, capsys, tmp_path):
    """What --print-config writes (every field, run.output_dir and run.experiment included) reads back into a
    sweep: a value equal to the preset's (smoke's run.num_workers 0) is not a request; the sweep's flags and
    defaults stand, as they do over the preset's own."""
    assert main(["train", "--preset", "smoke", "--set", "data.name=synthetic", "--print-config"]) == 0
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    assert yaml.safe_load(printed.read_text())["run"]["num_workers"] == 0
    code, sweep, launch, err = accepted([*GRID, "--config", str(printed)], capsys)
    assert code == 0, err
    assert (launch.workers_per_trial, launch.cpus_per_worker, launch.gpus_per_worker) == (1, None, 0.0)
    assert sweep.study == "sweeps"
    code, _, launch, err = accepted([*GRID, "--config", str(printed), "--workers-per-trial", "2"], capsys)
    assert code == 0 and launch.workers_per_trial == 2, err


def test_more_than_one_gpu_per_rank_is_refused(accepted, capsys):
    """One rank computes on one GPU: a second would be held and never used."""
    flag = "--gpus-per-worker (run.gpus_per_worker)"
    for argv, name in (([*GRID, "--gpus-per-worker", "2"], flag), ([*GRID, "--set", "run.gpus_per_worker=2"], flag),
                       ([*MOMENTUM, "--gpus-per-worker", "1.5"], flag),
                       (["train", "--preset", "smoke", "--set", "run.gpus_per_worker=2", "--print-config"],
                        "run.gpus_per_worker")):
        code, _, _, err = accepted(argv, capsys)
        assert code == 2, (argv, err)
        line = err.strip().splitlines()[-1]
        assert f"{name}: " in line and "allowed [0, 1]: one rank computes on one GPU" in line, line
        assert "more GPUs" in line and ("workers" in line), line
    code, _, launch, err = accepted([*GRID, "--gpus-per-worker", "1"], capsys)
    assert code == 0 and launch.gpus_per_worker == 1.0, err


def test_asha_on_a_grid_is_refused_naming_both_flags(accepted, capsys):
    code, _, _, err = accepted([*GRID, "--scheduler", "asha"], capsys)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert "--scheduler asha" in line and "--search grid" in line and "--search random or optuna" in line, line
    code, sweep, _, err = accepted([*GRID, "--scheduler", "asha", "--search", "random"], capsys)
    assert code == 0 and sweep.scheduler == "asha", err


def test_a_sweep_built_in_code_is_refused_where_its_overrides_and_launch_disagree():
    sweep = Sweep(study="s", name="n", preset="smoke", description="", trials=[Trial("a", {"moco.m": 0.9})],
                  base_overrides={"data.name": "synthetic", "run.num_workers": 2})
    with pytest.raises(ValueError, match=re.escape("run.num_workers: 2 (--set or --config) and --workers-per-trial "
                                                   "1 disagree")):
        check_sweep(sweep, Launch())
    check_sweep(sweep, Launch(workers_per_trial=2))


def test_train_storage_and_output_dir_agree_or_are_refused(monkeypatch, capsys, tmp_path):
    """`mocolab train`: --storage sets run.output_dir; a --set value that disagrees is refused naming both, and
    one given is taken over $MOCOLAB_STORAGE (a node's default)."""
    monkeypatch.chdir(tmp_path)
    base = ["train", "--preset", "smoke", "--set", "data.name=synthetic", "--print-config"]
    assert main([*base, "--storage", "/a", "--set", "run.output_dir=/b"]) == 2
    err = capsys.readouterr().err
    assert "run.output_dir: '/b' (--set or --config) and --storage /a disagree" in err, err
    monkeypatch.setenv("MOCOLAB_STORAGE", "/shared")
    for extra, folder in ((["--set", "run.output_dir=/b"], "/b"), ([], "/shared"), (["--storage", "/a"], "/a"),
                          (["--storage", "/a", "--set", "run.output_dir=/a"], "/a")):
        assert main([*base, *extra]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["run"]["output_dir"] == folder, extra


def test_the_no_gpu_refusal_advises_what_the_command_takes():
    cpu_only = [{"CPU": 2.0, "GPU": 0.0}]
    for no_gpu in (RUN_NO_GPU, NO_GPU):
        with pytest.raises(ValueError, match=re.escape(f"on a CPU-only cluster ask for none: {no_gpu}")):
            check_placement(1, 1.0, 1.0, nodes=cpu_only, no_gpu=no_gpu)
        check_placement(1, 1.0, 0.0, nodes=cpu_only, no_gpu=no_gpu)  # what it advises is placed
    assert NO_GPU.startswith("--gpus-per-worker 0") and RUN_NO_GPU.startswith("--set run.gpus_per_worker=0")


def test_a_sweep_asking_a_cpu_only_cluster_for_gpus_is_refused_with_its_own_flag(tmp_path, ray_session):
    from conftest import mlflow_store
    from mocolab.tune import run_sweep

    sweep = Sweep(study="s", name="gpu", preset="smoke", description="", trials=[Trial("a", {"moco.m": 0.9})],
                  base_overrides={"data.name": "synthetic", "run.gpus_per_worker": 1})
    launch = Launch(workers_per_trial=0, gpus_per_worker=1, tracking_uri=mlflow_store(tmp_path),
                    storage=str(tmp_path / "sweeps"))
    with pytest.raises(ValueError, match=re.escape(f"ask for none: {NO_GPU}")):
        run_sweep(sweep, launch, progress=lambda _m: None)
