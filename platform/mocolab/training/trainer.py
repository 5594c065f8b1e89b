"""The MoCo training loop in plain PyTorch: data -> two views -> MoCo step -> monitors.

``Trainer`` holds one run on one rank (what training/build.py makes, the monitors,
the counters and the augment stream) so that one object can be checkpointed
and restored; ``run_training`` drives it epoch by epoch, evaluates
(evaluation/scoring.py) and reports through callbacks.  Nothing here imports Ray or
MLflow: the in-process CLI and the Ray Train worker call the same code.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from mocolab.data import sets as datasets
from mocolab.method import collectives as mdist
from mocolab.method import rng
from mocolab.method.async_copy import to_device
from mocolab.training.build import build_run, training_source
from mocolab.config import Config
from mocolab.training.step_metrics import step_metrics_interval
from mocolab.evaluation.scoring import Evaluation, FinalScores
from mocolab.evaluation.probe import ProbeResult
from mocolab.config.hardware import keep_freed_memory, resolve_device
from mocolab.training.monitors import DriftMonitor, FirstLayerGradNorm, Monitor
from mocolab.training.online_probe import OnlineProbe
from mocolab.data.sources import TrainSource

# A loss above this (or NaN) ends a run as diverged: log(1 + K) is the loss of
# a uniform guess, so 10× that is far outside anything training produces.
DIVERGENCE_FACTOR = 10.0
# A checkpoint's method parts besides encoder_q, in every checkpoint whatever the method (empty where it has
# none), so one written by any method reads like any other
CHECKPOINT_PARTS = ("encoder_k", "queue", "bank")
PRECISION_NAMES = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


# the per-step series every run keeps (the monitors add theirs): the momentum each step used, its loss and its
# pretext accuracy
STEP_SERIES = ("m", "step_loss", "step_pretext_acc")


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
    # key drift over the probes (method/diagnostics.py): mean cosine of the current encoder's embedding of a
    # probe's image with the writing encoder's (drift_cos) and with the stored entry (stored_cos)
    drift_cos: float | None = None
    stored_cos: float | None = None
    # the epoch's dictionary diagnostics in full (age histogram, every probe's age and cosines): an artifact
    diagnostics: dict = field(default_factory=dict)
    val_knn_top1: float | None = None  # the monitor on the validation split (data.val_size), what a search reads
    # the online probe (training/online_probe.py) with each kNN monitor, on the monitor's split
    online_linear_top1: float | None = None
    val_online_linear_top1: float | None = None

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
class StepResult:
    """What one training step reports: its loss, pretext accuracy, learning rate and momentum."""
    loss: float
    pretext_acc: float
    lr: float
    diverged: bool  # loss not finite or above the divergence threshold: no update was applied
    m: float = 0.0
    # the monitors' per-step values, on a step whose metrics are kept: {series name: value}, e.g.
    # grad_norm_first_layer, ‖∂loss/∂W‖ of the backbone's first layer (frozen or not)
    monitored: dict[str, float | None] = field(default_factory=dict)


class Trainer:
    """One MoCo run on one rank.  ``rank``/``world_size`` shard the data; the rest is per process."""

    def __init__(self, cfg: Config, *, train: datasets.ImageDataset | None = None,
                 test: datasets.ImageDataset | None = None, device: torch.device | None = None,
                 source: TrainSource | None = None) -> None:
        self.cfg = cfg
        # rank and world come from torch.distributed (Ray Train sets it up); one process is (0, 1)
        self.rank, self.world_size = mdist.rank_and_world()
        self.device = device or resolve_device(cfg.run.device)
        self.data = training_source(cfg, source=source, train=train, test=test)
        run = build_run(cfg, self.data, self.device, self.world_size)
        self.model, self.encoder, self.augment = run.model, run.encoder, run.augment
        self.optimizer, self.schedule = run.optimizer, run.schedule
        self.batch, self.precision = run.batch, run.precision
        # fp16's narrow range underflows small gradients: the loss is scaled, and the scale kept in checkpoints
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision == torch.float16 else None
        # the loss of a uniform guess: log(1 + K) against the queue (a bank: its K draws); in-batch: log(2·B·W − 1);
        # v3: 2τ·log(B·W) per direction, two directions (each method's uniform_loss)
        self.divergence_threshold = DIVERGENCE_FACTOR * self.model.uniform_loss(cfg.optim.batch_size)
        self.drift = DriftMonitor(self.model, self.data, cfg, self.device, rank=self.rank, batch=self.batch)
        self.monitors: list[Monitor] = [self.drift, FirstLayerGradNorm(self.encoder.backbone)]
        self.evaluation = Evaluation(self.encoder, self.data, cfg.eval, device=self.device, dtype=self.precision,
                                     validation=bool(cfg.data.val_size))
        # rank 0 alone: it scores, and the other ranks' features need not travel
        self.online = OnlineProbe(self.encoder.backbone, self.data.labels_at, self.data.classes, self.device) \
            if cfg.eval.online_probe and self.rank == 0 else None
        if self.online is not None:
            self.monitors.append(self.online)
            self.evaluation.online = self.online.score
        # The augment stream is torch's global generator (kornia draws from it): the trainer keeps
        # its state and swaps it in while it trains (see method/rng.py).
        self.rng_state = rng.global_state("augment", cfg.run.seed, rank=self.rank)
        self.step_metrics_interval = step_metrics_interval(cfg.run.step_metrics_every, self.schedule.total_steps)
        self.step = 0
        self.epoch = 0
        self.history: list[EpochRecord] = []
        self.epoch_stats = EpochStats()
        self.last_epoch_series: dict[str, list[list[float]]] = {}  # the finished epoch's EpochStats.per_step

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def epoch_order(self, epoch: int) -> torch.Generator:
        """Data order of an epoch: a function of (seed, epoch) alone, identical on every rank,
        different each epoch, and reproducible after a restart in the middle of an epoch."""
        return rng.generator("data", self.cfg.run.seed, epoch=epoch)

    def records_step(self, step: int) -> bool:
        """Whether the per-step metrics of the step that makes the count ``step`` are kept: every
        ``run.step_metrics_every``-th; by default as many as a chart draws (training/step_metrics.py)."""
        return step % self.step_metrics_interval == 0

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Everything needed to continue bit-for-bit: weights, queue, optimizer, counters, RNG."""
        # per part, unwrapped from DDP, so a checkpoint reads the same whatever W is; a part the method has
        # not is saved empty
        parts = {name: part.state_dict() for name, part in self.model.checkpoint_parts().items()}
        shuffle = self.model.shuffle_generator
        return {
            "encoder_q": self.encoder.state_dict(),
            **{name: parts.pop(name, {}) for name in CHECKPOINT_PARTS},
            **parts,  # a method's part of another name
            "probes": self.drift.state_dict(),
            "online_probe": self.online.state_dict() if self.online is not None else {},
            "moco_step": self.model.step.clone(),
            "optimizer": self.optimizer.state_dict(),
            "grad_scaler": self.scaler.state_dict() if self.scaler is not None else {},
            "step": self.step,
            "epoch": self.epoch,
            "rng": torch.get_rng_state() if self._in_epoch else self.rng_state,
            "shuffle_rng": shuffle.get_state() if shuffle is not None else None,
            "epoch_stats": asdict(self.epoch_stats),
            "unreadable": self.data.unreadable.state_dict(),  # what a stream found damaged so far
            # the per-step series went to the logger with their epoch: a checkpoint stays small
            "history": [{**asdict(h), "per_step": {}, "diagnostics": {}} for h in self.history],
        }

    def load_state_dict(self, state: dict) -> None:
        self.encoder.load_state_dict(state["encoder_q"])
        for name, part in self.model.checkpoint_parts().items():  # the key encoder, the queue or the bank
            part.load_state_dict(state[name])
        self.drift.load_state_dict(state.get("probes", {}))  # a checkpoint without probes loads with none
        if self.online is not None:
            self.online.load_state_dict(state.get("online_probe", {}))
        self.model.step.copy_(state["moco_step"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.rng_state = state["rng"]
        shuffle = self.model.shuffle_generator
        if shuffle is not None and state.get("shuffle_rng") is not None:
            shuffle.set_state(state["shuffle_rng"])
        self.epoch_stats = EpochStats(**state["epoch_stats"])  # a record without per_step loads it empty
        self.data.unreadable.load_state_dict(state.get("unreadable", {}))  # none kept: nothing found damaged
        self.history = [EpochRecord(**h) for h in state["history"]]

    # ------------------------------------------------------------------ training
    _in_epoch = False

    def train_epoch(self, on_step: Callable[["Trainer"], None] | None = None) -> tuple[float, float, float, bool]:
        """Train to the end of the current epoch (or the run), resuming mid-epoch if a checkpoint was
        taken there; ``on_step`` after every step.  Returns (mean loss, pretext acc, images/s, diverged)."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.rng_state)
            self._in_epoch = True
            try:
                result = self._train_epoch(on_step)
            finally:
                self._in_epoch = False
                self.rng_state = torch.get_rng_state()
        return result

    def _train_epoch(self, on_step: Callable[["Trainer"], None] | None) -> tuple[float, float, float, bool]:
        st, per_epoch = self.epoch_stats, self.schedule.steps_per_epoch
        self.model.train()
        done_in_epoch = self.step - self.epoch * per_epoch  # > 0 after a mid-epoch restart
        t0 = time.perf_counter() - st.seconds
        batches = self.data.epoch_indexed(self.epoch_order(self.epoch), self.batch, self.rank, self.world_size,
                                          start_step=done_in_epoch)
        for images, index in batches:
            if self.step >= self.schedule.total_steps:
                break
            res = self.train_step(images, index, self.schedule.momentum(self.step))
            if res.diverged:
                return res.loss, 0.0, 0.0, True
            st.add(res.loss, res.pretext_acc, images.shape[0] * self.world_size)
            if self.records_step(self.step):
                # the epoch's means hide what a step shows: BN's cheating and m = 0's collapse happen within an epoch
                st.add_series(self.step, {**dict(zip(STEP_SERIES, (res.m, res.loss, res.pretext_acc))),
                                          **res.monitored})
            st.seconds = time.perf_counter() - t0
            if on_step is not None:
                on_step(self)
        self.epoch += 1
        self.epoch_stats = EpochStats()
        self.last_epoch_series = st.per_step
        return st.mean_loss, st.mean_acc, st.images / max(st.seconds, 1e-9), False

    def train_step(self, images: torch.Tensor, index: torch.Tensor | None, m: float) -> StepResult:
        """One MoCo step on this rank's uint8 batch (B×C×H×W; ``index``: the images' positions in the
        training set, which a memory bank and the drift probes need; ``m``: the key encoder's momentum
        for this step, ``schedule.momentum(step)`` in a run): the whole algorithm, top to bottom.

        Augmentation draws from torch's global generator: ``train_epoch`` swaps
        the trainer's augment stream in around its steps (method/rng.py).
        """
        lr = self.schedule.lr(self.step)  # cosine schedule over the run's steps (after any warm-up)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.model.key_encoder is not None:
            self.model.m = m  # the key encoder's EMA momentum this step
        record = self.records_step(self.step + 1)  # this step's per-step metrics are kept (run.step_metrics_every)
        for monitor in self.monitors:
            monitor.before_step(record)
        im_q, im_k = self.augment(to_device(images, self.device))  # two views: B×C×H×W each
        if self.cfg.run.channels_last:
            im_q, im_k = (v.contiguous(memory_format=torch.channels_last) for v in (im_q, im_k))
        # MoCo forward: query encoder, EMA update of the key encoder, keys on a shuffled batch,
        # InfoNCE against the queue, enqueue the keys (method/moco.py); v3: both views, keys of the global batch
        out = self.model(im_q, im_k, None if index is None else to_device(index, self.device))
        for monitor in self.monitors:  # the drift probes among the slots this step wrote
            monitor.after_forward(self.step, out, images, index)
        loss_t = out.loss.detach().float()
        # decided across ranks: one rank's NaN stops every rank at this step, so no collective waits forever;
        # the decision, the loss and the pretext accuracy reach the host in the step's one transfer.  It is
        # the step's one wait for the device, kept: a garbage loss never updates the weights, and the GPU
        # idles only while the host queues backward's first kernels (a decision taken a step late on the
        # device would apply the bad update first, and checkpoints would have to hold it back)
        bad = mdist.any_rank_tensor(~torch.isfinite(loss_t) | (loss_t > self.divergence_threshold))
        loss, acc, diverged = torch.stack([loss_t, out.correct.float().mean(), bad.float()]).cpu().tolist()
        if diverged:
            return StepResult(loss, 0.0, lr, diverged=True, m=m)  # no update from a garbage loss
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            out.loss.backward()  # gradients reach the query encoder only; DDP averages them across ranks
        else:  # fp16: the scaled loss, the gradients unscaled before anything reads them
            self.scaler.scale(out.loss).backward()
            self.scaler.unscale_(self.optimizer)
        monitored: dict[str, float | None] = {}
        for monitor in self.monitors:  # the first layer's gradient norm
            monitored.update(monitor.after_backward(record))
        if self.scaler is None:
            self.optimizer.step()
        else:  # skipped where a gradient overflowed (a host read: fp16's cost), and the scale adapted
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.step += 1
        return StepResult(loss, acc, lr, diverged=False, m=m, monitored=monitored)

    def measure_epoch(self) -> dict:
        """The monitors' ``end_epoch`` fields of the finished epoch's ``EpochRecord`` (staleness, key drift,
        diagnostics)."""
        fields: dict = {}
        for monitor in self.monitors:
            fields.update(monitor.end_epoch(self.step, self.is_main))
        return fields


class ConsoleProgress:
    """The lines a run prints: what it is, a line every quarter epoch, one per epoch with its monitors and an
    ETA, and its scores at the end.  ``say`` None prints nothing."""

    def __init__(self, say: Callable[[str], None] | None) -> None:
        self.say = say or (lambda _msg: None)
        self.t_start = time.perf_counter()
        self.start_step = 0  # where this process began: the ETA counts only steps it ran

    def start(self, tr: Trainer) -> None:
        cfg, mc = tr.cfg, tr.cfg.moco
        m_txt = f"m={mc.m}" + (" rising to 1 (cosine)" if mc.m_schedule == "cosine" else "")
        dictionary = tr.model.describe(cfg.optim.batch_size)
        val = getattr(tr.data, "val", None)
        held = f" / {len(val)} validation (held out)" if val is not None else ""
        self.say(f"mocolab: {cfg.data.name} ({tr.data.size} train{held} / {tr.data.test_size} test, {tr.data.kind}), "
                 f"{f'method {cfg.method.name}' if cfg.method.name else f'MoCo {mc.version}'}, {cfg.model.backbone}, "
                 f"{m_txt}, {dictionary}, {cfg.optim.name} "
                 f"lr {cfg.effective_lr:g}, batch={cfg.optim.batch_size} "
                 f"on {tr.world_size} rank(s), {tr.schedule.total_steps} steps on {tr.device} "
                 f"({PRECISION_NAMES[tr.precision]} encoders) with {torch.get_num_threads()} threads"
                 + (f", resuming at step {tr.step}" if tr.step else ""))
        for note in tr.data.notes():
            self.say(f"  {note}")
        self.start_step = tr.step

    def initial(self, knn: float, linear: float) -> None:
        self.say(f"  at initialisation: linear top-1 {100 * linear:.2f}%  kNN top-1 {100 * knn:.2f}%")

    def on_step(self, tr: Trainer) -> None:
        """Every quarter epoch but at its end: the last loss and the epoch's throughput so far."""
        per_epoch = tr.schedule.steps_per_epoch
        done = tr.step - tr.epoch * per_epoch  # steps of the current epoch
        if done % max(1, per_epoch // 4) == 0 and done < per_epoch:
            st = tr.epoch_stats
            self.say(f"  epoch {tr.epoch + 1} step {tr.step}/{tr.schedule.total_steps} "
                     f"loss {st.recent_loss:.3f} {st.images / max(st.seconds, 1e-9):.0f} img/s")

    def on_epoch(self, tr: Trainer, rec: EpochRecord) -> None:
        total = tr.schedule.total_steps
        eta = (time.perf_counter() - self.t_start) / max(1, tr.step - self.start_step) * (total - tr.step)
        val = tr.evaluation.monitor_split == "val"
        which, monitor = ("val kNN", rec.val_knn_top1) if val else ("kNN", rec.knn_top1)
        knn_txt = (f"{which} {100 * monitor:.2f}%" if monitor is not None
                   else (f"{which} at the end" if rec.step >= total else f"{which} -"))
        online = rec.val_online_linear_top1 if val else rec.online_linear_top1
        if online is not None:
            knn_txt += f"  online probe {100 * online:.2f}%"
        stored = tr.model.dictionary is not None  # fresh negatives (v3, in-batch) have no age to show
        drift_txt = (f"  key drift cos {rec.drift_cos:.3f} (age ≤ {rec.staleness_max:.0f})"
                     if rec.drift_cos is not None and stored else "")
        self.say(f"epoch {rec.epoch:3d}  step {rec.step:6d}/{total}  loss {rec.loss:.4f}  "
                 f"pretext {100 * rec.pretext_acc:.1f}%  {knn_txt}  {rec.images_per_s:.0f} img/s{drift_txt}  "
                 f"ETA {fmt_time(eta)}")

    def diverged(self, step: int, loss: float) -> None:
        self.say(f"  diverged at step {step}: loss {loss}")

    def evaluating(self) -> None:
        self.say("final kNN and linear probe on frozen features ...")

    def done(self, scores: FinalScores) -> None:
        val_txt = (f"  (validation: linear {100 * scores.val_linear:.2f}%, kNN {100 * scores.val_knn:.2f}%)"
                   if scores.val_linear is not None else "")
        online = f"  online probe {100 * scores.online:.2f}%" if scores.online is not None else ""
        self.say(f"done in {fmt_time(time.perf_counter() - self.t_start)}: linear top-1 "
                 f"{100 * scores.probe.test_top1:.2f}%  kNN top-1 {100 * scores.knn:.2f}%{online}{val_txt}")


def fmt_time(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def run_training(cfg: Config, *, on_epoch: Callable[[EpochRecord], None] | None = None,
                 on_step: Callable[[Trainer], None] | None = None,
                 progress: Callable[[str], None] | None = print, trainer: Trainer | None = None,
                 measure_init: bool = False,
                 before_evaluation: Callable[[Trainer], None] | None = None) -> TrainResult:
    """Train to the end, monitoring kNN per epoch; finish with kNN and the linear probe.

    With several ranks every rank calls this in lockstep (``on_epoch`` and
    ``on_step`` run on all of them, so Ray's report barrier is met); the
    monitors and the probe run on rank 0 only, and other ranks return None
    for them.  A trainer restored from a checkpoint continues where it was.
    A diverged run stops at once and returns its last loss with ``diverged``
    set; its monitors are not run (the encoder is garbage by definition).
    ``before_evaluation`` runs on every rank once training ends, before rank 0 evaluates alone: the place
    for a caller's last collectives (no collective may follow, or the other ranks would wait in it for
    the whole evaluation).
    """
    console = ConsoleProgress(progress)
    keep_freed_memory()  # every step frees and takes back the same megabytes (config/hardware.py)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    tr = trainer or Trainer(cfg)
    console.start(tr)
    knn_init = linear_init = None
    if measure_init and tr.is_main:  # the baseline this run must beat: its own encoder before training (baselines.py)
        knn_init, probe_init = tr.evaluation.final_eval()
        linear_init = probe_init.test_top1
        console.initial(knn_init, linear_init)

    def after_step(t: Trainer) -> None:
        console.on_step(t)
        if on_step is not None:
            on_step(t)

    loss = tr.history[-1].loss if tr.history else float("nan")
    diverged = False
    while tr.step < tr.schedule.total_steps:
        t0 = time.perf_counter()
        loss, pretext, rate, diverged = tr.train_epoch(on_step=after_step)
        if diverged:
            console.diverged(tr.step, loss)
            break
        rec = _epoch_record(tr, loss, pretext, rate, t0)
        tr.history.append(rec)
        console.on_epoch(tr, rec)
        if on_epoch is not None:
            on_epoch(rec)
        rec.per_step, rec.diagnostics = {}, {}  # logged by on_epoch; held no longer (a million steps)
    if before_evaluation is not None:
        before_evaluation(tr)
    if diverged or not tr.is_main:
        return TrainResult(None, None, loss, tr.step, diverged, tr.history, knn_init, linear_top1_init=linear_init)
    console.evaluating()
    scores = tr.evaluation.final_scores(console.say)
    if tr.history:
        tr.history[-1].knn_top1 = scores.knn
        tr.history[-1].val_knn_top1 = scores.val_knn
        if tr.evaluation.monitor_split == "test":  # the online probe's curve ends on the split it ran on
            tr.history[-1].online_linear_top1 = scores.online
    console.done(scores)
    return TrainResult(scores.probe.test_top1, scores.knn, loss, tr.step, False, tr.history, knn_init, scores.probe,
                       linear_init, scores.val_linear, scores.val_knn)


def _epoch_record(tr: Trainer, loss: float, pretext: float, rate: float, t0: float) -> EpochRecord:
    """The epoch just trained: the kNN monitor where due (rank 0), then what the monitors measured."""
    cfg, e = tr.cfg, tr.cfg.eval
    last = tr.step >= tr.schedule.total_steps
    due = e.knn_every and tr.epoch % e.knn_every == 0 and not last  # the last one comes with the probe
    monitor = tr.evaluation.knn() if tr.is_main and due else None
    online = tr.evaluation.last_online if monitor is not None else None
    val = tr.evaluation.monitor_split == "val"
    knn, val_knn = (None, monitor) if val else (monitor, None)
    online, val_online = (None, online) if val else (online, None)
    measured = tr.measure_epoch()
    return EpochRecord(epoch=tr.epoch, step=tr.step, loss=loss, lr=tr.schedule.lr(tr.step - 1),
                       m=tr.schedule.momentum(tr.step - 1), pretext_acc=pretext, knn_top1=knn, images_per_s=rate,
                       seconds=time.perf_counter() - t0, per_step=tr.last_epoch_series, val_knn_top1=val_knn,
                       online_linear_top1=online, val_online_linear_top1=val_online, **run_constants(cfg),
                       **measured)


def run_constants(cfg: Config) -> dict[str, float]:
    """What the config fixes for the whole run, beside each epoch's measures so they read against it: the key
    encoder's EMA half-life in steps and the FIFO queue's staleness bound (0 where no queue is kept)."""
    return {"ema_half_life": cfg.ema_half_life, "max_staleness_bound": cfg.max_staleness if cfg.uses_queue else 0.0}
