"""Give back the CPUs of a trial that Tune stops early.

A trial is a Ray Train run started from inside a Tune trial. When ASHA stops
the trial, Tune ends the trial's actor, and with it (fate sharing) the Train
controller it owns, before the controller can remove its workers' placement
group. Ray Train leaves that to a cleaner actor that asks Ray's state API
whether the controller is alive; that API needs the dashboard (which local
studies do not start) and one Ray on the machine, so here the group would never
be removed: its CPUs would stay reserved and, on two cores, the next trial
would wait for them forever.

Each worker reports the placement group it runs in (``PG_KEY``, with every
report); when a trial ends for any reason, this callback removes the last
group its workers reported if Ray still holds it.
"""

from __future__ import annotations

import ray
from ray.tune import Callback
from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

from mocolab.training.resources import PG_KEY


def release(pg_hex: str) -> bool:
    """Remove the placement group ``pg_hex`` if Ray still holds it; whether it did."""
    pg = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_hex)))
    if placement_group_table(pg).get("state", "REMOVED") == "REMOVED":
        return False
    remove_placement_group(pg)
    return True


class ReleaseEndedTrials(Callback):
    """Tune callback: a trial that ended leaves no placement group of its workers behind."""

    def __init__(self, say=print) -> None:
        self.groups: dict[str, str] = {}
        self.say = say

    def __getstate__(self) -> dict:  # Tune saves its callbacks with the experiment state
        return {"groups": dict(self.groups), "say": print}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get(PG_KEY):
            self.groups[trial.trial_id] = result[PG_KEY]

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._release(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._release(trial)

    def _release(self, trial) -> None:
        pg = self.groups.pop(trial.trial_id, None)
        try:
            if pg and release(pg):
                self.say(f"  released the CPUs of stopped trial {trial.trial_id}'s workers")
        except Exception as err:  # noqa: BLE001 - never let cleanup end a sweep; say it
            self.say(f"  could not release trial {trial.trial_id}'s placement group {pg}: {err}")
