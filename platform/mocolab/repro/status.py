"""Where the reproduction stands, study by study, read from its MLflow store: what a researcher asks before
resuming hours of training across sessions (which studies are done, which part way, made on which machine,
how much training is left)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from mocolab.repro.export import trial_runs
from mocolab.repro.plan import Study
from mocolab.tracking import Store

ENDED = ("finished", "diverged")  # a trial the sweep does not run again


@dataclass(frozen=True)
class StudyStatus:
    study: Study
    ended: int
    unfinished: dict[str, int]  # running, failed, killed, stopped ...: what the same command trains again
    machines: tuple[str, ...]
    trial_minutes: float | None  # mean wall time of an ended trial (first start to end: across a resume, more)

    @property
    def planned(self) -> int:
        return len(self.study.arms) * self.study.seeds

    @property
    def left(self) -> int:
        return max(self.planned - self.ended, 0)

    def hours_left(self, cpus: int) -> float | None:
        """The trials left at the pace of this study's ended ones, as many at a time as ``cpus`` holds."""
        if self.trial_minutes is None or not self.left:
            return None if self.left else 0.0
        at_once = max(1, min(self.left, cpus // max(self.study.workers, 1)))
        return self.left * self.trial_minutes / at_once / 60


def study_status(study: Study, store: Store) -> StudyStatus:
    runs = trial_runs(study, store)
    ended = [(run, t) for run, _, t in runs if t["status"] in ENDED]
    unfinished: dict[str, int] = {}
    for _, _, t in runs:
        if t["status"] not in ENDED:
            unfinished[t["status"]] = unfinished.get(t["status"], 0) + 1
    minutes = [(run.info.end_time - run.info.start_time) / 60_000 for run, _ in ended
               if run.info.end_time and run.info.start_time]
    machines = tuple(sorted({run.data.tags.get("mocolab.device", "") for run, _, _ in runs} - {""}))
    return StudyStatus(study, len(ended), unfinished, machines, sum(minutes) / len(minutes) if minutes else None)


def status_lines(studies: list[Study], store: Store, cpus: int | None = None) -> list[str]:
    """A table of the studies' trials ended and planned, and the command that goes on with the first unfinished."""
    cpus = cpus or os.cpu_count() or 1
    rows = [study_status(s, store) for s in studies]
    lines = [f"{'study':<24} {'trials ended':>12} {'left':>5} {'hours left':>10}  machine(s); unfinished runs"]
    for r in rows:
        hours = r.hours_left(cpus)
        when = "—" if hours is None else f"{hours:.1f}"
        rest = "; ".join(f"{n} {status}" for status, n in sorted(r.unfinished.items()))
        lines.append(f"{r.study.name:<24} {f'{r.ended}/{r.planned}':>12} {r.left:>5} {when:>10}  "
                     f"{', '.join(r.machines) or 'not started'}" + (f"; {rest}" if rest else ""))
    todo = [r for r in rows if r.left]
    lines.append(f"{sum(r.left for r in rows)} trial(s) left; hours left at the pace of each study's ended trials, "
                 f"on {cpus} CPU(s) ('—': none ended yet)")
    lines.append(f"next: `mocolab repro` goes on in the plan's order, from {todo[0].study.name} (or `mocolab repro "
                 f"--study NAME` for one)" if todo else "every study has ended")
    return lines
