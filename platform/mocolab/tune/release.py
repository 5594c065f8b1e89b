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
group its workers reported if Ray still holds it. A trial whose function
returned has nothing running on it: its group goes at once. A stopped or
failed one is still running when Tune tells its callbacks (Tune stops the
trial's actor after them): removing the group then would end the workers
under a live ``fit``, which would record the stop as the run's failure. So
its group goes once the trial's actor is dead, checked at each step of
Tune's loop, or at the sweep's end.

The cleaner itself is a detached actor (a process of its own): a controller
that shuts down stops it, but after a stopped trial it outlives its controller
wherever the state API cannot answer it (no dashboard, or several Rays on one
machine: its thread dies on "Found multiple active Ray instances"), one process
more for every trial ASHA stops, until the cluster ends. So when a trial ends,
and when the sweep ends, this callback also ends every cleaner whose controller
is gone: its one task, the group, is removed above.
"""

from __future__ import annotations

import os
import signal

import ray
from ray._private import state
from ray.tune import Callback
from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from mocolab.training.resources import PG_KEY


CLEANER = "PlacementGroupCleaner"  # Ray Train V2's watcher of its controller (train/v2/_internal/execution)


def release(pg_hex: str) -> bool:
    """Remove the placement group ``pg_hex`` if Ray still holds it; whether it did."""
    pg = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_hex)))
    if placement_group_table(pg).get("state", "REMOVED") == "REMOVED":
        return False
    remove_placement_group(pg)
    return True


def end_orphaned_cleaners() -> int:
    """End the alive Train placement-group cleaners whose owner (their Train controller) is no longer alive;
    returns how many.  The actor table comes from the GCS (``ray._private.state``): the public state API is
    the dashboard's, the very thing that is missing where cleaners are orphaned."""
    alive = state.actors(actor_state_name="ALIVE").values()
    addresses = {(a["Address"]["IPAddress"], a["Address"]["Port"]) for a in alive}
    ended = 0
    for actor in alive:
        owner = (actor["OwnerAddress"]["IPAddress"], actor["OwnerAddress"]["Port"])
        if actor["ActorClassName"] == CLEANER and owner not in addresses:
            _end_process(actor["Address"]["NodeID"], actor["Pid"])
            ended += 1
    return ended


def _end_process(node_id: str, pid: int) -> None:
    """SIGKILL an actor's process on its node: ``ray.kill`` takes only a handle, which only the actor's
    creator (the dead controller) held.  The cleaner is detached and never restarted, so Ray marks it dead."""
    if node_id == ray.get_runtime_context().get_node_id():
        _kill(pid)
        return
    task = ray.remote(num_cpus=0)(_kill)
    ray.get(task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(pid))


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended meanwhile
        pass


def actor_dead(actor_hex: str) -> bool:
    """Whether the actor ``actor_hex`` has ended (or is unknown to the GCS)."""
    return state.actors(actor_id=actor_hex).get("State", "DEAD") == "DEAD"


class ReleaseEndedTrials(Callback):
    """Tune callback: a trial that ended leaves no placement group of its workers behind, nor their cleaner."""

    def __init__(self, say=print) -> None:
        self.groups: dict[str, str] = {}  # trial id -> its workers' group, while the trial runs
        self.waiting: dict[str, tuple[str, str]] = {}  # trial id -> (group, its actor), until that actor is dead
        self.say = say

    def __getstate__(self) -> dict:  # Tune saves its callbacks with the experiment state
        return {"groups": dict(self.groups), "waiting": dict(self.waiting), "say": print}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result.get(PG_KEY):
            self.groups[trial.trial_id] = result[PG_KEY]

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._ended(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ended(trial)

    def on_step_end(self, iteration, trials, **info):
        for trial_id, (pg, actor) in list(self.waiting.items()):
            try:
                dead = actor_dead(actor)
            except Exception as err:  # noqa: BLE001 - the GCS did not answer: release it now, as before
                self.say(f"  could not tell whether trial {trial_id}'s process has ended: {err}")
                dead = True
            if dead:
                del self.waiting[trial_id]
                self._release(trial_id, pg)

    def on_experiment_end(self, trials, **info):
        for trial_id, (pg, _) in list(self.waiting.items()):  # the sweep is over: nothing runs on them
            self._release(trial_id, pg)
        self.waiting.clear()
        self._end_cleaners()

    def _ended(self, trial) -> None:
        pg = self.groups.pop(trial.trial_id, None)
        # its function reported its final result (Tune keeps the last; the property would ask the actor)
        returned = bool(trial.run_metadata.last_result.get("final"))
        actor = trial.temporary_state.ray_actor  # Tune stops it after its callbacks
        if pg and not returned and actor is not None:
            self.waiting[trial.trial_id] = (pg, actor._actor_id.hex())
        elif pg:
            self._release(trial.trial_id, pg)
        else:
            self._end_cleaners()

    def _release(self, trial_id: str, pg: str) -> None:
        try:
            if release(pg):
                self.say(f"  released the CPUs of stopped trial {trial_id}'s workers")
        except Exception as err:  # noqa: BLE001 - never let cleanup end a sweep; say it
            self.say(f"  could not release trial {trial_id}'s placement group {pg}: {err}")
        self._end_cleaners()

    def _end_cleaners(self) -> None:
        try:
            end_orphaned_cleaners()
        except Exception as err:  # noqa: BLE001 - as above
            self.say(f"  could not end the placement-group cleaners of ended Train runs: {err}")
