"""tune/release.py on a real Ray: what a trial stopped by ASHA leaves behind is ended with the trial or the sweep.

A trial that ASHA stops ends its Train controller without a shutdown; Ray Train's placement-group cleaner, a
detached actor the controller started, then outlives it wherever Ray's state API cannot answer it (a Ray without
the dashboard, as local studies start, or several Rays on one machine). Here a stand-in of that actor, of the same
class name, is started by an actor that is then killed, as Tune kills a stopped trial's controller.
"""

from __future__ import annotations

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
