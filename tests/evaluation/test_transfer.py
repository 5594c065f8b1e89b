"""`mocolab eval`: a trained encoder scored on other data, from a run id, a models:/ URI or an export folder,
logged as a run that names its source; bad input refused before any work. A real sqlite store and a real
(tiny) training run made by `mocolab train`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import thread_share_env
from mocolab.data.sets import fashion_mnist_dir
from readme_blocks import commands

needs_data = pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)")

# A smoke model on 1,024 images, 8 steps; its evaluation reads 512 training and 200 test images for kNN
SMALL_TRAIN = ["--set", "data.subset=1024", "--set", "optim.batch_size=64", "--set", "queue.size=256", "--set",
               "optim.epochs=2", "--set", "optim.max_steps=8", "--set", "eval.knn_bank=512", "--set",
               "eval.knn_test=200", "--set", "eval.linear_train=512", "--set", "eval.linear_steps=5", "--set",
               "run.system_metrics_s=0"]
# Appended to each `mocolab eval` line of docs/tracking.md: a thousand images, a short probe
SMALL_EVAL = ["--set", "data.subset=1024", "--set", "data.synthetic_size=512", "--set", "eval.linear_steps=5"]


def _env(work: Path) -> dict[str, str]:
    return {"HOME": os.environ.get("HOME", str(work)), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "LANG": "C.UTF-8", "MOCOLAB_DATA": str(fashion_mnist_dir()),
            **{k: v for k, v in os.environ.items() if k.startswith(("RAY_TMPDIR", "MOCOLAB_LOCKS"))},
            **thread_share_env()}


def _sh(line: str, work: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-e", "-c", line], cwd=work, env=_env(work), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(work folder, store URI, run id) of a smoke model trained by `mocolab train` as a user runs it."""
    if fashion_mnist_dir() is None:
        pytest.skip("Fashion-MNIST not installed (make data)")
    work = tmp_path_factory.mktemp("transfer")
    (work / ".venv").symlink_to(Path(sys.prefix))
    res = _sh(" ".join([".venv/bin/mocolab train --preset smoke", *SMALL_TRAIN]), work)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("mocolab").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    return work, uri, runs[0].info.run_id


def _all_runs(uri: str) -> list:
    client = MlflowClient(uri)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def _image_folder(root: Path) -> Path:
    """ImageNet-style RGB images of two classes a probe can tell apart (dark and bright)."""
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for label, level in (("dark", 60), ("bright", 190)):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(12):
                pixels = (level + 40 * torch.rand(40, 40, 3, generator=g)).clamp(0, 255).to(torch.uint8)
                Image.fromarray(pixels.numpy()).save(folder / f"{i}.png")
    return root


@pytest.mark.slow
def test_docs_eval_block_runs_and_links_every_evaluation_to_its_source(trained, tmp_path):
    work, uri, run_id = trained
    folder = _image_folder(tmp_path / "images")
    lines = commands("eval", {"<run id>": run_id, "<image folder>": str(folder)})
    assert sum(" eval " in f" {line} " for line in lines) == 3 and any("--leaderboard" in line for line in lines)
    outputs = []
    for line in lines:
        res = _sh(line + (" " + " ".join(SMALL_EVAL) if " eval " in line else ""), work)
        assert res.returncode == 0, f"{line}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        outputs.append(res.stdout)
    client = MlflowClient(uri)
    evals = client.search_runs([client.get_experiment_by_name("transfer").experiment_id])
    by_data = {r.data.tags["mocolab.eval.data"]: r for r in evals}
    assert set(by_data) == {"synthetic", "imagefolder", "fashion-mnist"}, [r.data.tags for r in evals]
    for data, run in by_data.items():
        tags = run.data.tags
        # every evaluation names the run and experiment the encoder came from, whichever way it was given
        assert tags["mocolab.eval.source_run"] == run_id and tags["mocolab.eval.source_experiment"] == "mocolab"
        assert run.info.status == "FINISHED" and run.data.params["data.name"] == data
        assert 0 <= run.data.metrics["linear_top1"] <= 1 and 0 <= run.data.metrics["knn_top1"] <= 1
        assert run.data.params["model.backbone"] == "convnet"  # the encoder's own config, beside the data's
        assert "mlflow.parentRunId" not in tags  # a link, not a child: the source run stays a trial in reports
    assert by_data["imagefolder"].data.tags["mocolab.eval.source"] == str((work / "my-encoder").resolve())
    assert by_data["fashion-mnist"].data.tags["mocolab.eval.source_model"].startswith("models:/m-")
    # two well-separated classes: the transfer probe finds them in RGB images resized and made grey
    assert by_data["imagefolder"].data.metrics["linear_top1"] >= 0.9
    assert run_id[:8] in outputs[-1] and (work / "dashboards" / "leaderboard" / "leaderboard.html").is_file()


@needs_data
@pytest.mark.slow  # the module's training (its fixture)
def test_eval_on_the_training_data_gives_the_runs_own_scores(trained):
    """The scoring is training's final evaluation: the encoder scored on its own data (the same first 512
    training images, the same test images) reproduces the linear_top1 and knn_top1 the run logged."""
    import mocolab

    _, uri, run_id = trained
    logged = MlflowClient(uri).get_run(run_id).data.metrics
    res = mocolab.evaluate(run_id, "fashion-mnist", tracking_uri=uri, log=False, progress=None)
    assert res.run_id is None and res.images == {"train": 512, "test": 2_000}  # smoke scores the first 2,000
    assert res.knn_top1 == pytest.approx(logged["knn_top1"], abs=1 / 200)
    assert res.linear_top1 == pytest.approx(logged["linear_top1"], abs=1 / 2_000)


@needs_data
def test_a_run_id_a_model_uri_and_an_export_give_one_encoder(trained, tmp_path):
    import mocolab
    from mocolab.tracking.logged_models import export_run, load_encoder as logged_program, model_uri, register_model

    _, uri, run_id = trained
    out = export_run(run_id, tmp_path / "export", tracking_uri=uri)
    name, version = register_model(run_id, "transfer-test", uri)
    images = torch.rand(5, 1, 28, 28)
    want = logged_program(run_id, uri)(images)  # the exported program MLflow holds
    for source in (run_id, model_uri(uri, run_id), f"models:/{name}/{version}", str(out)):
        encoder = mocolab.load_encoder(source, tracking_uri=uri)
        with torch.no_grad():
            assert torch.allclose(encoder(images), want, atol=1e-5), source
    with pytest.raises(ValueError, match="is the run's 'classifier' model"):
        mocolab.load_encoder(model_uri(uri, run_id, "classifier"), tracking_uri=uri)


# A source that names no model is refused before any store is read: an empty store does (no training)
NO_SOURCE = [
    (["no-such-run", "--data", "synthetic"], "SOURCE: 'no-such-run' is not a folder, a models:/ URI or a run"),
    (["./no-such-export", "--data", "synthetic"], "EXPORT_DIR: './no-such-export' is not a folder"),
    (["models:/m-0000", "--data", "synthetic"], "MODEL_URI: 'models:/m-0000' names no logged model"),
    (["models:/nobody/1", "--data", "synthetic"], "MODEL_URI: 'models:/nobody/1' names no registered model"),
]
# bad settings beside a real trained run (RUN): the module's training, so marked slow
WITH_RUN = [
    (["RUN", "--data", "mnist"], "--data: unknown dataset 'mnist'; choose one of"),
    (["RUN", "--data", "synthetic", "--set", "moco.m=0.9"], "--set moco.m: an evaluation reads only data.*"),
    (["RUN", "--data", "synthetic", "--set", "eval.knn_k=0"], "eval.knn_k: 0 is out of range"),
    (["RUN", "--data", "imagefolder"], "data.root: imagefolder needs a folder path"),
    (["RUN", "--data", "imagefolder", "--set", "data.root=/no/such/folder"], "data.root: '/no/such/folder' does not"),
    (["RUN", "--data", "synthetic", "--experiment", "a/b"], "--experiment: 'a/b' is not a valid name"),
]


def _refused(uri: str, argv: list[str], message: str, capsys) -> None:
    from mocolab.cli.commands import main

    before = len(_all_runs(uri))
    capsys.readouterr()  # MLflow's lines as it makes a new store's tables
    assert main(["eval", *argv, "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert len(_all_runs(uri)) == before


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> str:
    """A store with no run: MLflow makes its tables once for the module."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('empty') / 'mlflow.db'}"
    _all_runs(uri)
    return uri


@pytest.mark.parametrize("argv, message", NO_SOURCE)
def test_a_source_that_names_no_model_is_one_line_exit_2_and_leaves_no_run(empty_store, capsys, argv, message):
    _refused(empty_store, argv, message, capsys)


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("argv, message", WITH_RUN)
def test_bad_input_is_one_line_exit_2_and_leaves_no_run(trained, capsys, argv, message):
    _, uri, run_id = trained
    _refused(uri, [run_id if a == "RUN" else a for a in argv], message, capsys)


def test_an_export_folder_missing_its_files_is_named(tmp_path, capsys):
    from mocolab.cli.commands import main

    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.yaml").write_text("model: {backbone: convnet}\n")
    assert main(["eval", str(tmp_path / "half"), "--data", "synthetic", "--tracking-uri",
                 f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 2
    assert "has no backbone.pt" in capsys.readouterr().err


def test_images_take_the_encoders_channels():
    from mocolab.evaluation.transfer import to_channels

    grey = torch.randint(0, 256, (2, 1, 4, 4), dtype=torch.uint8)
    assert torch.equal(to_channels(grey, 3), grey.expand(-1, 3, -1, -1)) and to_channels(grey, 1) is grey
    rgb = torch.zeros(1, 3, 2, 2, dtype=torch.uint8)
    rgb[:, 0], rgb[:, 1], rgb[:, 2] = 200, 100, 0
    assert to_channels(rgb, 1).flatten().tolist() == [round(0.299 * 200 + 0.587 * 100)] * 4
    with pytest.raises(ValueError, match="4 channels"):
        to_channels(torch.zeros(1, 4, 2, 2, dtype=torch.uint8), 3)
