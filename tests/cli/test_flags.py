"""Every number every command takes is checked at the door: out of range, one line naming the flag and its
range, exit status 2, and nothing started (no file written, no Ray, MLflow or torch imported)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys

import pytest

from mocolab.cli.commands import build_parser, main, sweep_parser
from mocolab.config.choices import STUDIES

# What a value the sweep below tries is taken on purpose for (and why): the rest must be refused.
TAKES_ZERO = {"--first-seed": "seed 0", "--workers-per-trial": "each trial trains in its own process",
              "--gpus-per-worker": "CPU only", "--head-cpus": "the head only coordinates",
              "--gpus": "a CPU node", "--workers": "the head alone", "--port": "any free port",
              "--dashboard-port": "any free port", "--mlflow-port": "any free port",
              "--postgres-port": "any free port"}
TAKES_HUGE = {"--stop-after": "never reached: the whole sweep runs", "--top": "capped at the runs there are",
              "--max-concurrent": "capped at what the cluster holds at once"}
# The other flags each command needs, so that the flag under test is the only thing wrong.
BASE = {("sweep",): ["--grid", "moco.m=0.9,0.99", "--search", "optuna", "--preset", "smoke"],
        ("report",): ["--experiment", "x", "--out", "report"], ("baselines",): ["--preset", "smoke"]}


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))
        elif action.option_strings and action.type in (int, float):
            yield path, action.option_strings[-1], action.type


def numeric_flags() -> list[tuple[tuple[str, ...], str, type]]:
    """(command, flag, type) of every number of every command: the main parser, the sweep's, each study's."""
    found = list(_walk(build_parser(), ()))
    found += _walk(sweep_parser(), ("sweep",))
    for name in STUDIES:
        found += _walk(importlib.import_module(f"mocolab.tune.studies.{name}").parser(), ("study", name))
    return found


def bad_cases() -> list[tuple[list[str], str]]:
    """(argv, the flag it gets wrong): zero, negative, huge, non-integer or non-finite, less what is taken."""
    cases = []
    for path, flag, typ in numeric_flags():
        base = [*path, *BASE.get(path[:1], ["--preset", "smoke"] if path[0] == "study" else [])]
        values = {"zero": "0", "negative": "-1", "huge": str(10**12)}
        values.update({"non-integer": "2.5"} if typ is int else {"nan": "nan", "inf": "inf"})
        for kind, value in values.items():
            if (kind == "zero" and flag in TAKES_ZERO) or (kind == "huge" and flag in TAKES_HUGE):
                continue
            cases.append(([*base, f"{flag}={value}"], flag))
    for command in (["sweep", *BASE[("sweep",)]], ["baselines"], ["study", "momentum"]):  # the last seed too
        cases.append(([*command, f"--first-seed={2**32 - 1}", "--seeds=2"], "--first-seed"))
    return cases


# Runs each case in one fresh interpreter where importing Ray, MLflow or torch is refused and recorded: a case
# that gets past the door fails at once instead of training. HOME and the working folder are empty folders.
RUNNER = r"""
import contextlib, io, json, os, sys, tempfile
from pathlib import Path

attempted = []

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ray", "mlflow", "torch"):
            attempted.append(name)
            raise ImportError(f"work started: {name} imported")

sys.meta_path.insert(0, Refuse())
from mocolab.cli.commands import main

out = []
for argv in json.loads(sys.argv[1]):
    root = Path(tempfile.mkdtemp())
    (root / "home").mkdir(), (root / "work").mkdir()
    os.environ["HOME"] = str(root / "home")
    os.chdir(root / "work")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except SystemExit as e:
        code = e.code
    except BaseException as e:
        code = f"{type(e).__name__}: {e}"
    left = [str(p.relative_to(root)) for p in root.rglob("*") if p.name not in ("home", "work")]
    out.append({"argv": argv, "code": code, "stderr": err.getvalue(), "left": left, "imported": attempted[:]})
    attempted.clear()
print(json.dumps(out))
"""


def test_every_numeric_flag_of_every_command_is_known():
    flags = {flag for _, flag, _ in numeric_flags()}
    assert {"--samples", "--max-concurrent", "--stop-after", "--workers-per-trial", "--cpus-per-worker",
            "--gpus-per-worker", "--watch", "--seeds", "--first-seed", "--top", "--threads"} <= flags
    from mocolab.config.flags import NUMBERS

    assert flags <= set(NUMBERS), f"flags without a range in mocolab/config/flags.py: {sorted(flags - set(NUMBERS))}"


def test_every_number_out_of_range_is_refused_at_the_door_naming_the_flag_and_starting_nothing(tmp_path):
    cases = bad_cases()
    assert len(cases) > 100
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "MOCOLAB_STORAGE")}
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps([argv for argv, _ in cases])], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    surprises = []
    for (argv, flag), res in zip(cases, json.loads(proc.stdout)):
        lines = res["stderr"].strip().splitlines()
        last = lines[-1] if lines else ""
        # argparse refuses a non-integer itself, after its usage line; every range is refused in the config's words
        ours = re.fullmatch(rf"(mocolab: )?error: {flag}: \S+ is out of range; allowed .+", last) and len(lines) == 1
        theirs = re.fullmatch(rf".*error: argument {flag}: invalid int value: '2.5'", last)
        if res["code"] != 2:
            surprises.append(f"{argv}: exit {res['code']!r}, not 2: {last}")
        elif not (ours or theirs):
            surprises.append(f"{argv}: not one line naming {flag} and its range: {res['stderr']!r}")
        if res["left"] or res["imported"]:
            surprises.append(f"{argv}: work started: wrote {res['left']}, imported {res['imported']}")
    assert not surprises, f"{len(surprises)} of {len(cases)}:\n" + "\n".join(surprises)


def test_study_help_lists_the_studies_and_what_each_is(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["study", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for name in STUDIES:
        first = importlib.import_module(f"mocolab.tune.studies.{name}").__doc__.splitlines()[0]
        assert name in out and first[:40] in " ".join(out.split()), (name, out)
    assert "mocolab study NAME --help" in out



# A grid with no validation split held out (data.val_size 0), and the same with one, on data that needs no files.
NO_VAL = ["--preset", "smoke", "--set", "data.name=synthetic", "--register", "best"]
WITH_VAL = [*NO_VAL, "--set", "data.val_size=64"]


def _study_sweep(argv: list[str]):
    from mocolab.tune import Trial
    from mocolab.tune.study import make_sweep

    args = importlib.import_module("mocolab.tune.studies.momentum").parser().parse_args(argv)
    return make_sweep(args, "momentum-ablation", "test", [Trial("m=0.9 seed=0", {"moco.m": 0.9, "run.seed": 0})])


def test_register_ranks_by_a_validation_metric_unless_told():
    """--register picks the best trial by the validation split's linear probe; where the sweep holds none out it
    is refused at the door, naming the flag and the two ways on (hold one out, or rank by the test split)."""
    from mocolab.tune.spec import Launch, check_sweep, register_warning

    assert sweep_parser().parse_args(["--grid", "moco.m=0.9"]).register_metric == "val_linear_top1"
    for name in STUDIES:
        assert importlib.import_module(f"mocolab.tune.studies.{name}").parser().parse_args([]).register_metric == \
            "val_linear_top1"
    with pytest.raises(ValueError, match=r"^--register-metric: val_linear_top1 \(the default\) ranks the trials on "
                                         r"a validation split, and data.val_size is 0.*--set data.val_size=N.*"
                                         r"--register-metric linear_top1"):
        check_sweep(_study_sweep(NO_VAL), Launch())
    with pytest.raises(ValueError, match=r"^--register-metric: val_knn_top1 ranks"):
        check_sweep(_study_sweep([*NO_VAL, "--register-metric", "val_knn_top1"]), Launch())
    for argv in (WITH_VAL, NO_VAL[:-2], [*NO_VAL, "--register-metric", "final_loss"]):  # held out; no --register
        check_sweep(_study_sweep(argv), Launch())
        assert register_warning(_study_sweep(argv)) == ""


@pytest.mark.parametrize("metric", ["linear_top1", "knn_top1"])
def test_registering_by_a_test_metric_says_it_is_selection_on_the_test_split(metric):
    from mocolab.tune.spec import Launch, check_sweep, register_warning

    sweep = _study_sweep([*NO_VAL, "--register-metric", metric])
    check_sweep(sweep, Launch())  # the user's choice: taken, with the warning
    warning = register_warning(sweep)
    assert warning.startswith(f"warning: --register-metric {metric} picks the best trial by its test-split score: "
                              f"that is model selection on the test split, so the registered model's {metric} is "
                              f"optimistic and not a held-out result"), warning
    assert register_warning(_study_sweep([*NO_VAL[:-2], "--register-metric", metric])) == ""  # nothing registered


def test_mocolab_sweep_refuses_to_register_without_a_validation_split(capsys, monkeypatch):
    import mocolab.tune.study

    monkeypatch.setattr(mocolab.tune.study, "run_study", lambda *a, **k: pytest.fail("the sweep started"))
    assert main(["sweep", "--grid", "moco.m=0.9,0.99", *NO_VAL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mocolab: error: --register-metric: val_linear_top1 (the default)")
