"""Which studies the reproduction runs, with which settings: one list, read by the runner, the exporter and
the write-up, so that a study's command, its CSV file and its section in the document cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

Value = Union[float, int, str]
LABEL = "label"  # ``Study.by`` when the arm is the trial's label less its seed (a script's named settings)
HISTORY = "history"  # results/history/<study>.csv: the trials' curves over training, beside results/<study>.csv
# The columns of results/<study>.csv and results/history/<study>.csv the write-up reads (repro/document.py; the
# exporter writes more): every study's, what a momentum section reads besides, and the curves'
READ_COLUMNS = ("arm", "seed", "status", "linear_top1", "knn_top1", "final_loss", "pretext_acc", "commit", "dirty",
                "precision", "torch", "device", "data")
MOMENTUM_COLUMNS = ("ema_half_life", "queue_size")
HISTORY_READ_COLUMNS = ("arm", "seed", "metric", "step", "value")


def word(value: Value) -> str:
    """An arm's text, as the CSV's ``arm`` column and a script's value list write it: 0.99, 4096, split."""
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Borrowed:
    """An arm another study ran, read into this one: ``arm`` as that study's CSV writes it, ``name`` as this
    study's claims call it (the same unless given). Its run of seed s is read only where it was made on the kind
    of machine this study's own arms of seed s were made on: the same config and seed train otherwise on another CPU
    (its bf16 kernels differ), so a pair across machines would not be a pair (repro/document.py)."""

    study: str
    arm: str
    name: str = ""

    @property
    def here(self) -> str:
        return self.name or self.arm


@dataclass(frozen=True)
class Study:
    """One study of the reproduction.

    ``name`` is the sweep's ``--name`` (so the same command resumes it), the baselines' set name and the CSV
    file's stem (``results/<name>.csv``).  ``by``: the config field its arms differ in (``moco.m``,
    ``queue.size``, ``moco.bn``), or ``label`` when an arm is one of the script's named settings (the trial's
    label less ``seed=N``).  ``values``: the arms, numbers or words, in the order the document shows them.
    ``flag``: the script's flag that takes the values as a comma-separated list, or None when the script
    chooses its arms from switches in ``extra`` (``--grid``, ``--what bn``).  ``reference``: the arm every
    other is tested against in the write-up.  ``baseline_sets``: ``--set`` values for the baselines alone
    (where the preset's encoder is not the one the arms train).  ``workers``: Ray Train workers per trial (0:
    one process per trial, two trials at a time on two cores; 2: one two-rank trial at a time).
    ``borrow``: arms of other studies this one compares with (the reference among them where it is none of
    this study's own): the write-up reads their rows from those studies' CSVs and pairs them by seed.
    ``names``: (the arm as ``by``'s value writes it, the arm's name in the write-up), where the value alone
    says little (``moco.symmetric``'s True).  ``budget``: the budget whose bar of "learning is plain" the
    study reads (repro/claims.py's PLAIN_BARS), the preset's name unless given.
    """

    name: str
    script: str
    preset: str
    by: str
    values: tuple[Value, ...]
    seeds: int
    flag: str | None
    title: str
    extra: tuple[str, ...] = field(default=())  # more flags of the script; its --set values reach the baselines
    reference: str = ""
    baseline_sets: tuple[str, ...] = field(default=())
    workers: int = 0
    borrow: tuple[Borrowed, ...] = field(default=())
    names: tuple[tuple[str, str], ...] = field(default=())
    budget: str = ""

    @property
    def bar_budget(self) -> str:
        return self.budget or self.preset

    @property
    def arms(self) -> tuple[str, ...]:
        return tuple(word(v) for v in self.values)

    def overrides(self, precision: str) -> list[str]:
        """The ``--set`` values the trials and the baselines share: the pinned precision and ``extra``'s."""
        extra = [self.extra[i + 1] for i, a in enumerate(self.extra) if a == "--set"]
        return [f"run.precision={precision}", *extra]

    def baseline_overrides(self, precision: str) -> list[str]:
        return [*self.overrides(precision), *self.baseline_sets]

    def steps(self) -> int:
        """Training steps each trial takes (the trainer's own schedule for the preset and ``extra``'s values):
        what the budget rules (repro/claims.py) read."""
        from mocolab.config import build_config
        from mocolab.data.roots import check_data
        from mocolab.training.build import Schedule

        cfg = check_data(build_config(self.preset, self.overrides("fp32")))
        world = max(self.workers, 1)
        return Schedule.from_config(cfg, cfg.train_size, cfg.optim.batch_size // world, world).total_steps

    def command(self, precision: str, threads: int) -> list[str]:
        """The study's command line (relative to the repository), with precision and threads pinned."""
        sets = [a for kv in [*self.overrides(precision), f"run.threads={threads}"] for a in ("--set", kv)]
        rest = [a for i, a in enumerate(self.extra) if a != "--set" and (i == 0 or self.extra[i - 1] != "--set")]
        values = [self.flag, ",".join(self.arms)] if self.flag else []
        return ["experiments/" + self.script, "--preset", self.preset, *values, "--seeds", str(self.seeds),
                "--name", self.name, "--workers-per-trial", str(self.workers), *sets, *rest]


MOMENTA = (0.0, 0.9, 0.99, 0.999, 0.9999)
# Every K that mocolab.tune.studies.queue.queue_sizes gives for cpu-quick (powers of two times the batch of 256, up
# to half the 60,000 training images): log-spaced from 256 to 16,384, the preset's own K and the largest valid.
QUEUE_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)
QUEUE_SIZES_FULL = (256, 1024, 4096, 16384)
BN_MODES = ("plain", "groups", "split")
# on two ranks the cross-rank shuffle of the paper joins them (augmentation_ablation.py adds it from W = 2)
BN_MODES_RANKS = ("plain", "groups", "split", "shuffle")
# negatives_ablation.py's settings at --momenta 0.999: the four sources, the queue's two at the paper's m
NEGATIVES = ("in batch", "memory bank", "queue fifo m=0.999", "queue random m=0.999")
QUEUE_ARM, IN_BATCH = NEGATIVES[2], NEGATIVES[0]
SYMMETRIC = "queue fifo symmetric m=0.999"  # the queue arm of NEGATIVES with moco.symmetric=true
SUPERVISED = "supervised"  # method.name of the supervised bound
BATCH_KEYS = "batch keys m=0.999"  # the key encoder's keys of the global batch as negatives: no queue
# negatives_ablation.py --settings: the one-change control between the symmetric queue arm and the in-batch arm
CONTROL = (BATCH_KEYS, SYMMETRIC, IN_BATCH)
# negatives_ablation.py --settings: FIFO against random replacement where the key encoder moves fast enough for a
# key's age to matter (m = 0.99: half-life 69 steps), and at the paper's m, where it should not (693 steps)
STALENESS = ("queue fifo m=0.99", "queue random m=0.99", "queue fifo m=0.999", "queue random m=0.999")
# the final evaluation's instruments beside the full probe, logged by every run since they were fixed
# (evaluation/low_label.py, the k = 20 kNN): the studies below re-run earlier ones with them, under new names
# vit_ablation.py --compare-versions: each version's own recipe (head, tau, augmentation, optimiser)
VERSIONS = ("v1 convnet", "v2 convnet", "v3 convnet", "v3 vit_tiny")
CONVNET = ("model.backbone=convnet", "model.width=32", "vit.patch_size=0", "vit.depth=0")

STUDIES: tuple[Study, ...] = (
    Study("momentum-cpu-quick", "momentum_ablation.py", "cpu-quick", "moco.m", MOMENTA, 5, "--momenta",
          "Momentum of the key encoder, cpu-quick budget"),
    Study("momentum-cpu-full", "momentum_ablation.py", "cpu-full", "moco.m", MOMENTA, 5, "--momenta",
          "Momentum of the key encoder, cpu-full budget"),
    Study("queue-cpu-quick", "queue_ablation.py", "cpu-quick", "queue.size", QUEUE_SIZES, 3, None,
          "Queue size K, cpu-quick budget", extra=("--grid",), reference="16384"),
    # K at the budget where learning is plain (cpu-full), five seeds: cpu-quick's three seeds could not tell
    # an effect of a few points, which is all there is to learn here
    Study("queue-cpu-full", "queue_ablation.py", "cpu-full", "queue.size", QUEUE_SIZES_FULL, 5, "--sizes",
          "Queue size K, cpu-full budget", extra=("--grid",), reference="16384"),
    # m = 0.99 against 0.999 where the paper's order can show: 17 epochs of cpu-full are 3,638 steps, more than
    # five half-lives of m = 0.999 (3,464; repro/claims.py's budget rule)
    Study("momentum-long-cpu-full", "momentum_ablation.py", "cpu-full", "moco.m", (0.99, 0.999), 5, "--momenta",
          "Momentum 0.99 against 0.999 for five half-lives of 0.999: cpu-full at 17 epochs",
          extra=("--set", "optim.epochs=17"), budget="cpu-full at 17 epochs"),
    # batch norm at cpu-full on two ranks (128 images each): plain (one BN a rank, unshuffled), groups (BN
    # groups of 32 images, unshuffled: the paper's per-GPU batch, where it saw the cheating), split (the same
    # groups, the keys shuffled across them) and shuffle (the paper's cross-rank shuffle)
    Study("bn-cpu-full", "augmentation_ablation.py", "cpu-full", "moco.bn", BN_MODES_RANKS, 5, None,
          "Batch norm on two ranks at cpu-full: the cheating in BN groups of 32 images, and the shuffles that "
          "prevent it", extra=("--what", "bn"), reference="shuffle", workers=2),
    Study("bn-cpu-quick", "augmentation_ablation.py", "cpu-quick", "moco.bn", BN_MODES, 3, None,
          "Batch norm: the cheating that shuffling BN prevents, cpu-quick budget", extra=("--what", "bn"),
          reference="split"),
    Study("bn-ranks-cpu-quick", "augmentation_ablation.py", "cpu-quick", "moco.bn", BN_MODES_RANKS, 3, None,
          "Batch norm on two ranks: the paper's cross-rank shuffle beside the unshuffled arms, cpu-quick budget",
          extra=("--what", "bn"), reference="shuffle", workers=2),
    # The memory bank writes each entry once an epoch, so a short budget gives it few writes (benchmarks/RESULTS.md,
    # "Sources of negatives"): cpu-full's 10 epochs, the plan's longest budget, and every source trains as long.
    Study("negatives-cpu-full", "negatives_ablation.py", "cpu-full", LABEL, NEGATIVES, 3, None,
          "Sources of negatives: in-batch, memory bank, queue (FIFO, random), cpu-full budget",
          extra=("--momenta", "0.999"), reference="queue fifo m=0.999"),
    # The bank alone, three times as long, against the FIFO queue of negatives-cpu-full (10 epochs, the same seeds):
    # at 10 epochs its stored entries had not caught up with the encoder (a 30-epoch pilot on the validation split,
    # results/pilot/bank-30ep.txt, traced why). Its arm is the bank's field. It reads cpu-full's bar of "learning is
    # plain": the queue it is set against trains at cpu-full, and no MoCo arm trains at 30 epochs.
    Study("bank-30ep-cpu-full", "momentum_ablation.py", "cpu-full", "moco.negatives", ("memory_bank",), 3, None,
          "The memory bank trained three times as long: cpu-full at 30 epochs",
          extra=("--momenta", "0.999", "--set", "moco.negatives=memory_bank", "--set", "optim.epochs=30"),
          reference="queue fifo m=0.999", borrow=(Borrowed("negatives-cpu-full", "queue fifo m=0.999"),)),
    # the in-batch arm of negatives-cpu-full (the same overrides, five seeds), run on the machine the symmetric
    # control runs on, so that the control's three arms pair on one kind of CPU
    Study("inbatch-cpu-full", "momentum_ablation.py", "cpu-full", "moco.negatives", (IN_BATCH,), 5, None,
          "The in-batch arm (end-to-end negatives) for the symmetric control, cpu-full budget",
          extra=("--momenta", "0.999", "--set", "moco.negatives=in_batch"), reference=IN_BATCH,
          names=(("in_batch", IN_BATCH),)),
    # the first one-change control between the queue arm and the in-batch arm, which differ in three ways at
    # once: the queue arm with the symmetric loss (repro/claims.py says what it asks). The queue arm is
    # momentum-cpu-full's m = 0.999 (the same config as negatives-cpu-full's queue fifo arm, five seeds)
    Study("symmetric-cpu-full", "momentum_ablation.py", "cpu-full", "moco.symmetric", (SYMMETRIC,), 5, None,
          "A control: the queue arm with a symmetric loss, beside the queue and in-batch arms, cpu-full budget",
          extra=("--momenta", "0.999", "--set", "moco.symmetric=true"), reference=QUEUE_ARM,
          borrow=(Borrowed("momentum-cpu-full", "0.999", QUEUE_ARM), Borrowed("inbatch-cpu-full", IN_BATCH)),
          names=(("True", SYMMETRIC),)),
    # how much there is to learn at cpu-full: the same backbone, augmentation and steps trained with the labels,
    # scored by the same kNN and probe (method/supervised.py); the sections at cpu-full read it as their scale
    Study("supervised-cpu-full", "momentum_ablation.py", "cpu-full", "method.name", (SUPERVISED,), 5, None,
          "The supervised bound: cpu-full's backbone, augmentation and steps, trained with the labels",
          extra=("--momenta", "0.999", "--set", f"method.name={SUPERVISED}"), reference=SUPERVISED),
    # The studies below were planned, with their rules (repro/claims.py), before any of their runs; each runs on
    # one kind of CPU, its paired arms included (none borrowed), so that its verdicts can be shown to follow rules
    # that came first. First the one-change control: the symmetric queue arm and the in-batch arm differ in the
    # key encoder and in where the negatives come from; batch keys keeps the key encoder and takes the batch's
    # keys as negatives. They are listed in the order they run.
    Study("control-cpu-full", "negatives_ablation.py", "cpu-full", LABEL, CONTROL, 5, "--settings",
          "A one-change control: the key encoder's batch keys beside the symmetric queue and in-batch arms, "
          "cpu-full budget", extra=("--momenta", "0.999"), reference=SYMMETRIC),
    Study("staleness-cpu-full", "negatives_ablation.py", "cpu-full", LABEL, STALENESS, 5, "--settings",
          "Staleness: FIFO against random replacement at m = 0.99, where a key's age should matter, and at "
          "m = 0.999, where it should not; cpu-full budget", extra=("--momenta", "0.99,0.999"),
          reference="queue fifo m=0.99"),
    Study("bn-probes-cpu-full", "augmentation_ablation.py", "cpu-full", "moco.bn", BN_MODES_RANKS, 5, None,
          "Batch norm on two ranks at cpu-full, with the low-label probes and the k = 20 kNN",
          extra=("--what", "bn"), reference="shuffle", workers=2),
    Study("momentum-probes-cpu-full", "momentum_ablation.py", "cpu-full", "moco.m", (0.9, 0.99, 0.999), 5,
          "--momenta", "Momentum of the key encoder at cpu-full, with the low-label probes and the k = 20 kNN"),
    Study("versions-vit-quick", "vit_ablation.py", "vit-quick", LABEL, VERSIONS, 3, None,
          "MoCo v1, v2 and v3 at one budget (vit-quick's data, batch and epochs)", extra=("--compare-versions",),
          reference="v2 convnet", baseline_sets=CONVNET),
)


# Arms of different studies that train the same config, as (study, arm): tests/repro checks the configs their runs
# recorded in results/runs.db field by field; the document sets their numbers side by side, seed by seed, which
# shows what a borrowed arm may be paired with (one kind of machine gives the same numbers to the last digit)
SAME_CONFIG: tuple[tuple[tuple[str, str], ...], ...] = (
    (("momentum-cpu-full", "0.999"), ("queue-cpu-full", "16384"), ("negatives-cpu-full", QUEUE_ARM),
     ("staleness-cpu-full", QUEUE_ARM)),
    (("negatives-cpu-full", IN_BATCH), ("inbatch-cpu-full", IN_BATCH), ("control-cpu-full", IN_BATCH)),
    (("symmetric-cpu-full", SYMMETRIC), ("control-cpu-full", SYMMETRIC)),
)


def study(name: str) -> Study:
    for s in STUDIES:
        if s.name == name:
            return s
    raise ValueError(f"--study: no study {name!r}; the reproduction has {[s.name for s in STUDIES]}")

# the README block mocolab repro writes its headline table into
HEADLINE_BEGIN = "<!-- repro:headline (generated by mocolab repro; do not edit) -->"
HEADLINE_END = "<!-- /repro:headline -->"
