"""Pre-registration a machine can check: each study's rules as one canonical text, its short hash, and the tag
every run the reproduction launches carries, so that "the rules came before the runs" is read from the runs.

A study's rules are everything that decides its verdicts: its arms, seeds, reference and borrowed arms, each
claim's comparisons, kind, primary metric, margin, the paper's numbers set beside them, the steps each needs and
whether the study's budget has them (so the plan says in advance which claims a budget can test), the contrasts,
the level and power, the bar of "learning is plain" and the arm it is read from, and the verdict rules in words
(repro/claims.py). ``mocolab repro`` puts ``plan_tag(study)`` in the environment of each study it launches
(tracking/source.py's PLAN_ENV), so every run it makes, baselines included, carries it in the tag PLAN_TAG; the
export writes it to the CSV's ``plan_hash`` column, and the document labels a verdict *post hoc* unless every run
it judges carries the hash of the rules that judge it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any

from mocolab.repro.claims import (ALPHA, BASELINE_CHECK, HALF_LIVES, MARGINS, PLAIN_BARS, PLAIN_KNN, PLAIN_LINEAR,
                                  POWER, RANDOM_INIT, SECONDARY_METRICS, SHARED_HALF_LIVES, VERDICT_RULES, Claim,
                                  Contrast, paper_claims)
from mocolab.repro.plan import STUDIES, Study

HASH_CHARS = 12  # a short hash: 48 bits, enough that two plans of one repository do not collide by chance
PLAN_COLUMN = "plan_hash"  # results/<study>.csv: the hashes a run carries, space-separated; empty where none


def _number(x: float) -> float | str | None:
    """A float as JSON holds it exactly once (NaN and inf have no JSON form)."""
    if x is None:
        return None
    return str(x) if math.isnan(x) or math.isinf(x) else round(float(x), 12)


def in_study(study: Study, arm: str) -> bool:
    """Whether the study plans ``arm`` (its own, its reference, a borrowed one or the random-init baseline)."""
    return arm in study.arms or arm in (study.reference, *(b.here for b in study.borrow)) or arm == RANDOM_INIT


def _claim(claim: Claim, study: Study, steps: int) -> dict[str, Any]:
    pairs = [p for p in claim.pairs if in_study(study, p[0]) and in_study(study, p[1])]
    return {"words": claim.words, "kind": claim.kind, "metric": claim.metric, "margin": _number(claim.margin),
            "control": claim.control, "momenta": claim.momenta, "m": _number(claim.m),
            "pairs": [{"a": a, "b": b, "paper": _number(claim.paper_effect((a, b))),
                       "steps_needed": _number(claim.steps((a, b))), "testable": steps >= claim.steps((a, b))}
                      for a, b in pairs]}


def _contrast(c: Contrast, study: Study, steps: int) -> dict[str, Any]:
    arms = tuple(a for a in c.arms if in_study(study, a))
    return {"words": c.words, "shape": c.shape, "metric": c.metric, "arms": list(arms), "low": list(c.low),
            "paper": _number(c.paper), "momenta": c.momenta, "m": _number(c.m),
            "steps_needed": _number(c.steps(arms)) if arms else None, "testable": bool(arms) and steps >= c.steps(arms)}


def rules(study: Study, steps: int | None = None) -> dict[str, Any]:
    """The rules that judge ``study``'s verdicts, as plain data (``steps``: the study's, computed if not given)."""
    steps = study.steps() if steps is None else steps
    paper = paper_claims(study.name, study.by, study.script)
    bar = PLAIN_BARS.get(study.bar_budget)
    return {
        "study": study.name, "preset": study.preset, "by": study.by, "arms": list(study.arms), "seeds": study.seeds,
        "steps": steps, "reference": study.reference, "workers": study.workers,
        "borrow": [{"study": b.study, "arm": b.arm, "as": b.here} for b in study.borrow],
        "claims": [_claim(c, study, steps) for c in paper.claims],
        "contrasts": [_contrast(c, study, steps) for c in paper.contrasts],
        "baseline_check": {"words": BASELINE_CHECK.words, "metric": BASELINE_CHECK.metric},
        "alpha": ALPHA, "power": POWER, "margins": {k: _number(v) for k, v in MARGINS.items()},
        "secondary_metrics": list(SECONDARY_METRICS),
        "half_lives": HALF_LIVES, "shared_half_lives": SHARED_HALF_LIVES,
        "plain_bar": {"budget": study.bar_budget, "study": bar[0] if bar else None, "arm": bar[1] if bar else None,
                      "knn": PLAIN_KNN, "linear": PLAIN_LINEAR},
        "verdict_rules": list(VERDICT_RULES),
    }


def canonical(study: Study, steps: int | None = None) -> str:
    """``rules`` as one JSON text, keys sorted, no spaces: the same rules give the same bytes on every machine."""
    return json.dumps(rules(study, steps), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def rules_hash(study: Study, steps: int | None = None) -> str:
    return hashlib.sha256(canonical(study, steps).encode("utf-8")).hexdigest()[:HASH_CHARS]


def plan_tag(study: Study) -> str:
    """What a run of ``study`` carries: its study's hash, then the hash of every study that borrows its arms (they
    judge its runs too), space-separated."""
    readers = [s for s in STUDIES if s.name != study.name and any(b.study == study.name for b in s.borrow)]
    return " ".join([rules_hash(study), *(rules_hash(s) for s in readers)])


def carries(tag: object, digest: str) -> bool:
    """Whether a run's ``plan_hash`` cell (NaN or empty where it carries none) holds ``digest``."""
    return isinstance(tag, str) and digest in tag.split()


def tag_runs(study: Study) -> str:
    """Put ``plan_tag(study)`` where every run this process and its children make reads it (tracking/source.py's
    ``source_tags``): a study's baselines, its sweep's parent and trials. The tag it set."""
    from mocolab.tracking.source import PLAN_ENV

    os.environ[PLAN_ENV] = tag = plan_tag(study)
    return tag
