"""The command line: `python -m mocolab` is `mocolab`, and the help lists every closed set of values."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_concurrently

import yaml

from mocolab.config import CHOICES, build_config, list_presets, parse_overrides


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_python_dash_m_is_the_mocolab_command():
    console = str(Path(sys.executable).with_name("mocolab"))
    for args in (["--version"], ["train", "--help"]):
        by_module = _run(sys.executable, "-m", "mocolab", *args)
        by_script = _run(console, *args)
        assert by_module.returncode == by_script.returncode == 0, by_module.stderr + by_script.stderr
        assert by_module.stdout.replace("python -m mocolab", "mocolab").replace("__main__.py", "mocolab") == \
            by_script.stdout
    bad = _run(sys.executable, "-m", "mocolab", "train", "--set", "moco.bn=group")
    assert bad.returncode == 2 and "moco.bn: unknown value 'group'" in bad.stderr


def test_train_help_lists_the_allowed_values_from_their_single_source():
    out = _run(sys.executable, "-m", "mocolab", "train", "--help").stdout
    for key, values in CHOICES.items():
        line = next(line for line in out.splitlines() if line.strip().startswith(key + " "))
        assert line.split(None, 1)[1].strip() == ", ".join(values)


@pytest.mark.parametrize("mark, script, n_trains, n_studies", [
    ("v3-quickstart", "vit_ablation.py", 3, 2),
    ("negatives-quickstart", "negatives_ablation.py", 4, 2),
])
def test_readme_blocks_are_valid_as_written(mark, script, n_trains, n_studies):
    """README's MoCo v3 and negatives blocks: each `mocolab train` line resolves (run with --print-config, so
    no training) to the values it sets, and each study line's flags are the script's
    (test_command_blocks.py runs them)."""
    import shlex

    from readme_blocks import commands

    repo = Path(__file__).resolve().parents[2]
    lines = commands(mark)
    trains = [line for line in lines if line.startswith(".venv/bin/mocolab train")]
    studies = [line for line in lines if f"experiments/{script}" in line]
    assert len(trains) == n_trains and len(studies) == n_studies
    mocolab = str(Path(sys.executable).with_name("mocolab"))
    *shown_configs, usage = run_concurrently(
        [[mocolab, *shlex.split(line)[1:], "--print-config"] for line in trains]
        + [[sys.executable, str(repo / "experiments" / script), "--help"]], timeout=120)
    for line, res in zip(trains, shown_configs):
        argv = shlex.split(line)[1:]
        assert res.returncode == 0, line + "\n" + res.stderr
        shown = {f"{s}.{k}": v for s, sec in yaml.safe_load(res.stdout).items() for k, v in sec.items()}
        for key, value in parse_overrides([argv[i + 1] for i, a in enumerate(argv) if a == "--set"]).items():
            assert shown[key] == value, (key, shown[key], value)
    assert usage.returncode == 0, usage.stderr
    usage = usage.stdout
    for line in studies:
        for flag in (a for a in shlex.split(line) if a.startswith("--")):
            assert flag in usage, flag


def test_a_command_ends_without_the_final_heap_walk_and_keeps_its_status():
    """``exit_now`` (every entry point's last call) freezes the heap, so the exit's last collection skips
    it, and exits with the command's status; output written before it is flushed as usual."""
    code = ("import gc, atexit\nfrom mocolab.cli.exiting import exit_now\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, flush=True))\n"
            "print('ran', end='')\nexit_now(3)\n")
    res = _run(sys.executable, "-c", code)
    assert res.returncode == 3 and res.stdout == "ranfrozen True\n", res
    assert _run(str(Path(sys.executable).with_name("mocolab")), "train", "--set", "optim.epochs=-1").returncode == 2


def test_presets_lists_every_preset_with_what_it_is_for():
    res = subprocess.run([str(Path(sys.executable).with_name("mocolab")), "presets"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == list_presets()
    assert all(len(line.split(None, 1)[1]) >= 20 for line in lines[:-1])
    assert "MoCo v2 on ImageNet" in res.stdout and "--print-config" in lines[-1]


def test_print_config_is_yaml_that_config_reads_back_and_set_still_wins(tmp_path):
    mocolab = str(Path(sys.executable).with_name("mocolab"))
    first = subprocess.run([mocolab, "train", "--preset", "smoke", "--set", "moco.m=0.9", "--set", "queue.size=512",
                            "--print-config"], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    mine = tmp_path / "mine.yaml"
    mine.write_text(first.stdout)
    again = subprocess.run([mocolab, "train", "--preset", "cpu-quick", "--config", str(mine), "--print-config"],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    body = lambda text: text.split("\n", 1)[1]  # noqa: E731  (less the comment naming the preset given)
    assert body(again.stdout) == body(first.stdout)
    assert yaml.safe_load(first.stdout)["moco"]["m"] == 0.9
    want = build_config("smoke", {"moco.m": 0.9, "queue.size": 512}).to_dict()
    assert yaml.safe_load(first.stdout) == want
    over = subprocess.run([mocolab, "train", "--config", str(mine), "--set", "moco.m=0.99", "--print-config"],
                          capture_output=True, text=True, timeout=120)
    assert yaml.safe_load(over.stdout)["moco"]["m"] == 0.99
    # a partial file of the user's: only what it sets changes
    (tmp_path / "part.yaml").write_text("moco:\n  tau: 0.1\n")
    part = subprocess.run([mocolab, "train", "--preset", "smoke", "--config", str(tmp_path / "part.yaml"),
                           "--print-config"], capture_output=True, text=True, timeout=120)
    assert yaml.safe_load(part.stdout) == build_config("smoke", {"moco.tau": 0.1}).to_dict()


@pytest.mark.parametrize("text, message", [
    (None, "is not a file"),
    ("moco: [1, 2\n", "is not valid YAML"),
    ("- a\n- b\n", "must map sections to fields"),
    ("moco:\n  mm: 0.9\n", "unknown config key 'moco.mm'"),
    ("moco:\n  m: 1.5\n", "moco.m: 1.5 is out of range"),
])
def test_a_bad_config_file_is_one_line_naming_the_problem(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    for argv in ([str(Path(sys.executable).with_name("mocolab")), "train", "--preset", "smoke"],
                 [sys.executable, str(Path(__file__).resolve().parents[2] / "experiments" / "momentum_ablation.py"),
                  "--preset", "smoke"]):
        res = subprocess.run([*argv, "--config", str(path)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert message in res.stderr


def test_a_missing_data_folder_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """config.validate reads no disk; each command checks the data it will read (data_root.check_data) before
    any work: one line naming data.root, exit 2, nothing written (no MLflow store, no run or sweep folder)."""
    from mocolab.cli.commands import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # `mocolab study` and `sweep` name themselves in argv
    missing = str(tmp_path / "imagenet")
    data = ["--set", "data.name=imagefolder", "--set", f"data.root={missing}"]
    for argv in (["train", "--preset", "smoke", *data], ["train", "--preset", "smoke", "--print-config", *data],
                 ["baselines", "--preset", "smoke", *data], ["study", "queue", "--preset", "smoke", "--grid", *data],
                 ["study", "momentum", "--preset", "smoke", "--momenta", "0.9", *data],
                 ["sweep", "--preset", "smoke", "--grid", "moco.tau=0.1,0.2", *data]):
        assert main(argv) == 2, argv
        assert f"data.root: {missing!r} does not exist" in capsys.readouterr().err, argv
    assert list(tmp_path.iterdir()) == []


def test_each_named_study_is_also_a_mocolab_subcommand_with_the_scripts_flags(tmp_path):
    """``mocolab study NAME`` is the script's ``main`` (a pip-installed user has no experiments/ folder)."""
    from mocolab.config.choices import STUDIES

    mocolab = str(Path(sys.executable).with_name("mocolab"))
    repo = Path(__file__).resolve().parents[2]
    scripts = {"momentum": "momentum_ablation", "queue": "queue_ablation", "augmentation": "augmentation_ablation",
               "negatives": "negatives_ablation", "vit": "vit_ablation"}
    assert set(STUDIES) == set(scripts)
    results = run_concurrently([[mocolab, "study", name, "--help"] for name in STUDIES]
                               + [[sys.executable, str(repo / "experiments" / f"{scripts[n]}.py"), "--help"]
                                  for n in STUDIES], timeout=120)
    for name, ours, script in zip(STUDIES, results[:len(STUDIES)], results[len(STUDIES):]):
        assert ours.returncode == 0 and script.returncode == 0, (ours.stderr, script.stderr)
        assert ours.stdout.startswith(f"usage: mocolab study {name} ")
        flags = lambda text: sorted(set(re.findall(r"(--[a-z][a-z-]+)", text)))  # noqa: E731
        assert flags(ours.stdout) == flags(script.stdout), name
    bad = subprocess.run([mocolab, "study", "momentum", "--preset", "smoke", "--momenta", "x"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--momenta" in bad.stderr
    assert list(tmp_path.iterdir()) == []


def test_sweep_and_eval_say_what_they_take():
    sweep, evaluate = run_concurrently([[sys.executable, "-m", "mocolab", "sweep", "--help"],
                                        [sys.executable, "-m", "mocolab", "eval", "--help"]], timeout=120)
    assert sweep.returncode == 0 and evaluate.returncode == 0, sweep.stderr + evaluate.stderr
    # the sweep takes every flag of the named studies, and its own
    for flag in ("--grid", "--search", "--samples", "--seeds", "--stop-after", "--register", "--watch", "--set"):
        assert flag in sweep.stdout, flag
    assert "RUN_ID|MODEL_URI|EXPORT_DIR" in evaluate.stdout and "synthetic" in evaluate.stdout
    unknown = _run(sys.executable, "-m", "mocolab", "train", "--no-such-flag")
    assert unknown.returncode == 2 and "unrecognized arguments: --no-such-flag" in unknown.stderr


def test_a_diverged_training_is_not_the_bad_input_exit_status(tmp_path):
    """Divergence is a result of the settings, not a mistake in the command: exit 3, never 2."""
    res = subprocess.run([sys.executable, "-m", "mocolab", "train", "--preset", "smoke", "--in-process",
                          "--set", "optim.lr=1e6", "--set", "optim.schedule=constant", "--set", "moco.tau=0.01",
                          "--set", "data.subset=512", "--set", "queue.size=256", "--set", "optim.max_steps=16"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 3, res.stdout[-2000:] + res.stderr[-2000:]
    assert "training diverged after" in res.stderr
