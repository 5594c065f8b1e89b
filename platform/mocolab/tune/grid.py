"""A sweep over any config fields: ``mocolab sweep --grid moco.tau=0.07,0.2 --grid queue.size=1024,4096``.

The grid's every point (times the seeds) is one trial, or, with ``--search optuna|random``, the grid's
values are the choices a search samples from. It runs as the named studies do (``tune.study.run_study``):
a parent run with one child per trial, resumed by the same command, a closing table and report, and
their exit codes. Parsing and checking load no torch, Ray or MLflow, so bad input is refused at once.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mocolab.config import CHOICES, parse_overrides
from mocolab.config.launch_fields import LAUNCH_SETTINGS
from mocolab.tune.spec import Sweep, Trial, with_validation_split

if TYPE_CHECKING:
    import pandas as pd

EXPERIMENT = "sweeps"  # where `mocolab sweep` logs unless --experiment says otherwise
SEED = "run.seed"
# Fields every trial's run gets from the sweep and its launch (tune/spec.py: trial_overrides), and the flag that
# sets each
SWEEP_FIELDS = LAUNCH_SETTINGS


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["moco.tau=0.07,0.2", "queue.size=1024,4096"]`` -> ``{"moco.tau": [0.07, 0.2], ...}`` (YAML scalars)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--grid {item!r}: expected section.field=value1,value2 (e.g. moco.tau=0.07,0.2)")
        if key in grid:
            raise ValueError(f"--grid {key}: given twice; list all its values in one --grid {key}=a,b")
        grid[key] = [parse_overrides([f"{key}={v.strip()}"])[key] for v in text.split(",") if v.strip()]
    return check_grid(grid)


def check_grid(grid: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    """The grid's form: fields a trial may vary, each with distinct values. Whether a field exists and its
    values are allowed is checked when each trial's config is built (``spec.check_sweep``)."""
    if not grid:
        raise ValueError("--grid: give at least one field to sweep, e.g. --grid moco.tau=0.07,0.2")
    out = {}
    for key, values in grid.items():
        if key == SEED:
            raise ValueError(f"--grid {key}: give seeds with --seeds N (and --first-seed), not as a grid field")
        if key in SWEEP_FIELDS:
            raise ValueError(f"--grid {key}: the sweep sets it for every trial (use {SWEEP_FIELDS[key]})")
        values = [values] if isinstance(values, (str, bytes)) else list(values)
        if not values:
            allowed = f" (allowed: {', '.join(CHOICES[key])})" if key in CHOICES else ""
            raise ValueError(f"--grid {key}: no values given{allowed}")
        if len(set(map(str, values))) != len(values):
            raise ValueError(f"--grid {key}: a value is listed twice in {values}")
        out[key] = values
    return out


def grid_trials(grid: Mapping[str, Sequence[Any]], seeds: Sequence[int]) -> list[Trial]:
    """Every point of the grid for every seed, seed by seed: a sweep stopped part way holds whole seeds."""
    keys = list(grid)
    out = []
    for seed in seeds:
        for point in itertools.product(*(grid[k] for k in keys)):
            over = dict(zip(keys, point))
            label = " ".join(f"{k}={v}" for k, v in over.items()) + f" seed={seed}"
            out.append(Trial(label, {**over, SEED: seed}))
    return out


def default_name(grid: Mapping[str, Any], preset: str, first_seed: int) -> str:
    """``sweep-tau-size-smoke-s0``: the same command resumes the same sweep by this name."""
    fields = "-".join(k.rsplit(".", 1)[-1] for k in grid)
    return f"sweep-{fields}-{preset}-s{first_seed}"[:200]


def grid_sweep(grid: Mapping[str, Sequence[Any]], *, preset: str = "cpu-quick", seeds: Sequence[int] = (0,),
               overrides: Mapping[str, Any] | None = None, name: str | None = None, experiment: str = EXPERIMENT,
               search: str = "grid", samples: int = 1, metric: str = "val_knn_top1", scheduler: str = "fifo",
               **flags: Any) -> Sweep:
    """The ``Sweep`` of a grid (or, ``search`` optuna/random, of a search over the grid's values);
    ``flags``: the other ``Sweep`` fields (register, register_metric)."""
    grid = {k: list(v) for k, v in grid.items()}
    seeds = list(seeds)
    if not seeds:
        raise ValueError("--seeds: give at least one seed")
    shown = ", ".join(f"{k} in {v}" for k, v in grid.items())
    common = dict(study=experiment, name=name or default_name(grid, preset, seeds[0]), preset=preset,
                  base_overrides=dict(overrides or {}), **flags)
    if search == "grid":
        return Sweep(description=f"grid over {shown}; seeds {seeds}; preset {preset}",
                     trials=grid_trials(grid, seeds), scheduler=scheduler, **common)  # check_search refuses asha
    common["base_overrides"] = with_validation_split(preset, common["base_overrides"])  # what it selects on
    return Sweep(description=f"{search} search over {shown} ({samples} samples per seed) on {metric} of "
                             f"{common['base_overrides']['data.val_size']:,} held-out training images; seeds "
                             f"{seeds}; preset {preset}", search=search, search_space=grid, num_samples=samples,
                 seeds=seeds, metric=metric, mode="max", scheduler=scheduler, **common)


def setting(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    """A trial's point of the grid, seed left out: what the closing table groups by."""
    return " ".join(f"{k}={row.get(f'params.{k}')}" for k in keys)


def grid_report(keys: Sequence[str]):
    """The closing table of a grid sweep (``run_study``'s ``report``): per point, mean ± std over seeds."""

    def report(out_dir: Path, trials: pd.DataFrame):
        from mocolab.analysis import bar_plot, fmt_mean_std, summarise

        by = trials.assign(**{"params.setting": [setting(r, keys) for r in trials.to_dict("records")]})
        table = summarise(by, "setting")
        width = max([7, *(len(str(s)) for s in table["setting"])])
        lines = [f"{'setting':<{width}} {'seeds':>5} {'linear top-1 %':>16} {'kNN top-1 %':>16} {'status':>10}"]
        for _, r in table.iterrows():
            lines.append(f"{r.setting:<{width}} {r.seeds:>5} {fmt_mean_std(r.linear_top1_mean, r.linear_top1_std):>16} "
                         f"{fmt_mean_std(r.knn_top1_mean, r.knn_top1_std):>16} {r.status:>10}")
        figure = bar_plot(table, "setting", "linear probe and kNN per setting (mean ± std over seeds)",
                          out_dir / "sweep.png")
        return "\n".join(lines), figure, table

    return report
