"""A GPU's rules, kept on a machine without one: each rank's step on the ``meta`` device in a two-rank world.

``meta`` tensors have shapes and a device but no data, so a step runs on them as it would on a GPU: a CPU
tensor mixed in where a device tensor is needed shows, and every read of a device value on the host
(``.item()``, a copy to the CPU, ``nonzero``, a boolean mask) has to go through ``HostSyncs``, which counts
it and answers with zeros.  It also counts the blocking copies from the host to the device (a CUDA copy
from pageable memory, or without ``non_blocking``, waits for the stream).  ``TwoRanks`` stands in for the
process group as either rank (NCCL's rule: every tensor a collective is handed sits on the rank's device)
and checks that rule on every call.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import yaml
from conftest import assert_same_method_state, checkpoint_mid_epoch
from gloo_launch import launch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mocolab.data.augment import TwoViews
from mocolab.config import build_config
from mocolab.config.hardware import resolve_precision
from mocolab.training.trainer import Trainer
from mocolab.config.manifest import RunManifest
from mocolab.training.storage import Location
from mocolab.training import worker
from mocolab.training.launch import fit
from mocolab.training.resources import worker_gpus
from mocolab.training.session import WorkerArgs

REPO = Path(__file__).resolve().parents[2]
aten = torch.ops.aten
META = torch.device("meta")


class TwoRanks:
    """Rank ``rank`` of a two-rank NCCL world: each collective asserts its tensors sit on ``device`` and
    answers as if the other rank had sent the same tensors."""

    def __init__(self, device: torch.device, rank: int = 0) -> None:
        self.device, self.calls, self.misplaced = torch.device(device), Counter(), []
        self.rank = rank

    def _check(self, name: str, *tensors: torch.Tensor) -> None:
        self.calls[name] += 1
        for t in tensors:
            if t.device != self.device:
                self.misplaced.append(f"{name}: a {t.device.type} tensor {tuple(t.shape)} (NCCL: {self.device.type})")

    def all_gather(self, parts, x, group=None, async_op=False):
        self._check("all_gather", x, *parts)
        for p in parts:
            p.copy_(x)

    def all_reduce(self, t, op=None, group=None, async_op=False):
        self._check("all_reduce", t)

    def broadcast(self, t, src=0, group=None, async_op=False):
        self._check("broadcast", t)

    def reduce_scatter(self, out, chunks, op=None, group=None, async_op=False):
        self._check("reduce_scatter", out, *chunks)
        out.copy_(chunks[0])

    def all_to_all_single(self, out, x, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        self._check("all_to_all_single", out, x)

    @contextlib.contextmanager
    def installed(self, monkeypatch):
        """torch.distributed answers as this world's rank ``rank`` while the context is open (DDP left out:
        its collectives are torch's own, on the module's device by construction)."""
        for name in ("all_gather", "all_reduce", "broadcast", "reduce_scatter", "all_to_all_single"):
            monkeypatch.setattr(dist, name, getattr(self, name))
        monkeypatch.setattr(dist, "is_available", lambda: True)
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: self.rank)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
        monkeypatch.setattr(nn.parallel, "DistributedDataParallel", _Unwrapped)
        yield self


class _Unwrapped(nn.Module):
    """DDP's place in the module tree (``.module``), without its process group."""

    def __init__(self, module: nn.Module, device_ids=None) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _is_meta(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "meta"


def _is_host(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cpu"


def _in_kornia_s_transfer_helper() -> bool:
    """Whether kornia's own copy helper is on the stack: it copies its parameters with ``non_blocking`` on
    CUDA (and blocking elsewhere, ``meta`` included), so its copies are kornia's and not counted here."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(KORNIA_TRANSFER) and "nonblocking" in frame.f_code.co_name:
            return True
        frame = frame.f_back
    return False


KORNIA_TRANSFER = os.path.join("kornia", "core", "utils.py")


class HostSyncs(TorchDispatchMode):
    """Counts every read of a device (meta) tensor's values on the host, answering each with zeros, and every
    blocking copy from the host to the device (``blocking_h2d``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._to_copy.default and _is_host(args[0]) and str(kwargs.get("device")) == "meta" \
                and not kwargs.get("non_blocking") and not _in_kornia_s_transfer_helper():
            self.counts["blocking_h2d"] += 1
        if func is aten.copy_.default and _is_meta(args[0]) and _is_host(args[1]) \
                and not (args[2] if len(args) > 2 else kwargs.get("non_blocking")) \
                and not _in_kornia_s_transfer_helper():
            self.counts["blocking_h2d"] += 1
        if func is aten._local_scalar_dense.default and _is_meta(args[0]):
            self.counts["item"] += 1
            return False if args[0].dtype == torch.bool else 0
        if func is aten._to_copy.default and _is_meta(args[0]) and str(kwargs.get("device")) == "cpu":
            self.counts["to_cpu"] += 1
            return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        if func in (aten.nonzero.default, aten.masked_select.default) and _is_meta(args[0]):
            self.counts[func.__name__.split(".")[0]] += 1
            return torch.zeros((0, args[0].dim()) if "nonzero" in str(func) else (0,), dtype=torch.long,
                               device="meta")
        if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default) and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool and _is_meta(i)
                for i in args[1] if i is not None):
            self.counts["boolean_mask"] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


# --------------------------------------------------------------------------------------------- a rank's step

# every queue layout and policy, shuffler and BN mode, negative source and version
COMBOS = {
    "v2 replicated queue, split BN": {},
    "sharded queue": {"queue.layout": "sharded"},
    "random replacement": {"queue.policy": "random"},
    "shuffle BN": {"moco.bn": "shuffle"},
    "sync BN (ours over the group)": {"moco.bn": "sync"},
    "groups BN": {"moco.bn": "groups"},
    "plain BN": {"moco.bn": "plain"},
    "v1": {"moco.version": "v1"},
    "v3": {"moco.version": "v3"},
    "memory bank": {"moco.negatives": "memory_bank"},
    "in-batch": {"moco.negatives": "in_batch"},
    "batch keys (the control)": {"moco.negatives": "batch_keys"},
    "batch keys, shuffle BN": {"moco.negatives": "batch_keys", "moco.bn": "shuffle"},
    "symmetric loss": {"moco.symmetric": True},
    "symmetric loss, shuffle BN, sharded queue": {"moco.symmetric": True, "moco.bn": "shuffle",
                                                  "queue.layout": "sharded"},
}


def _config(overrides: dict, **more):
    return build_config("smoke", {"data.name": "synthetic", "data.subset": 1024, "optim.batch_size": 32,
                                  "queue.size": 256, "run.precision": "fp32", "run.num_workers": 2,
                                  "run.step_metrics_every": 1000, **overrides, **more})


def _rank_step(monkeypatch, rank: int, overrides: dict, preset: str = "smoke", **more):
    """Rank ``rank``'s trainer on ``meta`` in a two-rank world, its first batch as the loader hands it (CPU
    images and index), and the world that answered its collectives."""
    world = TwoRanks(META, rank)
    cfg = _config(overrides, **more) if preset == "smoke" else build_config(preset, {**overrides, **more})
    with world.installed(monkeypatch):
        tr = Trainer(cfg, device=META)
        assert (tr.rank, tr.world_size) == (rank, 2)
        images, index = next(iter(tr.data.epoch_indexed(tr.epoch_order(0), tr.batch, rank, 2, start_step=0)))
        assert images.device.type == index.device.type == "cpu"
        with torch.random.fork_rng(devices=[]), HostSyncs() as syncs:
            tr.train_step(images, index, 0.99)
    return tr, world, syncs, images, index


def _probes_hit(tr: Trainer) -> int:
    """How many drift probes the step wrote (0 where the method stores no dictionary)."""
    probes = tr.drift.probes
    return 0 if probes is None else int((probes.write_step >= 0).sum())


# the default (v2, replicated queue, split BN) in make test-fast; every other combination in make test and
# make mutate (half a second each)
STEP_CASES = [pytest.param(o, id=name, marks=() if not o else [pytest.mark.slow, pytest.mark.mutate])
              for name, o in COMBOS.items()]


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("overrides", STEP_CASES)
def test_a_step_obeys_nccl_reads_the_device_once_and_never_blocks_a_copy(monkeypatch, overrides, rank):
    """On every rank, every collective of a step gets tensors on the rank's device; the loss, the pretext
    accuracy and the divergence decision reach the host in one transfer, and nothing else of a step waits
    for the device, the drift probes included (the first step writes slots where probes sit).  Exact counts.
    A memory bank's written entries are its gathered image indices, found on the device: a step that
    writes a probe of a bank reads them once more."""
    tr, world, syncs, images, index = _rank_step(monkeypatch, rank, overrides)
    assert world.misplaced == [], world.misplaced
    assert sum(world.calls.values()) >= 2, world.calls  # a two-rank step does talk to the other rank
    hit = _probes_hit(tr)
    if tr.model.dictionary is not None:
        assert hit > 0  # the case this test exists for: a step that writes drift probes
    bank_read = 1 if hit and tr.model.negatives == "memory_bank" else 0
    assert dict(syncs.counts) == {"to_cpu": 1 + bank_read}, dict(syncs.counts)
    # the method itself, handed the loader's CPU index as it is (the queue's own guard)
    with world.installed(monkeypatch), torch.random.fork_rng(devices=[]), HostSyncs():
        im_q, im_k = tr.augment(images.to(META))
        tr.model(im_q, im_k, index)
    assert world.misplaced == [], world.misplaced


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_an_imagenet_step_with_its_probes_reads_once_and_never_blocks_a_copy(monkeypatch, rank):
    """imagenet-resnet50's step as a GPU runs it: its K = 65,536, global batch 256 (128 a rank) and 256 drift
    probes (one every 256 slots, so every step writes one), on small synthetic images (on ``meta`` only shapes
    count).  Each rank: one read, no blocking copy, the probe written."""
    tr, world, syncs, *_ = _rank_step(
        monkeypatch, rank, {"data.name": "synthetic", "data.synthetic_size": 66000, "data.image_size": 16,
                            "data.loader": "memory", "eval.knn_bank": 256, "eval.knn_test": 128,
                            "eval.linear_train": 256, "run.precision": "fp32", "run.num_workers": 2},
        preset="imagenet-resnet50")
    assert (tr.cfg.queue.size, tr.cfg.optim.batch_size, tr.batch, tr.cfg.eval.drift_probes) == (65536, 256, 128, 256)
    assert world.misplaced == [] and _probes_hit(tr) == 1, (world.misplaced, _probes_hit(tr))
    assert dict(syncs.counts) == {"to_cpu": 1}, dict(syncs.counts)


# ------------------------------------------------------------------------------------------- random streams

@pytest.mark.parametrize("preset", ["mocov1", "mocov2", "mocov3", "crop"])
@pytest.mark.parametrize("channels", [1, 3])
def test_augmentation_on_a_device_draws_from_the_cpu_stream_the_trainer_owns(preset, channels):
    """kornia would rebuild its samplers on the device (drawing from a generator no checkpoint holds); the
    views keep them on the CPU, where torch's global generator is the run's augment stream (method/rng.py)."""
    views = TwoViews(preset, 28, channels).to(META)
    samplers = [m for m in views.modules() if hasattr(m, "set_rng_device_and_dtype")]
    assert samplers and all(torch.device(m.device).type == "cpu" for m in samplers if getattr(m, "device", None))
    assert views.normalise.mean.device == META
    torch.manual_seed(3)
    before = torch.get_rng_state()
    q, k = views(torch.zeros(8, channels, 28, 28, dtype=torch.uint8, device=META))
    assert q.device == k.device == META and q.shape == (8, channels, 28, 28)
    assert not torch.equal(before, torch.get_rng_state())  # the draws came from the CPU stream


@pytest.mark.slow
def test_a_checkpoint_holds_every_generator_a_step_draws_from():
    """Resumed from a mid-epoch checkpoint, a run's next steps equal the uninterrupted run's, bit for bit,
    with a step that draws from every stream: augmentation and split BN's shuffle (the augment stream),
    random replacement's slots and the queue's initial keys."""
    cfg = build_config("smoke", {"data.name": "synthetic", "data.subset": 512, "optim.batch_size": 32,
                                 "queue.size": 256, "queue.policy": "random", "optim.max_steps": 12,
                                 "eval.knn_every": 0})
    full = Trainer(cfg)
    state = checkpoint_mid_epoch(cfg, 5)
    full.train_epoch()
    resumed = Trainer(cfg)
    resumed.load_state_dict(state)
    resumed.train_epoch()
    assert resumed.step == full.step == 12
    assert_same_method_state(full, resumed)
    assert torch.equal(full.rng_state, resumed.rng_state)


# --------------------------------------------------------------------------------------- the device, decided

def _gpu(monkeypatch, major: int) -> None:
    """This process sees one CUDA device of compute capability ``major`` (a mocked capability: no GPU here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(major=major))
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)  # emulation works


@pytest.mark.parametrize("major, expected", [(7, None), (8, torch.bfloat16), (9, torch.bfloat16)])
def test_auto_precision_is_bf16_only_where_the_gpu_computes_it(monkeypatch, major, expected):
    _gpu(monkeypatch, major)
    assert resolve_precision("auto", torch.device("cuda")) is expected
    assert resolve_precision("bf16", torch.device("cuda")) is torch.bfloat16  # asked for: given


CPU_NODES = [{"CPU": 2.0, "GPU": 0.0}, {"CPU": 4.0, "GPU": 0.0}]
GPU_NODES = [{"CPU": 16.0, "GPU": 2.0}]


@pytest.mark.parametrize("device, asked, workers, nodes, expected", [
    ("auto", 0.0, 2, GPU_NODES, 1.0),  # a GPU cluster: the default trains on its GPUs
    ("auto", 0.0, 2, CPU_NODES, 0.0),
    ("cuda", 0.0, 2, GPU_NODES, 1.0),
    ("cuda", 2.0, 1, GPU_NODES, 2.0),
    ("auto", 0.5, 1, GPU_NODES, 0.5),  # one rank may share a GPU
    ("cpu", 0.0, 2, GPU_NODES, 0.0),
    ("auto", 0.0, 0, GPU_NODES, 1.0),  # a sweep's local-mode trial asks Tune for one
])
def test_the_workers_gpus_follow_run_device(device, asked, workers, nodes, expected):
    assert worker_gpus(device, asked, workers, nodes) == expected


@pytest.mark.parametrize("device, asked, workers, nodes, message", [
    ("cuda", 0.0, 2, CPU_NODES, "run.device: 'cuda' was asked for, but no node of the Ray cluster has a GPU"),
    ("cuda", 0.5, 2, GPU_NODES, "run.gpus_per_worker: 0.5 with run.num_workers=2 would put two NCCL ranks"),
    ("auto", 1.5, 2, GPU_NODES, "allowed: whole GPUs"),
    ("cpu", 1.0, 2, GPU_NODES, "run.device: 'cpu' with run.gpus_per_worker=1 would hold GPUs"),
])
def test_a_device_the_cluster_cannot_give_is_refused(device, asked, workers, nodes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        worker_gpus(device, asked, workers, nodes)


def test_cuda_without_a_gpu_is_refused_in_process_before_any_run(tmp_path, monkeypatch):
    """In process (W = 0) the loop runs where the command does: a GPU it cannot see is refused at the door,
    before an MLflow run or a run folder exists."""
    monkeypatch.chdir(tmp_path)
    cfg = _config({"run.device": "cuda", "run.num_workers": 0, "run.output_dir": str(tmp_path / "runs")})
    with pytest.raises(ValueError, match="run.device: 'cuda' was asked for but no GPU is visible"):
        fit(cfg, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", progress=lambda _: None)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


# ------------------------------------------------------------------------------------- the end of a run

EVALUATION_S = 6.0  # rank 0's final evaluation, made longer than the collective timeout below
COLLECTIVE_TIMEOUT_S = 3.0


class _QuietSession:
    """A rank's session with nothing behind it: no checkpoint to resume, reports kept in a list."""

    def __init__(self) -> None:
        self.reports: list[dict] = []

    def world_rank(self) -> int:
        return dist.get_rank()

    def checkpoint(self):
        return None

    def report(self, metrics: dict, checkpoint_dir: str | None) -> None:
        self.reports.append(dict(metrics))


def _finish_with_a_slow_evaluation(rank: int, world: int, run_root: str) -> dict:
    cfg = build_config("smoke", {"data.name": "synthetic", "data.subset": 512, "optim.batch_size": 32,
                                 "queue.size": 256, "optim.max_steps": 2, "eval.knn_every": 0,
                                 "eval.knn_bank": 256, "eval.linear_train": 256, "eval.linear_test": 128,
                                 "eval.knn_test": 128, "run.num_workers": 0, "run.log_models": False})
    trainer = Trainer(cfg)
    evaluate = trainer.evaluation.final_scores

    def slow(*args, **kwargs):
        time.sleep(EVALUATION_S)
        return evaluate(*args, **kwargs)

    trainer.evaluation.final_scores = slow
    session = _QuietSession()
    run_dir = Location(str(Path(run_root) / f"rank{rank}"))
    args = WorkerArgs(RunManifest.of(cfg), run_dir.location, "")
    worker._train(cfg, trainer, args, None, run_dir, worker.MemoryWatch(), session)
    return session.reports[-1]


@pytest.mark.slow
def test_the_ranks_are_released_before_rank_0_evaluates_alone(tmp_path):
    """Rank 0 evaluates longer than a collective may wait: the other rank must not be waiting in one."""
    final = launch(_finish_with_a_slow_evaluation, 2, tmp_path, str(tmp_path), collective_timeout=COLLECTIVE_TIMEOUT_S,
                   timeout=120)
    assert final[0]["final"] == final[1]["final"] == 1.0
    assert final[0]["linear_top1"] > 0 and "linear_top1" not in final[1]
    assert final[0]["worker_rss_growth_mb"] >= final[1]["worker_rss_growth_mb"] - 1e-9


@pytest.mark.slow
def test_the_kuberay_rayjob_s_trials_obey_nccl_s_rules(monkeypatch):
    """kuberay/rayjob.yaml as shipped (its preset, workers and GPUs): each worker asks for a whole GPU, and a
    rank's step hands every collective tensors on its GPU.  The data is a small synthetic stand-in for its
    ImageNet folder at the same image size (on ``meta`` only the shapes count), its queue a smaller one of
    the same layout (65,536 keys need a training set larger than that)."""
    (job,) = [d for d in yaml.safe_load_all((REPO / "kuberay" / "rayjob.yaml").read_text()) if d["kind"] == "RayJob"]
    entry = shlex.split(job["spec"]["entrypoint"])

    def flag(name: str) -> str:
        return entry[entry.index(name) + 1]

    preset, workers, gpus = flag("--preset"), int(flag("--workers-per-trial")), float(flag("--gpus-per-worker"))
    sets = dict(entry[i + 1].split("=", 1) for i, word in enumerate(entry) if word == "--set")
    cfg = build_config(preset, {**sets, "run.num_workers": workers})
    assert worker_gpus(cfg.run.device, gpus, workers, GPU_NODES) == 1.0
    stand_in = {"data.name": "synthetic", "data.subset": 600, "data.loader": "memory", "queue.size": 512,
                "eval.knn_bank": 256, "eval.knn_test": 128, "eval.linear_train": 256, "run.precision": "fp32",
                "run.num_workers": workers}
    world = TwoRanks(META)
    with world.installed(monkeypatch):
        tr = Trainer(build_config(preset, stand_in), device=META)
        assert tr.cfg.model.backbone == cfg.model.backbone and tr.cfg.moco == cfg.moco
        assert tr.cfg.queue.layout == cfg.queue.layout and tr.cfg.augment == cfg.augment
        images, index = next(iter(tr.data.epoch_indexed(tr.epoch_order(0), tr.batch, 0, 2, start_step=0)))
        with torch.random.fork_rng(devices=[]), HostSyncs() as syncs:
            tr.train_step(images, index, cfg.moco.m)
    assert world.misplaced == [] and sum(world.calls.values()) >= 2, (world.misplaced, world.calls)
    assert syncs.counts["boolean_mask"] == 0


def test_shuffle_bn_sends_images_across_ranks_in_the_encoder_s_dtype():
    """Under bf16 autocast the encoder's first layer reads bf16 anyway: the cross-rank gather sends that,
    half the bytes of float32 images; in float32 the images go as they are."""
    from mocolab.method.moco import MoCo
    from mocolab.method.shuffle import CrossRankShuffle

    seen = []

    class Recording(CrossRankShuffle):
        def shuffle(self, x):
            seen.append(x.dtype)
            return x, None

        def unshuffle(self, k, restore):
            return k

    for dtype, sent in ((torch.bfloat16, torch.bfloat16), (None, torch.float32)):
        model = MoCo(nn.Sequential(nn.Flatten(), nn.Linear(12, 4)), None, shuffler=Recording(), encoder_dtype=dtype)
        model.compute_keys(torch.randn(2, 3, 2, 2))
        assert seen[-1] == sent
