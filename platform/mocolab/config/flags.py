"""The range of every number a command takes, in one table, checked as soon as the command line is parsed.

A flag's number is refused as a config field's is (``config._range``: the same words), before Ray, MLflow or
torch loads: ``--samples 0`` is one line and exit status 2, never a sweep that quietly runs one trial, and
``--seeds 10**12`` is refused before a list of that many seeds is built. ``check_numbers`` reads every
numeric flag of the parser it is given, so a flag added without a range here fails at once (and in tests).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from mocolab.config.validate import _range

SEED_MAX = 2**32 - 1  # run.seed's range: the last seed of --first-seed .. --first-seed + --seeds - 1 too
PORT = dict(lo=0, hi=65535, allowed="[0, 65535] (0: any free port)")


@dataclass(frozen=True)
class Range:
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    allowed: str | None = None  # the range as words where the interval alone would not say it


NUMBERS: dict[str, Range] = {
    # the studies' and `mocolab sweep`'s
    "--seeds": Range(1, 1000),
    "--first-seed": Range(0, SEED_MAX),
    "--samples": Range(1, 10_000),
    "--workers-per-trial": Range(0, 4096, allowed="[0, 4096] (0: each trial trains in its own process)"),
    "--cpus-per-worker": Range(0.0, 4096.0, lo_open=True, allowed="(0, 4096]"),  # run.cpus_per_worker's
    "--gpus-per-worker": Range(0.0, 64.0),  # a node's in `cluster up`; a sweep's above 1: spec.check_launch
    "--max-concurrent": Range(1),
    "--stop-after": Range(1),
    "--watch": Range(1, 86_400, allowed="[1, 86400] seconds between rewrites"),
    # `mocolab report`'s and `mocolab repro`'s
    "--top": Range(1),
    "--threads": Range(1, 1024),  # run.threads' (whose 0, "all cores", repro pins instead)
    # `mocolab cluster`'s
    "--workers": Range(0, 64),
    "--head-cpus": Range(0.0, 4096.0),
    "--cpus": Range(0.0, 4096.0, lo_open=True, allowed="(0, 4096]"),
    "--gpus": Range(0.0, 64.0),
    "--object-store-mb": Range(128, 1 << 20),
    "--port": Range(**PORT),
    "--dashboard-port": Range(**PORT),
    "--mlflow-port": Range(**PORT),
    "--postgres-port": Range(**PORT),
}


def check_number(flag: str, value: float | None) -> None:
    """Raise the config's ValueError (``--samples: 0 is out of range; allowed [1, 10000]``) for a value out of
    ``flag``'s range; None (a flag not given) passes. For callers that take the number without a parser."""
    if value is not None:
        r = NUMBERS[flag]
        _range(flag, value, r.lo, r.hi, lo_open=r.lo_open, allowed=r.allowed)


def check_seeds(first_seed: int, seeds: int) -> None:
    """The seeds' count and every seed of ``first_seed .. first_seed + seeds - 1`` in run.seed's range."""
    check_number("--seeds", seeds)
    check_number("--first-seed", first_seed)
    last = first_seed + seeds - 1
    if last > SEED_MAX:
        raise ValueError(f"--first-seed: {first_seed} is out of range; allowed [0, {SEED_MAX - seeds + 1}] with "
                         f"--seeds {seeds} (its last seed, {last}, must be <= {SEED_MAX})")


def check_numbers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every number ``args`` holds for ``parser``'s flags (and its chosen subcommand's), in its range."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen in action.choices:
                check_numbers(action.choices[chosen], args)
        elif action.option_strings and action.type in (int, float):
            flag = next(f for f in action.option_strings if f.startswith("--"))
            if flag not in NUMBERS:
                raise KeyError(f"{flag}: a number without a range in mocolab/config/flags.py's NUMBERS")
            check_number(flag, getattr(args, action.dest, None))
    if isinstance(getattr(args, "seeds", None), int) and isinstance(getattr(args, "first_seed", None), int):
        check_seeds(args.first_seed, args.seeds)


def parse_checked(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with every number checked: a ValueError names the first one out of range."""
    args = parser.parse_args(argv)
    check_numbers(parser, args)
    return args
