"""Whether the run a name points to was made by this code: the same command after a code change never
returns the old result as if new.

A run's name is a digest of its config and seed; the code that trains it is keyed apart (its code
fingerprint, in the run's manifest and MLflow run).  An ended run made by the same code is reported as it
is, without training or evaluating again.  An ended run made by other code stays as it was, and this code
trains the config as a new run beside it, named with its fingerprint (``<name>-c<digest>``); one line names
the old run and its result.  A run that was interrupted under other code is refused: continuing it would mix
two versions of the method in one encoder, unless the user asks to and the change is recorded as a segment.
Runs without a fingerprint read as "code unknown": for ``mocolab train`` other code, for a sweep's
finished trial its result (a study of days is not retrained for lacking a fingerprint).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from mocolab.training.code_fingerprint import UNKNOWN, CodeFingerprint
from mocolab.config.manifest import RunManifest, read_outcome
from mocolab.training.storage import Location

REUSE_FLAG = "--reuse-other-code"
CONTINUE_FLAG = "--continue-across-code"
REUSE_HELP = ("report an ended run of the same config made by other code (a code fingerprint other than this "
              "checkout's) instead of training the config again beside it")
CONTINUE_HELP = ("continue a run interrupted under other code, recording the change as a segment of the run "
                 "(refused otherwise: one encoder would be trained by two versions of the code)")


class CodeChanged(ValueError):
    """An interrupted run asked to continue under other code: one line naming both fingerprints, what
    differs and the two ways on (a user's choice, so exit 2 and no traceback)."""


@dataclass(frozen=True)
class Ended:
    """A run that has ended, as the same command reports it: its status, scores and the code that made it."""

    name: str
    status: str
    mlflow_run_id: str | None = None
    linear_top1: float | None = None
    knn_top1: float | None = None
    final_loss: float | None = None
    steps: int = 0
    checkpoint: str | None = None
    val_linear_top1: float | None = None
    val_knn_top1: float | None = None
    code: str = UNKNOWN

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def result(self) -> str:
        linear = "" if self.linear_top1 is None else f", linear top-1 {100 * self.linear_top1:.2f} %"
        where = f"MLflow run {self.mlflow_run_id}" if self.mlflow_run_id else "no MLflow run"
        return f"{self.status}{linear} ({where})"


def ended_run(run_dir: Location, tracker: Any, name: str, parent_run_id: str | None = None) -> Ended | None:
    """The run ``name`` if it has ended: its folder's record, else (a run whose folder holds no such
    record) its MLflow run's final metrics, code unknown unless the run is tagged with it."""
    record = read_outcome(run_dir)
    if record is not None:
        return Ended(**{k: v for k, v in record.items() if k in Ended.__dataclass_fields__})
    run = tracker.finished(name, parent_run_id) if tracker is not None else None
    if run is None:
        return None
    from mocolab.tracking.store import CODE_TAG, STATUS_TAG  # tracking: MLflow's side, asked only here

    m = run.data.metrics

    def metric(key: str) -> float | None:
        value = m.get(key)
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)

    return Ended(name, run.data.tags.get(STATUS_TAG, "finished"), run.info.run_id, metric("linear_top1"),
                 metric("knn_top1"), metric("final_loss"), int(m.get("steps", 0) or 0), None,
                 metric("val_linear_top1"), metric("val_knn_top1"), run.data.tags.get(CODE_TAG, UNKNOWN))


def describe(digest: str) -> str:
    return f"code {digest[:8]}" if digest else "code unknown (made before code fingerprints)"


def other_code_name(name: str, code: CodeFingerprint) -> str:
    """The name this code trains a config under when a run of its plain name was made by other code."""
    return f"{name}-c{code.short}"


def interrupted_by_other_code(name: str, where: str, started: RunManifest, code: CodeFingerprint,
                              fresh: str) -> CodeChanged:
    """The refusal of an interrupted run whose code is not this checkout's: both fingerprints, the modules
    that differ where the run's manifest lists them, and the two ways on."""
    before = started.code_fingerprint
    diffs = code.differences(before) if before.modules else []
    shown = "; ".join(diffs[:8]) + (f"; ... ({len(diffs)} in all)" if len(diffs) > 8 else "")
    return CodeChanged(
        f"{where} was started by {describe(before.digest)} and this checkout's code is {code.digest[:8]}"
        + (f" ({shown})" if shown else "") + f": continuing would train one encoder with two versions of the "
        f"code. Start fresh ({fresh}), or continue and record the change in the run: {CONTINUE_FLAG}")


def continued_segments(started: RunManifest, code: CodeFingerprint, step: int | None) -> tuple[Mapping[str, Any], ...]:
    """The run's code segments once this code continues it from ``step``: the first segment is the code
    that started it."""
    first = started.segments or ({"code": started.code_fingerprint.digest, "from_step": 0},)
    return (*first, {"code": code.digest, "from_step": step})


__all__ = ["CONTINUE_FLAG", "CONTINUE_HELP", "REUSE_FLAG", "REUSE_HELP", "CodeChanged", "Ended", "continued_segments",
           "describe", "ended_run", "interrupted_by_other_code", "other_code_name"]
