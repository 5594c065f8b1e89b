"""Every command block in README.md and docs/ is run by a test or says why not; the blocks no other test
owns are run here, as a user types them, in a copy of the repository.

Each line runs with a size override appended, the same words README gives: training lines on 1,024 images
for 4 steps; study lines on the smoke preset (the ViT study: its own, at batch 64), small sizes,
``--workers-per-trial 0`` (each trial trains in its trial's process; studies on Ray Train workers are
test_faults.py's and the cluster tests') and ``--max-concurrent 1 --stop-after 1``; both scored on the first
500 test images (cpu-quick and vit-quick score on all 10,000: a third of a ViT line's CPU, for scores no
claim here reads) and mapped on 50 (SMALL_EVAL). So a study builds its whole grid (and says how many trials it holds),
runs one trial of it to the end, and stops as a resumable ``partial`` sweep. Lines whose runs no later
command reads as MLflow models (the studies, the methods' trainings) also get ``run.log_models=false``: the
models are the train blocks' claim, here and in test_mlflow_models.py. What is checked is that each command
as written works, not what it learns: the studies' outcomes are tests/tune/test_tune.py's.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from mocolab.data.sets import fashion_mnist_dir
from conftest import repo_copy, thread_share_env
from readme_blocks import COMMAND_LANGUAGES, MARK, REPO, block, blocks, commands, documents, names_read_by

needs_data = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")

# Scored on: the first 500 test images for the probes, 50 (the fewest a t-SNE map takes) for the feature map.
SMALL_EVAL = ["--set", "eval.linear_test=500", "--set", "eval.feature_map_images=50"]
# Appended to each study line: the smoke preset on 1,024 images, 8 steps a trial trained in the trial's own
# process, one trial of the study.
SMALL_STUDY = ["--preset", "smoke", "--set", "data.subset=1024", "--set", "optim.max_steps=8", "--set",
               "eval.knn_bank=1024", "--set", "eval.knn_test=500", "--set", "eval.linear_train=1024", "--set",
               "eval.linear_steps=20", *SMALL_EVAL, "--set", "queue.size=256", "--set", "run.log_models=false",
               "--max-concurrent", "1", "--stop-after", "1", "--workers-per-trial", "0"]
# Appended to each `mocolab train` line: whatever its preset, 1,024 images, batch 64, 4 steps of one epoch.
SMALL_TRAIN = ["--set", "data.subset=1024", "--set", "optim.batch_size=64", "--set", "queue.size=256", "--set",
               "optim.epochs=1", "--set", "optim.warmup_epochs=0", "--set", "optim.max_steps=4", "--set",
               "eval.knn_bank=512", "--set", "eval.knn_test=200", "--set", "eval.linear_train=512", "--set",
               "eval.linear_steps=5", *SMALL_EVAL]


def test_every_command_block_is_run_by_a_test_or_says_why_not():
    found = blocks()
    assert len(found) > 10
    unmarked, unowned = [], []
    for b in found:
        if b.language not in COMMAND_LANGUAGES:
            continue  # output (``text``), configuration, a listing: nothing a user runs
        m = MARK.match(b.mark)
        if m is None:
            unmarked.append(b.where)
        elif m.group("test"):
            test = REPO / m.group("test")
            if not test.is_file() or m.group("name") not in names_read_by(test):
                unowned.append(f"{b.where}: {m.group('test')} never reads the block {m.group('name')!r} "
                               f"(block/commands of that name, or a parametrize value passed to them)")
        else:
            assert len(m.group("why").split()) >= 3, f"{b.where}: say why it is not run"
    assert not unmarked, ("command blocks with neither a test that runs them nor the reason they are not run "
                          f"(readme_blocks.py says how to mark one): {unmarked}")
    assert not unowned, unowned


def test_the_walker_sees_a_block_without_a_mark(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("text\n\n<!-- a-block: run as written by tests/docs/test_command_blocks.py -->\n"
                   "```bash\necho a  # one\n```\n\n```bash\necho b\n```\n\n```\noutput\n```\n")
    found = blocks(doc)
    assert [(b.line, b.language) for b in found] == [(4, "bash"), (8, "bash"), (12, "")]
    assert MARK.match(found[0].mark).group("name") == "a-block" and MARK.match(found[1].mark) is None


def test_the_walker_sees_every_kind_of_fence_and_the_folders_beside_the_docs(tmp_path):
    """A command a user copies may sit in a ~~~ fence, an indented one inside a list, one with a title after
    its language, or one with no language at all; and in the READMEs of the folders beside the code."""
    doc = tmp_path / "x.md"
    doc.write_text("1. First:\n\n   ```bash title=\"setup\"\n   make run\n     --flag\n   ```\n\n"
                   "~~~\nrm -rf runs\n~~~\n\n````sh\n```\necho nested\n````\n\n"
                   "<!-- not run here: shows a listing of the output -->\n```{.python}\nprint(1)\n```\n"
                   "text with ```inline``` code\n")
    found = blocks(doc)
    assert [(b.line, b.language, b.text) for b in found] == [
        (3, "bash", "make run\n  --flag\n"), (8, "", "rm -rf runs\n"), (12, "sh", "```\necho nested\n"),
        (18, "python", "print(1)\n")]
    assert all(b.language in COMMAND_LANGUAGES for b in found), "an unlabelled fence is not taken for output"
    assert MARK.match(found[3].mark).group("why")
    read = {p.relative_to(REPO).parts[0] for p in documents()}
    assert {"README.md", "docs", "docker", "dashboards", "benchmarks", "results"} <= read, read


def test_a_test_owns_a_block_only_by_reading_it_by_name(tmp_path):
    """``eval`` and ``report`` are ordinary words: a test that says them does not run the blocks so named."""
    test = tmp_path / "test_x.py"
    test.write_text('''
import pytest
from readme_blocks import block, commands

def test_words():
    """This test does not eval the report block."""
    assert "report" != "eval"

def test_direct():
    commands("live-report", {"ID": "x"}) + [block("load-encoder")]

@pytest.mark.parametrize("name, n", [("v3-quickstart", 1), ("negatives-quickstart", 2)])
def test_parametrized(name, n):
    commands(name)
''')
    assert names_read_by(test) == {"live-report", "load-encoder", "v3-quickstart", "negatives-quickstart"}


def _run(lines: list[str], work: Path, extra: list[str], timeout: float = 900) -> list[subprocess.CompletedProcess]:
    env = {"HOME": os.environ.get("HOME", str(work)), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "LANG": "C.UTF-8", "MOCOLAB_DATA": str(fashion_mnist_dir()),
           **{k: v for k, v in os.environ.items() if k.startswith(("RAY_TMPDIR", "MOCOLAB_LOCKS"))},
           **thread_share_env()}
    out = []
    for line in lines:
        argv = shlex.split(line)
        res = subprocess.run(["bash", "-e", "-c", shlex.join(argv + extra)], cwd=work, env=env,
                             capture_output=True, text=True, timeout=timeout)
        assert res.returncode == 0, f"{line}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        out.append(res)
    return out


def _small_study(line: str) -> list[str]:
    """SMALL_STUDY, less the smoke preset for the ViT study (its own preset is a ViT's), at SMALL_TRAIN's
    batch there: vit-quick's 256 would make its 8 steps a ViT's 2,048 images."""
    return SMALL_STUDY[2:] + ["--set", "optim.batch_size=64"] if "vit_ablation.py" in line else SMALL_STUDY


def _one_trial_of(res: subprocess.CompletedProcess) -> int:
    """How many trials the study's grid holds, from its --stop-after line (one of them done)."""
    m = re.search(r"^1 of (\d+) trials done \(--stop-after 1\)", res.stdout, re.M)
    assert m, res.stdout[-3000:]
    return int(m.group(1))


@pytest.mark.slow
@needs_data
def test_readme_sweeps_and_report_blocks_run(tmp_path):
    work = repo_copy(tmp_path / "mocolab")
    sweeps = commands("sweeps")
    assert [re.search(r"experiments/(\w+)\.py", s).group(1) for s in sweeps] == [
        "momentum_ablation", "queue_ablation", "queue_ablation", "augmentation_ablation"]
    momentum, search, grid, augmentation = (_one_trial_of(res) for res in _run(sweeps, work, SMALL_STUDY))
    assert momentum == 2 * 6  # --seeds 2 over m in {0, .5, .9, .99, .999, .9999}
    assert search == 6  # --samples 6
    assert grid == 3  # every K: 128, 256 and 512 of 1,024 images (batch 128)
    assert augmentation == 5 + 3  # none/crop/mocov1/2/3, bn split/groups/plain
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    for name in ("momentum-ablation", "queue-ablation", "augmentation-ablation"):
        runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
        assert not [r for r in runs if r.info.status == "RUNNING"], name
        finished = [r for r in runs if "mlflow.parentRunId" in r.data.tags and r.info.status == "FINISHED"]
        assert len(finished) == (2 if name == "queue-ablation" else 1), name
    # the report blocks, on the momentum study just run (ID: its parent run)
    parent = next(r for r in client.search_runs([client.get_experiment_by_name("momentum-ablation").experiment_id])
                  if "mlflow.parentRunId" not in r.data.tags).info.run_id
    _run(commands("report", {" [--parent-run ID]": ""}) + commands("live-report", {"ID": parent}), work, [])
    assert (work / "dashboards" / "momentum" / "report.html").is_file()
    assert (work / "dashboards" / "live" / "report.html").is_file()
    # dashboards/README.md's block, its --watch line included: it ends once nothing runs
    dash = commands("dashboards-report", {"<id>": parent, "DIR": "dashboards/one-sweep"})
    assert [("--parent-run" in line, "--watch" in line) for line in dash] == [(False, False), (True, False),
                                                                              (False, True)], dash
    (work / "dashboards" / "momentum" / "report.html").unlink()
    _run(dash, work, [], timeout=300)
    assert (work / "dashboards" / "momentum" / "report.html").is_file()
    assert (work / "dashboards" / "one-sweep" / "report.html").is_file()


def test_the_dashboards_readme_names_only_flags_mocolab_report_takes():
    """dashboards/README.md describes `mocolab report` in prose as well as in its block: a flag it names that
    the command does not take (an interval the command never had) fails here, not in a user's shell."""
    named = set(re.findall(r"`(--[a-z][\w-]*)", (REPO / "dashboards" / "README.md").read_text()))
    res = subprocess.run([str(Path(sys.executable).with_name("mocolab")), "report", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    taken = set(re.findall(r"(--[a-z][\w-]*)", res.stdout))
    assert named and not named - taken, f"dashboards/README.md names flags mocolab report lacks: {named - taken}"


@pytest.mark.slow
@needs_data
def test_readme_train_blocks_run(tmp_path):
    work = repo_copy(tmp_path / "mocolab")
    lines = commands("train-one-model") + commands("train-workers")
    assert len(lines) == 5
    shown = [line for line in lines if "--print-config" in line or "--in-process" in line]
    trained = [line for line in lines if line not in shown]
    results = _run(shown, work, []) + _run(trained, work, SMALL_TRAIN)
    _check_smoke_learns(next(r for line, r in zip(shown, results) if "--in-process" in line).stdout)
    assert any(yaml.safe_load(r.stdout).get("moco", {}).get("m") is not None for r in results[:2]
               if r.stdout.startswith("# mocolab train")), [r.stdout[:300] for r in results[:2]]
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == len(trained) and all(r.info.status == "FINISHED" for r in runs), [r.info for r in runs]
    # a saved encoder, loaded in Python and exported, by the id of the last run
    run_id = runs[0].info.run_id
    code = "import torch\nimages = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8)\n" + \
        block("load-encoder").replace("<run id>", run_id) + "print(tuple(features.shape))\n"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True, timeout=900)
    assert loaded.returncode == 0 and re.search(r"^\(5, \d+\)$", loaded.stdout, re.M), loaded.stderr[-3000:]
    _run(commands("export", {"<run id>": run_id, " [--register fmnist-moco]": ""}), work, [])
    assert (work / "encoder-m0.99" / "encoder.pt2").is_file()


def _check_smoke_learns(out: str) -> None:
    """README's in-process smoke line, at its full size: the run beats its own encoder at initialisation by 2
    kNN points and scores above 75 % linear; each of its four epochs prints a line with its throughput and an
    ETA, the last at step 256 of 256; it ends with the scores."""
    init = re.search(r"at initialisation: linear top-1 ([\d.]+)%  kNN top-1 ([\d.]+)%", out)
    done = re.search(r"^done in \S+: linear top-1 ([\d.]+)%  kNN top-1 ([\d.]+)%", out, re.M)
    assert init and done and "diverged" not in out, out[-3000:]
    assert float(done.group(2)) >= float(init.group(2)) + 2, (init.groups(), done.groups())
    assert float(done.group(1)) > 75, done.groups()
    epochs = re.findall(r"^epoch +(\d+) +step +(\d+)/(\d+) .* img/s.*ETA \S+$", out, re.M)
    assert [int(e) for e, _, _ in epochs] == [1, 2, 3, 4] and epochs[-1][1:] == ("256", "256"), epochs


@pytest.mark.slow
@needs_data
# negatives: in batch, memory bank, FIFO at each m (4 by default), random; the second line 2 momenta, 2 seeds
@pytest.mark.parametrize("name, trials", [("v3-quickstart", [3 * 2, 4]),
                                          ("negatives-quickstart", [2 + 4 + 1, (2 + 2 + 1) * 2])])
def test_readme_method_blocks_run(tmp_path, name, trials):
    work = repo_copy(tmp_path / "mocolab")
    lines = commands(name)
    trains = [line for line in lines if "mocolab train" in line]
    studies = [line for line in lines if "experiments/" in line]
    assert trains and studies and len(trains) + len(studies) == len(lines)
    _run(trains, work, SMALL_TRAIN + ["--set", "run.log_models=false"])
    held = [_one_trial_of(res) for line in studies for res in _run([line], work, _small_study(line))]
    assert len(held) == len(trials), f"{name}: {len(held)} study lines, the test expects {len(trials)}: {studies}"
    assert held == trials, (name, held)
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert not [r for r in runs if r.info.status == "RUNNING"]
    # one run per training line, one finished trial per study line (--stop-after 1), each with its probe
    trained = [r for r in runs if r.info.status == "FINISHED" and "linear_top1" in r.data.metrics]
    assert len([r for r in trained if "mlflow.parentRunId" in r.data.tags]) == len(studies), [r.info for r in runs]
    assert len([r for r in trained if "mlflow.parentRunId" not in r.data.tags]) == len(trains), [r.info for r in runs]
