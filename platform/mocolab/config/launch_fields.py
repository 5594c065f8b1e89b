"""The run fields a launcher sets from its own flags, and what a user's --config or --set asks of them.

A sweep sets six fields in every trial's run (its workers, their CPU and GPU
share, the MLflow experiment, the checkpoint folder and the run's name);
`mocolab train` sets run.output_dir from --storage. A value the user gives
for one of them is used or refused by name (tune/spec.py, cli/commands.py),
never replaced; these helpers say which values the user gave.
"""

from __future__ import annotations

from typing import Any, Mapping

from mocolab.config.io import load_preset
from mocolab.config.schema import Config, apply_overrides

# Each field and the flag that sets it. A --set or --config value of one of the first four is taken where its
# flag is not given and refused where the flag says otherwise; run.output_dir and run.name a sweep makes per
# trial, so a value of the user's is refused there.
LAUNCH_SETTINGS = {"run.num_workers": "--workers-per-trial", "run.cpus_per_worker": "--cpus-per-worker",
                   "run.gpus_per_worker": "--gpus-per-worker", "run.experiment": "--experiment",
                   "run.output_dir": "--storage", "run.name": "--name"}


def launch_requests(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The launch fields that ``overrides`` give, typed as the config types them; a ``run.name`` of None (derive
    it) asks for nothing."""
    given = {k: overrides[k] for k in LAUNCH_SETTINGS if k in overrides}
    if not given:
        return {}
    flat = apply_overrides(Config(), given).flatten()
    return {k: flat[k] for k in given if flat[k] is not None}


def config_file_requests(preset: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """A --config file's fields less the launch fields that restate the preset's value: ``--print-config`` writes
    every field, so a file made from it names the preset's run.output_dir and run.experiment without asking for
    them; a value of the user's own stays, to be used or refused."""
    asked, preset_values = launch_requests(fields), load_preset(preset).flatten()
    return {k: v for k, v in fields.items() if k not in asked or asked[k] != preset_values[k]}
