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

