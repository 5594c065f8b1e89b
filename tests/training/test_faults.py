"""What survives what: the run and sweep lifecycle off the happy path, as a specification.

Real processes throughout: real Ray (the session's local instance), real MLflow
(sqlite), real gloo process groups, real signals (SIGKILL) sent to real writers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import mlflow_store, start_mlflow_server, stop_mlflow_server
from mocolab.config import ConfigMismatchError, build_config
from mocolab.data.sets import fashion_mnist_dir
from mocolab.training.lock import InUseError, NameLock
from mocolab.training.trainer import Trainer
from mocolab.config.manifest import FORMAT_VERSION, MANIFEST, OldRunFormat, RunManifest
from mocolab.tracking import Store
from mocolab.training import fit
from mocolab.training.checkpoint import load_rank_state, save_rank_state
from mocolab.training.resources import check_placement

REPO = Path(__file__).resolve().parents[2]
needs_fmnist = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")

TINY = {"data.subset": 1024, "eval.knn_bank": 1024, "eval.knn_test": 500, "eval.linear_train": 1024,
        "eval.linear_steps": 20, "optim.max_steps": 12, "queue.size": 512, "run.log_models": False}


def _cfg(tmp_path: Path, **over):
    return build_config("smoke", {**TINY, "run.output_dir": str(tmp_path / "runs"), "run.experiment": "faults",
                                  **over})


def _runs(uri: str, experiment: str = "faults") -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id])


# ----------------------------------------------------------------------------------- 1. resume never mixes configs

@pytest.mark.slow
@needs_fmnist
def test_resume_with_other_settings_is_refused_before_any_work(tmp_path):
    uri = mlflow_store(tmp_path)
    cfg = _cfg(tmp_path, **{"run.name": "same-name", "optim.max_steps": 4})
    first = fit(cfg, tracking_uri=uri, progress=lambda _m: None)
    checkpoint = Path(first.checkpoint_path) / "rank0.pt"
    assert checkpoint.is_file(), "W = 0 reports a checkpoint that exists"
    before = checkpoint.stat().st_mtime_ns
    changed = cfg.replace(**{"moco.m": 0.9, "queue.size": 256})
    with pytest.raises(ConfigMismatchError) as info:
        fit(changed, tracking_uri=uri, progress=lambda _m: None)
    msg = str(info.value)
    assert "moco.m: 0.99 -> 0.9" in msg and "queue.size: 512 -> 256" in msg and "run.name" in msg
    assert checkpoint.stat().st_mtime_ns == before, "a refused resume touched the checkpoint"
    runs = _runs(uri)
    assert len(runs) == 1 and runs[0].data.params["moco.m"] == "0.99"
    # one manifest, in the folder and on the MLflow run: the config, its fingerprint, the run format
    manifest = RunManifest.from_dict(json.loads((tmp_path / "runs" / "same-name" / MANIFEST).read_text()), MANIFEST)
    assert manifest == RunManifest.of(cfg) and manifest.format == FORMAT_VERSION
    assert runs[0].data.tags["mocolab.config_fingerprint"] == manifest.fingerprint
    assert runs[0].data.tags["mocolab.run_format"] == str(FORMAT_VERSION)
    assert not (tmp_path / "runs" / "same-name" / "config.json").exists()
    # what may change between attempts (failure limits, threads, storage details) does not count
    again = fit(cfg.replace(**{"run.max_failures": 5, "run.threads": 1}), tracking_uri=uri, progress=lambda _m: None)
    assert again.resumed and again.mlflow_run_id == first.mlflow_run_id


def _format1_folder(folder: Path, cfg) -> dict[str, int]:
    """A run folder as run format 1 left it (mocolab 0.1.0): a config record and a local-mode checkpoint whose
    file carries the config; the files' modification times, to show nothing touched them."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg.flatten(), indent=1, default=str))
    (folder / "local-checkpoint").mkdir()
    torch.save({"format": 1, "rank": 0, "world_size": 1, "config": cfg.to_dict(), "state": {"step": 4}},
               folder / "local-checkpoint" / "rank0.pt")
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
@needs_fmnist
def test_a_run_of_an_older_format_is_refused_in_one_line_before_any_work(tmp_path, capsys):
    """Run format 1 is refused, not converted: in its folder (by `mocolab train`, exit 2), in its checkpoint
    file, and in an MLflow run it left unfinished where no folder is left. Each error is one line that
    names the run, the mocolab that can finish it and how to start fresh, and nothing is written."""
    from mocolab.cli.commands import main

    uri = mlflow_store(tmp_path)
    cfg = _cfg(tmp_path, **{"run.name": "old-run"})
    folder = tmp_path / "runs" / "old-run"
    before = _format1_folder(folder, cfg)
    args = ["train", "--preset", "smoke", "--tracking-uri", uri,
            *[f"--set={k}={v}" for k, v in {**TINY, "run.output_dir": tmp_path / "runs", "run.experiment": "faults",
                                             "run.name": "old-run"}.items()]]
    assert main(args) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if "old-run" in line]
    assert len(said) == 1, said  # one line
    err = said[0]
    assert f"run 'old-run' ({folder}) was started by mocolab 0.1.0 (run format 1)" in err
    assert "finish it with mocolab 0.1.0" in err and "--set run.name=<a new name>" in err and f"remove {folder}" in err
    with pytest.raises(OldRunFormat, match="^run 'old-run' .* mocolab 0.1.0"):
        fit(cfg, tracking_uri=uri, progress=lambda _m: None)
    with pytest.raises(OldRunFormat, match=r"^run 'old-run' \(checkpoint .*rank0.pt\) was started by mocolab 0.1.0 "
                                           r"\(run format 1\)[^\n]*--set run.name=<a new name>"):
        load_rank_state(folder / "local-checkpoint", 0, 1)
    after = {str(p): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before and _runs(uri) == []  # no manifest, no checkpoint, no MLflow run
    # an unfinished trial of run format 1 in a carried-over store, its folder gone: refused by its MLflow record
    client = MlflowClient(uri)
    exp = client.create_experiment("faults")
    old = client.create_run(exp, run_name="old-trial", tags={"mocolab.run_name": "old-trial", "preset": "smoke",
                                                             "mocolab.config_fingerprint": "e70fb97a9bf2235c"})
    Store(uri).log_params(old.info.run_id, {k: v for k, v in cfg.flatten().items() if k != "run.name"})
    client.set_tag(old.info.run_id, "mocolab.status", "stopped")
    client.set_terminated(old.info.run_id, "KILLED")
    with pytest.raises(OldRunFormat) as info:
        fit(cfg.replace(**{"run.name": "old-trial"}), tracking_uri=uri, progress=lambda _m: None)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"run 'old-trial' (MLflow run {old.info.run_id}) was started by "
                                              f"mocolab 0.1.0 (run format 1)")
    assert "delete that MLflow run" in msg
    assert not (tmp_path / "runs" / "old-trial" / MANIFEST).exists()
    assert [r.info.run_id for r in _runs(uri)] == [old.info.run_id]
    assert client.get_run(old.info.run_id).info.status == "KILLED"


# ----------------------------------------------------------------------------------- 3. impossible requests

def test_requests_the_cluster_can_never_meet_are_errors(tmp_path, ray_session):
    two_cpus = [{"CPU": 2.0, "GPU": 0.0}]
    with pytest.raises(ValueError, match=r"no node has 1 GPU \(node 0: 2 CPU, 0 GPU\)"):
        check_placement(1, 1.0, 1.0, nodes=two_cpus)
    with pytest.raises(ValueError, match="no node has 8 CPU"):
        check_placement(1, 8.0, 0.0, nodes=two_cpus)
    with pytest.raises(ValueError, match="at most 2 such worker"):
        check_placement(3, 1.0, 0.0, nodes=two_cpus)
    with pytest.raises(ValueError, match="at most 4 such worker"):  # per-node sizes count, not only the total
        check_placement(5, 1.5, 0.0, nodes=[{"CPU": 2.0, "GPU": 0.0}] * 4)  # 8 CPUs, but one worker a node
    check_placement(4, 1.5, 0.0, nodes=[{"CPU": 2.0, "GPU": 0.0}] * 4)
    # strict_spread: one worker per node; two nodes cannot host three, whatever their CPUs
    with pytest.raises(ValueError, match=r"run.placement=strict_spread .* only 2 node\(s\) can take one"):
        check_placement(3, 1.0, 0.0, nodes=[{"CPU": 8.0, "GPU": 0.0}] * 2, placement="strict_spread")
    check_placement(3, 1.0, 0.0, nodes=[{"CPU": 8.0, "GPU": 0.0}] * 2, placement="spread")
    with pytest.raises(ValueError, match=r"run.placement: unknown value 'scatter'; "
                                         r"choose one of \['pack', 'spread', 'strict_spread'\]"):
        build_config("smoke", {"run.placement": "scatter"})
    # through fit, against the real local Ray: refused before any MLflow run exists
    uri = mlflow_store(tmp_path)
    for over, match in (({"run.num_workers": 1, "run.gpus_per_worker": 1, "run.device": "auto"}, "GPU"),
                        ({"run.num_workers": 1, "run.cpus_per_worker": 64}, "no node has 64 CPU"),
                        ({"run.num_workers": 4, "optim.batch_size": 128}, "at most 2 such worker"),
                        ({"run.num_workers": 1, "run.device": "cuda"}, "run.device")):
        with pytest.raises(ValueError, match=match):
            fit(_cfg(tmp_path, **over), tracking_uri=uri, progress=lambda _m: None)
    assert _runs(uri) == []
    with pytest.raises(ValueError, match="run.cpus_per_worker"):
        build_config("smoke", {"run.cpus_per_worker": 0})


# ----------------------------------------------------------------------------------- 4. one writer, atomic files

_HOLDER = """
import sys, time
from mocolab.training.lock import NameLock
lock = NameLock(sys.argv[1], "run 'x'").acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InUseError, match=rf"run 'x' is in use by pid {holder.pid} on "):
            NameLock(folder, "run 'x'").acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    said: list[str] = []
    with NameLock(folder, "run 'x'", say=said.append):
        pass
    assert len(said) == 1 and f"taking over the lock of pid {holder.pid}" in said[0]
    said.clear()
    with NameLock(folder, "run 'x'", say=said.append):  # released cleanly last time: nothing to say
        pass
    assert said == []


_WRITER = """
import sys, torch
from mocolab.config.manifest import RunManifest
from mocolab.training.checkpoint import save_rank_state
step = 0
while True:
    step += 1
    save_rank_state({"step": step, "w": torch.full((256, 1024), float(step))}, RunManifest("w", {"c": 1}, ""),
                    sys.argv[1], 0, 1)
    print(step, flush=True)
"""


WRITTEN = RunManifest("w", {"c": 1}, "")  # what _WRITER's files carry


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    folder = tmp_path / "ckpt"
    save_rank_state({"step": 0, "w": torch.zeros(256, 1024)}, WRITTEN, folder, 0, 1)
    last = 0
    for delay in (0.05, 0.13, 0.31, 0.47, 0.7):  # different points of a ~1 MB write
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(folder)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip().isdigit()  # the first checkpoint is written: writes go on
        time.sleep(delay)  # somewhere inside a later write
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        state, manifest = load_rank_state(folder, 0, 1)
        assert manifest == WRITTEN and (state["w"] == float(state["step"])).all()
        last = state["step"]
    assert last > 0, "the writer never completed a checkpoint"
    save_rank_state({"step": -1, "w": torch.zeros(1)}, WRITTEN, folder, 0, 1)
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.pt"], "a temporary file was left behind"


# ----------------------------------------------------------------------------------- 6. faults during training

def _diverge_on_one_rank(rank: int, world: int) -> dict:
    cfg = build_config("smoke", {"data.name": "synthetic", "data.synthetic_size": 512, "data.subset": None,
                                 "optim.batch_size": 64, "queue.size": 256, "run.num_workers": world,
                                 "moco.bn": "shuffle", "optim.max_steps": 16, "run.device": "cpu"})
    tr = Trainer(cfg)

    def poison(t: Trainer) -> None:
        if t.step == 3 and rank == world - 1:  # only the last rank's weights go bad
            with torch.no_grad():
                for p in t.encoder.parameters():
                    p.fill_(float("nan"))

    loss, _, _, diverged = tr.train_epoch(on_step=poison)
    return {"diverged": diverged, "step": tr.step}


@pytest.mark.slow
def test_divergence_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    from gloo_launch import launch  # the gloo launcher of the distributed tests

    results = launch(_diverge_on_one_rank, 2, tmp_path, timeout=90)
    assert results == [{"diverged": True, "step": 3}] * 2


@pytest.mark.slow
@needs_fmnist
def test_local_mode_restarts_from_its_checkpoint_like_ray_workers(tmp_path):
    uri = mlflow_store(tmp_path)
    said: list[str] = []
    cfg = _cfg(tmp_path, **{"run.name": "local-fault", "run.fault_step": 10, "run.max_failures": 1,
                            "run.checkpoint_every": 4})
    out = fit(cfg, tracking_uri=uri, progress=said.append)
    assert (tmp_path / "runs" / "local-fault" / ".fault-injected").is_file()
    assert any("restarting from its latest checkpoint (1/1)" in m for m in said)
    assert out.status == "finished" and out.steps == 12
    assert out.checkpoint_path and (Path(out.checkpoint_path) / "rank0.pt").is_file()
    state, _ = load_rank_state(out.checkpoint_path, 0, 1)
    assert state["step"] == 12
    # Ray's layout, and Ray's num_to_keep: checkpoint_<time>/rank0.pt in the run's folder, the newest kept
    folder = tmp_path / "runs" / "local-fault"
    kept = sorted(p.name for p in folder.glob("checkpoint_*"))
    assert Path(out.checkpoint_path).parent == folder and kept[-1] == Path(out.checkpoint_path).name
    assert len(kept) == cfg.run.keep_checkpoints and (folder / MANIFEST).is_file()
    run = MlflowClient(uri).get_run(out.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.tags["mocolab.status"] == "finished"
    # with no failures allowed the same fault fails the run, recorded with its reason
    cfg0 = _cfg(tmp_path, **{"run.name": "local-fault-0", "run.fault_step": 6, "run.max_failures": 0})
    with pytest.raises(Exception, match="injected fault"):
        fit(cfg0, tracking_uri=uri, progress=lambda _m: None)
    failed = [r for r in _runs(uri) if r.data.tags.get("mocolab.run_name") == "local-fault-0"]
    assert len(failed) == 1 and failed[0].info.status == "FAILED"
    assert "injected fault" in failed[0].data.tags["mocolab.failure_reason"]


# ----------------------------------------------------------------------------------- 2 + 5. paths and signals

STUDY_TINY = ["--set=data.subset=1024", "--set=eval.knn_bank=1024", "--set=eval.knn_test=500",
              "--set=eval.linear_train=1024", "--set=eval.linear_steps=20", "--set=optim.max_steps=24",
              "--set=queue.size=512", "--set=run.log_models=false"]


def _study_cmd(*extra: str, workers: int = 0) -> list[str]:
    """The momentum study on two settings, training in its trials' processes unless ``workers``: Ray Train
    workers are the default a user gets, and the SIGKILL test keeps them."""
    # relative store and storage: they must mean the folder the command runs in, whatever Ray does
    return [sys.executable, str(REPO / "experiments/momentum_ablation.py"), "--preset", "smoke",
            "--momenta", "0.9,0.99", "--max-concurrent", "1", "--name", "sig", "--tracking-uri",
            "sqlite:///rel.db", "--storage", "rel/sweeps", "--workers-per-trial", str(workers), *STUDY_TINY, *extra]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}


@pytest.mark.slow
@needs_fmnist
@pytest.mark.parametrize("signals", [(signal.SIGTERM,), (signal.SIGINT, signal.SIGINT)],
                         ids=["sigterm", "ctrl-c-twice"])
def test_a_signalled_study_closes_every_run_and_the_same_command_resumes(tmp_path, signals):
    proc = subprocess.Popen(_study_cmd(), cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    seen = []
    try:
        deadline = time.time() + 720
        for line in proc.stdout:  # wait until a trial is training (its first epoch line), then signal the driver
            seen.append(line)
            if "] epoch " in line and "loss" in line:
                break
            assert time.time() < deadline, "".join(seen[-40:])
        for s in signals:
            proc.send_signal(s)
            time.sleep(0.3)
        rest, _ = proc.communicate(timeout=540)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen) + rest
    assert proc.returncode == 128 + signals[0], out[-3000:]
    assert "interrupted" in out and "run the same command again to resume" in out
    if len(signals) > 1:
        assert "again: still closing runs" in out
    uri = f"sqlite:///{tmp_path / 'rel.db'}"
    runs = _runs(uri, "momentum-ablation")
    assert runs, "the relative store was not where the command ran"
    assert not [r for r in runs if r.info.status == "RUNNING"], "a run was left RUNNING"
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parent) == 1 and parent[0].info.status == "KILLED"
    assert parent[0].data.tags["mocolab.status"] == "interrupted"
    client = MlflowClient(uri)
    for r in runs:
        if "mlflow.parentRunId" in r.data.tags:  # what a trial logged before the signal: each step once, no gap
            steps = _logged_once(client, r.info.run_id, "m")
            assert steps == list(range(1, len(steps) + 1)), (r.data.tags["trial"], steps)
    assert (tmp_path / "rel" / "sweeps" / "sig" / "train").is_dir(), "relative storage not under the command's folder"
    if len(signals) > 1:
        return  # the resume after an interruption is the same whichever signal it was: checked once, after SIGTERM

    # the same name with other settings is refused before any work, and adds no run
    other = subprocess.run(_study_cmd("--set=optim.lr=0.1"), cwd=tmp_path, env=_env(), capture_output=True,
                           text=True, timeout=1800)
    assert other.returncode == 2, other.stdout[-3000:] + other.stderr[-3000:]
    assert "sweep 'sig'" in other.stderr and "sweep.set.optim.lr: (absent) -> 0.1" in other.stderr, other.stderr
    assert len(_runs(uri, "momentum-ablation")) == len(runs)
    again = subprocess.run(_study_cmd(), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=1800)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    runs = _runs(uri, "momentum-ablation")
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    assert sorted(r.data.tags["trial"] for r in children) == ["m=0.9 seed=0", "m=0.99 seed=0"], "no duplicates"
    for r in children:
        assert r.info.status == "FINISHED" and "linear_top1" in r.data.metrics
        assert r.data.metrics["loss"] > 0  # the metrics landed in the relative store too
        assert _logged_once(client, r.info.run_id, "m") == list(range(1, 25))  # every step once, across the signal


# _train_cmd's run: the smoke preset's 4 epochs of batch 128 on 2,048 images, 16 steps each
TRAIN_STEPS = 4 * 2048 // 128


def _train_cmd(name: str) -> list[str]:
    """`mocolab train` of a small run (TRAIN_STEPS steps) that checkpoints every 8, its store and folder relative."""
    return [str(Path(sys.executable).with_name("mocolab")), "train", "--preset", "smoke",
            "--tracking-uri", "sqlite:///m.db", "--set", f"run.name={name}", "--set", "run.experiment=faults",
            "--set", "run.output_dir=runs", "--set", "run.checkpoint_every=8", "--set", "data.subset=2048",
            "--set", "eval.knn_bank=1024", "--set", "eval.knn_test=500", "--set", "eval.linear_steps=20"]


def _until(proc: subprocess.Popen, started: str, timeout: float = 900) -> str:
    """Read ``proc``'s output until a line holding ``started`` (a trial or run is training); what was read."""
    seen = []
    deadline = time.time() + timeout
    for line in proc.stdout:
        seen.append(line)
        if started in line and "loss" in line:
            return "".join(seen)
        assert time.time() < deadline, "".join(seen[-40:])
    pytest.fail(f"the process ended before {started!r}: {''.join(seen[-40:])}")


def _logged_once(client: MlflowClient, run_id: str, key: str) -> list[int]:
    """The steps ``key`` was logged at, sorted, after checking none was logged twice: a resume that logs a
    step again would otherwise only show as a longer history."""
    steps = [m.step for m in client.get_metric_history(run_id, key)]
    assert len(steps) == len(set(steps)), f"{key} logged twice at some step: {sorted(steps)}"
    return sorted(steps)


def _trial_driver(study_pid: int):
    """The Tune actor process a study's trial runs in (Tune's class for a function trainable)."""
    import psutil

    titles = {}
    for p in psutil.Process(study_pid).children(recursive=True):
        try:
            titles[p] = " ".join(p.cmdline())
        except psutil.Error:  # a Ray worker that ended between the listing and the read
            pass
    found = [p for p, title in titles.items() if title.startswith("ray::ImplicitFunc")]
    assert len(found) == 1, f"no single trial driver among the study's processes: {sorted(titles.values())}"
    return found[0]


@pytest.mark.slow
@needs_fmnist
def test_a_study_killed_with_sigkill_resumes_and_a_lost_trial_runs_again_into_its_one_run(tmp_path):
    """Two faults of one study on a Ray Train worker (what a user's study runs on), each where it strikes:

    1. SIGKILL to the study and what it started, in its trial's first epoch: no handler runs, and the runs
       it leaves RUNNING and its lock are the next command's to take over.
    2. The same command resumes; in its trial, the trial's process dies (what a node lost under a trial's
       driver does; `make test-deploy` kills such a node). Ray Train's restarts cannot bring back the
       controller that makes them: the study runs the trial again itself, from its checkpoint, and ends.

    After both: one MLflow run for the trial, finished, every step's metrics logged once."""
    study = _study_cmd("--momenta", "0.99", workers=1)
    proc = subprocess.Popen(study, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _until(proc, "] epoch ")
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and what it started in its session, as `kill -9 -PGID`
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    uri = f"sqlite:///{tmp_path / 'rel.db'}"
    assert [r.info.status for r in _runs(uri, "momentum-ablation")] == ["RUNNING"] * 2  # what SIGKILL leaves

    again = subprocess.Popen(study, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = _until(again, "] epoch ")
        _trial_driver(again.pid).kill()
        rest, _ = again.communicate(timeout=900)
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
    out = seen + rest
    assert again.returncode == 0, out[-4000:]
    assert "taking over the lock of pid" in out, out[-4000:]
    assert "m=0.99 seed=0: the trial's process was lost" in out and "(1/2, run.max_failures)" in out, out[-4000:]
    assert "sweep: 1/1 trials done" in out, out[-4000:]  # the lost attempt is not counted as a trial
    client = MlflowClient(uri)
    runs = _runs(uri, "momentum-ablation")
    assert not [r for r in runs if r.info.status == "RUNNING"], "a run was left RUNNING"
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED", [r.info for r in parent]
    assert [r.data.tags["trial"] for r in children] == ["m=0.99 seed=0"], "one run for the trial"
    for r in children:
        assert r.info.status == "FINISHED" and r.data.tags["mocolab.status"] == "finished"
        assert "linear_top1" in r.data.metrics
        assert _logged_once(client, r.info.run_id, "m") == list(range(1, 25))  # every step once, none twice
        assert _logged_once(client, r.info.run_id, "loss")


@pytest.mark.slow
@needs_fmnist
def test_mocolab_train_killed_with_sigkill_resumes_into_its_one_run(tmp_path):
    cmd = _train_cmd("kill9")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        _until(proc, "epoch   1")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    runs = _runs(f"sqlite:///{tmp_path / 'm.db'}")
    assert len(runs) == 1 and runs[0].info.status == "RUNNING"  # what SIGKILL leaves: nothing could close it
    again = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=1800)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming at step" in again.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = _runs(f"sqlite:///{tmp_path / 'm.db'}")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", [r.info for r in runs]
    steps = _logged_once(client, runs[0].info.run_id, "m")
    assert steps == list(range(1, TRAIN_STEPS + 1)), steps  # every step to the run's last once, across the kill
    assert _logged_once(client, runs[0].info.run_id, "loss")


# ----------------------------------------------------------------------------------- 6. MLflow outage

def _outage_command(tmp_path, uri: str, name: str, epochs: int) -> list[str]:
    return [str(Path(sys.executable).with_name("mocolab")), "train", "--preset", "smoke", "--tracking-uri", uri,
            "--set", "data.subset=4096", "--set", f"optim.epochs={epochs}", "--set", "eval.knn_test=1000",
            "--set", "eval.linear_steps=20", "--set", f"run.name={name}", "--set", "run.experiment=faults",
            "--set", f"run.output_dir={tmp_path / 'runs'}"]


def _train_through_an_outage(tmp_path, port: int, server, cmd: list[str], back_at_epoch: int | None):
    """Run ``cmd``; stop the MLflow server once epoch 1 is printed and, with ``back_at_epoch``, start it again
    when that epoch is printed. (exit code, everything printed, the server now running or None)."""
    train = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    seen: list[str] = []
    try:
        for line in train.stdout:
            seen.append(line)
            if line.startswith("epoch   1"):
                break
        stop_mlflow_server(server)  # the store goes away while training runs
        server = None
        if back_at_epoch is not None:
            for line in train.stdout:
                seen.append(line)
                if line.startswith(f"epoch {back_at_epoch:3d}"):
                    break
            server = start_mlflow_server(tmp_path, port)  # ... and comes back before the end
        rest, _ = train.communicate(timeout=1800)
        seen.append(rest)
    finally:
        if train.poll() is None:
            train.kill()
    return train.returncode, "".join(seen), server


@pytest.mark.slow
@needs_fmnist
def test_training_outlives_an_mlflow_outage_and_sends_the_metrics_when_it_returns(tmp_path, free_port):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    code, out, server = _train_through_an_outage(tmp_path, port, start_mlflow_server(tmp_path, port),
                                                 _outage_command(tmp_path, uri, "outage", 8), back_at_epoch=3)
    assert code == 0, out[-4000:]
    assert "cannot log to the tracking store" in out and "answers again" in out, out[-4000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
    assert [r.info.status for r in runs] == ["FINISHED"], [r.info for r in runs]  # one run, closed, none RUNNING
    run = runs[0]
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss"))
    assert steps == [32 * e for e in range(1, 9)], steps  # every epoch, none lost, none twice
    assert "linear_top1" in run.data.metrics
    stop_mlflow_server(server)


@pytest.mark.slow
@needs_fmnist
def test_a_store_still_down_at_the_end_keeps_the_metrics_and_the_same_command_sends_them(tmp_path, free_port):
    """The server goes away after the first epoch and is not back when training ends: one line says what is
    kept and how to finish (no traceback); once it is back, the same command sends every epoch and closes."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    cmd = _outage_command(tmp_path, uri, "late-outage", 4)
    code, out, _ = _train_through_an_outage(tmp_path, port, start_mlflow_server(tmp_path, port), cmd,
                                            back_at_epoch=None)
    assert code == 1, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    kept = tmp_path / "runs" / "late-outage" / "unsent_metrics.json"
    assert kept.is_file() and str(kept) in out, out[-4000:]
    assert "did not answer at the end of run 'late-outage'" in out and "run the same command" in out
    server = start_mlflow_server(tmp_path, port)
    try:
        again = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=1800)
        assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
        assert "sent the metrics an earlier attempt kept" in again.stdout
        assert not kept.exists()
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
        assert len(runs) == 1 and runs[0].info.status == "FINISHED"
        steps = sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "loss"))
        assert steps == [32 * e for e in range(1, 5)], steps  # every epoch, none lost, none twice
        for key in ("lr", "pretext_acc", "knn_top1"):  # the other metrics of each epoch too
            history = client.get_metric_history(runs[0].info.run_id, key)
            assert sorted({m.step for m in history}) == steps, (key, history)
        assert "linear_top1" in runs[0].data.metrics
    finally:
        stop_mlflow_server(server)


# ----------------------------------------------------------------------------------- disk full, train CLI

_FULL_DISK = """
import resource, signal, sys, torch
from mocolab.config.manifest import RunManifest
from mocolab.training.checkpoint import save_rank_state
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))  # files beyond 64 KiB cannot be written
try:
    save_rank_state({"step": 2, "w": torch.ones(256, 1024)}, RunManifest("w", {"c": 1}, ""), sys.argv[1], 0, 1)
except Exception as err:  # torch's zip writer reports the short write as a RuntimeError
    print("refused:", type(err).__name__)
else:
    print("written")
"""


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path):
    folder = tmp_path / "ckpt"
    save_rank_state({"step": 1, "w": torch.zeros(4)}, WRITTEN, folder, 0, 1)
    res = subprocess.run([sys.executable, "-c", _FULL_DISK, str(folder)], capture_output=True, text=True, timeout=120)
    assert "refused:" in res.stdout, res.stdout + res.stderr  # the real write hit the file-size limit
    state, _ = load_rank_state(folder, 0, 1)
    assert state["step"] == 1
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.pt"], "the partial file was left behind"


@pytest.mark.slow
def test_mocolab_train_with_a_dead_ray_address_fails_before_any_run(tmp_path):
    env = {**_env(), "RAY_ADDRESS": "127.0.0.1:9"}
    res = subprocess.run([str(Path(sys.executable).with_name("mocolab")), "train", "--preset", "smoke",
                          "--set", "run.num_workers=1", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
                          "--set", f"run.output_dir={tmp_path / 'runs'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "RAY_ADDRESS=127.0.0.1:9: the cluster does not answer" in res.stderr, res.stderr
    assert _runs(f"sqlite:///{tmp_path / 'm.db'}", "mocolab") == []
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@needs_fmnist
def test_sigterm_to_mocolab_train_closes_its_run_and_the_same_command_resumes(tmp_path):
    cmd = _train_cmd("term")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("epoch   1"):
                break
        proc.send_signal(signal.SIGTERM)
        seen.append(proc.communicate(timeout=120)[0])
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    runs = _runs(f"sqlite:///{tmp_path / 'm.db'}")
    assert len(runs) == 1 and runs[0].info.status == "KILLED", out[-3000:]
    assert runs[0].data.tags["mocolab.status"] == "interrupted"
    again = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming at step" in again.stdout
    runs = _runs(f"sqlite:///{tmp_path / 'm.db'}")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    assert _logged_once(client, runs[0].info.run_id, "m") == list(range(1, TRAIN_STEPS + 1))  # each step once
    assert _logged_once(client, runs[0].info.run_id, "loss")


@pytest.mark.slow
@needs_fmnist
def test_a_study_whose_trials_all_fail_says_so_exits_1_and_closes_its_parent(tmp_path):
    """m=0.9 fails in training (its MLflow run says why); m=0.99 fails before its MLflow run exists (another
    live process holds its run's lock): MLflow alone does not show that trial, and the study must still
    count it as failed, not as left for later."""
    held = NameLock(tmp_path / "rel/sweeps/sig/train/sig--m=0.99_seed=0", "run 'sig--m=0.99_seed=0'").acquire()
    try:
        res = subprocess.run(_study_cmd("--set=run.fault_step=3", "--set=run.max_failures=0"),
                             cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=1800)
    finally:
        held.release()
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "all 2 trials failed" in res.stderr, res.stderr[-3000:]
    assert "m=0.99 seed=0: InUseError: run 'sig--m=0.99_seed=0' is in use by pid" in res.stderr, res.stderr[-3000:]
    assert "(before its MLflow run was created)" in res.stderr and "--stop-after" not in res.stdout
    runs = _runs(f"sqlite:///{tmp_path / 'rel.db'}", "momentum-ablation")
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parent) == 1 and parent[0].info.status == "FAILED"
    reason = parent[0].data.tags["mocolab.failure_reason"]
    assert "all 2 trials failed" in reason and "m=0.99 seed=0: InUseError" in reason, reason
    assert [r.data.tags["trial"] for r in children] == ["m=0.9 seed=0"] and children[0].info.status == "FAILED"
    assert "injected fault at step 3" in children[0].data.tags["mocolab.failure_reason"], children[0].data.tags
