"""What a run is, as a config says it: the fields that define it (resumable ones left out), their digest,
and the one rule that refuses to resume a name with other settings."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping

from mocolab.config.schema import Config, departures


# Fields that may change between attempts of one run without changing what it computes: a resume
# ignores them.  Every other field is part of the run's identity (``fingerprint``).
RESUMABLE_FIELDS = ("run.max_failures", "run.threads", "run.cpus_per_worker", "run.placement", "run.output_dir",
                    "run.keep_checkpoints", "run.checkpoint_every", "run.system_metrics_s", "run.step_metrics_every",
                    "run.fault_step", "run.preset", "run.name", "run.log_models",
                    "data.loader", "data.memory_budget_mb", "data.stream_tasks",
                    "data.max_bad_fraction")  # how, not what, is read


def identity(flat: Mapping[str, Any]) -> dict[str, str]:
    """The flattened fields that define a run (RESUMABLE_FIELDS left out), as the strings MLflow stores."""
    return {k: str(v) for k, v in sorted(flat.items()) if k not in RESUMABLE_FIELDS}


def fingerprint(cfg: Config) -> str:
    """A short digest of what the run computes: equal for every attempt of one run, and only then."""
    return hashlib.sha1(json.dumps(identity(departures(cfg.flatten())), sort_keys=True).encode()).hexdigest()[:16]


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any],
                new_field: Callable[[str], bool] = lambda _key: True) -> list[str]:
    """``["moco.m: 0.99 -> 0.9", ...]`` over the identity fields of two flattened configs.

    A key absent from ``old`` for which ``new_field(key)`` holds is a field that did not exist when the
    run started (a newer mocolab), not a change, and is left out.
    """
    a, b = identity(old), identity(new)
    keys = sorted(k for k in set(a) | set(b) if k in a or not new_field(k))
    return [f"{k}: {a.get(k, '(absent)')} -> {b.get(k, '(absent)')}" for k in keys if a.get(k) != b.get(k)]


class ConfigMismatchError(ValueError):
    """A run or sweep name asked to resume with settings other than the ones it started with."""


def check_same_config(what: str, old: Mapping[str, Any], new: Mapping[str, Any], fresh: str,
                      new_field: Callable[[str], bool] = lambda _key: True) -> None:
    """Refuse to resume ``what`` when its identity fields changed; the error lists them and how to start fresh."""
    diff = config_diff(old, new, new_field)
    if diff:
        raise ConfigMismatchError(f"{what} was started with other settings; resuming would mix them. Changed: "
                                  f"{'; '.join(diff)}. Resume with the original settings, or start fresh: {fresh}")
