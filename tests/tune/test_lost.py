"""Which trials a sweep runs again by itself: those whose process was lost, not those that raised.

The end-to-end case (a trial's process killed mid-training, the study finishing into one run) is
tests/train/test_faults.py; `make test-deploy` kills the container that holds it.
"""

from types import SimpleNamespace

from ray.exceptions import ActorDiedError, ActorUnavailableError, NodeDiedError, RayTaskError
from ray.train import TrainingFailedError

from mocolab.tune.lost import is_lost_process, lost_trials


def test_a_lost_actor_or_node_is_lost_and_an_error_of_the_training_is_not():
    assert is_lost_process(ActorUnavailableError("gone", b"0" * 16))  # the trial's node died (what Tune saw)
    assert is_lost_process(ActorDiedError())
    assert is_lost_process(NodeDiedError("node lost"))
    assert is_lost_process(RayTaskError("train", "tb", ActorDiedError()))  # the Train controller, passed on
    assert not is_lost_process(RayTaskError("train", "tb", ValueError("data.root: missing")))
    assert not is_lost_process(RayTaskError("train", "tb", TrainingFailedError("restarts used up")))
    assert not is_lost_process(ValueError("x")) and not is_lost_process(None)


def test_only_the_lost_trials_of_a_grid_are_named():
    def result(label, error):
        return SimpleNamespace(config={"trial": {"label": label, "overrides": {}}}, error=error)

    grid = [result("m=0.9 seed=0", None), result("m=0.99 seed=0", ActorUnavailableError("gone", b"1" * 16)),
            result("m=0.999 seed=0", RayTaskError("train", "tb", RuntimeError("diverged")))]
    assert lost_trials(grid) == ["m=0.99 seed=0"]
    assert lost_trials(None) == []
