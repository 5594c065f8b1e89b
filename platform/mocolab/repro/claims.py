"""The reproduction's rules: which comparisons answer each paper claim, the margins that decide "not
reproduced", the budget each claim needs, and the bar a budget clears before its verdicts stand.

The document (repro/document.py) only applies these; a test (tests/repro/test_verdict_rules.py) builds
synthetic results that must come out reproduced, reversed, not reproduced and inconclusive, so a rule
changed here changes a test too. Whether the rules came before the runs they judge is not asserted here but
checked: repro/preregistration.py serialises each study's rules, every run the reproduction launches carries
their hash, and a verdict whose runs do not carry it is labelled post hoc.

The margins are on this data set's scale, not the paper's ImageNet points: what there is to learn at cpu-full
is the gap between a trained encoder and its random-init start on the validation split, 2.87 linear points
(m = 0.99, seeds 0-4; results/pilot/margin.csv). A margin of a third of it (1 point) is the smallest effect
called a difference; a claim is "not reproduced" only where the seeds exclude an effect that large in the
paper's direction, and a significant effect the seeds show to be smaller than it is "below the margin".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mocolab.analysis.verdicts import EQUAL, FAILS, GREATER

ALPHA = 0.05
POWER = 0.8  # the detectable effect each comparison prints: found with this probability at its level
# the smallest difference that counts, per metric (fractions): a third of what there is to learn at cpu-full
# (validation linear top-1, results/pilot/margin.csv); pretext accuracy, which the batch-norm claim reads,
# moves by tens of points when a model cheats (the paper's Figure: near 100 % without shuffling)
MARGINS = {"linear_top1": 0.01, "pretext_acc": 0.05,
           # the instruments beside the full probe take the full probe's margin: fixed before their first runs,
           # when no run had measured what there is to learn on them
           "knn20_top1": 0.01, "linear_top1_1pct": 0.01, "linear_top1_10pct": 0.01}
# Every claim on linear_top1 names it primary: its verdict is the claim's. These are read beside it, each with its
# own paired test, interval and detectable effect, Holm across the claim's pairs but not with the primary; they
# never decide a verdict (a run without them, made before they were logged, leaves them out).
SECONDARY_METRICS = ("knn20_top1", "linear_top1_1pct", "linear_top1_10pct")
LEARNED = 0.0287  # the pilot's mean validation gap (m = 0.99 over random-init) the linear margin is a third of
# A claim about momenta is testable when the run trains at least this many half-lives of the larger m
# (ln 0.5 / ln m steps): before that, the key encoder still holds more than 3 % (2^-5) of its random start,
# and the larger m's arm is partly an untrained network. m = 0.999: 3,464 steps; m = 0.9999: 34,656.
HALF_LIVES = 5
# A claim whose arms share one key-encoder momentum m (every arm but the momentum ablation's trains at the paper's
# m = 0.999) is testable when the run trains at least this many half-lives of that m: before one half-life the
# key encoder is more its random start than trained (at 117 steps, 0.999^117: 89 % of it), and MoCo has not begun.
SHARED_HALF_LIVES = 1
PAPER_M = 0.999
# "Learning is plain at this budget": in every seed, the budget's bar arm beats the random-init encoder of its
# seed by >= 5 kNN points and the raw-pixel probe by >= 3 linear points (test split). A study below the bar
# reports its verdicts as provisional.
PLAIN_MOMENTUM_ARM, PLAIN_KNN, PLAIN_LINEAR = "0.99", 0.05, 0.03
# One bar per budget (repro/plan.py's Study.budget), read from one named arm of one named study and stated once:
# identical runs in two studies of one budget get one answer. Where the named arm has no finished run yet, a
# study reads its own reference arm, and says so.
PLAIN_BARS: dict[str, tuple[str, str]] = {
    "cpu-quick": ("momentum-cpu-quick", PLAIN_MOMENTUM_ARM),
    "cpu-full": ("momentum-cpu-full", PLAIN_MOMENTUM_ARM),
    "cpu-full at 17 epochs": ("momentum-long-cpu-full", PLAIN_MOMENTUM_ARM),
    "vit-quick": ("versions-vit-quick", "v2 convnet"),
}
# "m = 0 fails" is a claim of kind FAILS against the random-init encoder; these describe how (not the verdict)
FAIL_LOSS_FRACTION = 0.9  # final InfoNCE loss >= 0.9 * ln(1 + K): no better than guessing among K + 1 keys
FAIL_PRETEXT = 0.05  # pretext accuracy below 5 % at the end
RANDOM_INIT = "random-init"


def half_life(m: float) -> float:
    """Steps for the key encoder's memory of a weight to halve at momentum ``m`` (inf at m = 1, 0 at m = 0)."""
    return 0.0 if m <= 0 else math.inf if m >= 1 else math.log(0.5) / math.log(m)


def steps_needed(momenta: tuple[float, ...]) -> float:
    """Training steps a comparison of these momenta needs: HALF_LIVES half-lives of the largest."""
    return HALF_LIVES * half_life(max(momenta))


def steps_for(arms: tuple[str, ...], momenta: bool, m: float | None) -> float:
    """Training steps a comparison of ``arms`` needs: ``steps_needed`` where the arms are values of m, else
    SHARED_HALF_LIVES half-lives of the key-encoder momentum ``m`` they share (0 where they share none)."""
    if momenta:
        return steps_needed(tuple(float(a) for a in arms))
    return SHARED_HALF_LIVES * half_life(m) if m else 0.0


@dataclass(frozen=True)
class Claim:
    """One paper claim: its comparisons, all of one kind, form one Holm family.

    ``pairs``: (a, b) arms as the CSV writes them; the paper says a > b (GREATER), a ≈ b (EQUAL) or that a is
    no better than b (FAILS).  ``momenta``: the pairs are values of m, so the budget rule applies.
    ``control``: no paper claim but a question the reproduction asks to explain one (which of the differences
    between two arms matters); judged as EQUAL, its verdicts read alike, different or inconclusive.
    ``m``: the key-encoder momentum the arms share (the budget rule of SHARED_HALF_LIVES), None where they share
    none.  ``paper``: per pair, the paper's own difference in ImageNet points (NaN where it gives none), set
    beside a "not reproduced" verdict's upper bound.
    """

    words: str
    pairs: tuple[tuple[str, str], ...]
    kind: str = GREATER
    metric: str = "linear_top1"
    momenta: bool = False
    control: bool = False
    m: float | None = PAPER_M
    paper: tuple[float, ...] = ()

    @property
    def margin(self) -> float:
        return MARGINS[self.metric]

    def steps(self, pair: tuple[str, str]) -> float:
        return steps_for(pair, self.momenta, self.m)

    def paper_effect(self, pair: tuple[str, str]) -> float:
        return self.paper[self.pairs.index(pair)] if pair in self.pairs and self.paper else math.nan


SLOPE, ORDER, GROUPS = "slope on log2", "order", "groups"


@dataclass(frozen=True)
class Contrast:
    """A claim about more than two arms tested as one per-seed linear contrast (analysis/stats.py ``contrast``),
    its own Holm family of one, the paper's direction GREATER: the primary test of its claim, the claim's
    pairwise comparisons secondary.

    ``shape``: SLOPE, the least-squares slope of the metric on log2 of the arm (points a doubling; its margin is
    the metric's margin spread over the log2 range the study's arms span); ORDER, the arms in the paper's
    order, lowest first (centred ranks: with three arms the last minus the first); GROUPS, the mean of the arms
    not in ``low`` minus the mean of those in ``low``. Only the arms the study plans take part. ``paper``: the
    paper's value of the contrast in ImageNet points (NaN where it gives none).
    """

    words: str
    arms: tuple[str, ...]
    shape: str
    metric: str = "linear_top1"
    paper: float = math.nan
    momenta: bool = False
    m: float | None = PAPER_M
    low: tuple[str, ...] = field(default=())

    def margin(self, arms: tuple[str, ...]) -> float:
        if self.shape == SLOPE:
            xs = [math.log2(float(a)) for a in arms]
            return MARGINS[self.metric] / (max(xs) - min(xs))
        return MARGINS[self.metric]

    def steps(self, arms: tuple[str, ...]) -> float:
        return steps_for(arms, self.momenta, self.m)


@dataclass(frozen=True)
class PaperClaims:
    """What a paper says about one kind of study: its own numbers, and the claims tested here."""

    text: str
    claims: tuple[Claim, ...]
    limits: str = ""  # where this data set limits a claim, said instead of tested
    contrasts: tuple[Contrast, ...] = ()


MOMENTUM = PaperClaims(
    "Paper (MoCo, He et al. 2020, Table 1b, ImageNet linear top-1): m = 0.9 → 55.2, 0.99 → 57.8, 0.999 → 59.0, "
    "0.9999 → 58.9; at m = 0 the training loss oscillates and fails to converge.",
    (Claim("a momentum below 0.99 costs accuracy", (("0.99", "0.9"),), momenta=True, paper=(2.6,)),
     Claim("m = 0.999 is better than 0.99", (("0.999", "0.99"),), momenta=True, paper=(1.2,)),
     Claim("m = 0.9999 is as good as 0.999", (("0.9999", "0.999"),), kind=EQUAL, momenta=True, paper=(-0.1,)),
     Claim("training fails at m = 0: its encoder is no better than the random-init network it starts from",
           (("0", RANDOM_INIT),), kind=FAILS, m=None)),
    contrasts=(Contrast("accuracy rises with m from 0.9 through 0.99 to 0.999 (the last minus the first)",
                        ("0.9", "0.99", "0.999"), ORDER, paper=59.0 - 55.2, momenta=True),))

# by the study's name, the field its arms differ in, or its script (repro/plan.py)
PAPER: dict[str, PaperClaims] = {
    "moco.m": MOMENTUM,
    "queue.size": PaperClaims(
        "Paper (Figure 3, ImageNet linear top-1, ResNet-50): MoCo's accuracy rises with K all the way to "
        "K = 65,536 (60.6); at K = 4,096 it is 59.0 (the momentum ablation's m = 0.999). The paper has no "
        "Fashion-MNIST number.",
        (Claim("a larger dictionary is better: each smaller K is below K = 16,384",
               (("16384", "256"), ("16384", "512"), ("16384", "1024"), ("16384", "2048"), ("16384", "4096"),
                ("16384", "8192"))),),
        contrasts=(Contrast("accuracy rises with log2 K (per doubling of K)",
                            ("256", "512", "1024", "2048", "4096", "8192", "16384"), SLOPE,
                            paper=(60.6 - 59.0) / 4),),  # K = 4,096 -> 65,536: four doublings
        limits="Fashion-MNIST has 10 classes: in a queue of K keys about a tenth share the query's class, so a "
               "larger K adds same-class negatives as fast as it adds others (ImageNet: a thousandth). K cannot "
               "exceed half the 55,000 training images here, so the paper's K = 65,536 is not tested."),
    "moco.bn": PaperClaims(
        "Paper (Section 3.3, Shuffling BN): without shuffling, the batch's statistics leak which key is the "
        "positive, so the model 'cheats' the pretext task and finds a low-loss solution that does not make "
        "a good representation. The paper gives no accuracy for the unshuffled model. Here `split` emulates "
        "its per-GPU BN with the key batch shuffled across the groups; `groups` and `plain` do not shuffle.",
        (Claim("unshuffled batch norm is worse than shuffled", (("split", "plain"), ("split", "groups"),
                                                              ("shuffle", "plain"), ("shuffle", "groups"))),
         Claim("unshuffled batch norm cheats: its pretext accuracy is higher than shuffled BN's",
               (("plain", "split"), ("groups", "split"), ("plain", "shuffle"), ("groups", "shuffle")),
               metric="pretext_acc")),
        contrasts=(Contrast("shuffled batch norm above unshuffled (mean of the shuffled arms minus the unshuffled)",
                            ("plain", "groups", "split", "shuffle"), GROUPS, low=("plain", "groups")),
                   Contrast("unshuffled batch norm cheats (mean pretext accuracy of the unshuffled arms minus the "
                            "shuffled)", ("plain", "groups", "split", "shuffle"), GROUPS, metric="pretext_acc",
                            low=("split", "shuffle")))),
    "negatives_ablation.py": PaperClaims(
        "Paper (Figure 3, ImageNet linear top-1): MoCo's queue beats the memory bank at every K, 60.6 against "
        "58.0 at K = 65,536 (a 2.6-point gap); end-to-end (in-batch) negatives match MoCo where memory allows "
        "(K up to 1,024), and MoCo's larger queues go above them. The paper runs FIFO only: it gives no number "
        "for random replacement. Here the in-batch arm has 2 x 256 - 2 negatives a query, the queue 16,384.",
        (Claim("the memory bank is below MoCo's FIFO queue", (("queue fifo m=0.999", "memory bank"),), paper=(2.6,)),
         Claim("in-batch negatives (end-to-end: K is the batch) are below MoCo's large queue",
               (("queue fifo m=0.999", "in batch"),))),
        limits="The in-batch arm differs from the queue arm in three ways at once (a symmetric loss, no key "
               "encoder, 2B − 2 negatives): its verdict cannot say which one mattered. The control "
               "`symmetric-cpu-full` changes the loss alone (its section)."),
    "moco.negatives": PaperClaims(
        "Paper (Figure 3, ImageNet linear top-1): the memory bank is below MoCo's queue at every K, 58.0 against "
        "60.6 at K = 65,536. Here the bank trains three times as long as the queue it is set against (30 epochs "
        "against the 10 of `negatives-cpu-full`, whose bank did not learn), both with 16,384 negatives a query.",
        (Claim("the memory bank is below MoCo's FIFO queue, even trained three times as long",
               (("queue fifo m=0.999", "memory_bank"),), paper=(2.6,)),)),
    "moco.symmetric": PaperClaims(
        "No paper claim: a control. The in-batch arm differs from the queue arm in three ways at once: a "
        "symmetric loss, no key encoder and 2B − 2 negatives. This study changes the first alone: the queue arm "
        "(key encoder at m = 0.999, 16,384 queued negatives; `momentum-cpu-full`'s m = 0.999, the same config as "
        "`negatives-cpu-full`'s queue fifo arm) with the loss computed both ways, each "
        "view a query against the other view's key; only the second view's keys enter the queue, so its writes "
        "and ages stay the queue arm's. Both views of each image now train the encoder, which the MoCo authors' "
        "CIFAR demo reports acts like about twice the epochs: the control changes that with the loss.",
        (Claim("the symmetric loss alone: the queue arm with it and without it",
               (("queue fifo symmetric m=0.999", "queue fifo m=0.999"),), kind=EQUAL, control=True),
         Claim("what remains between the in-batch arm and the symmetric queue arm (the key encoder, the negatives)",
               (("queue fifo symmetric m=0.999", "in batch"),), kind=EQUAL, control=True))),
    "control-cpu-full": PaperClaims(
        "No paper claim: a one-change control. The in-batch arm and the symmetric queue arm differ in two ways: "
        "the key encoder (an EMA copy at m = 0.999, no gradient through the keys, against the query's own encoder "
        "with gradient through both views) and the negatives (16,384 queued keys a query, against the other "
        "2B − 2 = 510 embeddings of the global batch of B = 256). The batch-keys arm keeps the key encoder and "
        "takes its negatives from the batch: each query is set against the key encoder's other B − 1 = 255 keys "
        "of the batch, the loss computed both ways and averaged, as the symmetric queue arm's is. All three arms "
        "run here, five seeds each, on one kind of machine.",
        (Claim("where the negatives come from and how many (16,384 queued against 255 of the batch), with the key "
               "encoder kept: the symmetric queue arm against batch keys",
               (("queue fifo symmetric m=0.999", "batch keys m=0.999"),), kind=EQUAL, control=True),
         Claim("the key encoder, with the negatives taken from the batch: batch keys against in batch",
               (("batch keys m=0.999", "in batch"),), kind=EQUAL, control=True))),
    "staleness-cpu-full": PaperClaims(
        "Paper (Section 3.2): a queue works because its keys come from a slowly changing encoder; the oldest key "
        "of a FIFO queue is K/(B·W) steps old (64 here), so every key is consistent. The paper runs FIFO only and "
        "gives no number for random replacement, whose keys' ages are geometric: mean about K/(B·W), the oldest "
        "of 16,384 slots several hundred steps. Where the key encoder moves fast (m = 0.99, half-life 69 steps) "
        "such old keys were written by a different encoder, so the argument predicts FIFO above random; at "
        "m = 0.999 (half-life 693 steps) age should not matter. Each arm's measured mean and maximum key age "
        "stand beside the FIFO bound.",
        (Claim("FIFO's young keys beat random replacement's old ones where the encoder moves fast (m = 0.99)",
               (("queue fifo m=0.99", "queue random m=0.99"),), m=0.99),
         Claim("at the paper's m = 0.999 a key's age does not matter: FIFO and random replacement alike",
               (("queue fifo m=0.999", "queue random m=0.999"),), kind=EQUAL))),
    "inbatch-cpu-full": PaperClaims(
        "No paper claim: the in-batch arm of `negatives-cpu-full` (the same config), five seeds, made on the kind "
        "of machine the symmetric control's runs were made on, so that the control pairs its three arms by seed "
        "on one CPU (its verdicts are in the control's section).", ()),
    "method.name": PaperClaims(
        "No paper claim: the scale. The MoCo paper compares with a supervised ResNet-50 (76.5 % ImageNet top-1 "
        "against MoCo's 60.6); here the bound is the same small network, augmentation and number of steps as "
        "cpu-full's MoCo trials, trained with the labels (cross-entropy on both views), then frozen and scored "
        "by the same kNN and linear probe. The sections at this budget read it as the top of their scale.",
        ()),
    "vit_ablation.py": PaperClaims(
        "Papers (ImageNet linear top-1, ResNet-50, 200 epochs): MoCo v1 60.6, MoCo v2 67.5 (Chen et al. 2020); "
        "MoCo v3 (Chen, Xie, He 2021) reports other epochs and backbones, no number at this recipe. Here every "
        "recipe trains at vit-quick's data, batch and epochs. The random-init baseline is the convnet the "
        "three convnet recipes train: the ViT's Δ is against that convnet, not against a random ViT.",
        (Claim("v2's recipe (MLP head, τ 0.2, blur) improves on v1's", (("v2 convnet", "v1 convnet"),),
               paper=(67.5 - 60.6,)),)),
}
BASELINE_CHECK = Claim("each arm's encoder beats its random-init start", (), m=None)  # pairs: every arm, per study
NO_CLAIMS = PaperClaims("The paper gives no number here.", ())


def paper_claims(name: str, by: str, script: str) -> PaperClaims:
    """A study's claims: its own where it has them, else its field's, else its script's."""
    return PAPER.get(name) or PAPER.get(by) or PAPER.get(script) or NO_CLAIMS


# The rules every study's verdicts follow, as words: part of what each study's plan hash covers
# (repro/preregistration.py), so that a change to how a verdict is decided changes the hash as a margin does.
VERDICT_RULES = (
    "a > b: reproduced when the Holm-corrected paired test is significant in the paper's direction and the "
    "no-effect test does not exclude the margin; reproduced, below the margin when both are significant; reversed "
    "when significant against it; not reproduced when the Holm-corrected no-effect test excludes the margin; "
    "else inconclusive",
    "a ≈ b: reproduced when TOST excludes the margin either way; not reproduced when the paired test is "
    "significant; else inconclusive",
    "a no better than b: reproduced when the no-effect test excludes a gain of the margin; reversed when a "
    "gain above the margin is significant; else inconclusive",
    "a contrast over several arms: per-seed linear contrast, one-sample t-test against 0, its own family, "
    "judged as a > b at its margin",
    "one family per claim; the baseline checks a family of their own",
    "a comparison the budget cannot test, or with fewer than two seeds, stays out of its family",
    "a study whose budget's bar is not met marks its verdicts provisional",
    "a claim's metric is its primary; the secondary metrics are tested beside it, Holm across the claim's pairs "
    "for each metric, and never decide its verdict",
)
