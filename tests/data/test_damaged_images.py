"""Damaged images in a set: named and counted, the same stand-ins in both loaders, a bound beyond which a run stops.

Real files (a truncated JPEG, an empty file, text named .jpg) and a real Ray; no mocks.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from mocolab.method import rng
from mocolab.config import build_config
from mocolab.data.sets import _synthetic, fill_unreadable, load_dataset
from mocolab.data.image_index import build_index, decode, write_imagefolder
from mocolab.data.sources import DamagedDataError, MemorySource, UnreadableFiles
from conftest import mlflow_store

DAMAGE = {  # how each broken file is made from a good JPEG's bytes
    "c000/broken_truncated.jpg": lambda good: good[: len(good) // 2],
    "c001/broken_empty.jpg": lambda good: b"",
    "c002/broken_text.jpg": lambda good: b"this is a note, not a picture\n",
}


def _damaged_folder(root, n=200, size=24, damage=DAMAGE, test_damage=("c001/broken_empty.jpg",)):
    """A generated imagefolder of n good training images plus the damaged ones (and some in val/)."""
    train, test = _synthetic(n, size, 0), _synthetic(n // 4, size, 1)
    write_imagefolder(train.images, train.labels, root, "train")
    write_imagefolder(test.images, test.labels, root, "val")
    good = min((root / "train").rglob("*.jpg")).read_bytes()
    for name, make in damage.items():
        (root / "train" / name).write_bytes(make(good))
    for name in test_damage:
        (root / "val" / name).write_bytes(damage[name](good))
    return root


def _stream(root, size, fraction):
    from mocolab.training.stream import StreamSource

    said: list[str] = []
    return StreamSource(build_index("imagefolder", str(root), "train", size),
                        build_index("imagefolder", str(root), "test", size), max_bad_fraction=fraction,
                        say=said.append), said


def _memory(root, size, fraction):
    return MemorySource(load_dataset("imagefolder", "train", root, image_size=size),
                        load_dataset("imagefolder", "test", root, image_size=size), max_bad_fraction=fraction)


def test_each_kind_of_damage_is_reported_by_the_decoder_not_raised(tmp_path):
    root = _damaged_folder(tmp_path, n=20)
    index = build_index("imagefolder", str(root), "train", 24)
    images, bad = decode(index.refs, 24)
    named = {index.short_name(index.refs[i]) for i in bad.nonzero().flatten().tolist()}
    assert named == {f"train/{name}" for name in DAMAGE}
    assert not images[bad].any() and images[~bad].flatten(1).any(1).all()  # zeros only where unreadable


def test_a_stand_in_is_the_previous_readable_image_of_the_batch():
    images = torch.arange(6, dtype=torch.uint8).view(6, 1, 1, 1).expand(6, 3, 2, 2).contiguous()
    unreadable = torch.tensor([True, False, True, True, False, True])
    got = fill_unreadable(images, unreadable)[:, 0, 0, 0].tolist()
    assert got == [1, 1, 1, 1, 4, 4]  # the first takes the next readable one: there is no previous
    assert fill_unreadable(images, torch.zeros(6, dtype=torch.bool)) is images
    with pytest.raises(ValueError, match=r"none of the 6 images of a batch could be decoded"):
        fill_unreadable(images, torch.ones(6, dtype=torch.bool))


def test_in_memory_a_set_damaged_beyond_the_bound_is_refused_before_training(tmp_path):
    root = _damaged_folder(tmp_path, n=200)  # 3 of 203 training images: 1.5 %
    train = load_dataset("imagefolder", "train", root, image_size=24)
    test = load_dataset("imagefolder", "test", root, image_size=24)
    with pytest.raises(DamagedDataError, match=r"^data.max_bad_fraction: 3 of 203 training images unreadable: "
                                               r"train/c000/broken_truncated.jpg, train/c001/broken_empty.jpg, "
                                               r"train/c002/broken_text.jpg \(1.48% of the split, more than the 1% "
                                               r"allowed\)"):
        MemorySource(train, test)  # the default bound: 1 %
    source = MemorySource(train, test, max_bad_fraction=0.02)
    assert source.unreadable.count("train") == 3 and source.unreadable.count("test") == 1
    assert source.unreadable.metrics() == {"data_unreadable_train": 3.0, "data_unreadable_test": 1.0}
    clean = UnreadableFiles({"train": 203, "val": 20, "test": 51})
    clean.add("test", ["val/c001/broken_empty.jpg"])
    # a split with none logs no key (as the tag names none): no series of zeros on the run's charts
    assert clean.metrics() == {"data_unreadable_test": 1.0}
    assert "3 of 203 training images unreadable" in source.unreadable.tags()["mocolab.data_unreadable"]
    notes = source.notes()
    assert notes[0].startswith("train data: 3 of 203 training images unreadable: train/c000/broken_truncated.jpg")
    assert "data.max_bad_fraction=0.02 allows 4" in notes[0] and notes[1].startswith("test data: 1 of 51 test")
    with pytest.raises(DamagedDataError, match=r"3 of 203 training .* more than the 0% allowed"):
        MemorySource(train, test, max_bad_fraction=0.0)  # zero tolerance: any damaged file stops the run
    with pytest.raises(DamagedDataError, match=r": 1 of 51 test images unreadable: val/c001/broken_empty.jpg"):
        MemorySource(train, test, max_bad_fraction=0.015)  # 3 of 203 training images pass; 1 of 51 test do not


def test_the_bound_is_checked_with_the_config(tmp_path):
    for bad in (-0.1, 1.5, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"^data.max_bad_fraction: .* is out of range; allowed \[0.0, 1.0\]"):
            build_config("smoke", {"data.max_bad_fraction": bad})
    assert build_config("smoke", {}).data.max_bad_fraction == 0.01
    # the bound changes what a run accepts, not what it computes: a run's name and identity keep it out at its default
    assert build_config("smoke", {"data.max_bad_fraction": 0.01}).run_name == build_config("smoke", {}).run_name


@pytest.mark.slow  # Ray Data's streaming executor
def test_both_loaders_stand_in_for_broken_files_alike_and_leave_them_out_of_evaluation(tmp_path, ray_session):
    root = _damaged_folder(tmp_path, n=200)
    (stream, said), memory = _stream(root, 24, 0.02), _memory(root, 24, 0.02)
    assert (stream.size, stream.test_size) == (memory.size, memory.test_size) == (203, 51)
    read = []
    for epoch in (0, 1):
        for rank in (0, 1):  # W = 2, as two ranks see it
            gen = lambda: rng.generator("data", 3, epoch=epoch)  # noqa: E731
            want = list(memory.epoch_indexed(gen(), 16, rank, 2, 0))
            got = list(stream.epoch_indexed(gen(), 16, rank, 2, 0))
            assert len(got) == len(want) == 203 // 32
            assert all(torch.equal(g[0], w[0]) and torch.equal(g[1], w[1]) for g, w in zip(got, want))
            assert all(b[0].flatten(1).any(1).all() for b in got)  # no zero image reaches a batch
            read += [p for _, p in want]
    pos = torch.cat(read)
    broken_read = len(set(pos[memory.train.labels[pos] < 0].tolist()))  # each epoch's tail of 11 is not read
    assert stream.unreadable.count("train") == broken_read >= 2
    assert stream.unreadable.names["train"] <= memory.unreadable.names["train"]
    assert any(re.match(r"  train data: [1-3] of 203 training images unreadable so far: train/c00\d/broken_", line)
               for line in said)
    # key-drift probes: the same images at the same positions, stand-ins included
    assert torch.equal(stream.images_at(pos), memory.images_at(pos))
    # evaluation leaves the broken files out in both, the labels with them
    for split in ("train", "test"):
        s_img = torch.cat([x for x, _ in stream.eval_split(split, None)])
        s_lab = torch.cat([y for _, y in stream.eval_split(split, None)])
        (m_img, m_lab), = list(memory.eval_split(split, None))
        assert torch.equal(s_img, m_img) and torch.equal(s_lab, m_lab) and (m_lab >= 0).all()
    assert len(s_lab) == 51 - 1 and stream.unreadable.count("test") == 1
    assert stream.unreadable.names == memory.unreadable.names  # everything read: the same names in both
    assert any(line.startswith("  test data: 1 of 51 test images unreadable so far: val/c001/broken_empty.jpg")
               for line in said)


@pytest.mark.slow
def test_a_stream_stops_once_it_has_found_more_damage_than_the_bound(tmp_path, ray_session):
    root = _damaged_folder(tmp_path, n=200)
    stream, _ = _stream(root, 24, 0.02)  # 4 allowed of 203: an epoch goes through
    assert len(list(stream.epoch(rng.generator("data", 0, epoch=0), 16, 0, 1, 0))) == 203 // 16
    strict, _ = _stream(root, 24, 0.005)  # 1 allowed: the second broken file found stops it
    batches = 0
    with pytest.raises(DamagedDataError, match=r"^data.max_bad_fraction: 2 of 203 training images unreadable so "
                                               r"far: train/c00\d/broken_\w+.jpg, train/c00\d/broken_\w+.jpg "
                                               r"\(0.985% of the split, more than the 0.5% allowed\)"):
        for _ in strict.epoch(rng.generator("data", 0, epoch=0), 16, 0, 1, 0):
            batches += 1
    assert batches < 203 // 16  # stopped within the epoch, not after it


@pytest.mark.slow
def test_a_streamed_run_damaged_beyond_the_bound_stops_naming_the_files(tmp_path, ray_session):
    from mlflow.tracking import MlflowClient

    from mocolab.training import fit

    root = _damaged_folder(tmp_path / "set", n=200)
    cfg = build_config("smoke", {
        "data.name": "imagefolder", "data.root": str(root), "data.image_size": 24, "data.subset": None,
        "data.loader": "stream", "data.max_bad_fraction": 0.005, "queue.size": 64, "optim.batch_size": 32,
        "optim.epochs": 1, "eval.knn_every": 0, "run.num_workers": 0, "run.max_failures": 0,
        "run.output_dir": str(tmp_path / "runs"), "run.name": "damaged", "run.experiment": "damaged"})
    uri = mlflow_store(tmp_path)
    with pytest.raises(DamagedDataError, match=r"data.max_bad_fraction: [23] of 203 training images unreadable so "
                                               r"far: train/c00\d/broken_\w+.jpg, train/c00\d/broken_\w+.jpg"):
        fit(cfg, tracking_uri=uri)
    # the stop is the run's end in MLflow too: one run, FAILED (not left RUNNING), saying why
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("damaged").experiment_id])
    assert [(r.info.status, r.data.tags.get("mocolab.status")) for r in runs] == [("FAILED", "failed")], \
        [r.info for r in runs]
    assert "data.max_bad_fraction: " in runs[0].data.tags["mocolab.failure_reason"], runs[0].data.tags


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["memory", "stream"])
def test_a_run_under_the_bound_logs_the_counts_and_names_to_mlflow(tmp_path, ray_session, loader):
    from mlflow.tracking import MlflowClient

    from mocolab.training import fit

    root = _damaged_folder(tmp_path / "set", n=200)
    uri = mlflow_store(tmp_path)
    cfg = build_config("smoke", {
        "data.name": "imagefolder", "data.root": str(root), "data.image_size": 24, "data.subset": None,
        "data.loader": loader, "data.max_bad_fraction": 0.05, "queue.size": 64, "optim.batch_size": 32,
        "optim.epochs": 1, "eval.knn_every": 0, "eval.knn_bank": None, "eval.linear_steps": 5,
        "run.num_workers": 0, "run.max_failures": 0, "run.output_dir": str(tmp_path / "runs"),
        "run.name": f"damaged-{loader}", "run.experiment": "damaged"})
    out = fit(cfg, tracking_uri=uri, progress=lambda _m: None)
    assert out.status == "finished"
    run = MlflowClient(uri).get_run(out.mlflow_run_id)
    assert run.data.metrics["data_unreadable_train"] == 3 and run.data.metrics["data_unreadable_test"] == 1
    tag = run.data.tags["mocolab.data_unreadable"]
    so_far = "( so far)?" if loader == "stream" else ""  # a stream knows a file once it has read it
    assert re.fullmatch(rf"3 of 203 training images unreadable{so_far}: train/c000/broken_truncated.jpg, "
                        rf"train/c001/broken_empty.jpg, train/c002/broken_text.jpg; 1 of 51 test images "
                        rf"unreadable{so_far}: val/c001/broken_empty.jpg", tag), tag


def test_the_unreadable_files_found_so_far_are_part_of_a_checkpoint():
    """A stream resumed mid-epoch does not read again what it read before the checkpoint: the names it had
    found come back with the checkpoint, so its count neither restarts nor counts a file twice."""
    from mocolab.config import build_config
    from mocolab.training.trainer import Trainer

    cfg = build_config("smoke", {"data.name": "synthetic", "data.subset": 256, "optim.batch_size": 32,
                                 "queue.size": 128, "eval.knn_every": 0})
    first = Trainer(cfg)
    first.data.unreadable.add("train", ["c000/broken.jpg", "c001/empty.jpg"])
    state = first.state_dict()
    resumed = Trainer(cfg)
    resumed.load_state_dict(state)
    assert resumed.data.unreadable.count("train") == 2
    resumed.data.unreadable.add("train", ["c000/broken.jpg"])  # read again after the resume: the same file
    assert resumed.data.unreadable.count("train") == 2
    assert resumed.data.unreadable.first("train") == ["c000/broken.jpg", "c001/empty.jpg"]


def _train_workers() -> set[str]:
    """The Ray Train worker actors this Ray has started, dead or alive (GCS keeps the ended ones): a restart
    after a failure starts new ones, which the driver's messages do not show with W >= 1 (Ray retries there)."""
    from ray._private import state

    return {a for a, info in state.actors().items() if info["ActorClassName"].endswith("RayTrainWorker")}


@pytest.mark.slow
def test_damage_a_ray_worker_finds_ends_the_run_once_without_retries(tmp_path, ray_session):
    """A user's error found on a Ray Train worker is the same on every attempt: the run ends with its one
    line, as in this process, and Ray restarts no worker for it (run.max_failures=2 would allow two). The
    worker ends its loop with the error written to the run's folder, so Ray sees no failure to retry: the
    error reaches the caller as itself, not as Ray's WorkerGroupError around three tracebacks."""
    from mlflow.tracking import MlflowClient

    from mocolab.data.sources import DamagedDataError
    from mocolab.training import fit

    root = _damaged_folder(tmp_path / "set", n=200)
    cfg = build_config("smoke", {
        "data.name": "imagefolder", "data.root": str(root), "data.image_size": 24, "data.subset": None,
        "data.loader": "stream", "data.max_bad_fraction": 0.005, "queue.size": 64, "optim.batch_size": 32,
        "optim.epochs": 1, "eval.knn_every": 0, "run.num_workers": 1, "run.cpus_per_worker": 1,
        "run.max_failures": 2, "run.output_dir": str(tmp_path / "runs"), "run.name": "damaged-ray",
        "run.experiment": "damaged"})
    uri = mlflow_store(tmp_path)
    before = _train_workers()
    with pytest.raises(DamagedDataError, match=r"data.max_bad_fraction: [23] of 203 training images unreadable"):
        fit(cfg, tracking_uri=uri, progress=lambda _m: None)
    started = _train_workers() - before
    assert len(started) == 1, started  # the one worker of the one attempt: Ray started no other
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("damaged").experiment_id])
    assert (run.info.status, run.data.tags.get("mocolab.status")) == ("FAILED", "failed")
    assert run.data.tags["mocolab.failure_reason"].startswith("DamagedDataError: data.max_bad_fraction: ")
    assert not (tmp_path / "runs" / "damaged-ray" / "final_error.json").exists()  # read once, then gone
