"""``mocolab cluster``: real Ray nodes, a real PostgreSQL server under a real ``mlflow server``.

Two clusters: README's block run as written (default ports, a fresh home folder; two trials log at
once and every metric is counted), and one on free ports where a two-worker run is SPREAD over two
nodes, one node is killed mid-run, a fresh one joins, and the run finishes from its checkpoint into
one MLflow run.  Each is stopped with ``mocolab cluster down``, which is checked to leave nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import in_private_network, kill_processes_with_env, repo_copy, thread_share_env
from mocolab.cluster import LocalCluster
from mocolab.cluster.local import MARKER, pids_with_env
from mocolab.cluster.postgres import Postgres, data_folder, find_bindir
from mocolab.data.sets import fashion_mnist_dir

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
needs_data = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")
# Each cluster holds several GiB (a node per worker, trials at once): two at a time ran this 24 GiB
# machine out of memory, so in a parallel suite they run one after another on one worker.
CLUSTERS = "mocolab-clusters"
needs_postgres = pytest.mark.skipif(find_bindir() is None,
                                    reason="PostgreSQL server binaries not installed (make setup)")


def readme_block() -> str:
    """The bash block marked local-cluster (docs/cluster.md), as a user would copy it."""
    from readme_blocks import block

    return block("local-cluster")


def fresh_home() -> Path:
    """An empty home folder that the system user postgres may enter (pytest's tmp_path is 0700)."""
    home = Path(tempfile.mkdtemp(prefix="mch", dir="/tmp"))
    home.chmod(0o755)
    return home


def client_env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "PATH": f"{BIN}:/usr/bin:/bin", "LANG": "C.UTF-8",
            "MOCOLAB_DATA": str(fashion_mnist_dir()), **thread_share_env()}


def metric_steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_bad_settings_are_refused_before_anything_starts(tmp_path):
    folder = tmp_path / "c"
    cluster = LocalCluster(folder, say=lambda _: None)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        for kwargs, message in (({"workers": -1}, "--workers: -1 must be in 0..64"),
                                ({"cpus_per_worker": 0}, "--cpus-per-worker: 0 must be > 0"),
                                ({"backend": "mysql"}, "--backend: 'mysql' is not one of auto, postgres, sqlite"),
                                ({"port": 70000}, "--port: 70000 is not a port"),
                                ({"mlflow_port": taken}, f"--mlflow-port: port {taken} on 127.0.0.1 is in use")):
            with pytest.raises(ValueError, match=re.escape(message)):
                cluster.up(**kwargs)
            assert not folder.exists()  # nothing written, nothing started
    # through the command line: one line on stderr, exit 2; and the verbs on a folder with no cluster
    res = subprocess.run([str(BIN / "mocolab"), "cluster", "up", "--dir", str(folder), "--workers", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert (res.returncode == 2
            and res.stderr.strip() == "mocolab: error: --workers: -1 is out of range; allowed [0, 64]")
    with pytest.raises(ValueError, match="no cluster in .*mocolab cluster up"):
        cluster.remove_worker("worker1")
    assert cluster.down() == 0 and not folder.exists()
    res = subprocess.run([str(BIN / "mocolab"), "cluster", "status", "--dir", str(folder)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "no cluster in" in res.stdout


@pytest.mark.slow
@pytest.mark.cluster
@needs_data
@needs_postgres
@pytest.mark.xdist_group(CLUSTERS)
def test_readme_block_two_trials_log_every_metric_to_mlflow(tmp_path, free_port):
    """As written, where Debian's PostgreSQL server is installed (the sqlite store a machine without it gets
    is the node-loss test's)."""
    block = readme_block()
    work = repo_copy(tmp_path / "mocolab")
    home = fresh_home()
    env = client_env(home)
    cluster_dir = home / ".mocolab" / "cluster"
    try:
        res = subprocess.run(in_private_network(["bash", "-e", "-c", block]), cwd=work, env=env, capture_output=True,
                             text=True, timeout=2400)
        out = res.stdout + res.stderr
        # Tune's record of a failed trial says why: its last lines (the exception) first, as a long report is
        # cut in the middle
        errors = "".join(f"\n--- {p}\n{p.read_text()[-1500:]}" for p in (cluster_dir / "storage").rglob("error.txt"))
        assert res.returncode == 0, errors + "\n--- output\n" + out[-5000:]
        assert "cluster: up in" in out and "3 node(s) alive" in out, out[-4000:]
        assert "store postgresql+psycopg2://mocolab@127.0.0.1:" in out, out[-4000:]
        # the submit command the cluster printed is the one README shows (before its extra arguments)
        printed = re.search(r"^  (RAY_AUTH_MODE=token ray job submit .*)$", out, re.M).group(1)
        assert printed.replace(str(home), "~") in readme_block().replace("\\\n    ", ""), printed
        assert "succeeded" in out, out[-4000:]
        assert "cluster: stopped" in out and "MLflow data and checkpoints kept" in out
        # `down` kept MLflow's store: its PostgreSQL, started again on its data folder, holds every run
        pg = Postgres(data_folder(cluster_dir), free_port(), find_bindir(), cluster_dir / "pgpass")
        assert pg.initialised() and not pg.running()
        pg.start()
        os.environ["PGPASSFILE"] = str(pg.pgpass)
        client = MlflowClient(pg.uri())
        exp = client.get_experiment_by_name("momentum-ablation")
        runs = client.search_runs([exp.experiment_id])
        children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        assert sorted(r.data.tags["trial"] for r in children) == ["m=0.9 seed=0", "m=0.99 seed=0"], \
            errors + "\n--- output\n" + out[-5000:]
        # the two ran at once: some moment lies inside both runs
        assert max(r.info.start_time for r in children) < min(r.info.end_time for r in children)
        # every epoch's every metric arrived: 2 epochs x 4 steps, one point per epoch, none twice; the
        # per-step series (the m each step used, the first layer's gradient norm) one point per step
        expected = [4 * (e + 1) for e in range(2)]
        counted = 0
        for r in children:
            assert r.info.status == "FINISHED", r.data.tags
            for key in ("loss", "lr", "pretext_acc", "knn_top1", "system/images_per_s", "staleness_mean"):
                assert metric_steps(client, r.info.run_id, key) == expected, (r.data.tags["trial"], key)
                counted += len(expected)
            for key in ("m", "grad_norm_first_layer"):
                assert metric_steps(client, r.info.run_id, key) == list(range(1, 9)), (r.data.tags["trial"], key)
                counted += 8
            assert "linear_top1" in r.data.metrics
        assert counted == 2 * (6 * 2 + 2 * 8)
        assert Path(cluster_dir / "storage").is_dir() and any((cluster_dir / "storage").iterdir())
    finally:
        os.environ.pop("PGPASSFILE", None)
        cluster = LocalCluster(cluster_dir, say=lambda _: None)
        cluster.down(purge=True)  # what a failed block left up
        Postgres(data_folder(cluster_dir), 0, find_bindir(), cluster_dir / "pgpass").remove()
        found = kill_processes_with_env("HOME", str(home))  # anything the block started that escaped `down`
        shutil.rmtree(home, ignore_errors=True)
    assert found == 0, "processes of the README block outlived `mocolab cluster down`"


@pytest.mark.slow
@pytest.mark.cluster
@needs_data
@pytest.mark.xdist_group(CLUSTERS)
def test_spread_run_survives_node_loss_into_one_mlflow_run(tmp_path):
    """On the sqlite store (``--backend sqlite``, what a machine without PostgreSQL gets; README's block runs
    on PostgreSQL): MLflow's server keeps one run across the node loss and the restarted workers."""
    home = fresh_home()
    env = client_env(home)
    cluster_dir = home / "cluster"
    mocolab = [str(BIN / "mocolab"), "cluster"]
    ident = None
    try:
        up = subprocess.run(mocolab + ["up", "--dir", str(cluster_dir), "--workers", "2", "--port", "0",
                                       "--dashboard-port", "0", "--mlflow-port", "0", "--backend", "sqlite"],
                            env=env, capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        cluster = LocalCluster(cluster_dir, say=lambda _: None)
        s = cluster.state
        ident = s.id
        status = subprocess.run(mocolab + ["status", "--dir", str(cluster_dir)], env=env, capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 0 and "worker2" in status.stdout, status.stdout
        assert s.tracking_uri.startswith("http://") and f"sqlite:///{cluster_dir / 'mlflow.db'}" in up.stdout, up.stdout
        # a second `up` on the same folder is refused, naming how to stop the first
        again = subprocess.run(mocolab + ["up", "--dir", str(cluster_dir)], env=env, capture_output=True,
                               text=True, timeout=60)
        assert again.returncode == 2 and "already up" in again.stderr and "cluster down" in again.stderr

        driver_env = {**env, "RAY_ADDRESS": f"127.0.0.1:{s.gcs_port}", "RAY_AUTH_MODE": "token"}
        train = [sys.executable, "-m", "mocolab", "train", "--preset", "smoke", "--tracking-uri", s.tracking_uri,
                 "--storage", s.storage, "--set", "run.name=node-loss", "--set", "run.num_workers=2",
                 "--set", "run.placement=spread", "--set", "run.cpus_per_worker=1", "--set", "data.subset=2048",
                 "--set", "optim.epochs=3", "--set", "run.checkpoint_every=4", "--set", "run.max_failures=3",
                 "--set", "eval.knn_bank=1024", "--set", "eval.knn_test=500", "--set", "eval.linear_train=1024",
                 "--set", "eval.linear_steps=20", "--set", "run.experiment=node-loss"]
        log = open(tmp_path / "driver.log", "w")
        driver = subprocess.Popen(train, env=driver_env, stdout=log, stderr=subprocess.STDOUT, cwd=home)
        client = MlflowClient(s.tracking_uri)
        nodes = {}
        deadline = time.time() + 1200
        run = None
        while time.time() < deadline and driver.poll() is None:  # first epoch logged: a checkpoint exists
            exp = client.get_experiment_by_name("node-loss")
            runs = client.search_runs([exp.experiment_id]) if exp else []
            if runs and metric_steps(client, runs[0].info.run_id, "loss"):
                run = runs[0]
                break
            time.sleep(1)
        assert run is not None, (tmp_path / "driver.log").read_text()[-4000:]
        nodes = cluster.node_ids()
        before = run.data.tags["mocolab.worker_nodes"].split(",")
        assert len(before) == 2 and len(set(before)) == 2, before  # SPREAD: two ranks, two nodes
        assert {nodes["worker1"][:12], nodes["worker2"][:12]} == set(before), (nodes, before)
        victim = "worker1" if before[0] == nodes["worker1"][:12] else "worker2"  # the node of rank 0 (it logs)
        cluster.remove_worker(victim)
        fresh = subprocess.run(mocolab + ["add-worker", "--dir", str(cluster_dir)], env=env, capture_output=True,
                               text=True, timeout=540)
        assert fresh.returncode == 0 and "worker3" in fresh.stdout, fresh.stdout + fresh.stderr
        rc = driver.wait(timeout=1800)
        out = (tmp_path / "driver.log").read_text()
        assert rc == 0, out[-6000:]
        assert "resuming at step" in out, out[-4000:]
        runs = client.search_runs([client.get_experiment_by_name("node-loss").experiment_id])
        assert len(runs) == 1 and runs[0].info.status == "FINISHED", [r.info for r in runs]
        final = runs[0]
        after = final.data.tags["mocolab.worker_nodes"].split(",")
        late = LocalCluster(cluster_dir, say=lambda _: None)  # worker3 joined through the CLI
        now = late.node_ids()
        assert "worker3" in now, (now, late.state.workers, late._node_table())
        assert set(after) == {now["worker3"][:12], now[({"worker1", "worker2"} - {victim}).pop()][:12]}, (now, after)
        steps_per_epoch = 2048 // 128
        assert metric_steps(client, final.info.run_id, "loss") == [steps_per_epoch * (e + 1) for e in range(3)]
        assert "linear_top1" in final.data.metrics
    finally:
        down = subprocess.run(mocolab + ["down", "--dir", str(cluster_dir), "--purge"], env=env,
                              capture_output=True, text=True, timeout=120)
        kill_processes_with_env("HOME", str(home))
        shutil.rmtree(home, ignore_errors=True)
    assert down.returncode == 0 and "cluster: stopped" in down.stdout, down.stdout + down.stderr
    assert ident is not None
    assert pids_with_env(MARKER, ident) == [], f"processes carrying {MARKER}={ident} outlived `down`"


_WITHOUT_PSYCOPG2 = """
import sys
sys.modules["psycopg2"] = None  # as on a machine where mocolab was installed without its cluster extra
from pathlib import Path
from mocolab.cluster.local import LocalCluster
try:
    LocalCluster(Path(sys.argv[1])).up(backend="postgres")
except ValueError as err:
    print("refused:", err)
print("made:", sorted(p.name for p in Path(sys.argv[1]).glob("*")))
"""


def test_a_postgres_cluster_without_its_driver_is_refused_before_anything_starts(tmp_path):
    """psycopg2 comes with `pip install 'mocolab[cluster]'`; without it the MLflow server could never reach
    PostgreSQL, so --backend postgres says what to install, and nothing is started or written."""
    res = subprocess.run([sys.executable, "-c", _WITHOUT_PSYCOPG2, str(tmp_path / "c")], capture_output=True,
                         text=True, timeout=120)
    assert "refused: --backend postgres: MLflow reaches PostgreSQL through psycopg2, which is not installed " \
           "here: pip install 'mocolab[cluster]' (or --backend sqlite)" in res.stdout, res.stdout + res.stderr
    assert "made: []" in res.stdout
