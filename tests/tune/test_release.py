"""tune/release.py on a real Ray: what a trial stopped by ASHA leaves behind is ended with the trial or the sweep.

A trial that ASHA stops ends its Train controller without a shutdown; Ray Train's placement-group cleaner, a
detached actor the controller started, then outlives it wherever Ray's state API cannot answer it (a Ray without
the dashboard, as local studies start, or several Rays on one machine). Here a stand-in of that actor, of the same
class name, is started by an actor that is then killed, as Tune kills a stopped trial's controller.
"""

from __future__ import annotations

import os
import time

import pytest

from mocolab.tune.release import CLEANER, ReleaseEndedTrials


def _state(ray, actor) -> str:
    """An actor's state in the GCS, from its handle or its id."""
    from ray._private import state

    return state.actors(actor_id=actor if isinstance(actor, str) else actor._actor_id.hex())["State"]


@pytest.mark.slow
def test_a_cleaner_whose_controller_died_is_ended_with_the_sweep_and_a_live_one_is_kept(ray_session):
    ray = ray_session

    class Watcher:  # Ray Train's cleaner: it only waits
        def ping(self) -> bool:
            return True

    Watcher.__name__ = Watcher.__qualname__ = CLEANER

    @ray.remote(num_cpus=0)
    class Controller:
        def start_cleaner(self) -> str:
            """Only the cleaner's id leaves: its creator alone holds a handle to it, as in Ray Train."""
            self.cleaner = ray.remote(num_cpus=0)(Watcher).options(lifetime="detached").remote()
            ray.get(self.cleaner.ping.remote())
            return self.cleaner._actor_id.hex()

        def end_cleaner(self) -> None:
            ray.kill(self.cleaner)

    dying, living = Controller.remote(), Controller.remote()
    orphan = ray.get(dying.start_cleaner.remote())
    kept = ray.get(living.start_cleaner.remote())
    ray.kill(dying)  # as Tune ends a stopped trial, and its controller with it
    deadline = time.time() + 30
    while _state(ray, dying) != "DEAD" and time.time() < deadline:
        time.sleep(0.2)
    said: list[str] = []
    try:
        ReleaseEndedTrials(said.append).on_experiment_end([])
        deadline = time.time() + 30
        while _state(ray, orphan) != "DEAD" and time.time() < deadline:
            time.sleep(0.2)
        assert _state(ray, orphan) == "DEAD", "the cleaner of a dead controller outlived the sweep"
        assert _state(ray, kept) == "ALIVE", "a running Train run's cleaner was ended"
        assert said == []
    finally:
        ray.get(living.end_cleaner.remote())
        ray.kill(living)


@pytest.mark.slow
def test_a_trial_that_tune_stops_is_told_apart_from_one_that_fails(ray_session, tmp_path, monkeypatch):
    """ASHA's stop ends the trial's session, then Tune removes the trial's placement group and with it the Train
    controller that ``fit`` waits on: the error that follows must leave the run for the sweep to close as
    stopped early, not mark it failed (training/launch.py). Here Tune's own trainable is stopped as Tune stops a
    trial, with its function still running."""
    from ray import tune
    from ray.train._internal.storage import StorageContext
    from ray.tune.trainable.function_trainable import wrap_function

    from mocolab.training.launch import stopped_by_tune, tune_trial_session

    assert tune_trial_session() is None and not stopped_by_tune(None)  # a run outside Tune is never "stopped"
    seen = {}

    def trial(config):
        seen["session"] = tune_trial_session()
        seen["running"] = stopped_by_tune(seen["session"])
        tune.report({"epoch": 1})
        time.sleep(30)  # still inside fit when Tune stops the trial

    # Tune's trainable moves its process into the trial's folder, which pytest deletes later: this test's
    # process goes back to where it stood, or every later test on its worker runs in a deleted folder
    monkeypatch.chdir(os.getcwd())
    storage = StorageContext(storage_path=str(tmp_path), experiment_dir_name="sweep", trial_dir_name="trial")
    trainable = wrap_function(trial)(config={}, storage=storage)
    assert trainable.train()["epoch"] == 1
    assert seen["session"] is not None and seen["running"] is False
    assert not stopped_by_tune(seen["session"])  # between reports: the trial runs on
    trainable.stop()  # what Tune's graceful stop of the trial's actor calls
    assert stopped_by_tune(seen["session"])


@pytest.mark.slow
def test_a_stopped_trials_workers_keep_their_group_until_the_trial_has_ended(ray_session):
    """Tune calls its callbacks before it stops the trial's actor: a stopped trial's workers' group goes once
    that actor is dead (at a later step of Tune's loop), a returned trial's at once, any left at the sweep's end."""
    from ray.tune.experiment import Trial
    from ray.util.placement_group import placement_group, placement_group_table

    from mocolab.training.resources import PG_KEY

    ray = ray_session

    @ray.remote(num_cpus=0)
    class TrialActor:  # what Tune asks of a trial's actor when it is set on the trial
        def get_auto_filled_metrics(self, debug_metrics_only=True):
            return {}

    def trial_with_group(name: str):
        trial = Trial("trainable", stub=True, trial_id=name)
        pg = placement_group([{"CPU": 0.01}])
        ray.get(pg.ready(), timeout=60)
        actor = TrialActor.remote()
        trial.set_ray_actor(actor)
        return trial, pg, actor

    def removed(pg) -> bool:
        return placement_group_table(pg)["state"] == "REMOVED"

    said: list[str] = []
    cb = ReleaseEndedTrials(said.append)
    stopped, stopped_pg, stopped_actor = trial_with_group("stopped")
    done, done_pg, _ = trial_with_group("done")
    left, left_pg, _ = trial_with_group("left")
    for trial, pg in ((stopped, stopped_pg), (done, done_pg), (left, left_pg)):
        cb.on_trial_result(0, [], trial, {PG_KEY: pg.id.hex()})
    done.update_last_result({"final": 1.0})  # the trial function's last report, as Tune records it
    for trial in (stopped, done, left):
        cb.on_trial_complete(0, [], trial)
    assert removed(done_pg), "a trial whose function returned kept its workers' group"
    cb.on_step_end(1, [])
    assert not removed(stopped_pg), "a stopped trial's group went while its actor still ran"
    ray.kill(stopped_actor)
    deadline = time.time() + 30
    while _state(ray, stopped_actor) != "DEAD" and time.time() < deadline:
        time.sleep(0.2)
    cb.on_step_end(2, [])
    assert removed(stopped_pg) and not removed(left_pg)
    cb.on_experiment_end([])
    assert removed(left_pg)
    assert sorted(said) == [f"  released the CPUs of stopped trial {t}'s workers" for t in ("done", "left", "stopped")]
