"""What `mocolab train` prints when Ray is not alone: the run's lines, not Ray Train's housekeeping."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mocolab.data.sets import fashion_mnist_dir
from mocolab.training.ray_output import keep

REPO = Path(__file__).resolve().parents[2]


def _batch(lines, actor="RayTrainWorker"):
    return {"ip": "10.0.0.1", "pid": 42, "actor_name": actor, "task_name": "", "is_err": False, "lines": lines}


@pytest.mark.parametrize("lines, actor", [
    (["Exception in thread PlacementGroupCleanerMonitor:", "Traceback (most recent call last):",
      "ConnectionError: Found multiple active Ray instances: {'a:1', 'b:2'}."], "PlacementGroupCleaner"),
    (["Reporting training result 3: TrainingReport(checkpoint=Checkpoint(filesystem=local, path=/x))"],
     "RayTrainWorker"),
    (["Requesting resources: {'CPU': 1.0} * 2",
      "Attempting to start training worker group of size 2 with the following resources: [{'CPU': 1.0}] * 2",
      "Started training worker group of size 2: ", "- (ip=10.0.0.1, pid=9924) world_rank=0, local_rank=0, node_rank=0",
      "[2026-12-02 02:16:42,851 E 9681 9792] core_worker.cc:2465: Actor with class name: 'PreemptionWatcher' and "
      "ID: '32' has constructor arguments in the object store and max_restarts > 0."], "TrainController"),
    (["Setting up process group for: env:// [rank=0, world_size=2]", "Progress bars disabled"], "RayTrainWorker"),
])
def test_ray_trains_housekeeping_is_kept_from_the_terminal(lines, actor):
    assert keep(_batch(lines, actor)) is None


def test_a_slow_cleaner_stop_traceback_is_kept_out_even_across_batches():
    """Logged by the controller when the cleaner takes over 12 s to stop (a busy machine); the run is fine."""
    head = ["Run finished: saving the result",
            "2026-12-02 08:13:44,123\tERROR placement_group_callback.py:130 -- Failed to stop "
            "PlacementGroupCleaner gracefully.", "Traceback (most recent call last):",
            '  File "/x/placement_group_callback.py", line 126, in _stop_cleaner']
    tail = ["    ray.get(self._cleaner.stop.remote(), timeout=self._stop_timeout)", "",
            "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.", "Controller done"]
    assert keep(_batch(head, "TrainController"))["lines"] == ["Run finished: saving the result"]
    assert keep(_batch(tail, "TrainController"))["lines"] == ["Controller done"]
    ours = ["Traceback (most recent call last):", "RuntimeError: the controller's own failure"]
    assert keep(_batch(ours, "TrainController"))["lines"] == ours  # later tracebacks come through


def test_a_timed_out_resource_request_traceback_is_kept_out():
    """Logged by the controller's autoscaling client when a request waits too long (an overloaded CPU, CI)."""
    lines = ["Failed to send resource request for train-b1266aaac74c414590ec8520e4cbe251. If this only happens "
             "transiently during network partition or CPU being overloaded, it's safe to ignore this error.",
             "Traceback (most recent call last):",
             '  File "/x/autoscaling_coordinator_client.py", line 58, in send_resource_request',
             "    ray.get(", '  File "python/ray/includes/common.pxi", line 107, in ray._raylet.check_status',
             "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
             "epoch   2  step      8/8  loss 4.0100  pretext 35.1%  kNN 40.10%  1010 img/s"]
    assert keep(_batch(lines, "TrainController"))["lines"] == lines[-1:]


def test_the_runs_own_lines_and_errors_come_through():
    ours = ["epoch   1  step      4/8  loss 4.1920  pretext 31.8%  kNN 37.20%  1072 img/s",
            "Traceback (most recent call last):", "RuntimeError: the worker's own failure"]
    mixed = _batch(["Reporting training result 1: TrainingReport(...)", *ours])
    assert keep(mixed)["lines"] == ours
    failure = ["Training failed: worker group of size 2 died; retrying from the latest checkpoint (1 of 3)"]
    assert keep(_batch(failure, "TrainController"))["lines"] == failure


@pytest.mark.slow
@pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")
def test_mocolab_train_beside_a_second_ray_prints_only_the_run(tmp_path):
    """A second local Ray (another study, a notebook) makes Ray Train's cleaner fail to find its own;
    `mocolab train` with a worker must still print the run and nothing of that, and --verbose everything."""
    other = subprocess.Popen([sys.executable, "-c", "import ray, time; ray.init(address='local', num_cpus=1, "
                              "include_dashboard=False); print('up', flush=True); time.sleep(600)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "up"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST") and k != "RAY_ADDRESS"}
        args = [sys.executable, "-m", "mocolab", "train", "--preset", "smoke", "--tracking-uri",
                f"sqlite:///{tmp_path / 'mlflow.db'}"]
        for kv in ("run.num_workers=1", "optim.max_steps=8", "data.subset=512", "queue.size=256",
                   "eval.knn_bank=256", "eval.linear_train=256", "eval.knn_test=300", "eval.linear_steps=5",
                   f"run.output_dir={tmp_path / 'runs'}"):
            args += ["--set", kv]
        t0 = time.monotonic()
        out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        text = out.stdout + out.stderr
        assert "final kNN and linear probe" in text and "run 'smoke-" in text and "finished" in text
        for noise in ("PlacementGroupCleaner", "Traceback", "Found multiple active Ray instances",
                      "Reporting training result", "Requesting resources", "Started training worker group",
                      "Setting up process group"):
            assert noise not in text, f"{noise!r} in the output of `mocolab train`:\n{text[-3000:]}"
        verbose = subprocess.run([*args, "--set", "run.name=verbose", "--verbose"], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=max(60.0, 600 - (time.monotonic() - t0)))
        assert verbose.returncode == 0, verbose.stdout[-3000:] + verbose.stderr[-3000:]
        assert "Reporting training result" in verbose.stdout + verbose.stderr  # kept, not lost
    finally:
        other.kill()
        other.wait()
