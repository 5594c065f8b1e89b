"""Which trials a sweep runs again by itself: those whose process was lost, not those that raised.

The end-to-end case (a trial's process killed mid-training, the study finishing into one run) is
tests/training/test_faults.py; `make test-deploy` kills the container that holds it.
"""

from types import SimpleNamespace

from ray.exceptions import ActorDiedError, ActorUnavailableError, NodeDiedError, RayTaskError
from ray.train import TrainingFailedError

from mocolab.training.lock import InUseError
from mocolab.tune.lost import is_lost_process, lost_trials, unrecorded_errors


def test_a_lost_actor_or_node_is_lost_and_an_error_of_the_training_is_not():
    assert is_lost_process(ActorUnavailableError("gone", b"0" * 16))  # the trial's node died (what Tune saw)
    assert is_lost_process(ActorDiedError())
    assert is_lost_process(NodeDiedError("node lost"))
    assert is_lost_process(RayTaskError("train", "tb", ActorDiedError()))  # the Train controller, passed on
    assert not is_lost_process(RayTaskError("train", "tb", ValueError("data.root: missing")))
    assert not is_lost_process(RayTaskError("train", "tb", TrainingFailedError("restarts used up")))
    assert not is_lost_process(ValueError("x")) and not is_lost_process(None)


def result(label, error):
    return SimpleNamespace(config={"trial": {"label": label, "overrides": {}}}, error=error)


def test_only_the_lost_trials_of_a_grid_are_named():
    grid = [result("m=0.9 seed=0", None), result("m=0.99 seed=0", ActorUnavailableError("gone", b"1" * 16)),
            result("m=0.999 seed=0", RayTaskError("train", "tb", RuntimeError("diverged")))]
    assert lost_trials(grid) == ["m=0.99 seed=0"]
    assert lost_trials(None) == []


def test_a_grid_trial_that_errored_without_an_mlflow_run_is_named_with_its_own_error():
    """The trials MLflow cannot show the sweep: errored in Tune and absent from the child runs. A trial that
    failed in training has its run (it says why there); a search's trial (no grid label) is counted by the
    sweep instead."""
    in_use = RayTaskError("train", "Traceback ...\nmocolab.lock.InUseError: ...",
                          InUseError("run 'a' is in use by pid 7"))
    grid = [result("m=0.9 seed=0", None), result("m=0.99 seed=0", in_use),
            result("m=0.999 seed=0", RayTaskError("train", "tb", RuntimeError("injected fault"))),
            result("m=0 seed=0", ActorUnavailableError("gone", b"2" * 16)),
            SimpleNamespace(config={"moco.m": 0.9}, error=RuntimeError("search trial"))]
    recorded = {"m=0.9 seed=0", "m=0.999 seed=0"}
    named = unrecorded_errors(grid, recorded)
    assert named[0] == "m=0.99 seed=0: InUseError: run 'a' is in use by pid 7"  # Ray's wrapper taken off
    assert len(named) == 2 and named[1].startswith("m=0 seed=0: ActorUnavailableError: The actor "), named
    assert unrecorded_errors(None, set()) == []
