"""The MoCo training loop in plain PyTorch: data -> two views -> MoCo step -> monitors.

``Trainer`` owns everything a run needs (encoders, queue, optimizer, counters,
RNG) so that one object can be checkpointed and restored; ``run_training``
drives it and reports through a callback.  Nothing here imports Ray or
MLflow: the in-process CLI and the Ray Train worker call the same code.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from . import data as datasets
from . import dist as mdist
from . import rng
from .augment import build_augmentation
from .config import Config
from .diagnostics import DriftProbes, age_histogram
from .evaluation import ProbeResult, extract_features, knn_accuracy, linear_probe
from .hardware import keep_freed_memory, resolve_device, resolve_precision
from .method import Method, MethodParts, build_method
from .models import build_encoder
from .norm import convert_global_bn
from .optimizers import build_optimizer
from .schedule import lr_at, momentum_at
from .vit import PatchGradNorm
from .sources import STREAMABLE, MemorySource, TrainSource, subset_positions, validation_positions

# A loss above this (or NaN) ends a run as diverged: log(1 + K) is the loss of
# a uniform guess, so 10× that is far outside anything training produces.
DIVERGENCE_FACTOR = 10.0
# A checkpoint's method parts besides encoder_q, in every checkpoint whatever the method (empty where it has
# none), so one written by any method reads like any other
CHECKPOINT_PARTS = ("encoder_k", "queue", "bank")


@dataclass
class EpochRecord:
    epoch: int
    step: int
    loss: float
    lr: float
    m: float
    pretext_acc: float
    knn_top1: float | None  # the test split's, at the end only when a validation split is held out
    images_per_s: float
    staleness_mean: float
    staleness_max: float
    ema_half_life: float
    max_staleness_bound: float
    seconds: float
    # per-step series of the epoch, {name: [[step, value], ...]}: the momentum m each step used and the
    # first layer's gradient norm (the step is the step count after that step, as for the epoch's metrics)
    per_step: dict[str, list[list[float]]] = field(default_factory=dict)
    # key drift over the probes (diagnostics.py): mean cosine of the current encoder's embedding of a
    # probe's image with the writing encoder's (drift_cos) and with the stored entry (stored_cos)
    drift_cos: float | None = None
    stored_cos: float | None = None
    # the epoch's dictionary diagnostics in full (age histogram, every probe's age and cosines): an artifact
    diagnostics: dict = field(default_factory=dict)
    val_knn_top1: float | None = None  # the monitor on the validation split (data.val_size), what a search reads

    def metrics(self) -> dict[str, float]:
        """Numeric fields for a metrics logger (None-valued monitors, per-step series and diagnostics left out)."""
        return {k: float(v) for k, v in asdict(self).items()
                if v is not None and k not in ("epoch", "per_step", "diagnostics")}


@dataclass
class EpochStats:
    """Running sums of the current epoch; part of a checkpoint so a mid-epoch resume reports the same."""
    loss_sum: float = 0.0
    acc_sum: float = 0.0
    steps: int = 0
    images: int = 0
    seconds: float = 0.0
    recent_loss: float = float("nan")
    per_step: dict[str, list[list[float]]] = field(default_factory=dict)  # see EpochRecord.per_step

    def add(self, loss: float, acc: float, images: int) -> None:
        self.loss_sum += loss
        self.acc_sum += acc
        self.steps += 1
        self.images += images
        self.recent_loss = loss

    def add_series(self, step: int, values: dict[str, float | None]) -> None:
        for name, value in values.items():
            if value is not None:
                self.per_step.setdefault(name, []).append([float(step), float(value)])

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / max(1, self.steps)

    @property
    def mean_acc(self) -> float:
        return self.acc_sum / max(1, self.steps)


@dataclass
class TrainResult:
    linear_top1: float | None
    knn_top1: float | None
    final_loss: float
    steps: int
    diverged: bool
    history: list[EpochRecord] = field(default_factory=list)
    knn_top1_init: float | None = None
    probe: ProbeResult | None = None  # the final linear probe, weights included (rank 0 of a finished run)
    linear_top1_init: float | None = None
    val_linear_top1: float | None = None  # on the validation split (data.val_size): what model selection reads
    val_knn_top1: float | None = None


@dataclass
class FinalScores:
    """The end of a run: kNN and the probe on the test split, and on the validation split where there is one."""
    knn: float
    probe: ProbeResult
    val_knn: float | None = None
    val_linear: float | None = None


def _subset(ds: datasets.ImageDataset, n: int | None) -> datasets.ImageDataset:
    """``data.subset``: the first n of a set stored shuffled; a fixed random n (in stored order) of one
    stored in class order (imagefolder, parquet), as the streaming loader takes."""
    if n is None or n >= len(ds):
        return ds
    idx = torch.from_numpy(subset_positions(len(ds), n)) if ds.name in STREAMABLE else slice(0, n)
    return datasets.ImageDataset(ds.images[idx], ds.labels[idx], ds.classes, ds.name, ds.skipped)


def hold_out(ds: datasets.ImageDataset, n: int) -> tuple[datasets.ImageDataset, datasets.ImageDataset | None]:
    """(training set, validation split): ``data.val_size`` images held out before any subset is taken."""
    if not n:
        return ds, None
    held = torch.from_numpy(validation_positions(len(ds), n))
    keep = torch.ones(len(ds), dtype=torch.bool)
    keep[held] = False

    def part(idx: torch.Tensor) -> datasets.ImageDataset:
        return datasets.ImageDataset(ds.images[idx], ds.labels[idx], ds.classes, ds.name, ds.skipped)

    return part(keep.nonzero().squeeze(1)), part(held)


def load_data(cfg: Config) -> tuple[datasets.ImageDataset, datasets.ImageDataset, datasets.ImageDataset | None]:
    """(train, test, validation split or None) as the config asks: the validation split is held out of the
    whole training set, then ``data.subset`` is taken from what is left."""
    d = cfg.data
    kwargs = dict(synthetic_size=d.synthetic_size, image_size=d.image_size, seed=cfg.run.seed)
    train, val = hold_out(datasets.load_dataset(d.name, "train", d.root, **kwargs), d.val_size)
    test = datasets.load_dataset(d.name, "test", d.root, **kwargs)
    return _subset(train, d.subset), test, val


@dataclass
class StepResult:
    """What one training step reports: its loss, pretext accuracy, learning rate and momentum."""
    loss: float
    pretext_acc: float
    lr: float
    diverged: bool  # loss not finite or above the divergence threshold: no update was applied
    m: float = 0.0
    grad_norm_first: float | None = None  # ‖∂loss/∂W‖ of the backbone's first layer (frozen or not)


def first_layer(backbone: torch.nn.Module) -> torch.nn.Module | None:
    """The first convolution or linear layer the images meet (a ViT's patch projection, a ResNet's conv1)."""
    if hasattr(backbone, "patch_embed"):
        return backbone.patch_embed
    return next((m for m in backbone.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))), None)


def encoder_factory(cfg: Config, channels: int, image_size: int,
                    device: torch.device) -> Callable[..., torch.nn.Module]:
    """``MethodParts.encoder``: ``predictor`` -> a fresh f_q as the config has it, its batch norm converted for
    ``moco.bn`` (groups for split and groups; sync: NCCL's SyncBatchNorm on CUDA, else ours over gloo).
    Its initial weights come from torch's global generator."""
    mc, mo, vit = cfg.moco, cfg.model, cfg.vit

    def encoder(predictor: bool = False) -> torch.nn.Module:
        groups = mc.bn_groups if mc.bn in ("split", "groups") else 1
        enc = build_encoder(mo.backbone, channels, width=mo.width, head=mo.head, dim=mo.dim, hidden=mo.hidden,
                            bn_groups=groups, predictor=predictor, image_size=image_size, patch_size=vit.patch_size,
                            depth=vit.depth, freeze_patch_embed=vit.freeze_patch_embed)
        if mc.bn == "sync":  # statistics over the global batch: NCCL's SyncBatchNorm, else ours (gloo)
            enc = (torch.nn.SyncBatchNorm.convert_sync_batchnorm(enc) if device.type == "cuda"
                   else convert_global_bn(enc))
        return enc

    return encoder


class Trainer:
    """One MoCo run on one rank.  ``rank``/``world_size`` shard the data; the rest is per process."""

    def __init__(self, cfg: Config, *, train: datasets.ImageDataset | None = None,
                 test: datasets.ImageDataset | None = None, device: torch.device | None = None,
                 source: TrainSource | None = None) -> None:
        self.cfg = cfg
        # rank and world come from torch.distributed (Ray Train sets it up); one process is (0, 1)
        self.rank, self.world_size = mdist.rank_and_world()
        rank, world_size = self.rank, self.world_size
        self.device = device or resolve_device(cfg.run.device)
        if source is None:  # the streaming source needs Ray Data: train/worker.py builds it and passes it in
            if cfg.data.loader == "stream" and (train is None or test is None):
                raise ValueError("data.loader: 'stream' reads through Ray Data, which a run without Ray "
                                 "(--in-process) does not start; drop --in-process, or use data.loader=memory")
            val = None
            if train is None or test is None:
                train, test, val = load_data(cfg)
            elif cfg.data.val_size:
                train, val = hold_out(train, cfg.data.val_size)
            source = MemorySource(train, test, max_bad_fraction=cfg.data.max_bad_fraction, val=val)
        elif cfg.data.val_size:
            raise ValueError("data.val_size: a validation split is held out of in-memory sets only; with "
                             "data.loader=stream, set data.val_size=0 (or data.loader=memory where the set fits)")
        self.data = source
        channels, size = source.channels, source.image_size
        self.batch = cfg.optim.batch_size // world_size
        if source.size < cfg.optim.batch_size:
            raise ValueError(f"optim.batch_size: {cfg.optim.batch_size} is larger than the training set "
                             f"({source.size} images)")
        self.precision = resolve_precision(cfg.run.precision, self.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(rng.stream_seed("init", cfg.run.seed))  # the same initial weights on every rank
            # moco.version / moco.negatives -> MoCo v1/v2, v3, memory bank or in-batch (method.py)
            parts = MethodParts(encoder_factory(cfg, channels, size, self.device), source.size, self.batch,
                                self.precision)
            self.model: Method = build_method(cfg, parts).to(self.device)
        self.encoder = self.model.encoder_q  # the unwrapped query encoder, for evaluation and checkpoints
        # key drift: probe slots of the dictionary (queue slots, or bank entries = training images)
        store = self.model.dictionary
        self.probes = DriftProbes(store.slots, cfg.eval.drift_probes, cfg.model.dim) \
            if store is not None and cfg.eval.drift_probes else None
        # a sharded queue's slots are this rank's own keys: each rank follows its own, without collectives
        self._probe_local = isinstance(store, mdist.ShardedKeyQueue)
        # the first layer's gradient: a ViT's patch projection measured from hooks (it may be frozen),
        # any other backbone's first layer read from its .grad after DDP has averaged it
        first = first_layer(self.encoder.backbone)
        self._first_layer = first
        self._patch_grad = PatchGradNorm(first) if hasattr(self.encoder.backbone, "patch_embed") else None
        if world_size > 1:  # DDP over the query encoder only: the queue and f_k stay out of its broadcasts
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model.encoder_q = torch.nn.parallel.DistributedDataParallel(self.encoder, device_ids=ids)
        self.augment = build_augmentation(cfg.augment, size, channels).to(self.device)
        o = cfg.optim
        self.optimizer = build_optimizer(o.name, self.encoder, cfg.effective_lr, momentum=o.momentum,
                                         weight_decay=o.weight_decay)
        # The augment stream is torch's global generator (kornia draws from it): the trainer keeps
        # its state and swaps it in while it trains (see rng.py).
        self.rng_state = rng.global_state("augment", cfg.run.seed, rank=rank)
        self.steps_per_epoch = datasets.batches_per_epoch(source.size, self.batch, world_size)
        planned = o.epochs * self.steps_per_epoch
        self.total_steps = min(planned, o.max_steps) if o.max_steps else planned
        self.warmup_steps = round(o.warmup_epochs * self.steps_per_epoch)
        # the loss of a uniform guess: log(1 + K) against the queue (a bank: its K draws); in-batch: log(2·B·W − 1);
        # v3: 2τ·log(B·W) per direction, two directions (each method's uniform_loss)
        uniform = self.model.uniform_loss(cfg.optim.batch_size)
        self.divergence_threshold = DIVERGENCE_FACTOR * uniform  # a loss this far above it (or NaN) has diverged
        self.step = 0
        self.epoch = 0
        self.history: list[EpochRecord] = []
        self.epoch_stats = EpochStats()
        self.last_epoch_series: dict[str, list[list[float]]] = {}  # the finished epoch's EpochStats.per_step

    def epoch_order(self, epoch: int) -> torch.Generator:
        """Data order of an epoch: a function of (seed, epoch) alone, identical on every rank,
        different each epoch, and reproducible after a restart in the middle of an epoch."""
        return rng.generator("data", self.cfg.run.seed, epoch=epoch)

    def lr(self, step: int) -> float:
        o = self.cfg.optim
        return lr_at(o.schedule, self.cfg.effective_lr, step, self.total_steps, self.warmup_steps)

    def records_step(self, step: int) -> bool:
        """Whether the per-step metrics of the step that makes the count ``step`` are kept: every
        ``run.step_metrics_every``-th (a million-step run need not send a million points per series)."""
        return step % self.cfg.run.step_metrics_every == 0

    def momentum(self, step: int) -> float:
        """The key encoder's momentum for the step after ``step`` steps (``moco.m_schedule``)."""
        mc = self.cfg.moco
        return momentum_at(mc.m_schedule, mc.m, step, self.total_steps)

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Everything needed to continue bit-for-bit: weights, queue, optimizer, counters, RNG."""
        # per part, unwrapped from DDP, so a checkpoint reads the same whatever W was; a part the method has
        # not is saved empty
        parts = {name: part.state_dict() for name, part in self.model.checkpoint_parts().items()}
        return {
            "encoder_q": self.encoder.state_dict(),
            **{name: parts.pop(name, {}) for name in CHECKPOINT_PARTS},
            **parts,  # a method's part of another name
            "probes": self.probes.state_dict() if self.probes is not None else {},
            "moco_step": self.model.step.clone(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "rng": torch.get_rng_state() if self._in_epoch else self.rng_state,
            "shuffle_rng": self._shuffle_gen.get_state() if self._shuffle_gen is not None else None,
            "epoch_stats": asdict(self.epoch_stats),
            # the per-step series went to the logger with their epoch: a checkpoint stays small
            "history": [{**asdict(h), "per_step": {}, "diagnostics": {}} for h in self.history],
        }

    def load_state_dict(self, state: dict) -> None:
        self.encoder.load_state_dict(state["encoder_q"])
        for name, part in self.model.checkpoint_parts().items():  # the key encoder, the queue or the bank
            part.load_state_dict(state[name])
        if self.probes is not None and state.get("probes"):  # absent in checkpoints from before the probes
            self.probes.load_state_dict(state["probes"])
        self.model.step.copy_(state["moco_step"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.rng_state = state["rng"]
        if self._shuffle_gen is not None and state.get("shuffle_rng") is not None:
            self._shuffle_gen.set_state(state["shuffle_rng"])
        self.epoch_stats = EpochStats(**state["epoch_stats"])  # per_step absent before it existed: empty
        self.history = [EpochRecord(**h) for h in state["history"]]

    # ------------------------------------------------------------------ training
    _in_epoch = False

    @property
    def _shuffle_gen(self) -> torch.Generator | None:
        return self.model.shuffle_generator

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def train_epoch(self, progress: Callable[[str], None] | None = None,
                    on_step: Callable[["Trainer"], None] | None = None) -> tuple[float, float, float, bool]:
        """Train to the end of the current epoch (or max_steps), resuming mid-epoch if a
        checkpoint was taken there.  Returns (mean loss, pretext acc, images/s, diverged)."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.rng_state)
            self._in_epoch = True
            try:
                result = self._train_epoch(progress, on_step)
            finally:
                self._in_epoch = False
                self.rng_state = torch.get_rng_state()
        return result

    def train_step(self, images: torch.Tensor, index: torch.Tensor | None = None) -> StepResult:
        """One MoCo step on this rank's uint8 batch (B×C×H×W; ``index``: the images' positions in the
        training set, which a memory bank and the drift probes need): the whole algorithm, top to bottom.

        Augmentation draws from torch's global generator: ``train_epoch`` swaps
        the trainer's augment stream in around its steps (rng.py).
        """
        lr = self.lr(self.step)  # cosine schedule over the run's steps (after any warm-up)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        m = self.momentum(self.step)  # constant, or rising to 1 (moco.m_schedule)
        if self.model.key_encoder is not None:
            self.model.m = m  # the key encoder's EMA momentum this step
        record = self.records_step(self.step + 1)  # this step's per-step metrics are kept (run.step_metrics_every)
        if self._patch_grad is not None:
            self._patch_grad.enabled = record
        im_q, im_k = self.augment(images.to(self.device, non_blocking=True))  # two views: B×C×H×W each
        # MoCo forward: query encoder, EMA update of the key encoder, keys on a shuffled batch,
        # InfoNCE against the queue, enqueue the keys (moco.py); v3: both views, keys of the global batch
        out = self.model(im_q, im_k, index)
        self._observe_probes(out.written, images, index)  # drift probes among the slots this step wrote
        loss = float(out.loss.detach())
        # decided across ranks: one rank's NaN stops every rank at this step, so no collective waits forever
        if mdist.any_rank(not math.isfinite(loss) or loss > self.divergence_threshold):
            if self._patch_grad is not None:
                self._patch_grad.grad = None
            return StepResult(loss, 0.0, lr, diverged=True, m=m)  # no update from a garbage loss
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()  # gradients reach the query encoder only; DDP averages them across ranks
        grad_first = self._first_layer_grad_norm() if record else None
        self.optimizer.step()
        self.step += 1
        return StepResult(loss, out.pretext_accuracy, lr, diverged=False, m=m, grad_norm_first=grad_first)

    # ---------------------------------------------------------- dictionary diagnostics
    @property
    def drift_encoder(self) -> torch.nn.Module | None:
        """The encoder that writes the dictionary: the key encoder for a queue, the encoder for a bank."""
        return self.model.writer

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Unit embeddings of un-augmented uint8 images by the dictionary's writer, in eval mode (no RNG)."""
        return torch.nn.functional.normalize(extract_features(self.drift_encoder, images, self.device), dim=1)

    def _observe_probes(self, written: torch.Tensor | None, images: torch.Tensor,
                        index: torch.Tensor | None) -> int:
        if self.probes is None or written is None or index is None:
            return 0
        offset = 0 if self._probe_local else self.rank * self.batch
        return self.probes.observe(written, offset, index, images, self.embed, self.step,
                                   collective=not self._probe_local, device=self.device)

    def dictionary_ages(self) -> torch.Tensor:
        """Ages in steps of this rank's stored negatives as the next step sees them (empty: no store)."""
        store = self.model.dictionary
        return store.ages(self.step) if store is not None else torch.zeros(0)

    def diagnostics(self) -> dict:
        """The dictionary at this step (rank 0's copy): its age histogram and, per probe, age and cosines."""
        out: dict = {"step": self.step, "negatives": self.model.negatives,
                     "age_histogram": age_histogram(self.dictionary_ages())}
        if self.probes is not None:
            keys = self.model.dictionary.keys
            probes = self.probes.measure(self.step, self.data.images_at, self.embed,
                                         stored=keys[self.probes.slots.to(keys.device)])
            if probes is not None:
                out["probes"] = probes
        return out

    def _first_layer_grad_norm(self) -> float | None:
        """The norm of the first layer's weight gradient, averaged over ranks as DDP averages gradients."""
        if self._patch_grad is not None:
            g = self._patch_grad.grad
            self._patch_grad.grad = None
            if g is None:
                return None
            return float(mdist.mean_over_ranks(g).norm())
        w = getattr(self._first_layer, "weight", None)
        return float(w.grad.norm()) if w is not None and w.grad is not None else None

    def _train_epoch(self, progress, on_step) -> tuple[float, float, float, bool]:
        st = self.epoch_stats
        self.model.train()
        done_in_epoch = self.step - self.epoch * self.steps_per_epoch  # > 0 after a mid-epoch restart
        report_every = max(1, self.steps_per_epoch // 4)
        t0 = time.perf_counter() - st.seconds
        batches = self.data.epoch_indexed(self.epoch_order(self.epoch), self.batch, self.rank, self.world_size,
                                          start_step=done_in_epoch)
        for i, (images, index) in enumerate(batches, start=done_in_epoch):
            if self.step >= self.total_steps:
                break
            res = self.train_step(images, index)
            if res.diverged:
                return res.loss, 0.0, 0.0, True
            st.add(res.loss, res.pretext_acc, images.shape[0] * self.world_size)
            if self.records_step(self.step):
                st.add_series(self.step, {"m": res.m, "grad_norm_first_layer": res.grad_norm_first})
            st.seconds = time.perf_counter() - t0
            if progress is not None and (i + 1) % report_every == 0 and i + 1 < self.steps_per_epoch:
                progress(f"  epoch {self.epoch + 1} step {self.step}/{self.total_steps} "
                         f"loss {st.recent_loss:.3f} {st.images / max(st.seconds, 1e-9):.0f} img/s")
            if on_step is not None:
                on_step(self)
        self.epoch += 1
        self.epoch_stats = EpochStats()
        self.last_epoch_series = st.per_step
        return st.mean_loss, st.mean_acc, st.images / max(st.seconds, 1e-9), False

    # ---------------------------------------------------------------- evaluation
    def backbone_copy(self) -> torch.nn.Module:
        """A float32 CPU copy of the query backbone without the gradient monitor's hook: what is exported."""
        if self._patch_grad is not None:
            self._patch_grad.remove()
        try:
            return copy.deepcopy(self.encoder.backbone).float().cpu()
        finally:
            if self._patch_grad is not None:
                self._patch_grad.attach()

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Evaluation features at the run's precision (bf16 encoders: bf16 autocast, as in training)."""
        return extract_features(self.encoder.backbone, images, self.device, dtype=self.precision)

    def split_features(self, split: str, n: int | None,
                       embed: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and labels of a split's evaluation images, batch by batch: only features are kept.
        ``embed``: uint8 images to features, by default the encoder's (a baseline passes its own)."""
        embed = embed or self.features
        feats, labels = [], []
        for images, lab in self.data.eval_split(split, n):
            feats.append(embed(images))
            labels.append(lab)
        return torch.cat(feats), torch.cat(labels)

    @property
    def monitor_split(self) -> str:
        """The split the per-epoch monitor reads: the validation split where one is held out, else the test."""
        return "val" if self.cfg.data.val_size else "test"

    def knn(self) -> float:
        """The per-epoch kNN monitor on ``monitor_split``."""
        e = self.cfg.eval
        f_bank, l_bank = self.split_features("train", e.knn_bank)
        f_test, l_test = self.split_features(self.monitor_split, e.knn_test)
        return knn_accuracy(f_bank, l_bank, f_test, l_test, self.data.classes, e.knn_k, e.knn_t)

    def final_eval(self, progress: Callable[[str], None] | None = None,
                   embed: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[float, ProbeResult]:
        """(kNN top-1, the linear probe) on the test split: ``final_scores`` without the validation split."""
        scores = self.final_scores(progress, embed, validation=False)
        return scores.knn, scores.probe

    def final_scores(self, progress: Callable[[str], None] | None = None,
                     embed: Callable[[torch.Tensor], torch.Tensor] | None = None, *,
                     validation: bool = True) -> FinalScores:
        """kNN top-1 and the linear probe at the end, from one extraction of the features both read.

        The kNN bank and the probe's training images are both prefixes of one
        list of training images, so the numbers equal ``knn()`` and a separate probe.
        ``embed``: what makes the features, by default the encoder (baselines.py passes raw pixels): every
        encoder and baseline is scored on the same images by the same kNN and probe.
        """
        e = self.cfg.eval
        n_bank = min(e.knn_bank or self.data.size, self.data.size)
        n_lin = min(e.linear_train or self.data.size, self.data.size)
        f_train, l_train = self.split_features("train", max(n_bank, n_lin), embed)
        f_test, l_test = self.split_features("test", None, embed)
        n_test = min(e.knn_test or len(l_test), len(l_test))
        if progress is not None:
            progress(f"evaluation: kNN bank {self.data.describe_eval('train', n_bank)} training images, "
                     f"linear probe trained on {self.data.describe_eval('train', n_lin)}, tested on all "
                     f"{len(l_test):,} test images (kNN on {self.data.describe_eval('test', n_test)})")
        knn = knn_accuracy(f_train[:n_bank], l_train[:n_bank], f_test[:n_test], l_test[:n_test],
                           self.data.classes, e.knn_k, e.knn_t)
        res = linear_probe(f_train[:n_lin], l_train[:n_lin], f_test, l_test, self.data.classes,
                           weight_decay=e.linear_wd, steps=e.linear_steps)
        scores = FinalScores(knn, res)
        if validation and self.cfg.data.val_size:  # the same kNN bank and probe, on the held-out images
            f_val, l_val = self.split_features("val", None, embed)
            scores.val_knn = knn_accuracy(f_train[:n_bank], l_train[:n_bank], f_val, l_val, self.data.classes,
                                          e.knn_k, e.knn_t)
            scores.val_linear = res.score(f_val, l_val)
        return scores


def run_training(cfg: Config, *, on_epoch: Callable[[EpochRecord], None] | None = None,
                 on_step: Callable[[Trainer], None] | None = None,
                 progress: Callable[[str], None] | None = print, trainer: Trainer | None = None,
                 measure_init: bool = False) -> TrainResult:
    """Train to the end, monitoring kNN per epoch; finish with kNN and the linear probe.

    With several ranks every rank calls this in lockstep (``on_epoch`` and
    ``on_step`` run on all of them, so Ray's report barrier is met); the
    monitors and the probe run on rank 0 only, and other ranks return None
    for them.  A trainer restored from a checkpoint continues where it was.
    A diverged run stops at once and returns its last loss with ``diverged``
    set; its monitors are not run (the encoder is garbage by definition).
    """
    say = progress or (lambda _msg: None)
    keep_freed_memory()  # every step frees and takes back the same megabytes (hardware.py)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    t_start = time.perf_counter()
    tr = trainer or Trainer(cfg)
    main = tr.is_main
    mc = cfg.moco
    m_txt = f"m={mc.m}" + (" rising to 1 (cosine)" if mc.m_schedule == "cosine" else "")
    dictionary = tr.model.describe(cfg.optim.batch_size)
    val = getattr(tr.data, "val", None)
    held = f" / {len(val)} validation (held out)" if val is not None else ""
    say(f"mocolab: {cfg.data.name} ({tr.data.size} train{held} / {tr.data.test_size} test, {tr.data.kind}), "
        f"MoCo {mc.version}, {cfg.model.backbone}, {m_txt}, {dictionary}, {cfg.optim.name} "
        f"lr {cfg.effective_lr:g}, batch={cfg.optim.batch_size} "
        f"on {tr.world_size} rank(s), {tr.total_steps} steps on {tr.device} "
        f"({'bf16' if tr.precision else 'fp32'} encoders) with {torch.get_num_threads()} threads"
        + (f", resuming at step {tr.step}" if tr.step else ""))
    for note in tr.data.notes():
        say(f"  {note}")
    knn_init = linear_init = None
    if measure_init and main:  # the baseline this run must beat: its own encoder before training (baselines.py)
        knn_init, probe_init = tr.final_eval()
        linear_init = probe_init.test_top1
        say(f"  at initialisation: linear top-1 {100 * linear_init:.2f}%  kNN top-1 {100 * knn_init:.2f}%")
    loss = tr.history[-1].loss if tr.history else float("nan")
    diverged = False
    e = cfg.eval
    start_step = tr.step
    while tr.step < tr.total_steps:
        t0 = time.perf_counter()
        loss, pretext, rate, diverged = tr.train_epoch(progress=say, on_step=on_step)
        if diverged:
            say(f"  diverged at step {tr.step}: loss {loss}")
            break
        last = tr.step >= tr.total_steps
        due = e.knn_every and tr.epoch % e.knn_every == 0 and not last  # the last one comes with the probe
        monitor = tr.knn() if main and due else None
        knn, val_knn = (None, monitor) if tr.monitor_split == "val" else (monitor, None)
        # v3 and in-batch negatives store nothing: every negative is this step's, so nothing is stale
        ages = tr.dictionary_ages()
        s_mean, s_max = (float(ages.mean()), float(ages.max())) if ages.numel() else (0.0, 0.0)
        diag = tr.diagnostics() if main else {}
        drift, stored = _mean_cosines(diag, tr.model.dictionary is None)
        rec = EpochRecord(tr.epoch, tr.step, loss, tr.lr(tr.step - 1), tr.momentum(tr.step - 1), pretext,
                          knn, rate, s_mean, s_max, cfg.ema_half_life,
                          cfg.max_staleness if cfg.uses_queue else 0.0, time.perf_counter() - t0,
                          per_step=tr.last_epoch_series, drift_cos=drift, stored_cos=stored, diagnostics=diag,
                          val_knn_top1=val_knn)
        tr.history.append(rec)
        eta = (time.perf_counter() - t_start) / max(1, tr.step - start_step) * (tr.total_steps - tr.step)
        which = "val kNN" if tr.monitor_split == "val" else "kNN"
        knn_txt = (f"{which} {100 * monitor:.2f}%" if monitor is not None
                   else (f"{which} at the end" if last else f"{which} -"))
        drift_txt = f"  key drift cos {drift:.3f} (age ≤ {s_max:.0f})" if drift is not None and ages.numel() else ""
        say(f"epoch {tr.epoch:3d}  step {tr.step:6d}/{tr.total_steps}  loss {loss:.4f}  pretext {100 * pretext:.1f}%  "
            f"{knn_txt}  {rate:.0f} img/s{drift_txt}  ETA {_fmt_time(eta)}")
        if on_epoch is not None:
            on_epoch(rec)
        rec.per_step, rec.diagnostics = {}, {}  # logged by on_epoch; held no longer (a million steps)
    if diverged:
        return TrainResult(None, None, loss, tr.step, True, tr.history, knn_init, linear_top1_init=linear_init)
    if not main:
        return TrainResult(None, None, loss, tr.step, False, tr.history, knn_init, linear_top1_init=linear_init)
    say("final kNN and linear probe on frozen features ...")
    scores = tr.final_scores(say)
    knn_final, probe = scores.knn, scores.probe
    linear = probe.test_top1
    if tr.history:
        tr.history[-1].knn_top1 = knn_final
        tr.history[-1].val_knn_top1 = scores.val_knn
    val_txt = (f"  (validation: linear {100 * scores.val_linear:.2f}%, kNN {100 * scores.val_knn:.2f}%)"
               if scores.val_linear is not None else "")
    say(f"done in {_fmt_time(time.perf_counter() - t_start)}: linear top-1 {100 * linear:.2f}%  "
        f"kNN top-1 {100 * knn_final:.2f}%{val_txt}")
    return TrainResult(linear, knn_final, loss, tr.step, False, tr.history, knn_init, probe, linear_init,
                       scores.val_linear, scores.val_knn)


def _mean_cosines(diag: dict, fresh_negatives: bool) -> tuple[float | None, float | None]:
    """(drift_cos, stored_cos) means over the probes.  Negatives computed by this step's encoder (in-batch,
    v3) are 1 by construction; a store whose probes were never written has no value yet."""
    if fresh_negatives:
        return (1.0, 1.0) if diag else (None, None)
    probes = diag.get("probes")
    if not probes:
        return None, None
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return mean(probes["drift_cos"]), (mean(probes["stored_cos"]) if "stored_cos" in probes else None)


def _fmt_time(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
